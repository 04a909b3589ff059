#![no_main]
//! See `weir::fuzzing::template`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::template(data));
