//! An embedding program on a SQLite file: open the store, load the standard policy, admit a
//! call, report how it ended, and see the same key answered again from its operation.
//! Built without the library's `postgres` feature, so a `postgres://` store is refused with
//! a clear error rather than linked.
//!
//! `cargo run --manifest-path examples/embedder/Cargo.toml -- <file.db>`

use std::sync::Arc;
use tollgate::config::Config;
use tollgate::engine::Completion;
use tollgate::model::{CallResult, Usage};
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::{AnyStore, SqliteStore, StoreError};
use tollgate::Engine;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "embedder.db".to_string());

    // This build has SQLite only: a PostgreSQL URL is refused, and says why.
    match AnyStore::open("postgres://localhost/tollgate") {
        Err(e @ StoreError::Unsupported(_)) => println!("postgres: {e}"),
        Err(e) => return Err(format!("a PostgreSQL URL failed otherwise: {e}").into()),
        Ok(_) => return Err("a PostgreSQL store opened in a SQLite-only build".into()),
    }

    let config = Config::from_json(&serde_json::json!({
        "tenant_defaults": {
            "requests": { "capacity": 100, "refill_per_s": 50 },
            "tokens": { "capacity": 200000, "refill_per_s": 10000 }
        },
        "tenants": { "acme": {} }
    }))?;
    let store = SqliteStore::open(std::path::Path::new(&db))?;
    let runtime = Runtime::new()?;
    let policy = runtime.load(builtin::get("standard").unwrap(), config.policy_limits())?;
    let engine = Engine::new(config, store, runtime, Arc::new(policy));

    let now = 1_000;
    let request = serde_json::json!({
        "tenant": "acme", "key": "req-1", "route": "interactive",
        "input_tokens": 300, "max_output_tokens": 500, "deadline_ms": now + 60_000
    });
    let decision = engine.admit(&request, now)?;
    println!("admit: {}", serde_json::to_string(&decision)?);
    if decision.authorises_call() {
        let report = Completion {
            result: CallResult::Succeeded,
            usage: Some(Usage {
                input_tokens: 300,
                output_tokens: 120,
            }),
            ..Completion::succeeded("acme", "req-1")
        };
        println!(
            "complete: {}",
            serde_json::to_string(&engine.complete(&report, now + 900)?)?
        );
    }
    let again = engine.admit(&request, now + 1_000)?;
    println!("again: {}", serde_json::to_string(&again)?);
    Ok(())
}
