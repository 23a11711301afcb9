//! Building the service (store, policy, writer) and serving it until shutdown.

use super::*;
use tollgate::engine::{Adopted, DirectoryAdopted};

/// How often the SQLite WAL is copied back into the database file. Often enough that each
/// checkpoint's `fsync` stays small: a large one stalls the writer's commits that meet it.
pub(super) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Builds the engine, the writer and the shared state from a configuration and a store.
pub fn build(
    config: ConfigFile,
    store: AnyStore,
) -> Result<(Shared, std::thread::JoinHandle<()>), String> {
    build_with(config, store, Vec::new())
}

/// As [`build`], with scenario files every candidate policy must pass (`--verify-with`).
pub fn build_with(
    config: ConfigFile,
    mut store: AnyStore,
    verify_with: Vec<std::path::PathBuf>,
) -> Result<(Shared, std::thread::JoinHandle<()>), String> {
    let verifier = ScenarioVerifier::new(verify_with);
    let metrics = Metrics::new();
    if let AnyStore::Sqlite(s) = &mut store {
        // The writer commits; checkpoints (and their fsync) happen beside it.
        let held = metrics.wal_restart_seconds.clone();
        s.checkpoint_in_background(
            CHECKPOINT_EVERY,
            Some(Arc::new(move |d| held.observe(d.as_secs_f64()))),
        )
        .map_err(|e| format!("store: {e}"))?;
    }
    let mut runtime = crate::runtime::runtime()?;
    let histogram = metrics.policy_calls.clone();
    runtime.set_call_observer(Arc::new(move |d| histogram.observe(d.as_secs_f64())));
    let gateway = crate::gateway::Gateway::from_config(&config)?;
    let bytes = builtin::resolve(&config.policy, None)?;
    let policy: LoadedPolicy = runtime
        .load(&bytes, config.engine.policy_limits())
        .map_err(|e| e.to_string())?;
    let engine = Arc::new(Engine::new(config.engine, store, runtime, Arc::new(policy)));
    // The configured policy must pass the same checks as a swapped-in one; it is already
    // active, so nothing is switched (and there is nothing to roll back to yet).
    engine
        .check_verified(&bytes, &verifier)
        .map_err(|e| format!("policy {}: {e}", config.policy))?;
    // The store's policy wins over the file's: a swap survives restarts, and replicas agree.
    match engine
        .adopt_stored_policy(&bytes)
        .map_err(|e| format!("the store's policy: {e}"))?
    {
        Adopted::Seeded => {
            tracing::info!(policy = %config.policy, "the store had no policy: it now keeps the configuration's")
        }
        Adopted::Same => {}
        Adopted::FromStore { stored, configured } => tracing::warn!(
            active = %stored.name, active_sha256 = %stored.sha256,
            configured = %configured.name, configured_sha256 = %configured.sha256,
            "the store's policy differs from the configuration's; the store's is active"
        ),
    }
    // So is its directory: tenants and keys added at run time are kept and shared.
    match engine
        .adopt_directory(&config.keys, &config.worker_renames)
        .map_err(|e| format!("the store's tenants and keys: {e}"))?
    {
        DirectoryAdopted::Seeded => tracing::info!(
            tenants = engine.config().tenants.len(),
            keys = config.keys.len(),
            "the store had no tenants or keys: it now keeps the configuration's"
        ),
        DirectoryAdopted::FromStore { tenants_differ } => {
            if tenants_differ {
                tracing::warn!("the store's tenants differ from the configuration's; the store's are in force (tollgate tenants list)")
            }
        }
    }
    let (writer, handle) = Writer::start(engine.clone(), metrics.clone(), config.max_connections);
    let state = Arc::new(AppState {
        gateway,
        engine,
        writer,
        metrics,
        clock: Clock::default(),
        verifier: Arc::new(verifier),
        max_connections: config.max_connections,
        max_connections_per_address: config.max_connections_per_address,
        metrics_text: tokio::sync::Mutex::new(None),
    });
    set_policy_gauge(&state.engine, &state.metrics);
    Ok((state, handle))
}

/// Serves until `shutdown` resolves: then stops accepting, lets requests in flight finish,
/// and returns once the writer has committed everything it was given.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Shared,
    writer_thread: std::thread::JoinHandle<()>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let app = router(state.clone());
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

/// Starts watching a policy file or folder; the returned flag stops the watcher.
pub fn watch_policy(
    state: &Shared,
    path: std::path::PathBuf,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handle = watch::spawn(
        state.engine.clone(),
        state.metrics.clone(),
        path,
        state.verifier.clone(),
        stop.clone(),
    );
    (stop, handle)
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
