//! Building what `tollgate serve` serves (the engine, the writer, the floor's state, the
//! gateway when configured), composing the service's and the gateway's routes over the
//! floor, and serving them until shutdown.

use crate::gateway::{Gateway, GatewayState};
use crate::http::{listen, AppState, Clock, Metrics, Shared, HEADER_TIMEOUT, MAX_HEAD_BYTES};
use crate::service::{set_policy_gauge, ServiceState};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tollgate::config::ConfigFile;
use tollgate::engine::{Adopted, EngineBuilder};
use tollgate::scenario::ScenarioVerifier;
use tollgate::store::AnyStore;
use tollgate::writer::Writer;

/// What [`build`] makes: the floor's state every handler shares, and the gateway's when
/// the configuration has one.
#[derive(Clone)]
pub struct Built {
    /// The engine, the writer, metrics and the clock.
    pub core: Shared,
    /// The service's state, standing on that floor.
    pub service: crate::service::Shared,
    /// The gateway's state, standing on the same floor.
    pub gateway: Option<crate::gateway::Shared>,
}

/// Fresh policy instances each policy keeps made ahead, by default, on a machine of
/// [`CORES_FOR_INSTANCES_AHEAD`] cores or more (see `Runtime::set_instances_ahead`).
const INSTANCES_AHEAD: usize = 8;
/// The fewest cores on which policies make instances ahead by default. The thread that
/// makes them takes the writer's instantiations and teardowns (15% of its time) at some
/// cost of its own: on two cores it took CPU time the HTTP side needed (the server's CPU
/// per admission 3–8% higher, the same rate), so there a decision makes its own.
const CORES_FOR_INSTANCES_AHEAD: usize = 4;

/// Fresh policy instances each policy keeps made ahead when none are asked for: see
/// [`CORES_FOR_INSTANCES_AHEAD`].
pub fn default_instances_ahead() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores >= CORES_FOR_INSTANCES_AHEAD {
        INSTANCES_AHEAD
    } else {
        0
    }
}

/// How often the SQLite WAL is copied back into the database file. Often enough that each
/// checkpoint's `fsync` stays small: a large one stalls the writer's commits that meet it.
pub(crate) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Builds the engine, the writer and the shared state from a configuration and a store.
pub fn build(
    config: ConfigFile,
    store: AnyStore,
) -> Result<(Built, std::thread::JoinHandle<()>), String> {
    build_with(config, store, Vec::new())
}

/// As [`build`], with scenario files every candidate policy must pass (`--verify-with`).
pub fn build_with(
    config: ConfigFile,
    store: AnyStore,
    verify_with: Vec<std::path::PathBuf>,
) -> Result<(Built, std::thread::JoinHandle<()>), String> {
    build_shards(config, vec![store], verify_with, default_instances_ahead())
}

