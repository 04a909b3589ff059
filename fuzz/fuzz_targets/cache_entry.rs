#![no_main]
//! See `weir_plugin_proxy_cache::entry::fuzz_file`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_proxy_cache::entry::fuzz_file(data));
