//! `tollgate serve`: the engine behind HTTP/1.1 + JSON (SPEC.md section 10).
//!
//! Checks run in a fixed order, each answering before anything is read or spent: the key
//! (401), its role (403), the body size (413, cut off, never read whole), the body's JSON and
//! types (400). What a refused client is still sending is drained, bounded (`linger`).
//! Engine work goes to the one writer thread (group commit), taken round robin across
//! tenants; hot swaps compile on a blocking thread and switch atomically. Connections are
//! bounded (`listen`).

mod config;
mod intake;
mod linger;
mod listen;
mod metrics;
mod watch;
mod writer;

pub use config::{Role, ServeConfig};
pub use metrics::Metrics;
pub use writer::{Writer, WRITER_THREAD};

use crate::engine::{Answer, Completion, Engine, Job, Reconciliation};
use crate::model::{CallResult, Resolution, Usage};
use crate::reason::Reason;
use crate::runtime::{LoadedPolicy, Runtime};
use crate::scenario::resolve_policy;
use crate::store::AnyStore;
use crate::validate;
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
    pub engine: Arc<Engine<AnyStore>>,
    pub writer: Writer,
    pub keys: std::collections::HashMap<String, Role>,
    pub metrics: Metrics,
    pub clock: Clock,
    /// Scenario files every candidate policy must pass before activation.
    pub verify_with: Vec<std::path::PathBuf>,
    /// Connections served at once (see `listen`).
    pub max_connections: usize,
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

/// The service's error answers: `{"outcome": "rejected", "reason": word}`.
struct Refusal {
    status: StatusCode,
    reason: &'static str,
    retry_after_ms: Option<u64>,
}

fn refuse(status: u16, reason: &'static str) -> Refusal {
    Refusal {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        reason,
        retry_after_ms: None,
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut body = json!({"outcome": "rejected", "reason": self.reason});
        if let Some(ms) = self.retry_after_ms {
            body["retry_after_ms"] = json!(ms);
        }
        with_retry_after(self.status, body, self.retry_after_ms)
    }
}

/// A JSON answer, with `Retry-After` (whole seconds, rounded up) when there is a retry-after.
fn with_retry_after(
    status: StatusCode,
    body: impl Serialize,
    retry_after_ms: Option<u64>,
) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(ms) = retry_after_ms {
        let secs = ms.div_ceil(1000);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    response
}

type Shared = Arc<AppState>;

/// The router of every endpoint.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/admit", post(admit))
        .route("/v1/operations/{key}/complete", post(complete))
        .route("/v1/operations/{key}/reconcile", post(reconcile))
        .route("/v1/operations/{key}", get(operation))
        .route("/v1/dispatch", post(dispatch))
        .route("/v1/admin/policy", get(policy_get).put(policy_put))
        .route("/v1/admin/policy/rollback", post(policy_rollback))
        .route("/v1/admin/downstream", post(downstream))
        .route("/v1/admin/inspect", get(inspect))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .fallback(|| async { refuse(404, "not_found") })
        .method_not_allowed_fallback(|| async { refuse(405, "method_not_allowed") })
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

/// The role of the request's bearer key: 401 when missing, unknown, of another scheme, or
/// given in more than one `Authorization` header.
fn role(s: &AppState, headers: &HeaderMap) -> Result<Role, Refusal> {
    // With two headers, a proxy in front might have checked the other key.
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let key = match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok().and_then(bearer),
        _ => None,
    };
    key.and_then(|k| s.keys.get(k))
        .cloned()
        .ok_or_else(|| refuse(401, "unauthorized"))
}

