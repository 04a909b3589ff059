//! A WebSocket echo upstream and the tokio runtime the WebSocket tests drive it with.
#![allow(dead_code)]

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};

/// A two-thread tokio runtime for the tests' async clients and servers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A WebSocket echo server (text and binary frames) on `rt`; returns its address.
pub fn ws_echo(rt: &tokio::runtime::Runtime) -> SocketAddr {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else { return };
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}
