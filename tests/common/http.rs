//! What the HTTP tests share: the keys of the usual configuration, that configuration,
//! requests, and raw exchanges for what a client library would not send.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub use super::server::{now_ms, Server};

pub const CALLER: &str = "acme-key";
pub const OTHER_CALLER: &str = "globex-key";
pub const WORKER: &str = "worker-key";
pub const ADMIN: &str = "admin-key";

pub fn config() -> Value {
    json!({
        "auth": {"callers": {CALLER: "acme", OTHER_CALLER: "globex"}, "workers": [WORKER], "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 2},
        "tenant_defaults": {"requests": {"capacity": 100, "refill_per_s": 0},
                            "tokens": {"capacity": 10000, "refill_per_s": 1}, "queue_limit": 2},
        "tenants": {"acme": {}, "globex": {"requests": {"capacity": 1, "refill_per_s": 0.5}}},
        "limits": {"max_request_bytes": 2048},
        "policy_params": {"busy_retry_after_ms": 1500}
    })
}

pub fn request(key: &str, route: &str, tokens: u64) -> Value {
    json!({"key": key, "route": route, "input_tokens": tokens, "max_output_tokens": tokens,
           "deadline_ms": now_ms() + 600_000})
}

/// Sends `request` in one write on a connection of its own and reads one answer: its
/// status and JSON body.
pub fn raw_exchange(base: &str, request: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    read_answer(&mut stream)
}

/// Reads one HTTP answer from `stream`: its status and JSON body.
pub fn read_answer(stream: &mut TcpStream) -> (u16, Value) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(0usize);
            if body.len() >= length {
                let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                return (status, serde_json::from_str(body).unwrap_or(Value::Null));
            }
        }
        match stream.read(&mut chunk) {
            Ok(n @ 1..) => answer.extend_from_slice(&chunk[..n]),
            other => panic!("the answer ended early ({other:?}): {text}"),
        }
    }
}

/// Opens `n` connections to `addr` that never send a request.
pub fn idle_connections(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}
