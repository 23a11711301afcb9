//! `tollgate serve`: the engine behind HTTP until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;
use tollgate::config::ConfigFile;
use tollgate::store::AnyStore;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Configuration file (docs/configuration.md).
    #[arg(long)]
    config: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// SQLite database file (created if missing), or a `postgres://` URL for a store shared by replicas.
    #[arg(long, default_value = "tollgate.db")]
    db: String,
    /// Log lines as `text` or `json` (one object per line, with `trace_id` and `span_id`
    /// inside a traced request).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// The same as `--log-format json`.
    #[arg(long)]
    json_logs: bool,
    /// Watch this policy file (or the newest `.wasm` in this folder) and activate it when it changes.
    #[arg(long)]
    watch_policy: Option<PathBuf>,
    /// Scenario files or folders every candidate policy must pass before activation.
    #[arg(long)]
    verify_with: Vec<PathBuf>,
    /// Also serve `/metrics` with every series, per-tenant ones included, on this address
    /// without a key (for a scraper on a private network).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Writer shards, each with its own engine, policy instance and batches; a tenant's
    /// work goes to one. On PostgreSQL each has a connection of its own and the budgets
    /// tenants share are leased between them; on SQLite they take turns on the file's one
    /// connection. Default: 1 on SQLite; on PostgreSQL a third of the machine's cores (at
    /// least 1, at most 8).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    writers: Option<u16>,
    /// Fresh instances each writer's policy keeps made ahead by a thread beside it, which
    /// also drops the used ones, so that a decision neither instantiates nor resets memory
    /// on the writer (every call still runs in a fresh instance); 0 for none. Default: 8
    /// on a machine of 4 cores or more, else 0.
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=64))]
    policy_instances_ahead: Option<u16>,
}

/// Writer shards on a shared store when none are asked for: a third of the machine's
/// cores, at least 1 and at most [`MOST_DEFAULT_WRITERS`]. A writer's work is about a third
/// of an admission's CPU (the rest is HTTP, parsing and answering), so a third of the
/// cores keeps the writers and the rest equally busy.
fn default_writers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 3).clamp(1, MOST_DEFAULT_WRITERS)
}

/// The most writer shards chosen by default: each holds a connection to the store and
/// leases of the budgets tenants share.
const MOST_DEFAULT_WRITERS: usize = 8;

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn run(args: ServeArgs) -> Result<ExitCode, String> {
    let ServeArgs {
        config,
        listen,
        db,
        log_format,
        json_logs,
        watch_policy,
        verify_with,
        metrics_listen,
        writers,
        policy_instances_ahead,
    } = args;
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let config = ConfigFile::load(&config).map_err(|e| e.to_string())?;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Requests hand their log lines to a writer thread (flushed when `_flush` drops at exit);
    // if that thread falls far behind, lines are dropped rather than requests slowed. The
    // thread flushes whenever it has emptied its queue, so the buffer only joins the lines
    // that were waiting together into one write instead of a system call per line.
    let stderr = std::io::BufWriter::with_capacity(64 << 10, std::io::stderr());
    let (log, _flush) = tracing_appender::non_blocking(stderr);
    // Log lines never see the spans meant for traces (their own layer takes those).
    let not_traces =
        tracing_subscriber::filter::filter_fn(|m| m.target() != tollgate_cli::telemetry::TARGET);
    let lines = tracing_subscriber::fmt::layer().with_writer(log);
    let lines = if log_format == LogFormat::Json || json_logs {
        lines
            .event_format(tollgate_cli::telemetry::logs::JsonLines)
            .with_filter(filter)
            .with_filter(not_traces)
            .boxed()
    } else {
        lines
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .with_filter(not_traces)
            .boxed()
    };
    let registry = tracing_subscriber::registry().with(lines);
    let (_telemetry, traces) = match tollgate_cli::telemetry::start(&config.telemetry)? {
        Some((telemetry, layer)) => (Some(telemetry), Some(layer)),
        None => (None, None),
    };
    registry.with(traces).init();
    if let Some(t) = &_telemetry {
        tracing::info!(endpoint = %t.endpoint, "exporting traces");
    }
    let store = AnyStore::open(&db).map_err(|e| format!("{db}: {e}"))?;
    let writers = match (writers, &store) {
        (Some(n), _) => usize::from(n),
        (None, AnyStore::Sqlite(_)) => 1,
        (None, _) => default_writers(),
    };
    if writers > 1 && matches!(store, AnyStore::Sqlite(_)) {
        tracing::info!(
            writers,
            "writer shards on a SQLite file take turns on its one connection: each decides inside the file's one transaction at a time, so they add no throughput over one writer"
        );
    }
    let mut stores = if writers == 1 {
        vec![store]
    } else {
        store.into_shards(writers)
    };
    while stores.len() < writers {
        stores.push(AnyStore::open(&db).map_err(|e| format!("{db}: {e}"))?);
    }
    let instances_ahead = policy_instances_ahead
        .map_or_else(tollgate_cli::server::default_instances_ahead, usize::from);
    let (state, writer) =
        tollgate_cli::server::build_shards(config, stores, verify_with, instances_ahead)?;
    let watcher = watch_policy.map(|path| {
        tracing::info!(path = %path.display(), "watching the policy");
        tollgate_cli::service::watch_policy(&state.service, path)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let shutdown = async move {
        tollgate_cli::server::shutdown_signal().await;
        // The watcher holds the engine: stop it before the writer drains.
        if let Some((stop, handle)) = watcher {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    };
    let metrics_router = tollgate_cli::service::metrics_router(&state.service);
    runtime.block_on(async move {
        if let Some(address) = metrics_listen {
            let listener = tokio::net::TcpListener::bind(&address).await.map_err(|e| format!("{address}: {e}"))?;
            tracing::info!(listen = %listener.local_addr().map_err(|e| e.to_string())?, "serving metrics");
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, metrics_router).await {
                    tracing::error!(error = %e, "the metrics listener failed");
                }
            });
        }
        let listener = tokio::net::TcpListener::bind(&listen).await.map_err(|e| format!("{listen}: {e}"))?;
        tracing::info!(listen = %listener.local_addr().map_err(|e| e.to_string())?, db = %db, "serving");
        tollgate_cli::server::serve(listener, state, writer, shutdown).await.map_err(|e| e.to_string())
    })?;
    Ok(ExitCode::SUCCESS)
}
