//! The engine and its store without HTTP: admissions per second with the wasm policy, the
//! same rules compiled natively and a fixed plan (the store's floor), and dispatch at a
//! large queue against a small one.

use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tollgate::config::Config;
use tollgate::engine::Engine;
use tollgate::model::{OpState, Operation, Route};
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::{QueuedJob, SqliteStore, Store, StoreError};

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
                model: None,
                priority: Default::default(),
                reserved_cost_microusd: 0,
                state_since_ms: Some(0),
                usage: None,
                deployment: None,
                holds_deployment_slot: false,
                asked_model: None,
                trace_context: None,
            };
            tx.put_operation(&op)?;
            tx.enqueue(&QueuedJob {
                tenant,
                key,
                priority: Default::default(),
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
        .load(
            builtin::get("standard").unwrap(),
            tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
        )
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

/// Which store an admission benchmark runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    Memory,
    File,
}

/// One admission workload's result.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    /// Admission-plus-completion cycles per second.
    pub per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

fn admit_config(tenants: u32) -> Config {
    Config::from_json(&admit_config_json(tenants)).expect("benchmark configuration is valid")
}

pub fn admit_config_json(tenants: u32) -> serde_json::Value {
    let mut names = serde_json::Map::new();
    for t in 0..tenants {
        names.insert(format!("t{t:05}"), serde_json::json!({}));
    }
    serde_json::json!({
        "global": {"requests": {"capacity": 1e12, "refill_per_s": 1e9}, "concurrency": 100000000u64},
        "tenant_defaults": {"requests": {"capacity": 1e12, "refill_per_s": 1e9},
                            "tokens": {"capacity": 1e12, "refill_per_s": 1e9}},
        "tenants": names,
    })
}

/// Runs `ops` cycles (an interactive admission, then its completion) with `decider`, in
/// batches of `batch` jobs per transaction as the service's writer does (1 = a transaction
/// per call). Latency is per admission: the batch's time divided by its admissions for
/// batched runs, the call's own time otherwise.
pub fn admissions(
    decider: Arc<dyn tollgate::runtime::Decider>,
    store: StoreKind,
    dir: &Path,
    tenants: u32,
    ops: u64,
    batch: usize,
) -> Result<Throughput, String> {
    admissions_with_shadow(decider, None, store, dir, tenants, ops, batch)
}

/// As [`admissions`], with `shadow` (a component) asked beside the policy on every one.
pub fn admissions_with_shadow(
    decider: Arc<dyn tollgate::runtime::Decider>,
    shadow: Option<&[u8]>,
    store: StoreKind,
    dir: &Path,
    tenants: u32,
    ops: u64,
    batch: usize,
) -> Result<Throughput, String> {
    use tollgate::engine::{Batch, Completion};
    let store = match store {
        StoreKind::Memory => SqliteStore::in_memory(),
        StoreKind::File => {
            let path = dir.join("admissions.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            SqliteStore::open(&path)
        }
    }
    .map_err(|e| e.to_string())?;
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let config = admit_config(tenants);
    let tenant_names: Vec<String> = config.tenants.keys().cloned().collect();
    let engine = Engine::new(config, store, runtime, decider);
    if let Some(bytes) = shadow {
        engine
            .install_shadow(bytes, &tollgate::engine::NoVerifier, 1.0)
            .map_err(|e| e.to_string())?;
    }
    let request = |i: u64| tollgate::model::Request {
        tenant: tenant_names[(i % u64::from(tenants)) as usize].clone(),
        key: format!("op-{i}"),
        route: Route::Interactive,
        input_tokens: 200,
        optional_context_tokens: 0,
        max_output_tokens: 300,
        deadline_ms: i64::MAX,
        size_bytes: 0,
        body_ref: None,
        fingerprint: None,
        model: None,
        priority: Default::default(),
        labels: Default::default(),
        fallback: true,
        trace_context: None,
    };
    let completion = |i: u64| {
        Completion::succeeded(
            &tenant_names[(i % u64::from(tenants)) as usize],
            &format!("op-{i}"),
        )
    };
    let mut latencies: Vec<f64> = Vec::with_capacity(ops as usize);
    let started = Instant::now();
    let mut i = 0u64;
    while i < ops {
        let n = (ops - i).min(batch.max(1) as u64);
        let now_ms = 1 + (i / 1000) as i64;
        if batch <= 1 {
            let t = Instant::now();
            let d = engine
                .admit_request(&request(i), now_ms)
                .map_err(|e| e.to_string())?;
            latencies.push(t.elapsed().as_secs_f64() * 1e6);
            if !d.authorises_call() {
                return Err(format!("admission refused in the benchmark: {d:?}"));
            }
            engine
                .complete(&completion(i), now_ms)
                .map_err(|e| e.to_string())?;
        } else {
            let mut admits = Batch::new();
            for j in i..i + n {
                admits.admit(request(j), now_ms);
            }
            let t = Instant::now();
            engine.run(admits).map_err(|e| e.to_string())?;
            let per = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            latencies.extend(std::iter::repeat_n(per, n as usize));
            let mut completes = Batch::new();
            for j in i..i + n {
                completes.complete(completion(j), now_ms);
            }
            engine.run(completes).map_err(|e| e.to_string())?;
        }
        i += n;
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    Ok(Throughput {
        per_s: ops as f64 / secs,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    })
}
