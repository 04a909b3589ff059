#![no_main]
//! See `weir::fuzzing::upstream_response`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::upstream_response(data));