/// As [`build_with`], with one writer shard per store: each an engine of its own, on its
/// own connection to one PostgreSQL store or on a handle of one SQLite file's connection
/// ([`AnyStore::into_shards`]), a tenant's work going to one of them (`serve --writers
/// N`). The first store's engine applies the configuration and serves the admin API. Each
/// shard's policy keeps `instances_ahead` fresh instances made ahead (`serve
/// --policy-instances-ahead`).
pub fn build_shards(
    config: ConfigFile,
    mut stores: Vec<AnyStore>,
    verify_with: Vec<std::path::PathBuf>,
    instances_ahead: usize,
) -> Result<(Built, std::thread::JoinHandle<()>), String> {
    if stores.is_empty() {
        return Err("no store to serve from".into());
    }
    if stores.len() > 1 && stores.iter().any(|s| matches!(s, AnyStore::Sqlite(_))) {
        return Err(
            "more than one writer on a SQLite file takes handles on its one connection (AnyStore::into_shards)"
                .into(),
        );
    }
    let more = stores.split_off(1);
    let mut store = stores.pop().expect("one store");
    let verifier = ScenarioVerifier::new(verify_with);
    let metrics = Metrics::new();
    // The writer commits; checkpoints (and their fsync) happen beside it.
    let held = metrics.wal_restart_seconds.clone();
    let observer: tollgate::store::sqlite::RestartObserver =
        Arc::new(move |d| held.observe(d.as_secs_f64()));
    let checkpointed = match &mut store {
        AnyStore::Sqlite(s) => s.checkpoint_in_background(CHECKPOINT_EVERY, Some(observer)),
        AnyStore::SqliteShard(s) => {
            s.with(|s| s.checkpoint_in_background(CHECKPOINT_EVERY, Some(observer)))
        }
        _ => Ok(()),
    };
    checkpointed.map_err(|e| format!("store: {e}"))?;
    let mut runtime = crate::runtime::runtime()?;
    runtime.set_instances_ahead(instances_ahead);
    let histogram = metrics.policy_calls.clone();
    runtime.set_call_observer(Arc::new(move |d| histogram.observe(d.as_secs_f64())));
    let gateway = Gateway::from_config(&config)?;
    let (policy_name, max_connections) = (config.policy.clone(), config.max_connections);
    let max_connections_per_address = config.max_connections_per_address;
    let verifier = Arc::new(verifier);
    let started = EngineBuilder::new(config.clone())
        .runtime(runtime.clone())
        .verifier(verifier.clone())
        .start(store, Clock::default().now_ms())
        .map_err(|e| e.to_string())?;
    let engine = Arc::new(started.engine);
    // The store's policy wins over the file's: a swap survives restarts, and replicas agree.
    match started.adopted {
        Adopted::Seeded => {
            tracing::info!(policy = %policy_name, "the store had no policy: it now keeps the configuration's")
        }
        Adopted::Same => {
            tracing::info!(policy = %policy_name, "the configuration's policy is the store's active policy")
        }
        Adopted::FromStore { stored, configured } => tracing::info!(
            active = %stored.name, active_sha256 = %stored.sha256,
            configured = %configured.name, configured_sha256 = %configured.sha256,
            "the configuration's policy is unchanged since the last start; the policy swapped in at run time stays active"
        ),
        Adopted::Installed { replaced } => tracing::info!(
            policy = %policy_name, replaced_sha256 = %replaced,
            "the configuration's policy changed since the last start: installed as the active policy (rollback returns to the one it replaced)"
        ),
    }
    // The file's tenants and keys are applied at every start; those made through the admin
    // API are kept beside them.
    let applied = started.applied;
    tracing::info!(
        seeded = applied.seeded,
        tenants_created = ?applied.tenants_created,
        tenants_updated = ?applied.tenants_updated,
        tenants_unchanged = applied.tenants_unchanged,
        tenants_removed = ?applied.tenants_removed,
        api_tenants = applied.api_tenants,
        keys_added = applied.keys_added,
        keys_updated = applied.keys_updated,
        keys_revoked = applied.keys_revoked,
        api_keys = applied.api_keys,
        "configuration applied"
    );
    if !applied.tenants_kept_busy.is_empty() {
        tracing::warn!(tenants = ?applied.tenants_kept_busy, "tenants removed from the configuration still have work in flight: kept until a start finds them idle");
    }
    // The other shards find the store as the first left it: nothing more to apply.
    let mut engines = vec![engine.clone()];
    for store in more {
        let started = EngineBuilder::new(config.clone())
            .runtime(runtime.clone())
            .verifier(verifier.clone())
            .start(store, Clock::default().now_ms())
            .map_err(|e| e.to_string())?;
        engines.push(Arc::new(started.engine));
    }
    if engines.len() > 1 {
        tracing::info!(
            writers = engines.len(),
            "writer shards: each tenant's work goes to one, the budgets tenants share are leased"
        );
    }
    let observer = Arc::new(metrics.clone());
    let (writer, handle) = Writer::start_shards(engines.clone(), max_connections, observer);
    let state = Arc::new(AppState {
        engine,
        engines,
        writer,
        metrics,
        clock: Clock::default(),
        max_connections,
        max_connections_per_address,
    });
    let service = Arc::new(ServiceState::new(state.clone(), verifier));
    set_policy_gauge(&state.engine, &state.metrics);
    let gateway = gateway.map(|gateway| {
        Arc::new(GatewayState {
            core: state.clone(),
            gateway,
        })
    });
    let built = Built {
        core: state,
        service,
        gateway,
    };
    Ok((built, handle))
}

