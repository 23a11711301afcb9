//! `tollgate-bench`: the benchmarks, run in one process one after the other so that their
//! ratios are comparable on a shared, noisy machine. Figures are printed, never asserted.
//! Use a release build: `cargo run --release -p tollgate-bench -- [http|dispatch]`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tollgate::runtime::Runtime;
use tollgate_bench::{gateway, http, native, redis_peer, simulate, soak, store, waiting};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tollgate-bench",
    about = "Benchmarks for tollgate (use a release build)"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    admit: AdmitBenchArgs,
}

/// The admission benchmark (the default `bench`).
#[derive(clap::Args)]
struct AdmitBenchArgs {
    /// Where the store lives.
    #[arg(long, value_enum, default_value = "file")]
    store: store::StoreKind,
    #[arg(long, default_value_t = 1_000)]
    tenants: u32,
    /// Admission-plus-completion cycles per workload.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Jobs per transaction (group commit, as the service's writer does).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Print one JSON line at the end.
    #[arg(long)]
    json: bool,
    /// Instead of the store workloads, the cost of one decision by each component named
    /// here (repeatable), beside the built-in Rust policy and the same rules compiled natively.
    #[arg(long = "policy")]
    policies: Vec<PathBuf>,
    /// With `--policy`: seconds of decisions per policy.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Admissions per second and latency through `tollgate serve` on loopback (file store).
    Http {
        #[arg(long, default_value_t = 1_000)]
        tenants: u32,
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
        /// A `postgres://` URL: replicas share it (in a scratch schema); default a SQLite file.
        #[arg(long)]
        db: Option<String>,
        /// Servers sharing the PostgreSQL store, the connections spread over them.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// Writer shards in each replica: on PostgreSQL each on its own connection, on the
        /// SQLite file taking turns on one.
        #[arg(long, default_value_t = 1)]
        writers: usize,
        /// Fresh instances each writer's policy keeps made ahead (`serve
        /// --policy-instances-ahead`); default: serve's.
        #[arg(long)]
        policy_instances_ahead: Option<usize>,
        /// Route the timed admissions to a gateway model with this many deployments, each
        /// with budgets and a concurrency limit that never bind (0: no model named).
        #[arg(long, default_value_t = 0)]
        deployments: usize,
        /// Milliseconds added to each round trip between the replicas and PostgreSQL, by a
        /// delaying TCP proxy (half each way): a real network's latency on one machine.
        #[arg(long)]
        db_latency_ms: Option<f64>,
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
        /// The `tollgate` executable to start (default: the one beside this benchmark).
        #[arg(long)]
        tollgate: Option<PathBuf>,
    },
    /// Proxied chat completions per second and the latency the gateway adds, against the
    /// same zero-latency stub called directly (plain and streaming).
    Gateway {
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Deployments serving the model (1: the one-upstream form).
        #[arg(long, default_value_t = 1)]
        deployments: usize,
        #[arg(long, default_value_t = 20_000)]
        calls: u64,
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
        /// The `tollgate` executable to start (default: the one beside this benchmark).
        #[arg(long)]
        tollgate: Option<PathBuf>,
    },
    /// The service under a steady mixed load at half its measured capacity for N minutes:
    /// a table of memory, descriptors, latency and store size each minute, then a JSON line
    /// with the samples and whether memory, p99 and descriptors stayed flat. Exits non-zero
    /// if the server died, descriptors grew, or the books did not balance.
    Soak {
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// Calls per second (default: half the capacity measured first).
        #[arg(long)]
        rate: Option<f64>,
        /// The `tollgate` executable to start (default: the one beside this benchmark).
        #[arg(long)]
        tollgate: Option<PathBuf>,
    },
    /// Simulated requests per second through `tollgate simulate`'s engine loop (logical
    /// time: the load, the real engine, store and standard policy).
    Simulate {
        #[arg(long, default_value_t = 1_000_000)]
        requests: u64,
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
    },
    /// Memory per call waiting in the waiting room, and the server's CPU while calls wait:
    /// `tollgate serve` with its one slot taken and N calls asking to wait.
    Waiting {
        #[arg(long, default_value_t = 10_000)]
        waiters: usize,
        /// Seconds the CPU is watched while they wait.
        #[arg(long, default_value_t = 10)]
        watch_s: u64,
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
        /// The `tollgate` executable to start (default: the one beside this benchmark).
        #[arg(long)]
        tollgate: Option<PathBuf>,
    },
    /// Claims per second at a large queue (many tenants, many jobs) next to a small one.
    Dispatch {
        #[arg(long, default_value_t = 10_000)]
        tenants: u32,
        #[arg(long, default_value_t = 1_000_000)]
        jobs: u64,
        #[arg(long, default_value_t = 20_000)]
        claims: u64,
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tollgate-bench: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        None => bench_admissions(&cli.admit),
        Some(BenchCommand::Http {
            tenants,
            connections,
            requests,
            db,
            replicas,
            writers,
            policy_instances_ahead,
            deployments,
            db_latency_ms,
            json,
            tollgate,
        }) => {
            let servers = http::Servers {
                replicas,
                writers,
                instances_ahead: policy_instances_ahead,
                deployments,
            };
            let dir = tempfile_dir()?;
            // The proxy lives as long as the run.
            let mut _proxy = None;
            let db = match (db, db_latency_ms) {
                (Some(url), Some(ms)) if ms > 0.0 => {
                    let (proxy, via) = tollgate_bench::latency::in_front_of(
                        &url,
                        std::time::Duration::from_secs_f64(ms / 1000.0),
                    )?;
                    _proxy = Some(proxy);
                    Some(via)
                }
                (None, Some(_)) => return Err("--db-latency-ms needs --db".into()),
                (db, _) => db,
            };
            let f = match db.as_deref() {
                Some(url) => http::http_postgres(url, tenants, connections, requests, servers),
                None => {
                    let exe = tollgate.map_or_else(serve_executable, Ok)?;
                    http::http(&exe, &dir, tenants, connections, requests, servers)
                }
            };
            println!(
                "store: {}, replicas: {}, writers per replica: {}, added round trip to the store: {} ms",
                db.as_deref().map_or("sqlite file", |_| "postgres"),
                replicas.max(1),
                writers.max(1),
                db_latency_ms.unwrap_or(0.0)
            );
            let _ = std::fs::remove_dir_all(&dir);
            let f = f?;
            println!(
                "{} admissions over {} connections: {:.0}/s, p50 {:.2} ms, p90 {:.2} ms, \
                 p99 {:.2} ms, p99.9 {:.2} ms, {} errors",
                f.requests,
                f.connections,
                f.admissions_per_s,
                f.p50_ms,
                f.p90_ms,
                f.p99_ms,
                f.p999_ms,
                f.errors
            );
            if let Some(b) = f.written_bytes_per_admission {
                println!("server wrote {b:.0} bytes per admission");
            }
            if let (Some(all), Some(writer)) =
                (f.server_cpu_us_per_admission, f.writer_cpu_us_per_admission)
            {
                println!(
                    "server CPU per admission: {all:.1} µs, of which the writer {writer:.1} µs"
                );
            }
            if let Some(m) = f.machine {
                println!(
                    "machine CPU while loaded: {:.1}% idle, {:.1}% stolen by the hypervisor",
                    m.idle_percent, m.steal_percent
                );
            }
            if let Some(b) = &f.shared_budget {
                println!(
                    "shared budget {} run short after the load: {} admitted of {}, overshoot {}, stranded {}",
                    b.budget, b.admitted, b.limit, b.overshoot, b.stranded
                );
            }
            if json {
                println!("{}", serde_json::json!(f));
            }
            if f.shared_budget.as_ref().is_some_and(|b| b.overshoot > 0) {
                eprintln!("a shared budget admitted more than it holds");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(BenchCommand::Soak {
            minutes,
            rate,
            tollgate,
        }) => {
            let dir = tempfile_dir()?;
            let exe = tollgate.map_or_else(serve_executable, Ok)?;
            println!(
                "{:>6} {:>9} {:>5} {:>8} {:>8} {:>8} {:>7} {:>11} {:>10}",
                "minute",
                "rss KiB",
                "fds",
                "p50 ms",
                "p99 ms",
                "calls",
                "errors",
                "store B",
                "wal B"
            );
            let report = soak::soak(&exe, &dir, minutes, rate, |s| {
                println!(
                    "{:>6} {:>9} {:>5} {:>8.3} {:>8.3} {:>8} {:>7} {:>11} {:>10}",
                    s.minute,
                    s.rss_kib,
                    s.fds,
                    s.p50_ms,
                    s.p99_ms,
                    s.calls,
                    s.errors,
                    s.store_bytes,
                    s.wal_bytes
                );
            });
            let _ = std::fs::remove_dir_all(&dir);
            let report = report?;
            println!(
                "capacity {:.0} calls/s, load {:.0} calls/s; rss_flat {}, p99_flat {}, fds_flat {}, store_bounded {}, server alive {}; {}",
                report.capacity_per_s,
                report.rate_per_s,
                report.rss_flat,
                report.p99_flat,
                report.fds_flat,
                report.store_bounded,
                report.server_alive,
                report.accounting
            );
            println!("{}", serde_json::json!(report));
            let healthy = report.server_alive && report.fds_flat && report.accounting_held;
            Ok(if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Some(BenchCommand::Waiting {
            waiters,
            watch_s,
            json,
            tollgate,
        }) => {
            let dir = tempfile_dir()?;
            let exe = tollgate.map_or_else(serve_executable, Ok)?;
            let watch = std::time::Duration::from_secs(watch_s);
            let f = waiting::waiting(&exe, &dir, waiters, watch)?;
            println!(
                "{} calls waiting: {:.0} bytes each ({} KiB before, {} KiB waiting); the server's CPU while they waited {:.2}% of a core over {:.1} s",
                f.waiters,
                f.bytes_per_waiter,
                f.rss_before_kib,
                f.rss_waiting_kib,
                f.cpu_share_while_waiting * 100.0,
                f.watched_s
            );
            if json {
                println!("{}", serde_json::json!(f));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(BenchCommand::Simulate { requests, json }) => {
            let f = simulate::simulate(requests)?;
            println!(
                "{} simulated requests ({} completed, {} engine calls) in {:.1} s: {:.0} requests/s",
                f.requests, f.completed, f.engine_calls, f.seconds, f.requests_per_s
            );
            if json {
                println!("{}", serde_json::json!(f));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(BenchCommand::Gateway {
            connections,
            deployments,
            calls,
            json,
            tollgate,
        }) => {
            let dir = tempfile_dir()?;
            let exe = tollgate.map_or_else(serve_executable, Ok)?;
            let f = gateway::gateway(&exe, &dir, connections, calls, deployments);
            let _ = std::fs::remove_dir_all(&dir);
            let f = f?;
            println!(
                "{:<16} {:>10} {:>9} {:>9}",
                "workload", "calls/s", "p50 ms", "p99 ms"
            );
            for (name, r) in [
                ("direct plain", &f.direct_plain),
                ("gateway plain", &f.gateway_plain),
                ("direct stream", &f.direct_stream),
                ("gateway stream", &f.gateway_stream),
            ] {
                println!(
                    "{name:<16} {:>10.0} {:>9.3} {:>9.3}",
                    r.calls_per_s, r.p50_ms, r.p99_ms
                );
            }
            println!(
                "added p50: {:.3} ms plain, {:.3} ms stream; proxied/direct calls/s: {:.2} plain, {:.2} stream",
                f.added_p50_ms_plain,
                f.added_p50_ms_stream,
                f.throughput_ratio_plain,
                f.throughput_ratio_stream
            );
            println!(
                "store: {:.0} bytes per finished operation ({} operations); spend ledger: {} rows over {} hour(s), {:.1} rows per hour",
                f.store.bytes_per_finished_operation,
                f.store.finished_operations,
                f.store.ledger_rows,
                f.store.ledger_hours,
                f.store.ledger_rows_per_hour
            );
            if json {
                println!("{}", serde_json::json!(f));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(BenchCommand::Dispatch {
            tenants,
            jobs,
            claims,
            json,
        }) => {
            let dir = tempfile_dir()?;
            let small = store::dispatch(&dir, 10, 1_000, 1_000)?;
            let large = store::dispatch(&dir, tenants, jobs, claims)?;
            let _ = std::fs::remove_dir_all(&dir);
            println!(
                "{:>8} {:>10} {:>8} {:>12} {:>8}",
                "tenants", "queued", "claims", "claims/s", "fill s"
            );
            for f in [&small, &large] {
                println!(
                    "{:>8} {:>10} {:>8} {:>12.0} {:>8.1}",
                    f.tenants, f.queued_jobs, f.claims, f.claims_per_s, f.fill_s
                );
            }
            let ratio = large.claims_per_s / small.claims_per_s;
            println!("large/small claims per second: {ratio:.2}");
            if json {
                println!(
                    "{}",
                    serde_json::json!({"small": small, "large": large, "ratio": ratio})
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn bench_admissions(a: &AdmitBenchArgs) -> Result<ExitCode, String> {
    if !a.policies.is_empty() {
        return bench_policies(a);
    }
    use store::admissions;
    use tollgate::runtime::{builtin, Decider};
    let dir = tempfile_dir()?;
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let wasm: Arc<dyn Decider> = Arc::new(
        runtime
            .load(
                builtin::get("standard").unwrap(),
                tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
            )
            .map_err(|e| e.to_string())?,
    );
    let native: Arc<dyn Decider> = Arc::new(native::NativeStandard::default());
    let fixed: Arc<dyn Decider> = Arc::new(native::Fixed::default());
    let (tenants, ops, batch) = (a.tenants, a.ops, a.batch);
    // One after the other in one process, so that the ratios compare like with like.
    let wasm_run = admissions(wasm.clone(), a.store, &dir, tenants, ops, batch)?;
    let native_run = admissions(native, a.store, &dir, tenants, ops, batch)?;
    let store_run = admissions(fixed, a.store, &dir, tenants, ops, batch)?;
    // The writer's cost of shadow mode: the same rules asked twice per admission.
    let standard = builtin::get("standard").unwrap();
    let shadow_run = store::admissions_with_shadow(
        wasm.clone(),
        Some(standard),
        a.store,
        &dir,
        tenants,
        ops,
        batch,
    )?;
    // Per-call latency: one transaction per admission, as an embedding library call.
    let latency_run = admissions(wasm, a.store, &dir, tenants, (ops / 4).max(1000), 1)?;
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&redis_dir).map_err(|e| e.to_string())?;
    let redis = redis_peer::run(&redis_dir, tenants, ops)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "store={:?} tenants={tenants} ops={ops} batch={batch}",
        a.store
    );
    println!("{:<28} {:>12}", "workload", "cycles/s");
    println!("{:<28} {:>12.0}", "wasm (standard policy)", wasm_run.per_s);
    println!("{:<28} {:>12.0}", "native (same rules)", native_run.per_s);
    println!(
        "{:<28} {:>12.0}",
        "store only (fixed plan)", store_run.per_s
    );
    println!(
        "{:<28} {:>12.0}",
        "wasm + shadow (standard)", shadow_run.per_s
    );
    println!(
        "{:<28} {:>12.0}",
        "wasm, one commit per call", latency_run.per_s
    );
    match redis {
        Some(r) => println!("{:<28} {:>12.0}", "redis lua (loopback peer)", r),
        None => println!(
            "{:<28} {:>12}",
            "redis lua (loopback peer)", "no redis-server"
        ),
    }
    println!("wasm/native: {:.2}", wasm_run.per_s / native_run.per_s);
    println!(
        "with shadow/without: {:.2}",
        shadow_run.per_s / wasm_run.per_s
    );
    println!(
        "per admission (one commit per call): p50 {:.1} us, p99 {:.1} us",
        latency_run.p50_us, latency_run.p99_us
    );
    if a.json {
        let line = serde_json::json!({
            "wasm_per_s": wasm_run.per_s.round(),
            "native_per_s": native_run.per_s.round(),
            "store_only_per_s": store_run.per_s.round(),
            "shadow_per_s": shadow_run.per_s.round(),
            "unbatched_wasm_per_s": latency_run.per_s.round(),
            "p50_us": (latency_run.p50_us * 10.0).round() / 10.0,
            "p99_us": (latency_run.p99_us * 10.0).round() / 10.0,
            "store": a.store,
            "tenants": tenants,
            "ops": ops,
            "batch": batch,
            "redis_lua_per_s": redis.map(f64::round),
        });
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--policy FILE...`: decisions per second and p50/p99 per decision, side by side.
fn bench_policies(a: &AdmitBenchArgs) -> Result<ExitCode, String> {
    let budget = std::time::Duration::from_secs_f64(a.seconds.clamp(0.1, 600.0));
    let costs = tollgate_bench::policies::run(&a.policies, budget, a.ops.max(200))?;
    println!("one decision (admit) in a fresh instance, one thread");
    println!(
        "{:<28} {:<28} {:>10} {:>12} {:>9} {:>9}",
        "policy", "describes", "bytes", "decisions/s", "p50 us", "p99 us"
    );
    for c in &costs {
        println!(
            "{:<28} {:<28} {:>10} {:>12.0} {:>9.1} {:>9.1}",
            c.policy, c.describes, c.bytes, c.per_s, c.p50_us, c.p99_us
        );
    }
    if let (Some(native), Some(rust)) = (costs.first(), costs.get(1)) {
        println!("rust wasm/native: {:.2}", rust.per_s / native.per_s);
    }
    if a.json {
        println!("{}", serde_json::json!({ "policies": costs }));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `tollgate` executable beside this one (both are built into the same target folder).
fn serve_executable() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sibling = exe.with_file_name(format!("tollgate{}", std::env::consts::EXE_SUFFIX));
    if sibling.is_file() {
        Ok(sibling)
    } else {
        Err(format!(
            "{} not found: build it (`cargo build --release`) or name it with --tollgate",
            sibling.display()
        ))
    }
}

/// A private scratch folder for benchmark databases.
fn tempfile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("tollgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}
