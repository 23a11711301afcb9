//! `tollgate-bench simulate`: how fast `tollgate simulate` goes through requests in logical
//! time: four tenants (two interactive, two durable) at 1,000 requests a simulated second,
//! a provider that fails 2% of calls and loses 0.1%, workers claiming in batches.

use serde::Serialize;
use std::path::Path;
use std::time::Instant;
use tollgate::runtime::Runtime;
use tollgate::simulate::{self, Simulation};

/// What one run measured.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub requests: u64,
    pub engine_calls: u64,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub completed: u64,
}

/// The workload, sized to about `requests` arrivals.
pub fn workload(requests: u64) -> serde_json::Value {
    let duration_ms = requests.max(1000);
    let load = |route: &str| {
        serde_json::json!({ "arrivals": { "kind": "poisson", "per_s": 250 }, "route": route,
                            "input_tokens": { "min": 100, "max": 500 }, "max_output_tokens": 200 })
    };
    serde_json::json!({
        "duration_ms": duration_ms, "seed": 5, "sample_ms": 1000,
        "config": {
            "global": { "requests": { "capacity": 2000, "refill_per_s": 2000 }, "concurrency": 600 },
            "tenant_defaults": { "requests": { "capacity": 400, "refill_per_s": 300 },
                                 "tokens": { "capacity": 10000000, "refill_per_s": 10000000 },
                                 "queue_limit": 1000 },
            "tenants": { "a": { "weight": 2 }, "b": {}, "c": {}, "d": {} },
            "scheduler": { "max_claims_per_worker": 128 }
        },
        "tenants": { "a": load("interactive"), "b": load("interactive"),
                     "c": load("durable"), "d": load("durable") },
        "provider": { "concurrency": 600, "base_ms": 300, "per_output_token_ms": 1,
                      "failures": { "rate_limited": 0.01, "unavailable": 0.01, "unknown": 0.001 } },
        "workers": { "count": 2, "claim_batch": 128, "poll_ms": 50 }
    })
}

/// Runs the workload once with the standard policy.
pub fn simulate(requests: u64) -> Result<Figures, String> {
    let sim = Simulation::from_json(Path::new("bench.json"), workload(requests))?;
    let plans = simulate::plans(&sim, &[])?;
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let run = simulate::run_plan(&plans[0], &runtime, Path::new("."))?;
    let seconds = started.elapsed().as_secs_f64();
    let o = &run.summary.overall;
    Ok(Figures {
        requests: o.offered,
        engine_calls: o.engine_calls,
        seconds,
        requests_per_s: o.offered as f64 / seconds,
        completed: o.completed,
    })
}
