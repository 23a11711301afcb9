//! The cost of one decision by each policy, side by side in one run: the standard rules
//! compiled natively, the built-in Rust component, and any components named with
//! `--policy` (the Python and JavaScript ports, say). Every decision runs in a fresh
//! instance, as in the engine; one thread, so that the figures are the policy's own.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::runtime::{
    builtin, Decider, DecisionView, Jitter, PolicyLimits, Priority, Request, Route, Runtime,
};

/// One policy's figures.
#[derive(Debug, serde::Serialize)]
pub struct Cost {
    /// What decided: `native`, `standard` (built-in) or the file's name.
    pub policy: String,
    /// The name and version the policy gave itself.
    pub describes: String,
    /// The component's size in bytes (0 for native rules).
    pub bytes: usize,
    pub decisions: u64,
    pub per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Decides with each policy for about `budget` (at least 200 decisions, at most `max`).
pub fn run(files: &[PathBuf], budget: Duration, max: u64) -> Result<Vec<Cost>, String> {
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let mut deciders: Vec<(String, usize, Arc<dyn Decider>)> = vec![
        (
            "native".into(),
            0,
            Arc::new(crate::native::NativeStandard::default()),
        ),
        {
            let bytes = builtin::get("standard").unwrap();
            let loaded = runtime
                .load(bytes, PolicyLimits::DEFAULT)
                .map_err(|e| e.to_string())?;
            ("standard (built-in)".into(), bytes.len(), Arc::new(loaded))
        },
    ];
    for file in files {
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let started = Instant::now();
        let loaded = runtime
            .load(&bytes, PolicyLimits::DEFAULT)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        eprintln!(
            "{}: loaded in {:.1} s",
            file.display(),
            started.elapsed().as_secs_f64()
        );
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        deciders.push((name, bytes.len(), Arc::new(loaded)));
    }
    deciders
        .into_iter()
        .map(|(policy, bytes, decider)| measure(policy, bytes, decider, budget, max))
        .collect()
}

fn measure(
    policy: String,
    bytes: usize,
    decider: Arc<dyn Decider>,
    budget: Duration,
    max: u64,
) -> Result<Cost, String> {
    let request = |i: u64| Request {
        tenant: "acme".into(),
        key: format!("op-{i}"),
        route: Route::Interactive,
        input_tokens: 200,
        optional_context_tokens: 0,
        max_output_tokens: 300,
        deadline_ms: i64::MAX,
        size_bytes: 0,
        attempt: 1,
        model: None,
        priority: Priority::Standard,
        labels: Vec::new(),
    };
    let view = |i: u64| {
        let mut v = DecisionView::scratch(Arc::default());
        v.now_ms = i as i64;
        v.jitter = Jitter::new(7, "acme", &format!("op-{i}"), 1);
        v
    };
    // Warm up: the first calls fault in the instance's pages.
    for i in 0..20 {
        decider
            .admit(view(i), &request(i))
            .map_err(|e| format!("{policy}: {e}"))?;
    }
    let mut latencies = Vec::new();
    let started = Instant::now();
    let mut i = 0u64;
    while i < max && (i < 200 || started.elapsed() < budget) {
        let (v, r) = (view(i), request(i));
        let t = Instant::now();
        decider.admit(v, &r).map_err(|e| format!("{policy}: {e}"))?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    let total: f64 = latencies.iter().sum();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Ok(Cost {
        describes: format!("{} {}", decider.info().name, decider.info().version),
        policy,
        bytes,
        decisions: i,
        per_s: i as f64 / (total / 1e6),
        p50_us: at(0.5),
        p99_us: at(0.99),
    })
}
