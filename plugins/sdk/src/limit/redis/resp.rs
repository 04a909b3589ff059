//! The bytes of RESP2, Redis's protocol, for the limiters' own connection (`super::lean`):
//! commands packed straight into a connection's write buffer, and replies parsed incrementally
//! (sans-IO) from its read buffer. Also the limiters' script calls ([`Script`], [`ScriptCall`]),
//! whose keys and arguments are collected in one buffer so that either client (this one, or
//! `redis` for Cluster and TLS) can send them.
//!
//! A reply is bounded: at most [`MAX_DEPTH`] nested arrays, [`MAX_ITEMS`] elements and
//! [`MAX_BULK`] bytes per string. A reply beyond those, or bytes that are not RESP2, end the
//! connection: a limiter's scripts never answer more.

use std::io;

use redis::{RedisWrite, ToRedisArgs, Value};

/// Deepest nesting of arrays accepted in a reply.
pub const MAX_DEPTH: usize = 4;
/// Most elements of one array in a reply.
pub const MAX_ITEMS: usize = 1024;
/// Longest string in a reply.
pub const MAX_BULK: usize = 1 << 20;

/// One reply: a value, or the server's error message (`-ERR ...`).
pub type Reply = Result<Value, String>;

/// Bytes that are not a reply the limiters accept (the connection is closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Parses the first reply in `buf`: `Ok(None)` when it is not complete yet, else the reply and
/// how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, Malformed> {
    let mut at = 0;
    match value(buf, &mut at, 0)? {
        None => Ok(None),
        Some(reply) => Ok(Some((reply, at))),
    }
}

/// The line at `*at` (without its CRLF), moving `*at` past it.
fn line<'b>(buf: &'b [u8], at: &mut usize) -> Result<Option<&'b [u8]>, Malformed> {
    let rest = &buf[*at..];
    let Some(end) = rest.iter().position(|&b| b == b'\n') else {
        // A line is never longer than an error message or a number.
        return if rest.len() > 4096 { Err(Malformed("line too long")) } else { Ok(None) };
    };
    if end == 0 || rest[end - 1] != b'\r' {
        return Err(Malformed("line not ended by CRLF"));
    }
    *at += end + 1;
    Ok(Some(&rest[..end - 1]))
}

fn int(digits: &[u8]) -> Result<i64, Malformed> {
    let (neg, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(Malformed("bad integer"));
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(Malformed("bad integer"));
        }
        n = n.checked_mul(10).and_then(|n| n.checked_add(i64::from(d - b'0'))).ok_or(Malformed("integer overflow"))?;
    }
    Ok(if neg { -n } else { n })
}

