#![no_main]
//! See `weir_plugin_opentelemetry::fuzz_traceparent`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_plugin_opentelemetry::fuzz_traceparent(data));
