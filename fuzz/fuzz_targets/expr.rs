#![no_main]
//! See `weir_plugin::expr::fuzz_expr`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin::expr::fuzz_expr(data));
