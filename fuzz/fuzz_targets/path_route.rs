#![no_main]
//! See `weir::fuzzing::path_route`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::path_route(data));
