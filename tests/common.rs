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
