//! `limit-conn`: bounds what is in progress at once per key, with a burst that is delayed
//! rather than refused. One name for two plugins, as APISIX has it: on HTTP routes it counts
//! requests in progress (`http`); on stream routes it counts connections (`stream`).

mod conf;
mod http;
mod shared;
mod stream;

pub use conf::{Conf, Rule};
pub use http::LimitConnHttp;
pub use stream::LimitConn;

weir_plugin::register_plugin!(LimitConnHttp::default());
weir_plugin::register_stream_plugin!(LimitConn::default());

#[cfg(test)]
mod tests;
