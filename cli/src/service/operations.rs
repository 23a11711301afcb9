//! The callers' and workers' endpoints on operations: admit, complete, reconcile, read
//! one back.

use super::Shared;
use crate::http::auth::{acting_for, role};
use crate::http::body::{check_key, json_body, read_body, OpKey};
use crate::http::refusal::{
    refuse, refuse_for, refuse_for_request, refuse_until, with_retry_after, Refusal, Rejection,
};
use crate::http::{AppState, STORE_RETRY_AFTER_MS};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tollgate::config::Role;
use tollgate::engine::{Completion, CompletionAnswer, CompletionError, Reconciliation};
use tollgate::model::{CallResult, Resolution, Usage};
use tollgate::reason::Reason;
use tollgate::validate;
use tollgate::writer::Failure;
use tracing::Instrument;

/// The writer's failure as the service's answer: 503 with a retry-after while the store is
/// away, 500 otherwise.
pub(super) fn store_refusal(e: Failure) -> Refusal {
    match e {
        Failure::Unavailable(e) => {
            tracing::warn!(error = %e, "store unavailable");
            refuse_until(Rejection::StoreUnavailable, STORE_RETRY_AFTER_MS)
        }
        Failure::Failed(e) => {
            tracing::error!(error = %e, "store failure");
            refuse(Rejection::Internal)
        }
    }
}

pub(super) async fn admit(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let Role::Caller { tenant } = role(&s, &headers)? else {
        return Err(refuse(Rejection::Forbidden));
    };
    let limit = s.engine.config().max_request_bytes;
    let bytes = read_body(&headers, body, limit).await?;
    let mut obj = validate::object(&bytes).map_err(refuse_for)?;
    match obj.get("tenant") {
        None => {
            obj.insert("tenant".into(), json!(tenant));
        }
        Some(Value::String(t)) if *t == tenant => {}
        Some(_) => return Err(refuse(Rejection::Forbidden)),
    }
    // How long the caller lets the call wait in the waiting room (none: answered now).
    let max_wait_ms = match obj.remove("max_wait_ms") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(ms) => Some(ms),
            None => {
                let e = validate::RequestError::Invalid {
                    field: "max_wait_ms".into(),
                    problem: "must be a whole number of milliseconds, 0 or more".into(),
                };
                return Err(refuse_for_request(&e));
            }
        },
    };
    let mut request = match validate::parse(&Value::Object(obj), &s.engine.config()) {
        Ok(r) => r,
        Err(e) => {
            s.metrics
                .decisions
                .with_label_values(&["rejected", e.reason().as_str()])
                .inc();
            return Err(refuse_for_request(&e));
        }
    };
    let span = crate::telemetry::admission(&request);
    crate::telemetry::durable_context(&mut request, &span);
    let waiting = s.engine.config().waiting;
    let now = s.clock.now_ms();
    let wait = max_wait_ms.filter(|ms| waiting.enabled && *ms > 0);
    let d = s
        .writer
        .admit_waiting(request, now, wait)
        .instrument(span.clone())
        .await
        .map_err(store_refusal)?;
    crate::telemetry::waited(&span, d.waited_ms);
    crate::telemetry::decided(&span, &d);
    let reason = d.reason.map_or("", Reason::as_str);
    s.metrics
        .decisions
        .with_label_values(&[d.outcome.as_str(), reason])
        .inc();
    tracing::info!(tenant = %tenant, outcome = d.outcome.as_str(), reason, policy = d.policy.as_deref().unwrap_or(""), "decision");
    let status = StatusCode::from_u16(d.http).unwrap_or(StatusCode::OK);
    let mut response = with_retry_after(status, &d, d.retry_after_ms);
    if let Some(ms) = d.waited_ms {
        response
            .headers_mut()
            .insert("x-tollgate-waited-ms", axum::http::HeaderValue::from(ms));
    }
    Ok(response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CompleteBody {
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
    #[serde(default)]
    attempt: Option<u32>,
    #[serde(default)]
    provider_limits: Option<tollgate::engine::ProviderLimits>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReconcileBody {
    #[serde(default)]
    tenant: Option<String>,
    resolution: Resolution,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    result_ref: Option<String>,
    #[serde(default)]
    attempt: Option<u32>,
}

pub(super) fn completion_response(a: CompletionAnswer) -> Result<Response, Refusal> {
    let status = match a.error {
        None => StatusCode::OK,
        Some(CompletionError::UnknownOperation) => return Err(refuse(Rejection::UnknownOperation)),
        Some(CompletionError::NotClaimed) => return Err(refuse(Rejection::NotClaimed)),
        Some(
            CompletionError::StaleAttempt
            | CompletionError::NotActive
            | CompletionError::NotUnknown,
        ) => StatusCode::CONFLICT,
    };
    Ok((status, axum::Json(json!(a))).into_response())
}

/// The shared start of `complete` and `reconcile`: a caller or worker key, a bounded JSON
/// body, a valid operation key, and whom the report is for (tenant, and the worker if any).
pub(super) async fn report<T: for<'de> Deserialize<'de>>(
    s: &AppState,
    key: OpKey,
    headers: &HeaderMap,
    body: Body,
    tenant_of: impl FnOnce(&mut T) -> Option<String>,
) -> Result<Report<T>, Refusal> {
    let role = role(s, headers)?;
    if role == Role::Admin {
        return Err(refuse(Rejection::Forbidden));
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
pub(super) struct Report<T> {
    body: T,
    key: String,
    tenant: String,
    worker: Option<String>,
}

pub(super) async fn complete(
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
        attempt: r.body.attempt,
        answer: None,
        provider_limits: r.body.provider_limits,
    };
    let answer = s.writer.complete(completion, s.clock.now_ms()).await;
    completion_response(answer.map_err(store_refusal)?)
}

pub(super) async fn reconcile(
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
        attempt: r.body.attempt,
    };
    let answer = s.writer.reconcile(reconciliation, s.clock.now_ms()).await;
    completion_response(answer.map_err(store_refusal)?)
}

pub(super) async fn operation(
    State(s): State<Shared>,
    key: OpKey,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let Role::Caller { tenant } = role(&s, &headers)? else {
        return Err(refuse(Rejection::Forbidden));
    };
    let key = check_key(key)?;
    let op = s.writer.operation(tenant, key).await;
    let op = op
        .map_err(store_refusal)?
        .ok_or_else(|| refuse(Rejection::UnknownOperation))?;
    let mut body = json!({
        "state": op.state,
        "attempt": op.attempt,
        "result_ref": op.result_ref,
        "reserved_tokens": op.reserved_tokens,
        "max_output_tokens": op.max_output_tokens,
        "degraded": op.degraded,
    });
    if op.reserved_cost_microusd > 0 {
        body["reserved_cost_microusd"] = json!(op.reserved_cost_microusd);
    }
    if let Some(u) = op.usage {
        body["usage"] = json!(u);
    }
    Ok(axum::Json(body).into_response())
}
