//! Unit tests of the plugin: configuration checks, and the bearer path against a provider
//! simulated by a test HTTP client.
