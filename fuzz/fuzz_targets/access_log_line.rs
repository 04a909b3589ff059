#![no_main]
//! See `weir::fuzzing::access_log_line`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::access_log_line(data));