/// The token of a `Bearer <token>` credential; the scheme is case-insensitive (RFC 9110).
fn bearer(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`]; larger bodies are cut off
/// (what the client is still sending is drained by [`linger`]).
async fn read_body(headers: &HeaderMap, body: Body, limit: u64) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(refuse(413, "too_large"));
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let read = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Err(_) => Err(refuse(408, "timeout")),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(refuse(413, "too_large")),
        Ok(Err(_)) => Err(refuse(400, "invalid_request")),
    }
}

fn json_body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, Refusal> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    validate::from_object(&mut json)
        .and_then(|body| json.end().map(|()| body))
        .map_err(|_| refuse(400, "invalid_request"))
}

async fn submit(s: &AppState, job: Job) -> Result<Answer, Refusal> {
    s.writer.submit(job).await.map_err(|e| {
        tracing::error!(error = %e, "store failure");
        refuse(500, "internal")
    })
}

async fn admit(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let Role::Caller { tenant } = role(&s, &headers)? else {
        return Err(refuse(403, "forbidden"));
    };
    let limit = s.engine.config().max_request_bytes;
    let bytes = read_body(&headers, body, limit).await?;
    let mut obj = validate::object(&bytes).map_err(|r| refuse(r.http(), r.as_str()))?;
    match obj.get("tenant") {
        None => {
            obj.insert("tenant".into(), json!(tenant));
        }
        Some(Value::String(t)) if *t == tenant => {}
        Some(_) => return Err(refuse(403, "forbidden")),
    }
    let request = match validate::request(&Value::Object(obj), s.engine.config()) {
        Ok(r) => r,
        Err(reason) => {
            s.metrics
                .decisions
                .with_label_values(&["rejected", reason.as_str()])
                .inc();
            return Err(refuse(reason.http(), reason.as_str()));
        }
    };
    let Answer::Decision(d) = submit(
        &s,
        Job::Admit {
            request,
            now_ms: s.clock.now_ms(),
        },
    )
    .await?
    else {
        return Err(refuse(500, "internal"));
    };
    let reason = d.reason.map_or("", Reason::as_str);
    s.metrics
        .decisions
        .with_label_values(&[d.outcome.as_str(), reason])
        .inc();
    tracing::info!(tenant = %tenant, outcome = d.outcome.as_str(), reason, policy = d.policy.as_deref().unwrap_or(""), "decision");
    let status = StatusCode::from_u16(d.http).unwrap_or(StatusCode::OK);
    Ok(with_retry_after(status, &d, d.retry_after_ms))
}

/// Who may complete or reconcile: a caller for its own tenant, or a worker naming the tenant
/// in the body (and then only for jobs it claimed).
fn acting_for(
    role: Role,
    body_tenant: Option<String>,
) -> Result<(String, Option<String>), Refusal> {
    match role {
        Role::Caller { tenant } => match body_tenant {
            Some(t) if t != tenant => Err(refuse(403, "forbidden")),
            _ => Ok((tenant, None)),
        },
        Role::Worker { name } => Ok((
            body_tenant.ok_or_else(|| refuse(400, "invalid_request"))?,
            Some(name),
        )),
        Role::Admin => Err(refuse(403, "forbidden")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    #[serde(default)]
    tenant: Option<String>,
    result: CallResult,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    failure: Option<String>,
    #[serde(default)]
    provider_retry_after_ms: Option<u64>,
    #[serde(default)]
    result_ref: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    #[serde(default)]
    tenant: Option<String>,
    resolution: Resolution,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    result_ref: Option<String>,
}

fn completion_response(answer: Answer) -> Result<Response, Refusal> {
    let Answer::Completion(a) = answer else {
        return Err(refuse(500, "internal"));
    };
    let status = match a.error {
        None => StatusCode::OK,
        Some("unknown_operation") => return Err(refuse(404, "unknown_operation")),
        Some("not_claimed") => return Err(refuse(403, "not_claimed")),
        Some(_) => StatusCode::CONFLICT,
    };
    Ok((status, axum::Json(json!(a))).into_response())
}

/// An operation key from the path, percent-decoded; `None` when that is not UTF-8. It never
/// refuses by itself, so that the key and role checks answer first (see [`check_key`]).
struct OpKey(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for OpKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let key = Path::<String>::from_request_parts(parts, state).await;
        Ok(OpKey(key.ok().map(|Path(k)| k)))
    }
}

/// The operation key, when it is UTF-8 of 1 to 255 characters.
fn check_key(key: OpKey) -> Result<String, Refusal> {
    match key.0 {
        Some(k) if (1..=validate::MAX_KEY_CHARS).contains(&k.chars().count()) => Ok(k),
        _ => Err(refuse(400, "invalid_request")),
    }
}

/// The shared start of `complete` and `reconcile`: a caller or worker key, a bounded JSON
/// body, a valid operation key, and whom the report is for (tenant, and the worker if any).
async fn report<T: for<'de> Deserialize<'de>>(
    s: &AppState,
    key: OpKey,
    headers: &HeaderMap,
    body: Body,
    tenant_of: impl FnOnce(&mut T) -> Option<String>,
) -> Result<Report<T>, Refusal> {
    let role = role(s, headers)?;
    if role == Role::Admin {
        return Err(refuse(403, "forbidden"));
    }
    let bytes = read_body(headers, body, s.engine.config().max_request_bytes).await?;
    let mut b: T = json_body(&bytes)?;
    let key = check_key(key)?;
    let (tenant, worker) = acting_for(role, tenant_of(&mut b))?;
    Ok(Report {
        body: b,
        key,
        tenant,
        worker,
    })
}

/// What [`report`] checked: the body, the operation key, and whom the report is for.
struct Report<T> {
    body: T,
    key: String,
    tenant: String,
    worker: Option<String>,
}

async fn complete(
    State(s): State<Shared>,
    key: OpKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let r = report(&s, key, &headers, body, |b: &mut CompleteBody| {
        b.tenant.take()
    })
    .await?;
    let completion = Completion {
        tenant: r.tenant,
        key: r.key,
        result: r.body.result,
        usage: r.body.usage,
        failure: r.body.failure,
        provider_retry_after_ms: r.body.provider_retry_after_ms,
        result_ref: r.body.result_ref,
        worker: r.worker,
    };
    completion_response(
        submit(
            &s,
            Job::Complete {
                completion,
                now_ms: s.clock.now_ms(),
            },
        )
        .await?,
    )
}

async fn reconcile(
    State(s): State<Shared>,
    key: OpKey,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let r = report(&s, key, &headers, body, |b: &mut ReconcileBody| {
        b.tenant.take()
    })
    .await?;
    let reconciliation = Reconciliation {
        tenant: r.tenant,
        key: r.key,
        resolution: r.body.resolution.into(),
        usage: r.body.usage,
        result_ref: r.body.result_ref,
        worker: r.worker,
    };
    completion_response(
        submit(
            &s,
            Job::Reconcile {
                reconciliation,
                now_ms: s.clock.now_ms(),
            },
        )
        .await?,
    )
}

async fn operation(
    State(s): State<Shared>,
    key: OpKey,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let Role::Caller { tenant } = role(&s, &headers)? else {
        return Err(refuse(403, "forbidden"));
    };
    let key = check_key(key)?;
    let Answer::Operation(op) = submit(&s, Job::Operation { tenant, key }).await? else {
        return Err(refuse(500, "internal"));
    };
    let op = op.ok_or_else(|| refuse(404, "unknown_operation"))?;
    Ok(
        axum::Json(json!({"state": op.state, "attempt": op.attempt, "result_ref": op.result_ref}))
            .into_response(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DispatchBody {
    #[serde(default)]
    worker: Option<String>,
    count: u32,
}

async fn dispatch(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let Role::Worker { name } = role(&s, &headers)? else {
        return Err(refuse(403, "forbidden"));
    };
    let bytes = read_body(&headers, body, s.engine.config().max_request_bytes).await?;
    let b: DispatchBody = json_body(&bytes)?;
    if b.worker.as_ref().is_some_and(|w| *w != name) {
        return Err(refuse(403, "forbidden"));
    }
    let count = b.count.min(1000);
    let Answer::Dispatch(a) = submit(
        &s,
        Job::Dispatch {
            worker: name,
            count,
            now_ms: s.clock.now_ms(),
        },
    )
    .await?
    else {
        return Err(refuse(500, "internal"));
    };
    Ok(axum::Json(json!(a)).into_response())
}

fn admin(s: &AppState, headers: &HeaderMap) -> Result<(), Refusal> {
    match role(s, headers)? {
        Role::Admin => Ok(()),
        _ => Err(refuse(403, "forbidden")),
    }
}

async fn policy_get(State(s): State<Shared>, headers: HeaderMap) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    Ok(axum::Json(json!(s.engine.policy_identity())).into_response())
}

async fn policy_put(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let bytes = read_body(&headers, body, s.engine.config().max_policy_bytes).await?;
    let engine = s.engine.clone();
    let verify_with = s.verify_with.clone();
    let result =
        tokio::task::spawn_blocking(move || engine.swap_policy_verified(&bytes, &verify_with))
            .await
            .map_err(|_| refuse(500, "internal"))?;
    match result {
        Ok(identity) => {
            tracing::info!(name = %identity.name, version = %identity.version, sha256 = %identity.sha256, "policy activated");
            set_policy_gauge(&s.engine, &s.metrics);
            Ok(axum::Json(json!(identity)).into_response())
        }
        Err(e) => {
            tracing::warn!(error = %e, "policy refused");
            let body =
                json!({"outcome": "rejected", "reason": "policy_refused", "error": e.to_string()});
            Ok((StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response())
        }
    }
}

async fn policy_rollback(State(s): State<Shared>, headers: HeaderMap) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    match s.engine.rollback() {
        Ok(identity) => {
            tracing::info!(name = %identity.name, sha256 = %identity.sha256, "policy rolled back");
            set_policy_gauge(&s.engine, &s.metrics);
            Ok(axum::Json(json!(identity)).into_response())
        }
        Err(e) => {
            let body = json!({"outcome": "rejected", "reason": "no_previous_policy", "error": e.to_string()});
            Ok((StatusCode::CONFLICT, axum::Json(body)).into_response())
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DownstreamBody {
    available: bool,
}

async fn downstream(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let bytes = read_body(&headers, body, s.engine.config().max_request_bytes).await?;
    let b: DownstreamBody = json_body(&bytes)?;
    submit(
        &s,
        Job::SetDownstream {
            available: b.available,
        },
    )
    .await?;
    tracing::info!(available = b.available, "downstream marked");
    Ok(axum::Json(json!({"ok": true, "available": b.available})).into_response())
}

async fn inspect(State(s): State<Shared>, headers: HeaderMap) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let Answer::Inspection(i) = submit(
        &s,
        Job::Inspect {
            now_ms: s.clock.now_ms(),
        },
    )
    .await?
    else {
        return Err(refuse(500, "internal"));
    };
    Ok(axum::Json(json!(i)).into_response())
}

async fn metrics(State(s): State<Shared>) -> Result<Response, Refusal> {
    let mut last = s.metrics_text.lock().await;
    let text = match &*last {
        Some((made, text)) if made.elapsed() < METRICS_FRESH_FOR => text.clone(),
        _ => {
            refresh_levels(&s).await?;
            let text = Bytes::from(s.metrics.render());
            *last = Some((std::time::Instant::now(), text.clone()));
            text
        }
    };
    drop(last);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(response)
}

/// Reads the bucket, slot and queue levels from the store into their gauges.
async fn refresh_levels(s: &AppState) -> Result<(), Refusal> {
    if let Answer::Inspection(i) = submit(
        s,
        Job::Levels {
            now_ms: s.clock.now_ms(),
        },
    )
    .await?
    {
        for (name, credits) in &i.buckets {
            s.metrics
                .buckets
                .with_label_values(&[name.as_str()])
                .set(*credits as f64);
        }
        for (scope, n) in &i.slots {
            s.metrics
                .slots
                .with_label_values(&[scope.as_str()])
                .set(f64::from(*n));
        }
        for (tenant, n) in &i.queues {
            s.metrics
                .queues
                .with_label_values(&[tenant.as_str()])
                .set(f64::from(*n));
        }
    }
    Ok(())
}

fn set_policy_gauge(engine: &Engine<AnyStore>, metrics: &Metrics) {
    let id = engine.policy_identity();
    metrics.policy.reset();
    metrics
        .policy
        .with_label_values(&[id.name.as_str(), id.version.as_str(), id.sha256.as_str()])
        .set(1.0);
}

/// How often the SQLite WAL is copied back into the database file. Often enough that each
/// checkpoint's `fsync` stays small: a large one stalls the writer's commits that meet it.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Builds the engine, the writer and the shared state from a configuration and a store.
pub fn build(
    config: ServeConfig,
    store: AnyStore,
) -> Result<(Shared, std::thread::JoinHandle<()>), String> {
    build_with(config, store, Vec::new())
}

/// As [`build`], with scenario files every candidate policy must pass (`--verify-with`).
pub fn build_with(
    config: ServeConfig,
    mut store: AnyStore,
    verify_with: Vec<std::path::PathBuf>,
) -> Result<(Shared, std::thread::JoinHandle<()>), String> {
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
    let mut runtime = Runtime::new().map_err(|e| format!("starting wasmtime: {e:#}"))?;
    let histogram = metrics.policy_calls.clone();
    runtime.set_call_observer(Arc::new(move |d| histogram.observe(d.as_secs_f64())));
    let bytes = resolve_policy(&config.policy, None)?;
    let policy: LoadedPolicy = runtime
        .load(&bytes, config.engine.max_policy_bytes)
        .map_err(|e| e.to_string())?;
    let engine = Arc::new(Engine::new(config.engine, store, runtime, Arc::new(policy)));
    // The configured policy must pass the same checks as a swapped-in one; it is already
    // active, so nothing is switched (and there is nothing to roll back to yet).
    engine
        .check_verified(&bytes, &verify_with)
        .map_err(|e| format!("policy {}: {e}", config.policy))?;
    let (writer, handle) = Writer::start(engine.clone(), metrics.clone(), config.max_connections);
    let state = Arc::new(AppState {
        engine,
        writer,
        keys: config.keys,
        metrics,
        clock: Clock::default(),
        verify_with,
        max_connections: config.max_connections,
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
        state.metrics.connections.clone(),
    );
    loop {
        tokio::select! {
            (stream, place) = acceptor.accept() => {
                let _ = stream.set_nodelay(true);
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_header_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
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
        state.verify_with.clone(),
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
