#![no_main]
//! See `weir::fuzzing::request_head`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::request_head(data));
