//! Headless Chromium for the tests of the control server's HTML pages.

/// The arguments every run takes: headless, no sandbox (root in CI), nothing fetched from the
/// network by the browser itself.
pub const ARGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// The chromium binary; `None` (the test is reported skipped) when it is not installed, unless
/// WEIR_REQUIRE_CHROMIUM is set (CI), which makes it a failure.
pub fn find(test: &str) -> Option<&'static str> {
    let found =
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().find(|p| std::path::Path::new(p).exists());
    if found.is_none() {
        if std::env::var_os("WEIR_REQUIRE_CHROMIUM").is_some() {
            panic!("chromium is required (WEIR_REQUIRE_CHROMIUM is set): apt-get install chromium");
        }
        super::skip(test, "chromium not installed (apt-get install chromium)");
    }
    found
}
