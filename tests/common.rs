//! Helpers shared by the integration tests.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::{SqliteStore, Store};
use tollgate::Engine;

/// An engine on `store` with a configuration given as JSON and a built-in policy.
pub fn engine_on<S: Store>(config: Value, store: S, policy: &str) -> Engine<S> {
    let runtime = Runtime::new().expect("wasmtime starts");
    let config = Config::from_json(&config).expect("valid configuration");
    let policy = runtime
        .load(builtin::get(policy).expect("built-in policy"), u64::MAX)
        .expect("policy loads");
    Engine::new(config, store, runtime, Arc::new(policy))
}

/// An engine on a private in-memory store.
pub fn engine(config: Value, policy: &str) -> Engine<SqliteStore> {
    engine_on(config, SqliteStore::in_memory().unwrap(), policy)
}

/// A request object with the usual fields.
pub fn request(tenant: &str, key: &str, route: &str, tokens: u64, deadline_ms: i64) -> Value {
    json!({"tenant": tenant, "key": key, "route": route, "input_tokens": tokens,
           "max_output_tokens": tokens, "deadline_ms": deadline_ms})
}

/// Starts `tollgate serve` with `args` on a free loopback port and waits until it answers
/// `/healthz`; returns the process and its base URL.
pub fn spawn_serve(args: &[&str]) -> (std::process::Child, String) {
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while ureq::get(&format!("{base}/healthz")).call().is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "tollgate serve {args:?} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, base)
}
