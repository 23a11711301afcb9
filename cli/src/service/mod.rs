//! `tollgate serve`: the engine behind HTTP/1.1 + JSON (`docs/http-api.md`).
//!
//! Checks run in a fixed order, each answering before anything is read or spent: the key
//! (401), its role (403), the body size (413, cut off, never read whole), the body's JSON and
//! types (400). What a refused client is still sending is drained, bounded (`linger`).
//! Engine work goes to the library's one writer thread (group commit), taken round robin
//! across tenants; hot swaps compile on a blocking thread and switch atomically. Connections are
//! bounded (`listen`).

mod admin;
mod auth;
mod body;
mod directory;
mod linger;
mod listen;
mod metrics;
mod operations;
mod refusal;
mod server;
mod ui;
mod watch;
mod worker;

pub use metrics::Metrics;
pub(crate) use operations::STORE_RETRY_AFTER_MS;
pub use server::{build, build_with, serve, shutdown_signal, watch_policy};
pub use tollgate::config::{ConfigFile, Role};
pub use tollgate::writer::{Failure, Writer, WRITER_THREAD};

use admin::*;
pub(crate) use auth::role;
use auth::*;
pub(crate) use body::read_body;
use body::*;
use directory::*;
use operations::*;
use refusal::*;
use worker::*;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate::engine::{Completion, CompletionAnswer, CompletionError, Engine, Reconciliation};
use tollgate::model::{CallResult, Resolution, Usage};
use tollgate::reason::Reason;
use tollgate::scenario::ScenarioVerifier;
use tollgate::store::AnyStore;
use tollgate::validate;

/// How long a client may take to send its body (slow bodies are cut off with 408).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (request line and headers) a connection buffers: past it the HTTP
/// stack answers 431. hyper's default, about 400 KiB, would let a client holding the
/// permitted connections open make the server hold hundreds of MiB of headers.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// A wall clock in Unix milliseconds that never steps backwards.
#[derive(Default)]
pub struct Clock {
    last: AtomicI64,
}

impl Clock {
    pub fn now_ms(&self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        prev.max(wall)
    }
}

/// What every handler shares.
pub struct AppState {
    /// The OpenAI-compatible gateway, when the configuration has one.
    pub gateway: Option<crate::gateway::Gateway>,
    pub engine: Arc<Engine<AnyStore>>,
    pub writer: Writer,
    pub metrics: Metrics,
    pub clock: Clock,
    /// What every candidate policy must pass before activation (`--verify-with`).
    pub verifier: Arc<ScenarioVerifier>,
    /// Connections served at once (see `listen`).
    pub max_connections: usize,
    /// Connections one client address may hold.
    pub max_connections_per_address: usize,
    /// The last `/metrics` text and when it was made (see [`METRICS_FRESH_FOR`]); held
    /// while one request makes it, so that the others wait for it instead of each making
    /// their own.
    pub metrics_text: tokio::sync::Mutex<Option<(std::time::Instant, Bytes)>>,
}

/// How long `/metrics` answers with the text it last made. It needs no key, and making it
/// reads the bucket, slot and queue levels through the writer (about 1.2 ms of the
/// writer's time with 1,000 tenants) and renders every series (about 1.6 ms of CPU): a
/// client asking in a loop could otherwise take the writer and the cores away from
/// admissions. Scrapers ask every few seconds; a second behind costs them nothing.
pub const METRICS_FRESH_FOR: Duration = Duration::from_secs(1);

/// The state every handler shares.
pub type Shared = Arc<AppState>;

/// The router of the `--metrics-listen` address: `/metrics` with every series, no key.
pub fn metrics_router(state: &Shared) -> Router {
    Router::new()
        .route("/metrics", get(private_metrics))
        .fallback(|| async { refuse(Rejection::NotFound) })
        .with_state(Arc::downgrade(state))
}

/// The router of every endpoint.
pub fn router(state: Shared) -> Router {
    let routes = Router::new();
    let routes = match state.gateway {
        Some(_) => crate::gateway::routes(routes),
        None => routes,
    };
    routes
        .route("/v1/admit", post(admit))
        .route("/v1/operations/{key}/complete", post(complete))
        .route("/v1/operations/{key}/reconcile", post(reconcile))
        .route("/v1/operations/{key}", get(operation))
        .route("/v1/dispatch", post(dispatch))
        .route("/v1/admin/policy", get(policy_get).put(policy_put))
        .route("/v1/admin/policy/rollback", post(policy_rollback))
        .route(
            "/v1/admin/policy/shadow",
            get(shadow_get).put(shadow_put).delete(shadow_delete),
        )
        .route("/v1/admin/tenants", get(tenants_list))
        .route(
            "/v1/admin/tenants/{tenant}",
            get(tenant_get).put(tenant_put).delete(tenant_delete),
        )
        .route("/v1/admin/keys", get(keys_list).post(keys_create))
        .route("/v1/admin/keys/{id}", axum::routing::delete(key_delete))
        .route("/v1/admin/downstream", post(downstream))
        .route("/v1/admin/inspect", get(inspect))
        .route("/v1/admin/operations", get(operations_list))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/ui", get(ui::page))
        .fallback(|| async { refuse(Rejection::NotFound) })
        .method_not_allowed_fallback(|| async { refuse(Rejection::MethodNotAllowed) })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_responses,
        ))
        .layer(axum::middleware::from_fn(linger::linger))
        .with_state(state)
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
