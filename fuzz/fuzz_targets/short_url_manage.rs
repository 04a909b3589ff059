#![no_main]
//! See `weir_plugin_short_url::validate::fuzz_manage` (PATCH bodies and list queries).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_short_url::validate::fuzz_manage(data));