/// Every route: the service's, the gateway's beside them when configured, each response
/// counted and what a refused client still sends drained (`linger`).
pub fn router(built: &Built) -> Router {
    let routes = crate::service::router(built.service.clone());
    let routes = match &built.gateway {
        Some(g) => routes.merge(crate::gateway::router(g.clone())),
        None => routes,
    };
    routes
        .layer(axum::middleware::from_fn_with_state(
            built.core.clone(),
            count_responses,
        ))
        .layer(axum::middleware::from_fn(crate::http::linger::linger))
        .layer(axum::middleware::from_fn(traced))
}

/// Each request inside its server span (a disabled one when nothing is exported), which
/// records the status it was answered with.
async fn traced(req: Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    if !tracing::span_enabled!(target: crate::telemetry::TARGET, tracing::Level::INFO) {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string());
    let span = crate::telemetry::server_span(
        req.method(),
        req.uri().path(),
        route.as_deref(),
        req.headers(),
    );
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    crate::telemetry::number(
        &span,
        "http.response.status_code",
        u64::from(status.as_u16()),
    );
    if status.is_server_error() {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.set_status(opentelemetry::trace::Status::error(status.to_string()));
    }
    response
}

async fn count_responses(
    State(s): State<Shared>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(req).await;
    s.metrics
        .responses
        .with_label_values(&[response.status().as_str()])
        .inc();
    response
}

/// Serves until `shutdown` resolves: then stops accepting, lets requests in flight finish,
/// and returns once the writer has committed everything it was given.
pub async fn serve(
    listener: tokio::net::TcpListener,
    built: Built,
    writer_thread: std::thread::JoinHandle<()>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = router(&built);
    let state = built.core.clone();
    // Budget alerts are posted from the store's outbox while the server runs.
    let alert_sender = (!state.engine.config().alerts.is_empty())
        .then(|| tokio::spawn(crate::service::alerts::send_forever(state.clone())));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut acceptor = listen::Acceptor::new(
        listener,
        state.max_connections,
        state.max_connections_per_address,
        state.metrics.connections.clone(),
    );
    let mut writer_check = tokio::time::interval(Duration::from_millis(200));
    let mut writer_died = false;
    loop {
        tokio::select! {
            _ = writer_check.tick() => {
                if writer_thread.is_finished() || !state.writer.is_running() {
                    tracing::error!("the writer thread stopped: shutting down to be restarted");
                    writer_died = true;
                    break;
                }
            }
            (stream, place) = acceptor.accept() => {
                let _ = stream.set_nodelay(true);
                let tower = hyper_util::service::TowerToHyperService::new(app.clone());
                // A whole request head arrived: this connection is no longer sheddable.
                let head_seen = place.head_seen.clone();
                let service = hyper::service::service_fn(move |req| {
                    head_seen.store(true, std::sync::atomic::Ordering::Relaxed);
                    hyper::service::Service::call(&tower, req)
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_header_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                let shed = place.shed.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = conn => {}
                        _ = shed.notified() => {}
                    }
                    drop(place);
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(acceptor);
    if let Some(sender) = alert_sender {
        sender.abort();
    }
    tracing::info!("shutting down: finishing requests in flight");
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after 30 s; closing");
    }
    drop(app);
    // The last handles to the writer go with the state; then it drains, commits and ends.
    drop(state);
    drop(built);
    tokio::task::spawn_blocking(move || writer_thread.join())
        .await
        .ok();
    if writer_died {
        return Err(std::io::Error::other(
            "the writer thread stopped; nothing more could be committed",
        ));
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
