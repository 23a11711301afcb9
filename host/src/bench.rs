//! Benchmarks, run in one process one after the other so that their ratios are comparable on
//! a shared, noisy machine. Figures are printed, never asserted.

use crate::config::Config;
use crate::engine::Engine;
use crate::model::{OpState, Operation, Route};
use crate::runtime::{builtin, Runtime};
use crate::store::{QueuedJob, SqliteStore, Store, StoreError};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Dispatch cost at one queue size.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchFigures {
    pub tenants: u32,
    pub queued_jobs: u64,
    pub fill_s: f64,
    pub claims: u64,
    pub claims_per_s: f64,
}

fn dispatch_config(tenants: u32) -> Config {
    let mut names = serde_json::Map::new();
    for t in 0..tenants {
        names.insert(format!("t{t:05}"), serde_json::json!({}));
    }
    Config::from_json(&serde_json::json!({
        "global": {"requests": {"capacity": 1e12, "refill_per_s": 0}, "concurrency": 100000000u64},
        "tenant_defaults": {"tokens": {"capacity": 1e12, "refill_per_s": 0}, "queue_limit": 1000000},
        "tenants": names,
        "scheduler": {"discipline": "wrr", "max_claims_per_worker": 100}
    }))
    .expect("benchmark configuration is valid")
}

/// Queues `jobs` durable jobs spread evenly over `tenants`, directly through the store
/// (admission is measured elsewhere), in one transaction.
fn fill(store: &mut SqliteStore, tenants: u32, jobs: u64) -> Result<(), StoreError> {
    store.transaction(|tx| {
        for j in 0..jobs {
            let tenant = format!("t{:05}", j % u64::from(tenants));
            let key = format!("job-{j}");
            let op = Operation {
                tenant: tenant.clone(),
                key: key.clone(),
                fingerprint: String::new(),
                route: Route::Durable,
                state: OpState::Queued,
                attempt: 1,
                deadline_ms: i64::MAX,
                input_tokens: 10,
                requested_max_output_tokens: 10,
                requested_optional_context_tokens: 0,
                max_output_tokens: 10,
                optional_context_tokens: 0,
                reserved_tokens: 20,
                estimated_exec_ms: 0,
                degraded: false,
                body_ref: Some(format!("blob/{j}")),
                holds_slot: false,
                holds_tenant_slot: false,
                tokens_reserved: false,
                not_before_ms: None,
                result_ref: None,
                worker: None,
                last_result: None,
                last_retry: None,
                policy_digest: String::new(),
                busy_retry_after_ms: None,
            };
            tx.put_operation(&op)?;
            tx.enqueue(&QueuedJob {
                tenant,
                key,
                tokens: 20,
                not_before_ms: 0,
                expire_at_ms: i64::MAX,
            })?;
        }
        Ok(())
    })
}

/// Claims `claims` jobs from a file-backed store holding `jobs` jobs over `tenants` tenants.
pub fn dispatch(
    dir: &Path,
    tenants: u32,
    jobs: u64,
    claims: u64,
) -> Result<DispatchFigures, String> {
    let path = dir.join(format!("dispatch-{tenants}-{jobs}.db"));
    let _ = std::fs::remove_file(&path);
    let mut store = SqliteStore::open(&path).map_err(|e| e.to_string())?;
    let started = Instant::now();
    fill(&mut store, tenants, jobs).map_err(|e| e.to_string())?;
    let fill_s = started.elapsed().as_secs_f64();

    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let policy = runtime
        .load(builtin::get("standard").unwrap(), u64::MAX)
        .map_err(|e| e.to_string())?;
    let engine = Engine::new(dispatch_config(tenants), store, runtime, Arc::new(policy));
    let started = Instant::now();
    let mut claimed = 0u64;
    let mut call = 0u64;
    while claimed < claims {
        call += 1;
        let want = (claims - claimed).min(100) as u32;
        let answer = engine
            .dispatch(&format!("w{call}"), want, 1)
            .map_err(|e| e.to_string())?;
        if answer.claimed.is_empty() {
            return Err(format!("dispatch claimed nothing: {:?}", answer.reason));
        }
        claimed += answer.claimed.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    drop(engine);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("db-wal"));
    let _ = std::fs::remove_file(path.with_extension("db-shm"));
    Ok(DispatchFigures {
        tenants,
        queued_jobs: jobs,
        fill_s,
        claims: claimed,
        claims_per_s: claimed as f64 / secs,
    })
}
