#![no_main]
//! See `weir::fuzzing::proxy_protocol`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::proxy_protocol(data));