fn value(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Reply>, Malformed> {
    let Some(&kind) = buf.get(*at) else { return Ok(None) };
    *at += 1;
    let Some(head) = line(buf, at)? else { return Ok(None) };
    Ok(Some(match kind {
        b'+' => Ok(if head == b"OK" { Value::Okay } else { Value::SimpleString(text(head)) }),
        b'-' => Err(text(head)),
        b':' => Ok(Value::Int(int(head)?)),
        b'$' => {
            let len = int(head)?;
            if len == -1 {
                return Ok(Some(Ok(Value::Nil)));
            }
            let len = usize::try_from(len).map_err(|_| Malformed("bad length"))?;
            if len > MAX_BULK {
                return Err(Malformed("string too long"));
            }
            if buf.len() < *at + len + 2 {
                return Ok(None);
            }
            if &buf[*at + len..*at + len + 2] != b"\r\n" {
                return Err(Malformed("string not ended by CRLF"));
            }
            let s = buf[*at..*at + len].to_vec();
            *at += len + 2;
            Ok(Value::BulkString(s))
        }
        b'*' => {
            let n = int(head)?;
            if n == -1 {
                return Ok(Some(Ok(Value::Nil)));
            }
            let n = usize::try_from(n).map_err(|_| Malformed("bad length"))?;
            if n > MAX_ITEMS {
                return Err(Malformed("array too long"));
            }
            if depth >= MAX_DEPTH {
                return Err(Malformed("arrays nested too deep"));
            }
            let mut items = Vec::with_capacity(n);
            let mut failed = None;
            for _ in 0..n {
                match value(buf, at, depth + 1)? {
                    None => return Ok(None),
                    Some(Ok(v)) => items.push(v),
                    // An error inside an array (a script's `redis.error_reply` in a table): the
                    // whole reply is that error.
                    Some(Err(e)) => failed = failed.or(Some(e)),
                }
            }
            match failed {
                Some(e) => Err(e),
                None => Ok(Value::Array(items)),
            }
        }
        _ => return Err(Malformed("unknown reply type")),
    }))
}

/// The fuzz target `resp_reply`: [`parse`] never panics; a reply it takes is a prefix of its
/// input that parses the same alone, and every shorter prefix of it is incomplete, not wrong.
pub fn fuzz_reply(data: &[u8]) {
    if let Ok(Some((reply, used))) = parse(data) {
        assert!(used > 0 && used <= data.len());
        assert_eq!(parse(&data[..used]), Ok(Some((reply, used))));
        if used <= 512 {
            for cut in 0..used {
                assert_eq!(parse(&data[..cut]), Ok(None), "prefix of {cut} bytes");
            }
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Appends `*<n>\r\n`.
fn array_head(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk string.
pub fn bulk(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(arg.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Appends a command of `args`.
pub fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    array_head(out, args.len());
    for a in args {
        bulk(out, a);
    }
}

/// A Lua script the limiters run on the server: sent by its SHA1 (`EVALSHA`), and in full
/// (`EVAL`) the first time a server does not know it.
pub struct Script {
    code: Box<str>,
    sha: Box<str>,
    inner: redis::Script,
}

impl Script {
    /// The script `code`.
    pub fn new(code: &str) -> Script {
        let inner = redis::Script::new(code);
        Script { code: code.into(), sha: inner.get_hash().into(), inner }
    }

    /// A call of the script with `key` as `KEYS[1]`.
    pub fn key<T: ToRedisArgs>(&self, key: T) -> ScriptCall<'_> {
        let mut call = ScriptCall { script: self, data: Vec::with_capacity(128), ends: Vec::with_capacity(8), keys: 0 };
        call.key(key);
        call
    }

    /// The script's code.
    pub(super) fn code(&self) -> &str {
        &self.code
    }

    /// The script as the `redis` crate has it.
    pub(super) fn redis(&self) -> &redis::Script {
        &self.inner
    }
}

/// A prepared call of a [`Script`]: its keys, then its arguments.
pub struct ScriptCall<'s> {
    script: &'s Script,
    /// Every key and argument, one after the other.
    data: Vec<u8>,
    /// Where each key and argument ends in `data`.
    ends: Vec<u32>,
    /// How many of them, from the first, are keys.
    keys: usize,
}

impl ScriptCall<'_> {
    /// Adds a key (`KEYS[n]`); keys come before every argument.
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        debug_assert_eq!(self.keys, self.ends.len(), "a script call's keys come before its arguments");
        key.write_redis_args(self);
        self.keys = self.ends.len();
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(self);
        self
    }

    /// The script called.
    pub(super) fn script(&self) -> &Script {
        self.script
    }

    /// Each key and argument, in order.
    pub(super) fn parts(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let part = &self.data[start..end as usize];
            start = end as usize;
            part
        })
    }

    /// How many keys.
    pub(super) fn key_count(&self) -> usize {
        self.keys
    }

    /// Appends the call as `EVALSHA` (or, `in_full`, as `EVAL` with the script's code).
    pub(super) fn encode(&self, out: &mut Vec<u8>, in_full: bool) {
        array_head(out, 3 + self.ends.len());
        if in_full {
            bulk(out, b"EVAL");
            bulk(out, self.script.code.as_bytes());
        } else {
            bulk(out, b"EVALSHA");
            bulk(out, self.script.sha.as_bytes());
        }
        bulk(out, itoa::Buffer::new().format(self.keys).as_bytes());
        for part in self.parts() {
            bulk(out, part);
        }
    }

    fn end_part(&mut self) {
        self.ends.push(self.data.len() as u32);
    }
}

