//! How long one policy call takes: a fresh instance from the pool, fuel, the call.
//! `cargo run --release -p tollgate-bench --example policy_call_cost` (`N=300000` for more calls, e.g. under
//! `perf record`)

use std::sync::Arc;
use std::time::Instant;
use tollgate::runtime::{
    builtin, Decider, DecisionView, Params, Priority, Request, Route, Runtime,
};

fn main() {
    let runtime = Runtime::new().unwrap();
    let wasm = runtime
        .load(
            builtin::get("standard").unwrap(),
            tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
        )
        .unwrap();
    let native = tollgate_bench::native::NativeStandard::default();
    let params = Arc::new(Params::default());
    let req = Request {
        tenant: "acme".into(),
        key: "k".into(),
        route: Route::Interactive,
        input_tokens: 100,
        optional_context_tokens: 0,
        max_output_tokens: 100,
        deadline_ms: 1_000_000,
        size_bytes: 0,
        attempt: 1,
        model: None,
        priority: Priority::Standard,
        labels: Vec::new(),
    };
    for (name, d) in [
        ("wasm", &wasm as &dyn Decider),
        ("native", &native as &dyn Decider),
    ] {
        let n = std::env::var("N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let started = Instant::now();
        for _ in 0..n {
            d.admit(DecisionView::scratch(params.clone()), &req)
                .unwrap();
        }
        println!(
            "{name}: {:.2} us per call",
            started.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}
