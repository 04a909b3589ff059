//! Metrics in the Prometheus text format, shared by the host and plugins.
//!
//! A *source* writes whole metric families into an [`Exposition`] when metrics are scraped: the
//! host registers its own (connections, requests, upstream health, node info) and a plugin its
//! counters (for example short-url's created / resolved / expired), each with [`set_source`].
//! The exporter (the `prometheus` plugin) renders its request metrics and then every source.
//! Sources read counters kept by their owners (atomics); nothing here is on the request path.

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Adds `delta` to a counter that only the calling thread writes (per-worker counters read by
/// a scrape): a load and a store, no locked instruction.
#[inline]
pub fn bump(counter: &AtomicU64, delta: i64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add_signed(delta), Ordering::Relaxed);
}

/// A scrape being written: Prometheus text format 0.0.4, every family name prefixed.
pub struct Exposition {
    out: String,
    prefix: String,
}

impl Exposition {
    /// An empty exposition whose family names start with `prefix` (e.g. `weir_`).
    pub fn new(prefix: &str) -> Self {
        Exposition { out: String::with_capacity(16 << 10), prefix: prefix.to_owned() }
    }

    /// The prefix family names get.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines (`kind`: counter, gauge, histogram).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {}{name} {help}", self.prefix);
        let _ = writeln!(self.out, "# TYPE {}{name} {kind}", self.prefix);
    }

    /// One sample of the current family: `name` is the family name, plus `_bucket`, `_sum` or
    /// `_count` for histograms. Label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        let rendered = render_labels(labels);
        self.sample_rendered(name, &rendered, None, value);
    }

    /// A sample whose labels were rendered once with [`render_labels`] (a histogram's buckets
    /// share them), plus one more label (`le`) when given.
    pub fn sample_rendered(&mut self, name: &str, labels: &str, extra: Option<(&str, &str)>, value: impl Display) {
        self.out.push_str(&self.prefix);
        self.out.push_str(name);
        if !labels.is_empty() || extra.is_some() {
            self.out.push('{');
            self.out.push_str(labels);
            if let Some((k, v)) = extra {
                if !labels.is_empty() {
                    self.out.push(',');
                }
                push_label(&mut self.out, k, v);
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// The text written so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }

    /// The finished text.
    pub fn into_text(self) -> String {
        self.out
    }
}

/// `k="v",k2="v2"`: labels rendered once, for [`Exposition::sample_rendered`].
pub fn render_labels(labels: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(labels.iter().map(|(k, v)| k.len() + v.len() + 4).sum());
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_label(&mut out, k, v);
    }
    out
}

fn push_label(out: &mut String, k: &str, v: &str) {
    out.push_str(k);
    out.push_str("=\"");
    escape_into(out, v);
    out.push('"');
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape_into(out: &mut String, v: &str) {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Something that writes metric families when metrics are scraped.
pub type Source = Arc<dyn Fn(&mut Exposition) + Send + Sync>;

static SOURCES: Mutex<Vec<(&'static str, Source)>> = Mutex::new(Vec::new());

/// Registers (or replaces) the source called `name`. Idempotent: call it from `Plugin::init`.
pub fn set_source(name: &'static str, source: impl Fn(&mut Exposition) + Send + Sync + 'static) {
    let mut sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    let source: Source = Arc::new(source);
    match sources.iter_mut().find(|(n, _)| *n == name) {
        Some(slot) => slot.1 = source,
        None => sources.push((name, source)),
    }
    sources.sort_by_key(|(n, _)| *n);
}

/// Writes every registered source, in name order (the registry is not locked while they run).
pub fn render_sources(out: &mut Exposition) {
    let sources: Vec<Source> =
        SOURCES.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, s)| s.clone()).collect();
    for source in sources {
        source(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_prefixed_and_label_values_escaped() {
        let mut e = Exposition::new("weir_");
        e.family("x_total", "counter", "Things.");
        e.sample("x_total", &[("a", "q\"b\\c\nd"), ("b", "")], 3);
        e.sample("x_total", &[], 1.5);
        assert_eq!(
            e.into_text(),
            "# HELP weir_x_total Things.\n# TYPE weir_x_total counter\nweir_x_total{a=\"q\\\"b\\\\c\\nd\",b=\"\"} 3\nweir_x_total 1.5\n"
        );
    }

    #[test]
    fn a_source_set_twice_is_replaced() {
        set_source("zz-test", |e| e.sample("one", &[], 1));
        set_source("zz-test", |e| e.sample("two", &[], 2));
        let mut e = Exposition::new("");
        render_sources(&mut e);
        assert!(e.as_str().contains("two 2") && !e.as_str().contains("one 1"), "{}", e.as_str());
    }
}
