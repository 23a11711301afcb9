//! What activating a policy costs: compiling it, and activating it again once compiled.
//! `cargo run --release -p tollgate-bench --example activation_cost`

use std::time::Instant;
use tollgate::runtime::{builtin, Runtime};

fn main() {
    let bytes = builtin::get("standard").unwrap();
    let mut cold = Vec::new();
    for _ in 0..5 {
        let runtime = Runtime::new().unwrap();
        let t = Instant::now();
        runtime
            .load(bytes, tollgate::runtime::PolicyLimits::DEFAULT.any_size())
            .unwrap();
        cold.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let runtime = Runtime::new().unwrap();
    runtime
        .load(bytes, tollgate::runtime::PolicyLimits::DEFAULT.any_size())
        .unwrap();
    let t = Instant::now();
    for _ in 0..100 {
        runtime
            .load(bytes, tollgate::runtime::PolicyLimits::DEFAULT.any_size())
            .unwrap();
    }
    let warm = t.elapsed().as_secs_f64() * 1e3 / 100.0;
    cold.sort_by(f64::total_cmp);
    println!(
        "compile and check (cold): median {:.1} ms",
        cold[cold.len() / 2]
    );
    println!(
        "check again (compiled component cached by digest): {:.3} ms",
        warm
    );
}
