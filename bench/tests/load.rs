//! The benchmarks run for real, small: their figures are checked for sense, never for speed.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The `tollgate` executable of the same profile as this benchmark, built if needed.
fn tollgate() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_tollgate-bench"));
    let release = bench.parent().unwrap().ends_with("release");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-p", "tollgate-cli", "--bin", "tollgate"]);
    if release {
        build.arg("--release");
    }
    assert!(build.status().unwrap().success(), "building tollgate");
    bench.with_file_name("tollgate")
}

/// Runs `tollgate-bench ARGS --json --tollgate EXE` and reads its JSON line.
fn bench_json(args: &[&str]) -> Value {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"));
    bench
        .args(args)
        .args(["--json", "--tollgate"])
        .arg(tollgate());
    json_line(&mut bench)
}

/// Runs a benchmark that must succeed, and reads the JSON line it prints.
fn json_line(bench: &mut Command) -> Value {
    let out = bench.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

#[test]
fn the_load_benchmark_drives_a_real_server_and_counts_every_answer() {
    // `tollgate-bench http` starts `tollgate serve` as a process and must see every one of
    // its admissions answered 200 (a generator that misreads responses fails here).
    let figures = bench_json(&[
        "http",
        "--tenants",
        "5",
        "--connections",
        "4",
        "--requests",
        "400",
    ]);
    assert_eq!(figures["requests"], 400, "{figures}");
    assert_eq!(figures["errors"], 0, "{figures}");
    assert!(figures["admissions_per_s"].as_f64().unwrap() > 0.0);
    let ms = |p: &str| figures[p].as_f64().unwrap();
    assert!(ms("p50_ms") <= ms("p90_ms") && ms("p90_ms") <= ms("p99_ms"));
    assert!(ms("p99_ms") <= ms("p999_ms"));
    // CPU per admission, from `/proc`: the writer thread's share of the process's (read a
    // moment later, so within one clock tick spread over the 400 admissions).
    let server = figures["server_cpu_us_per_admission"].as_f64().unwrap();
    let writer = figures["writer_cpu_us_per_admission"].as_f64().unwrap();
    let tick_per_admission_us = 1e6 / 100.0 / 400.0;
    assert!(server > 0.0, "{figures}");
    assert!(
        (0.0..=server + tick_per_admission_us).contains(&writer),
        "{figures}"
    );
    // The machine's shares over the same interval, from `/proc/stat`.
    let share = |k: &str| figures["machine"][k].as_f64().unwrap();
    for k in ["steal_percent", "idle_percent"] {
        assert!((0.0..=100.0).contains(&share(k)), "{figures}");
    }
    assert!(
        share("steal_percent") + share("idle_percent") < 100.0,
        "{figures}"
    );
    // The shared budget run short after the load: exactly what it holds was admitted.
    let b = &figures["shared_budget"];
    assert_eq!(b["budget"], "model.probe.requests", "{figures}");
    assert_eq!(
        (&b["limit"], &b["admitted"], &b["overshoot"], &b["stranded"]),
        (&1000.into(), &1000.into(), &0.into(), &0.into()),
        "{figures}"
    );
}

#[test]
fn the_gateway_benchmark_proxies_every_call_and_reports_both_sides() {
    // Every call of the four workloads must succeed (a failed call ends the run with an
    // error), through a real `tollgate serve` in front of the in-process stub.
    let f = bench_json(&["gateway", "--connections", "4", "--calls", "400"]);
    for run in [
        "direct_plain",
        "gateway_plain",
        "direct_stream",
        "gateway_stream",
    ] {
        let r = &f[run];
        assert!(r["calls_per_s"].as_f64().unwrap() > 0.0, "{f}");
        assert!(
            r["p50_ms"].as_f64().unwrap() <= r["p99_ms"].as_f64().unwrap(),
            "{f}"
        );
    }
    let ratio = f["throughput_ratio_plain"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio.is_finite(), "{f}");
}

#[test]
fn the_simulation_benchmark_runs_its_requests_through_the_engine() {
    let f = json_line(Command::new(env!("CARGO_BIN_EXE_tollgate-bench")).args([
        "simulate",
        "--requests",
        "20000",
        "--json",
    ]));
    let requests = f["requests"].as_u64().unwrap();
    // 1,000 a simulated second for 20 s, Poisson: about 20,000.
    assert!((18_000..22_000).contains(&requests), "{f}");
    // At least an admission each, and completions for most.
    assert!(f["engine_calls"].as_u64().unwrap() > requests, "{f}");
    assert!(f["completed"].as_u64().unwrap() > requests / 2, "{f}");
}
