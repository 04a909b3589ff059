#![no_main]
//! See `weir::fuzzing::config_yaml`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir::fuzzing::config_yaml(data));
