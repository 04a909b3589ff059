//! `filters`: regex substitutions on the response body, as OpenResty's `ngx.re.sub` (`once`)
//! and `ngx.re.gsub` (`global`) make them, compiled at load.
//!
//! A regex needs the whole body (a match may span chunks), so the body is held, up to
//! `max_resp_body_size`, and substituted at its end. A body that grows past the bound is not
//! cut: what was held and the rest are passed on unchanged (and a warning logged), so the
//! client always gets a whole body, substituted or not.

use std::borrow::Cow;

use regex::bytes::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::resub::Replacement;
use weir_plugin::{Bytes, RequestCtx};

/// `once` or `global`.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The first match.
    #[default]
    Once,
    /// Every match.
    Global,
}

/// One filter as configured.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterConf {
    /// The regex searched in the body.
    #[schemars(length(min = 1))]
    pub regex: String,
    /// The first match only, or every match.
    #[serde(default)]
    pub scope: Scope,
    /// The replacement (`$0`, `$1`, `${1}`, `$$`).
    pub replace: String,
    /// OpenResty regex options: `i` (case-insensitive), `m` (multi-line), `s` (`.` matches a
    /// newline), `x` (extended); `j`, `o`, `u`, `U`, `d`, `D`, `J` are accepted and change
    /// nothing here.
    #[serde(default = "default_options")]
    pub options: String,
}

fn default_options() -> String {
    "jo".into()
}

/// A compiled filter.
pub struct Filter {
    regex: Regex,
    replace: Replacement,
    scope: Scope,
}

impl Filter {
    /// Compiles filter `i`; a regex or option that cannot work is refused with its place.
    pub fn compile(i: usize, conf: &FilterConf) -> Result<Filter, String> {
        let at = format!("filters[{i}]");
        let mut b = RegexBuilder::new(&conf.regex);
        for o in conf.options.chars() {
            match o {
                'i' => b.case_insensitive(true),
                'm' => b.multi_line(true),
                's' => b.dot_matches_new_line(true),
                'x' => b.ignore_whitespace(true),
                'j' | 'o' | 'u' | 'U' | 'd' | 'D' | 'J' => &mut b,
                other => return Err(format!("{at}.options: `{other}` is not a supported regex option (i, m, s, x)")),
            };
        }
        let regex = b.build().map_err(|e| format!("{at}.regex: invalid regex: {e}"))?;
        let replace = Replacement::parse(&conf.replace).map_err(|e| format!("{at}.replace: {e}"))?;
        replace.check_groups(regex.captures_len()).map_err(|e| format!("{at}.replace: {e}"))?;
        Ok(Filter { regex, replace, scope: conf.scope })
    }
}

/// Runs every filter over `body`, in order.
pub fn apply(filters: &[Filter], mut body: Vec<u8>) -> Vec<u8> {
    for f in filters {
        let out = match f.scope {
            Scope::Once => f.regex.replacen(&body, 1, &f.replace),
            Scope::Global => f.regex.replace_all(&body, &f.replace),
        };
        if let Cow::Owned(o) = out {
            body = o;
        }
    }
    body
}

/// A response body on its way through the filters (the plugin's slot).
enum Held {
    /// Held so far.
    Body(Vec<u8>),
    /// Grew past the bound: passed on as it comes.
    Passing,
}

/// The body filter: holds chunks until the end of the body, then substitutes.
pub fn body_filter(filters: &[Filter], max: u64, ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
    let held = ctx.slots.get_mut::<Held>();
    if held.is_none() && eof {
        // The whole body in one chunk (answers of plugins, small bodies): no copy held.
        if chunk.len() as u64 <= max {
            *chunk = Bytes::from(apply(filters, chunk.to_vec()));
        } else {
            log::warn!("response-rewrite: a body over max_resp_body_size ({max} bytes) is passed on unfiltered");
        }
        return;
    }
    let state = match held {
        Some(s) => s,
        None => {
            ctx.slots.insert(Held::Body(Vec::new()));
            match ctx.slots.get_mut::<Held>() {
                Some(s) => s,
                None => return,
            }
        }
    };
    let Held::Body(buf) = state else { return };
    if (buf.len() + chunk.len()) as u64 > max {
        log::warn!("response-rewrite: a body over max_resp_body_size ({max} bytes) is passed on unfiltered");
        let mut out = std::mem::take(buf);
        out.extend_from_slice(chunk);
        *chunk = Bytes::from(out);
        *state = Held::Passing;
        return;
    }
    buf.extend_from_slice(chunk);
    *chunk = if eof { Bytes::from(apply(filters, std::mem::take(buf))) } else { Bytes::new() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::TestRequest;

    fn filters(v: serde_json::Value) -> Result<Vec<Filter>, String> {
        let confs: Vec<FilterConf> = serde_json::from_value(v).map_err(|e| e.to_string())?;
        confs.iter().enumerate().map(|(i, c)| Filter::compile(i, c)).collect()
    }

    fn stream(fs: &[Filter], max: u64, chunks: &[&[u8]]) -> Vec<u8> {
        let mut ctx = TestRequest::get("/").build();
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let mut chunk = Bytes::copy_from_slice(c);
            body_filter(fs, max, &mut ctx, &mut chunk, i + 1 == chunks.len());
            out.extend_from_slice(&chunk);
        }
        out
    }

    #[test]
    fn once_global_and_options() {
        let fs = filters(json!([
            {"regex": "X-Amzn-Trace-Id", "scope": "global", "replace": "X-Amzn-Trace-Id-Replace"},
            {"regex": "(hello) (world)", "replace": "$2 $1"},
            {"regex": "ABC", "replace": "x", "options": "i"}
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        let out = apply(&fs, b"X-Amzn-Trace-Id X-Amzn-Trace-Id hello world hello world abc abc".to_vec());
        assert_eq!(out, b"X-Amzn-Trace-Id-Replace X-Amzn-Trace-Id-Replace world hello hello world x abc");
    }

    #[test]
    fn matches_across_chunks_and_the_bound() {
        let fs = filters(json!([{"regex": "needle", "scope": "global", "replace": "pin"}]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stream(&fs, 1 << 20, &[b"a nee", b"dle and a ne", b"edle"]), b"a pin and a pin");
        // Past the bound: everything arrives, unchanged.
        assert_eq!(stream(&fs, 10, &[b"needle ", b"needle ", b"needle"]), b"needle needle needle");
        assert_eq!(stream(&fs, 3, &[b"needle"]), b"needle", "one chunk over the bound");
        assert_eq!(stream(&fs, 1 << 20, &[b"\xff\xfeneedle\x00"]), b"\xff\xfepin\x00", "bodies need not be UTF-8");
    }

    #[test]
    fn what_cannot_work_is_refused() {
        let e = |v| filters(v).err().unwrap_or_default();
        assert!(e(json!([{"regex": "(", "replace": ""}])).starts_with("filters[0].regex: invalid regex"));
        assert!(e(json!([{"regex": "a", "replace": "$1"}])).starts_with("filters[0].replace: `$1` names a group"));
        assert!(e(json!([{"regex": "a", "replace": "$x"}])).starts_with("filters[0].replace:"));
        assert!(e(json!([{"regex": "a", "replace": "", "options": "a"}])).starts_with("filters[0].options: `a`"));
        assert!(e(json!([{"regex": "a", "replace": "", "scope": "all"}])).contains("unknown variant"));
        assert!(e(json!([{"regex": "(?<=a)b", "replace": ""}])).starts_with("filters[0].regex"));
    }
}
