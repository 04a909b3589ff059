#![no_main]
//! See `weir_plugin_openid_connect::session::fuzz_cookie`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_openid_connect::session::fuzz_cookie(data));
