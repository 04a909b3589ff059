#![no_main]
//! See `weir_plugin_short_url::validate::fuzz_batch`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_short_url::validate::fuzz_batch(data));
