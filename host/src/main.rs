//! The `tollgate` command line.

use clap::{Parser, Subcommand};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::runtime::Runtime;
use tollgate::scenario::{self, Runner, Scenario};
use tollgate::store::{AnyStore, PgStore, SqliteStore};
use tollgate::Engine;

/// Requests allocate many small blocks on the runtime's threads that the writer thread
/// frees, and the writer allocates for every decision: mimalloc is markedly cheaper at both
/// than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Admission control and fair scheduling for expensive provider calls"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Conformance scenarios (SPEC.md section 9).
    Conformance {
        #[command(subcommand)]
        command: ConformanceCommand,
    },
    /// Decide one admission read as JSON from standard input, and print the decision.
    Decide {
        #[command(flatten)]
        engine: EngineArgs,
        /// Logical time of the decision, in ms (default: the wall clock).
        #[arg(long)]
        now: Option<i64>,
        /// Read one request per line and print one decision per line, until end of input.
        #[arg(long)]
        lines: bool,
    },
    /// Queue depth per tenant in a store.
    Queue {
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Operations in a store, with the hash of the policy that decided each.
    Ops {
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Serve the engine over HTTP (SPEC.md section 10) until SIGTERM or SIGINT.
    Serve {
        /// Configuration file: the engine configuration plus `auth` and `policy`.
        #[arg(long)]
        config: PathBuf,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// SQLite database file (created if missing), or a `postgres://` URL for a store shared by replicas.
        #[arg(long, default_value = "tollgate.db")]
        db: String,
        /// Log as JSON lines instead of text.
        #[arg(long)]
        json_logs: bool,
        /// Watch this policy file (or the newest `.wasm` in this folder) and activate it when it changes.
        #[arg(long)]
        watch_policy: Option<PathBuf>,
        /// Scenario files or folders every candidate policy must pass before activation.
        #[arg(long)]
        verify_with: Vec<PathBuf>,
    },
    /// Benchmarks (use a release build).
    Bench {
        #[command(subcommand)]
        command: Option<BenchCommand>,
        #[command(flatten)]
        admit: AdmitBenchArgs,
    },
    /// Policy modules.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum ConformanceCommand {
    /// Run scenario files, or every `*.json` under folders.
    Run {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Policy (built-in name or `.wasm` file) for scenarios that do not name one.
        #[arg(long, default_value = "standard")]
        policy: String,
        /// A `postgres://` URL to run every scenario against PostgreSQL (each in a fresh
        /// schema of its own); default: a private in-memory SQLite store per scenario.
        #[arg(long)]
        db: Option<String>,
    },
}

/// The admission benchmark (the default `bench`).
#[derive(clap::Args)]
struct AdmitBenchArgs {
    /// Where the store lives.
    #[arg(long, value_enum, default_value = "file")]
    store: tollgate::bench::StoreKind,
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
        /// Print one JSON line at the end.
        #[arg(long)]
        json: bool,
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

#[derive(Subcommand)]
enum PolicyCommand {
    /// Check a component as activation would (world, self-check, smoke decisions) and print its identity.
    Check {
        /// Built-in name or `.wasm` file.
        policy: String,
        #[arg(long)]
        config: Option<PathBuf>,
        /// Scenario files or folders the policy must pass (for scenarios that name no policy).
        #[arg(long)]
        verify_with: Vec<PathBuf>,
    },
    /// List the built-in policies with their identities.
    List,
    /// Activate a policy on a running `tollgate serve` (validated there; refused modules change nothing).
    Swap {
        /// Built-in name or `.wasm` file.
        policy: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        /// An admin key of that server.
        #[arg(long, env = "TOLLGATE_ADMIN_KEY")]
        key: String,
    },
    /// Switch a running `tollgate serve` back to its previous policy.
    Rollback {
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        #[arg(long, env = "TOLLGATE_ADMIN_KEY")]
        key: String,
    },
}

#[derive(clap::Args)]
struct EngineArgs {
    /// Configuration file (JSON, SPEC.md section 9); default: the defaults with no tenants.
    #[arg(long)]
    config: Option<PathBuf>,
    /// SQLite database file (created if missing) or `postgres://` URL; default: a private in-memory store.
    #[arg(long)]
    db: Option<String>,
    /// Built-in policy name or `.wasm` file.
    #[arg(long, default_value = "standard")]
    policy: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tollgate: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    let runtime = Runtime::new().map_err(|e| format!("starting wasmtime: {e:#}"))?;
    match cli.command {
        Command::Conformance {
            command: ConformanceCommand::Run { paths, policy, db },
        } => conformance(runtime, &paths, policy, db),
        Command::Decide {
            engine,
            now,
            lines: true,
        } => {
            let engine = open_engine(runtime, &engine)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            for line in std::io::stdin().lines() {
                let line = line.map_err(|e| e.to_string())?;
                let decision = match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(request) => engine
                        .admit(&request, now.unwrap_or_else(wall_clock_ms))
                        .map_err(|e| e.to_string())?,
                    Err(_) => tollgate::engine::Decision::rejected(
                        tollgate::reason::Reason::InvalidRequest,
                        None,
                    ),
                };
                use std::io::Write;
                writeln!(out, "{}", serde_json::to_string(&decision).unwrap())
                    .map_err(|e| e.to_string())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Decide {
            engine,
            now,
            lines: false,
        } => {
            let engine = open_engine(runtime, &engine)?;
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .map_err(|e| e.to_string())?;
            let request: serde_json::Value =
                serde_json::from_str(&input).map_err(|e| format!("request is not JSON: {e}"))?;
            let decision = engine
                .admit(&request, now.unwrap_or_else(wall_clock_ms))
                .map_err(|e| e.to_string())?;
            println!("{}", serde_json::to_string_pretty(&decision).unwrap());
            Ok(ExitCode::SUCCESS)
        }
        Command::Queue { engine } => {
            let engine = open_engine(runtime, &engine)?;
            for (tenant, depth) in engine.queue_depths().map_err(|e| e.to_string())? {
                println!("{tenant}\t{depth}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ops { engine } => {
            let engine = open_engine(runtime, &engine)?;
            let inspection = engine.inspect(wall_clock_ms()).map_err(|e| e.to_string())?;
            println!("tenant\tkey\tstate\tattempt\tpolicy");
            for op in inspection.operations {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    op.tenant,
                    op.key,
                    op.state.as_str(),
                    op.attempt,
                    op.policy
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command: None,
            admit,
        } => bench_admissions(&admit),
        Command::Bench {
            command:
                Some(BenchCommand::Http {
                    tenants,
                    connections,
                    requests,
                    db,
                    replicas,
                    json,
                }),
            ..
        } => {
            let dir = tempfile_dir()?;
            let f = match db.as_deref() {
                Some(url) => {
                    tollgate::bench::http_postgres(url, tenants, connections, requests, replicas)
                }
                None => {
                    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                    tollgate::bench::http(&exe, &dir, tenants, connections, requests)
                }
            };
            println!(
                "store: {}, replicas: {}",
                db.as_deref().map_or("sqlite file", |_| "postgres"),
                replicas.max(1)
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
            if json {
                println!("{}", serde_json::json!(f));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command:
                Some(BenchCommand::Dispatch {
                    tenants,
                    jobs,
                    claims,
                    json,
                }),
            ..
        } => {
            let dir = tempfile_dir()?;
            let small = tollgate::bench::dispatch(&dir, 10, 1_000, 1_000)?;
            let large = tollgate::bench::dispatch(&dir, tenants, jobs, claims)?;
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
        Command::Serve {
            config,
            listen,
            db,
            json_logs,
            watch_policy,
            verify_with,
        } => serve(&config, &listen, &db, json_logs, watch_policy, verify_with),
        Command::Policy {
            command:
                PolicyCommand::Swap {
                    policy,
                    server,
                    key,
                },
        } => {
            let bytes = scenario::resolve_policy(&policy, None)?;
            let url = format!("{}/v1/admin/policy", server.trim_end_matches('/'));
            let response = ureq::put(&url)
                .set("Authorization", &format!("Bearer {key}"))
                .set("Content-Type", "application/wasm")
                .send_bytes(&bytes);
            print_admin_answer(response)
        }
        Command::Policy {
            command: PolicyCommand::Rollback { server, key },
        } => {
            let url = format!("{}/v1/admin/policy/rollback", server.trim_end_matches('/'));
            let response = ureq::post(&url)
                .set("Authorization", &format!("Bearer {key}"))
                .call();
            print_admin_answer(response)
        }
        Command::Policy {
            command: PolicyCommand::List,
        } => {
            for name in tollgate::runtime::builtin::names() {
                let bytes = tollgate::runtime::builtin::get(name).unwrap();
                match runtime.load(bytes, u64::MAX) {
                    Ok(p) => println!("{name}\t{}\t{}", p.info.version, p.digest),
                    Err(e) => println!("{name}\trefused: {e}"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy {
            command:
                PolicyCommand::Check {
                    policy,
                    config,
                    verify_with,
                },
        } => {
            let args = EngineArgs {
                config,
                db: None,
                policy: "standard".into(),
            };
            let engine = open_engine(runtime, &args)?;
            let bytes = scenario::resolve_policy(&policy, None)?;
            let checked = engine
                .check_verified(&bytes, &verify_with)
                .map_err(|e| e.to_string());
            if checked.is_ok() && !verify_with.is_empty() {
                println!("verified against the scenarios in {verify_with:?}");
            }
            match checked {
                Ok(p) => {
                    println!(
                        "ok\t{}\t{}\t{}",
                        p.info().name,
                        p.info().version,
                        p.digest()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    println!("refused\t{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

fn conformance(
    runtime: Runtime,
    paths: &[PathBuf],
    policy: String,
    db: Option<String>,
) -> Result<ExitCode, String> {
    let files = scenario::collect(paths)?;
    let mut runner = Runner::new(runtime);
    runner.default_policy = policy;
    if let Some(db) = &db {
        if !tollgate::store::is_postgres_url(db) {
            return Err(format!(
                "--db {db}: conformance runs take a postgres:// URL (SQLite runs in memory)"
            ));
        }
    }
    let (mut passed, mut failed) = (0, 0);
    for (i, file) in files.into_iter().enumerate() {
        let outcome = Scenario::load(&file).and_then(|s| {
            let mismatches = match &db {
                Some(url) => {
                    let schema = format!("tollgate_conformance_{}_{i}", std::process::id());
                    let store = PgStore::open_scratch(url, &schema).map_err(|e| {
                        tollgate::scenario::ScenarioError {
                            path: file.display().to_string(),
                            message: e.to_string(),
                        }
                    })?;
                    runner.run_on(&s, store)?
                }
                None => runner.run(&s)?,
            };
            Ok((s.name, mismatches))
        });
        match outcome {
            Ok((_, mismatches)) if mismatches.is_empty() => passed += 1,
            Ok((name, mismatches)) => {
                failed += 1;
                for m in mismatches {
                    println!("FAIL {name} ({}) {m}", file.display());
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {e}");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn open_engine(runtime: Runtime, args: &EngineArgs) -> Result<Engine<AnyStore>, String> {
    let config = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            Config::from_json(&value).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Config::from_json(&serde_json::json!({})).map_err(|e| e.to_string())?,
    };
    let store = match &args.db {
        Some(db) => AnyStore::open(db),
        None => SqliteStore::in_memory().map(AnyStore::Sqlite),
    }
    .map_err(|e| e.to_string())?;
    let bytes = scenario::resolve_policy(&args.policy, None)?;
    let policy = runtime
        .load(&bytes, config.max_policy_bytes)
        .map_err(|e| e.to_string())?;
    Ok(Engine::new(config, store, runtime, Arc::new(policy)))
}

fn bench_admissions(a: &AdmitBenchArgs) -> Result<ExitCode, String> {
    use tollgate::bench::admissions;
    use tollgate::runtime::{builtin, Decider};
    let dir = tempfile_dir()?;
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let wasm: Arc<dyn Decider> = Arc::new(
        runtime
            .load(builtin::get("standard").unwrap(), u64::MAX)
            .map_err(|e| e.to_string())?,
    );
    let native: Arc<dyn Decider> = Arc::new(tollgate::native::NativeStandard::default());
    let fixed: Arc<dyn Decider> = Arc::new(tollgate::native::Fixed::default());
    let (tenants, ops, batch) = (a.tenants, a.ops, a.batch);
    // One after the other in one process, so that the ratios compare like with like.
    let wasm_run = admissions(wasm.clone(), a.store, &dir, tenants, ops, batch)?;
    let native_run = admissions(native, a.store, &dir, tenants, ops, batch)?;
    let store_run = admissions(fixed, a.store, &dir, tenants, ops, batch)?;
    // Per-call latency: one transaction per admission, as an embedding library call.
    let latency_run = admissions(wasm, a.store, &dir, tenants, (ops / 4).max(1000), 1)?;
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&redis_dir).map_err(|e| e.to_string())?;
    let redis = tollgate::bench::redis_peer::run(&redis_dir, tenants, ops)?;
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
        "per admission (one commit per call): p50 {:.1} us, p99 {:.1} us",
        latency_run.p50_us, latency_run.p99_us
    );
    if a.json {
        let line = serde_json::json!({
            "wasm_per_s": wasm_run.per_s.round(),
            "native_per_s": native_run.per_s.round(),
            "store_only_per_s": store_run.per_s.round(),
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

fn print_admin_answer(response: Result<ureq::Response, ureq::Error>) -> Result<ExitCode, String> {
    match response {
        Ok(r) => {
            println!("{}", r.into_string().unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Err(ureq::Error::Status(code, r)) => {
            println!("{code} {}", r.into_string().unwrap_or_default());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.to_string()),
    }
}

fn serve(
    config: &Path,
    listen: &str,
    db: &str,
    json_logs: bool,
    watch_policy: Option<PathBuf>,
    verify_with: Vec<PathBuf>,
) -> Result<ExitCode, String> {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Requests hand their log lines to a writer thread (flushed when `_flush` drops at exit);
    // if that thread falls far behind, lines are dropped rather than requests slowed. The
    // thread flushes whenever it has emptied its queue, so the buffer only joins the lines
    // that were waiting together into one write instead of a system call per line.
    let stderr = std::io::BufWriter::with_capacity(64 << 10, std::io::stderr());
    let (log, _flush) = tracing_appender::non_blocking(stderr);
    let logs = tracing_subscriber::fmt()
        .with_writer(log)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter);
    if json_logs {
        logs.json().init();
    } else {
        logs.init();
    }
    let text = std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config.display()))?;
    let config = tollgate::service::ServeConfig::from_json(&value)
        .map_err(|e| format!("{}: {e}", config.display()))?;
    let store = AnyStore::open(db).map_err(|e| format!("{db}: {e}"))?;
    let (state, writer) = tollgate::service::build_with(config, store, verify_with)?;
    let watcher = watch_policy.map(|path| {
        tracing::info!(path = %path.display(), "watching the policy");
        tollgate::service::watch_policy(&state, path)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let shutdown = async move {
        tollgate::service::shutdown_signal().await;
        // The watcher holds the engine: stop it before the writer drains.
        if let Some((stop, handle)) = watcher {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    };
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("{listen}: {e}"))?;
        tracing::info!(listen = %listener.local_addr().map_err(|e| e.to_string())?, db = %db, "serving");
        tollgate::service::serve(listener, state, writer, shutdown).await.map_err(|e| e.to_string())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// A private scratch folder for benchmark databases.
fn tempfile_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("tollgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
