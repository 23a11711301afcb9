//! The operators' endpoints: the policy (read, swap, roll back), downstream status,
//! inspection, and `/metrics`.

use super::METRICS_FRESH_FOR;
use super::{ServiceState, Shared};
use crate::http::auth::admin;
use crate::http::body::{json_body, read_body};
use crate::http::refusal::{refuse, refuse_until, Refusal, Rejection};
use crate::http::STORE_RETRY_AFTER_MS;
use crate::http::{AppState, Metrics};
use crate::service::operations::store_refusal;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tollgate::engine::Engine;
use tollgate::engine::{Page, MOST_PER_PAGE};
use tollgate::model::OpState;
use tollgate::store::AnyStore;

/// `GET /healthz`: ok while the writer takes jobs and the store writes; 503
/// `store_unavailable` with the store's reason while it cannot write (its disk full, its
/// connection lost: ok again by itself once it writes), 503 `writer_stopped` once the
/// writer has stopped (the process then exits non-zero, for a supervisor to restart it).
pub(super) async fn healthz(State(s): State<Shared>) -> Response {
    if !s.writer.is_running() {
        return refuse(Rejection::WriterStopped).into_response();
    }
    match s.writer.store_trouble() {
        None => "ok\n".into_response(),
        Some(t) => {
            let mut refusal = refuse_until(Rejection::StoreUnavailable, STORE_RETRY_AFTER_MS);
            refusal.message = format!("{} ({}: {})", refusal.message, t.kind, t.message);
            refusal.into_response()
        }
    }
}

pub(super) async fn policy_get(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    Ok(axum::Json(json!(s.engine.policy_identity())).into_response())
}

