#![no_main]
//! See `weir_plugin::limit::redis::resp::fuzz_reply`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin::limit::redis::resp::fuzz_reply(data));
