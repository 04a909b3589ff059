#![no_main]
//! See `weir_plugin::jwt::fuzz_token`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin::jwt::fuzz_token(data));