pub(super) async fn policy_put(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let bytes = read_body(&headers, body, s.engine.config().max_policy_bytes).await?;
    let engine = s.engine.clone();
    let verifier = s.verifier.clone();
    let result =
        tokio::task::spawn_blocking(move || engine.swap_policy_verified(&bytes, verifier.as_ref()))
            .await
            .map_err(|_| refuse(Rejection::Internal))?;
    match result {
        Ok(identity) => {
            tracing::info!(name = %identity.name, version = %identity.version, sha256 = %identity.sha256, "policy activated");
            s.take_up_changes().await;
            set_policy_gauge(&s.engine, &s.metrics);
            Ok(axum::Json(json!(identity)).into_response())
        }
        Err(e @ tollgate::engine::SwapError::Store(_)) => {
            tracing::warn!(error = %e, "the store could not record the policy");
            Err(refuse(Rejection::StoreUnavailable))
        }
        Err(e) => {
            tracing::warn!(error = %e, "policy refused");
            let body =
                json!({"outcome": "rejected", "reason": "policy_refused", "error": e.to_string()});
            Ok((StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response())
        }
    }
}

pub(super) async fn policy_rollback(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let engine = s.engine.clone();
    let rolled = tokio::task::spawn_blocking(move || engine.rollback())
        .await
        .map_err(|_| refuse(Rejection::Internal))?;
    match rolled {
        Ok(identity) => {
            tracing::info!(name = %identity.name, sha256 = %identity.sha256, "policy rolled back");
            s.take_up_changes().await;
            set_policy_gauge(&s.engine, &s.metrics);
            Ok(axum::Json(json!(identity)).into_response())
        }
        Err(e @ (tollgate::engine::SwapError::Store(_) | tollgate::engine::SwapError::Load(_))) => {
            tracing::warn!(error = %e, "rollback failed");
            let body =
                json!({"outcome": "rejected", "reason": "rollback_failed", "error": e.to_string()});
            Ok((StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response())
        }
        Err(e) => {
            let body = json!({"outcome": "rejected", "reason": "no_previous_policy", "error": e.to_string()});
            Ok((StatusCode::CONFLICT, axum::Json(body)).into_response())
        }
    }
}

/// `PUT /v1/admin/policy/shadow?sample=F`: the share of live admissions the shadow is asked about.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShadowQuery {
    sample: Option<f64>,
}

pub(super) async fn shadow_put(
    State(s): State<Shared>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<ShadowQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let sample = query
        .map_err(|_| refuse(Rejection::InvalidRequest))?
        .0
        .sample
        .unwrap_or(1.0);
    let bytes = read_body(&headers, body, s.engine.config().max_policy_bytes).await?;
    let engine = s.engine.clone();
    let verifier = s.verifier.clone();
    let result = tokio::task::spawn_blocking(move || {
        engine.install_shadow(&bytes, verifier.as_ref(), sample)
    })
    .await
    .map_err(|_| refuse(Rejection::Internal))?;
    match result {
        Ok(identity) => {
            tracing::info!(name = %identity.name, sha256 = %identity.sha256, sample, "shadow policy installed");
            s.take_up_changes().await;
            Ok(axum::Json(json!({"shadow": identity, "sample": sample})).into_response())
        }
        Err(e @ tollgate::engine::SwapError::Store(_)) => {
            tracing::warn!(error = %e, "the store could not record the policy");
            Err(refuse(Rejection::StoreUnavailable))
        }
        Err(e) => {
            tracing::warn!(error = %e, "shadow policy refused");
            let body =
                json!({"outcome": "rejected", "reason": "policy_refused", "error": e.to_string()});
            Ok((StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response())
        }
    }
}

pub(super) async fn shadow_get(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    match s.shadow_report() {
        Some(report) => Ok(axum::Json(json!(report)).into_response()),
        None => Err(refuse(Rejection::NoShadowPolicy)),
    }
}

pub(super) async fn shadow_delete(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let engine = s.engine.clone();
    let removed = tokio::task::spawn_blocking(move || engine.remove_shadow())
        .await
        .map_err(|_| refuse(Rejection::Internal))?
        .map_err(|_| refuse(Rejection::StoreUnavailable))?;
    match removed {
        Some(identity) => {
            tracing::info!(name = %identity.name, sha256 = %identity.sha256, "shadow policy removed");
            s.take_up_changes().await;
            s.metrics.shadow.reset();
            Ok(axum::Json(json!({"removed": identity})).into_response())
        }
        None => Err(refuse(Rejection::NoShadowPolicy)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DownstreamBody {
    available: bool,
}

pub(super) async fn downstream(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let bytes = read_body(&headers, body, s.engine.config().max_request_bytes).await?;
    let b: DownstreamBody = json_body(&bytes)?;
    s.writer
        .set_downstream(b.available)
        .await
        .map_err(store_refusal)?;
    tracing::info!(available = b.available, "downstream marked");
    Ok(axum::Json(json!({"ok": true, "available": b.available})).into_response())
}

/// `?limit=N&after=CURSOR` (and `state=` for `/v1/admin/operations`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageQuery {
    limit: Option<u32>,
    after: Option<String>,
    state: Option<String>,
}

/// The page a query asks for (at most `MOST_PER_PAGE`, the default), and its state filter.
fn page_of(
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
    with_state: bool,
) -> Result<(Page, Option<OpState>), Refusal> {
    let q = query.map_err(|_| refuse(Rejection::InvalidRequest))?.0;
    let limit = q.limit.unwrap_or(MOST_PER_PAGE);
    if limit == 0 || limit > MOST_PER_PAGE {
        return Err(refuse(Rejection::InvalidRequest));
    }
    let after = match q.after {
        Some(c) => Some(Page::parse_cursor(&c).ok_or_else(|| refuse(Rejection::InvalidRequest))?),
        None => None,
    };
    let state = match (q.state, with_state) {
        (None, _) => None,
        (Some(word), true) => {
            Some(OpState::from_word(&word).ok_or_else(|| refuse(Rejection::InvalidRequest))?)
        }
        (Some(_), false) => return Err(refuse(Rejection::InvalidRequest)),
    };
    Ok((Page { after, limit }, state))
}

/// `GET /v1/admin/inspect[?limit=N&after=CURSOR]`: levels, and one page of operations.
pub(super) async fn inspect(
    State(s): State<Shared>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let (page, _) = page_of(query, false)?;
    let i = s.writer.inspect(s.clock.now_ms(), page).await;
    let i = i.map_err(store_refusal)?;
    let mut view = json!(i);
    // The calls waiting in this process's waiting rooms, per band and per tenant.
    view["waiting"] = json!(s.writer.waiting());
    Ok(axum::Json(view).into_response())
}

/// `GET /v1/admin/operations[?state=S&limit=N&after=CURSOR]`: one page of operations.
pub(super) async fn operations_list(
    State(s): State<Shared>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let (page, state) = page_of(query, true)?;
    let page = s.writer.operations(state, page).await;
    let page = page.map_err(store_refusal)?;
    Ok(axum::Json(json!(page)).into_response())
}

pub(super) async fn metrics(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    // Without a key, totals only; with the admin key, the per-tenant series too.
    let per_tenant = headers.contains_key(header::AUTHORIZATION);
    if per_tenant {
        admin(&s, &headers)?;
    }
    metrics_answer(&s, per_tenant).await
}

/// `GET /metrics` on the `--metrics-listen` address: every series, no key (the address is
/// the operators'). It holds the service weakly, so that it never delays a shutdown.
pub(super) async fn private_metrics(
    State(s): State<std::sync::Weak<ServiceState>>,
) -> Result<Response, Refusal> {
    let Some(s) = s.upgrade() else {
        return Err(refuse(Rejection::Stopping));
    };
    metrics_answer(&s, true).await
}

/// The metrics text, per-tenant series included when `per_tenant`.
async fn metrics_answer(s: &ServiceState, per_tenant: bool) -> Result<Response, Refusal> {
    let mut last = s.metrics_text.lock().await;
    let fresh = matches!(&*last, Some((made, _)) if made.elapsed() < METRICS_FRESH_FOR);
    if !fresh {
        // While the store cannot be reached or written the levels stay as last read: the
        // counters (its write failures among them) are what an operator needs then.
        if let Err(refusal) = refresh_levels(s).await {
            if refusal.reason != Rejection::StoreUnavailable.reason() {
                return Err(refusal);
            }
        }
        let text = Bytes::from(s.metrics.render(false));
        *last = Some((std::time::Instant::now(), text));
    }
    let text = match (&*last, per_tenant) {
        (_, true) => Bytes::from(s.metrics.render(true)),
        (Some((_, text)), false) => text.clone(),
        (None, false) => Bytes::new(),
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
pub(super) async fn refresh_levels(s: &AppState) -> Result<(), Refusal> {
    {
        let i = s
            .writer
            .levels(s.clock.now_ms())
            .await
            .map_err(store_refusal)?;
        for (name, credits) in &i.buckets {
            s.metrics
                .buckets
                .with_label_values(&[name.as_str()])
                .set(*credits as f64);
        }
        for (name, limit) in &i.period_limits {
            let left = i.buckets.get(name).copied().unwrap_or(0);
            s.metrics
                .period_spent
                .with_label_values(&[name.as_str()])
                .set((limit - left).max(0) as f64);
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
        for (tenant, ms) in &i.queue_age_ms {
            s.metrics
                .queue_age
                .with_label_values(&[tenant.as_str()])
                .set(*ms as f64 / 1000.0);
        }
        for d in i.deployments.values() {
            let labels = [d.model.as_str(), d.deployment.as_str()];
            s.metrics
                .deployment_state
                .with_label_values(&labels)
                .set(d.state.number() as f64);
            if let Some(limit) = d.concurrency_limit {
                s.metrics
                    .deployment_limit
                    .with_label_values(&labels)
                    .set(f64::from(limit));
            }
        }
    }
    // The waiting rooms, every shard's.
    let waiting = s.writer.waiting();
    for (band, n) in &waiting.bands {
        s.metrics
            .waiting_calls
            .with_label_values(&[band])
            .set(*n as f64);
    }
    s.metrics.waiting_tenant_calls.reset();
    for (t, n) in &waiting.tenants {
        s.metrics
            .waiting_tenant_calls
            .with_label_values(&[t.as_str()])
            .set(*n as f64);
    }
    s.metrics
        .log_lines_dropped
        .set(tollgate::runtime::log_lines_dropped() as i64);
    let (ready, found) = s
        .engines
        .iter()
        .map(|e| e.active_policy().instances_ahead())
        .fold((0u64, 0u64), |(r, f), (a, b)| (r + a, f + b));
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    s.metrics.instances_ready.set(gauge(ready));
    s.metrics.calls_found_ready.set(gauge(found));
    // Another replica may have swapped it since this one did.
    set_policy_gauge(&s.engine, &s.metrics);
    if let Some(report) = s.engine.shadow_report() {
        for pair in &report.by_outcome {
            s.metrics
                .shadow
                .with_label_values(&[pair.active.as_str(), pair.shadow.as_str()])
                .set(pair.count as f64);
        }
    }
    Ok(())
}

pub(crate) fn set_policy_gauge(engine: &Engine<AnyStore>, metrics: &Metrics) {
    let id = engine.policy_identity();
    metrics.policy.reset();
    metrics
        .policy
        .with_label_values(&[id.name.as_str(), id.version.as_str(), id.sha256.as_str()])
        .set(1.0);
}
