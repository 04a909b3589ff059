//! `udp-logger`: request log entries sent in batches as UDP datagrams (APISIX's udp-logger).
//! Entries are built by `weir_plugin::log_entry` and batched by `weir_plugin::batch`; the
//! request's log phase only enqueues. A batch is one JSON array (one object when
//! `batch_max_size` is 1), as in APISIX; a batch larger than a datagram can carry (65,507
//! bytes) is split into several arrays, each a whole JSON text.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::batch::{self, BatchConf, Encode, SendFuture, Sink, SinkPlugin, MAX_DATAGRAM};
use weir_plugin::{register_plugin, BuildContext};

fn three() -> u64 {
    3
}

/// The plugin's own fields (APISIX's names and defaults); with `log_format`, the body fields and
/// the batch processor's, they make its configuration (`weir_plugin::batch::SinkConf`).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Conf {
    /// The log server's address or name.
    #[schemars(length(min = 1))]
    pub host: String,
    /// Its UDP port.
    pub port: u16,
    /// Seconds sending a batch may take.
    #[serde(default = "three")]
    #[schemars(range(min = 1))]
    pub timeout: u64,
}

/// The JSON arrays of `entries`, each at most `max` bytes (an entry alone larger than that is an
/// error); one object, not an array, when batches hold one entry.
pub fn datagrams(entries: &[String], batch_max_size: usize, max: usize) -> Result<Vec<String>, String> {
    if let Some(big) = entries.iter().find(|e| e.len() + 2 > max) {
        return Err(format!("an entry of {} bytes does not fit in a datagram", big.len()));
    }
    if batch_max_size == 1 {
        return Ok(entries.to_vec());
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 2;
    for (i, e) in entries.iter().enumerate() {
        if size + e.len() + 1 > max && i > start {
            out.push(batch::json_array(&entries[start..i], 0));
            start = i;
            size = 2;
        }
        size += e.len() + 1;
    }
    out.push(batch::json_array(&entries[start..], 0));
    Ok(out)
}

/// Datagrams of whole JSON arrays.
pub struct UdpSink {
    host: String,
    port: u16,
    timeout: Duration,
    batch_max_size: usize,
}

impl Sink for UdpSink {
    fn send<'a>(&'a self, entries: &'a [String]) -> SendFuture<'a> {
        Box::pin(async move {
            let grams = datagrams(entries, self.batch_max_size, MAX_DATAGRAM)?;
            batch::udp_send(&self.host, self.port, self.timeout, grams.iter().map(String::as_bytes)).await
        })
    }
}

/// Entries as their JSON.
pub struct Entry;
impl Encode for Entry {}

/// The plugin.
pub struct UdpLogger;

impl SinkPlugin for UdpLogger {
    type Own = Conf;
    type Sink = UdpSink;
    type Encode = Entry;
    const NAME: &'static str = "udp-logger";
    const PRIORITY: i32 = 400;
    fn sink(&self, conf: Conf, batch: &BatchConf, _ctx: &BuildContext<'_>) -> Result<(UdpSink, Entry), String> {
        let sink = UdpSink {
            host: conf.host,
            port: conf.port,
            timeout: Duration::from_secs(conf.timeout),
            batch_max_size: batch.batch_max_size as usize,
        };
        Ok((sink, Entry))
    }
}

register_plugin!(UdpLogger);

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn batches_split_into_whole_json_arrays_that_fit() {
        let entries: Vec<String> = (0..10).map(|i| format!("{{\"n\":{i}}}")).collect();
        let grams = datagrams(&entries, 10, 30).expect("fits");
        assert!(grams.len() > 1 && grams.iter().all(|g| g.len() <= 30), "{grams:?}");
        let back: Vec<Value> =
            grams.iter().flat_map(|g| serde_json::from_str::<Vec<Value>>(g).expect("a JSON array")).collect();
        assert_eq!(back.len(), 10);
        assert_eq!(datagrams(&entries[..1], 1, 30).expect("fits"), vec!["{\"n\":0}".to_string()]);
        assert!(datagrams(&["x".repeat(40)], 10, 30).is_err());
    }
}
