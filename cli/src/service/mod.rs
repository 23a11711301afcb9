//! `tollgate serve`'s own API: the engine behind HTTP/1.1 + JSON (`docs/http-api.md`),
//! standing on the HTTP floor (`crate::http`).
//!
//! Checks run in a fixed order, each answering before anything is read or spent: the key
//! (401), its role (403), the body size (413, cut off, never read whole), the body's JSON and
//! types (400). What a refused client is still sending is drained, bounded (`linger`).
//! Engine work goes to the library's one writer thread (group commit), taken round robin
//! across tenants; hot swaps compile on a blocking thread and switch atomically. Connections
//! are bounded (`listen`).
//!
//! Handlers by role: `operations` (callers and workers on one operation), `worker`
//! (dispatch), `admin` (policy, downstream, inspection, metrics), `directory` (tenants and
//! keys); `ui` (the dashboard) and `watch` (the policy file watcher).

mod admin;
pub mod alerts;
mod directory;
mod groups;
mod operations;
mod spend;
mod ui;
mod watch;
mod worker;

pub(crate) use admin::set_policy_gauge;

use crate::http::refusal::{refuse, Rejection};
use crate::http::AppState;
use axum::body::Bytes;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use std::time::Duration;
use tollgate::scenario::ScenarioVerifier;

/// What the service's handlers share: the floor's state and the service's own.
pub struct ServiceState {
    /// The engine, the writer, metrics and the clock, shared with the gateway.
    pub core: crate::http::Shared,
    /// What every candidate policy must pass before activation (`--verify-with`).
    pub verifier: Arc<ScenarioVerifier>,
    /// The last `/metrics` text and when it was made (see [`METRICS_FRESH_FOR`]); held
    /// while one request makes it, so that the others wait for it instead of each making
    /// their own.
    pub metrics_text: tokio::sync::Mutex<Option<(std::time::Instant, Bytes)>>,
}

impl ServiceState {
    /// The service's state over `core`.
    pub fn new(core: crate::http::Shared, verifier: Arc<ScenarioVerifier>) -> Self {
        ServiceState {
            core,
            verifier,
            metrics_text: tokio::sync::Mutex::new(None),
        }
    }
}

/// The floor's state is read through the service's (`s.engine`, `s.writer`, …).
impl std::ops::Deref for ServiceState {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.core
    }
}

/// The service's state, shared by its handlers.
pub type Shared = Arc<ServiceState>;

/// How long `/metrics` answers with the text it last made. It needs no key, and making it
/// reads the bucket, slot and queue levels through the writer (about 1.2 ms of the
/// writer's time with 1,000 tenants) and renders every series (about 1.6 ms of CPU): a
/// client asking in a loop could otherwise take the writer and the cores away from
/// admissions. Scrapers ask every few seconds; a second behind costs them nothing.
pub const METRICS_FRESH_FOR: Duration = Duration::from_secs(1);

/// The router of the `--metrics-listen` address: `/metrics` with every series, no key.
pub fn metrics_router(state: &Shared) -> Router {
    Router::new()
        .route("/metrics", get(admin::private_metrics))
        .fallback(|| async { refuse(Rejection::NotFound) })
        .with_state(std::sync::Arc::downgrade(state))
}

/// The service's routes, with the fallbacks every unknown path and method answers.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/admit", post(operations::admit))
        .route("/v1/operations/{key}/complete", post(operations::complete))
        .route(
            "/v1/operations/{key}/reconcile",
            post(operations::reconcile),
        )
        .route("/v1/operations/{key}", get(operations::operation))
        .route("/v1/dispatch", post(worker::dispatch))
        .route(
            "/v1/admin/policy",
            get(admin::policy_get).put(admin::policy_put),
        )
        .route("/v1/admin/policy/rollback", post(admin::policy_rollback))
        .route(
            "/v1/admin/policy/shadow",
            get(admin::shadow_get)
                .put(admin::shadow_put)
                .delete(admin::shadow_delete),
        )
        .route("/v1/admin/tenants", get(directory::tenants_list))
        .route(
            "/v1/admin/tenants/{tenant}",
            get(directory::tenant_get)
                .put(directory::tenant_put)
                .delete(directory::tenant_delete),
        )
        .route("/v1/admin/spend", get(spend::spend))
        .route("/v1/admin/groups", get(groups::groups_list))
        .route(
            "/v1/admin/groups/{group}",
            get(groups::group_get)
                .put(groups::group_put)
                .delete(groups::group_delete),
        )
        .route(
            "/v1/admin/keys",
            get(directory::keys_list).post(directory::keys_create),
        )
        .route(
            "/v1/admin/keys/{id}",
            axum::routing::delete(directory::key_delete),
        )
        .route("/v1/admin/downstream", post(admin::downstream))
        .route("/v1/admin/inspect", get(admin::inspect))
        .route("/v1/admin/operations", get(admin::operations_list))
        .route("/healthz", get(admin::healthz))
        .route("/metrics", get(admin::metrics))
        .route("/ui", get(ui::page))
        .fallback(|| async { refuse(Rejection::NotFound) })
        .method_not_allowed_fallback(|| async { refuse(Rejection::MethodNotAllowed) })
        .with_state(state)
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
