#![no_main]
//! See `weir_plugin_hmac_auth::fuzz_authorization`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_hmac_auth::fuzz_authorization(data));
