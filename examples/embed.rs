//! tollgate embedded in a program of your own: open a store, load a policy, admit a call,
//! report how it ended, queue durable work and dispatch it, and swap the policy.
//!
//! `cargo run --release --example embed` (CI builds it with the tests).

use std::sync::Arc;
use tollgate::config::ConfigFile;
use tollgate::engine::Completion;
use tollgate::model::{CallResult, Usage};
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::SqliteStore;
use tollgate::Engine;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The same configuration file `tollgate serve` reads; `auth` is for the service only.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/tollgate.json");
    let config = ConfigFile::load(std::path::Path::new(path))?.engine;

    // One store (a file for durability; in memory here), one runtime, one policy.
    let store = SqliteStore::in_memory()?;
    let runtime = Runtime::new()?;
    let policy = runtime.load(builtin::get("standard").unwrap(), config.policy_limits())?;
    let engine = Engine::new(config, store, runtime, Arc::new(policy));

    // Time is an argument: your clock, in milliseconds (the deadline uses the same clock).
    let now = 1_000;
    let request = serde_json::json!({
        "tenant": "acme", "key": "req-1", "route": "interactive",
        "input_tokens": 300, "max_output_tokens": 500, "deadline_ms": now + 60_000
    });
    let decision = engine.admit(&request, now)?;
    println!("admit req-1: {}", serde_json::to_string(&decision)?);
    // Only a fresh acceptance authorises the provider call.
    if decision.authorises_call() {
        let report = Completion {
            result: CallResult::Succeeded,
            usage: Some(Usage::new(300, 120)),
            ..Completion::succeeded("acme", "req-1")
        };
        let answer = engine.complete(&report, now + 900)?;
        println!("complete req-1: {}", serde_json::to_string(&answer)?);
    }
    // The same key again is a duplicate, answered from the operation's state.
    let again = engine.admit(&request, now + 1_000)?;
    println!("admit req-1 again: {}", serde_json::to_string(&again)?);

    // Durable work waits in its tenant's queue until a worker claims it.
    let batch = serde_json::json!({
        "tenant": "globex", "key": "batch-7", "route": "durable", "input_tokens": 1000,
        "max_output_tokens": 2000, "deadline_ms": now + 3_600_000, "body_ref": "s3://b/7"
    });
    println!(
        "admit batch-7: {}",
        serde_json::to_string(&engine.admit(&batch, now)?)?
    );
    let claims = engine.dispatch("worker-1", 4, now + 10)?;
    println!("dispatch: {}", serde_json::to_string(&claims)?);

    // Swap the policy (checked first; a refused module changes nothing), then roll back.
    let identity = engine.swap_policy(builtin::get("deny-all").unwrap())?;
    println!("active: {} {}", identity.name, identity.sha256);
    let refused = engine.admit(
        &serde_json::json!({
            "tenant": "acme", "key": "req-2", "route": "interactive",
            "input_tokens": 10, "max_output_tokens": 10, "deadline_ms": now + 60_000
        }),
        now + 2_000,
    )?;
    println!(
        "admit req-2 under deny-all: {}",
        serde_json::to_string(&refused)?
    );
    println!("rolled back to: {}", engine.rollback()?.name);
    Ok(())
}
