#![no_main]
//! See `weir::fuzzing::client_hello_sni`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::client_hello_sni(data));
