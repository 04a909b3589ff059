#![no_main]
//! See `weir::fuzzing::resources_yaml`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::resources_yaml(data));