impl RedisWrite for ScriptCall<'_> {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.extend_from_slice(arg);
        self.end_part();
    }

    fn writer_for_next_arg(&mut self) -> impl io::Write + '_ {
        PartWriter(self)
    }
}

/// Writes one part of a [`ScriptCall`]; the part ends when the writer is dropped.
struct PartWriter<'c, 's>(&'c mut ScriptCall<'s>);

impl io::Write for PartWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for PartWriter<'_, '_> {
    fn drop(&mut self) {
        self.0.end_part();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(bytes: &[u8]) -> Reply {
        let (reply, used) = parse(bytes).expect("well-formed").expect("complete");
        assert_eq!(used, bytes.len());
        reply
    }

    #[test]
    fn replies_of_every_kind() {
        assert_eq!(one(b"+OK\r\n"), Ok(Value::Okay));
        assert_eq!(one(b"+PONG\r\n"), Ok(Value::SimpleString("PONG".into())));
        assert_eq!(one(b"-NOSCRIPT No matching script\r\n"), Err("NOSCRIPT No matching script".into()));
        assert_eq!(one(b":-42\r\n"), Ok(Value::Int(-42)));
        assert_eq!(one(b"$3\r\na\r\n\r\n"), Ok(Value::BulkString(b"a\r\n".to_vec())));
        assert_eq!(one(b"$-1\r\n"), Ok(Value::Nil));
        assert_eq!(
            one(b"*2\r\n:7\r\n*1\r\n$1\r\nx\r\n"),
            Ok(Value::Array(vec![Value::Int(7), Value::Array(vec![Value::BulkString(b"x".to_vec())])]))
        );
        assert_eq!(one(b"*2\r\n-ERR one\r\n:1\r\n"), Err("ERR one".into()));
    }

    #[test]
    fn a_reply_split_anywhere_waits_for_the_rest() {
        let whole = b"*3\r\n:1\r\n$5\r\nhello\r\n+OK\r\n";
        for cut in 0..whole.len() {
            assert_eq!(parse(&whole[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = whole.to_vec();
        two.extend_from_slice(b":9\r\n");
        let (_, used) = parse(&two).expect("ok").expect("complete");
        assert_eq!(used, whole.len());
        assert_eq!(parse(&two[used..]), Ok(Some((Ok(Value::Int(9)), 4))));
    }

    #[test]
    fn hostile_bytes_are_refused() {
        for bad in [
            &b"?1\r\n"[..],
            b":1\n",
            b":12a\r\n",
            b":99999999999999999999\r\n",
            b"$-2\r\n",
            b"$2\r\nabXY",
            b"*-5\r\n",
            b"$2000000\r\n",
            b"*100000\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse(&[b'+'; 5000]).is_err());
    }

    #[test]
    fn script_calls_are_packed_as_redis_packs_them() {
        let script = Script::new("return 1");
        let mut call = script.key("k1");
        call.key(String::from("k2")).arg(5u64).arg(-1i64).arg(2.5f64).arg("v");
        let mut ours = Vec::new();
        call.encode(&mut ours, false);
        let expected = redis::cmd("EVALSHA")
            .arg(script.redis().get_hash())
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg(5u64)
            .arg(-1i64)
            .arg(2.5f64)
            .arg("v")
            .get_packed_command();
        assert_eq!(ours, expected);
        assert_eq!(call.key_count(), 2);
        assert_eq!(call.parts().count(), 6);
        let mut full = Vec::new();
        call.encode(&mut full, true);
        assert!(full.starts_with(b"*9\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n2\r\n"));
        let mut cmd = Vec::new();
        command(&mut cmd, &[b"SELECT", b"3"]);
        assert_eq!(cmd, redis::cmd("SELECT").arg(3).get_packed_command());
    }
}
