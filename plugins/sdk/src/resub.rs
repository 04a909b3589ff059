//! Replacement templates of regex substitutions as APISIX configurations write them (the second
//! half of `regex_uri` in redirect and proxy-rewrite, `replace` in response-rewrite's `filters`):
//! OpenResty's `ngx.re.sub` syntax, parsed once at load and applied per match without parsing.
//!
//! - `$0` is the whole match, `$1`...`$N` the capture groups (every digit after `$` is part of
//!   the number, as nginx reads it); `${N}` separates a number from digits that follow it
//!   (`${1}0`); `$$` is a literal `$`.
//! - Anything else after a `$` (`$host`, a lone `$` at the end) is refused, as nginx refuses it,
//!   and so is a group the regex does not have ([`Replacement::check_groups`]).
//!
//! Unlike the `regex` crate's own syntax, `$1a` means group 1 then `a` (the `regex` crate reads a
//! group named `1a` and writes nothing): configurations written for APISIX keep their meaning.
//!
//! ```
//! use weir_plugin::resub::Replacement;
//! let re = regex::Regex::new("^/iresty/(.*)/(.*)/(.*)").expect("valid");
//! let rep = Replacement::parse("/$1-$2-${3}x$$").expect("valid");
//! rep.check_groups(re.captures_len()).expect("groups exist");
//! assert_eq!(re.replace("/iresty/a/b/c", &rep), "/a-b-cx$");
//! assert!(Replacement::parse("/$host").is_err());
//! assert!(Replacement::parse("/$4").expect("parses").check_groups(re.captures_len()).is_err());
//! ```

/// A part of a replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(Box<str>),
    Group(usize),
}

/// A parsed replacement template (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pieces: Vec<Piece>,
}

impl Replacement {
    /// Parses `text`; a `$` that names no group is an error that says where.
    pub fn parse(text: &str) -> Result<Replacement, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            lit.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (group, tail) = if let Some(tail) = after.strip_prefix('$') {
                lit.push('$');
                rest = tail;
                continue;
            } else if let Some(braced) = after.strip_prefix('{') {
                let end = braced.find('}').ok_or_else(|| format!("unclosed `${{` in `{text}`"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            if group.is_empty() || !group.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "`$` must be followed by a group number (`$1`, `${{1}}`) or another `$`, near `{}`",
                    &rest[at..]
                ));
            }
            let n = group.parse::<usize>().map_err(|_| format!("group number `{group}` is too large"))?;
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit).into()));
            }
            pieces.push(Piece::Group(n));
            rest = tail;
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit.into()));
        }
        Ok(Replacement { pieces })
    }

    /// Refuses a reference to a group a regex with `captures_len` groups (the whole match
    /// included, as `Regex::captures_len` counts) does not have.
    pub fn check_groups(&self, captures_len: usize) -> Result<(), String> {
        match self.pieces.iter().find_map(|p| match p {
            Piece::Group(n) if *n >= captures_len => Some(*n),
            _ => None,
        }) {
            Some(n) => Err(format!("`${n}` names a group the regex does not have (it has {})", captures_len - 1)),
            None => Ok(()),
        }
    }

    /// Appends the replacement of one match to `dst` (a group that did not take part in the
    /// match writes nothing).
    pub fn expand(&self, caps: &regex::Captures<'_>, dst: &mut String) {
        for p in &self.pieces {
            match p {
                Piece::Text(t) => dst.push_str(t),
                Piece::Group(n) => dst.push_str(caps.get(*n).map_or("", |m| m.as_str())),
            }
        }
    }

    /// [`Replacement::expand`] for a match on bytes.
    pub fn expand_bytes(&self, caps: &regex::bytes::Captures<'_>, dst: &mut Vec<u8>) {
        for p in &self.pieces {
            match p {
                Piece::Text(t) => dst.extend_from_slice(t.as_bytes()),
                Piece::Group(n) => dst.extend_from_slice(caps.get(*n).map_or(&b""[..], |m| m.as_bytes())),
            }
        }
    }
}

impl regex::Replacer for &Replacement {
    fn replace_append(&mut self, caps: &regex::Captures<'_>, dst: &mut String) {
        self.expand(caps, dst);
    }
}

impl regex::bytes::Replacer for &Replacement {
    fn replace_append(&mut self, caps: &regex::bytes::Captures<'_>, dst: &mut Vec<u8>) {
        self.expand_bytes(caps, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(re: &str, rep: &str, input: &str) -> String {
        let re = regex::Regex::new(re).unwrap_or_else(|e| panic!("{e}"));
        let rep = Replacement::parse(rep).unwrap_or_else(|e| panic!("{e}"));
        rep.check_groups(re.captures_len()).unwrap_or_else(|e| panic!("{e}"));
        re.replace(input, &rep).into_owned()
    }

    #[test]
    fn nginx_template_syntax() {
        assert_eq!(sub("^/a/(.*)", "/b/$1", "/a/x/y"), "/b/x/y");
        assert_eq!(sub("^/(a)(b)", "$1x$2$0", "/ab"), "axb/ab", "`$1x` is group 1 then `x`");
        assert_eq!(sub("^/(a)", "${1}0", "/a"), "a0");
        assert_eq!(sub("^/(a)(z)?", "[$2]", "/a"), "[]", "a group that did not match writes nothing");
        assert_eq!(sub("x", "$$1", "x"), "$1");
    }

    #[test]
    fn what_nginx_refuses_is_refused() {
        for bad in ["$host", "a$", "${1", "${x}", "$-1", "${}"] {
            assert!(Replacement::parse(bad).is_err(), "{bad}");
        }
        let two = Replacement::parse("$2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(two.check_groups(2).err().as_deref(), Some("`$2` names a group the regex does not have (it has 1)"));
        assert!(two.check_groups(3).is_ok());
        assert!(Replacement::parse("$99999999999999999999999").is_err());
    }

    #[test]
    fn bytes_are_substituted_too() {
        let re = regex::bytes::Regex::new("(?-u)b(.)").unwrap_or_else(|e| panic!("{e}"));
        let rep = Replacement::parse("<$1>").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(re.replace_all(b"ab\xffcbz", &rep).as_ref(), b"a<\xff>c<z>");
    }
}
