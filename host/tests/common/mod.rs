//! Helpers shared by the engine's integration suites (and, through a path, by the service's
//! in tests/common): an engine on a store with a configuration and a policy, and a request.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::runtime::Runtime;
use tollgate::store::{SqliteStore, Store};
use tollgate::Engine;

/// A policy component by name: a built-in one, or a test fixture this build made
/// (`policies/fixtures/`).
pub fn policy_bytes(name: &str) -> Vec<u8> {
    tollgate::scenario::resolve_policy(name, None, &tollgate::scenario::default_fixtures())
        .unwrap_or_else(|e| panic!("policy {name}: {e}"))
}

/// An engine on `store` with a configuration given as JSON and a built-in policy.
pub fn engine_on<S: Store>(config: Value, store: S, policy: &str) -> Engine<S> {
    let runtime = Runtime::new().expect("wasmtime starts");
    let config = Config::from_json(&config).expect("valid configuration");
    let policy = runtime
        .load(
            &policy_bytes(policy),
            tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
        )
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
