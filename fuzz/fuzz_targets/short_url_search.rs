#![no_main]
//! See `weir_plugin_short_url::store::links::fuzz_search` (a search for a piece of a title finds it).
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_short_url::store::links::fuzz_search(data));
