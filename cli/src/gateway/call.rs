//! One gateway call from admission to completion: admit, send upstream, complete with the
//! provider's usage, and retry here (same key, next attempt) when the provider refused
//! before doing the work and the policy allows it. Only the final result reaches the
//! caller.

use super::completion::{finish, Ending};
use super::dialect::CallLimit;
use super::openai;
use super::owned;
use super::replay;
use super::sse::Splitter;
use super::upstream::{self, Sent};
use super::Shared;
use super::{DeploymentRoute, Gateway, GatewayCall, MAX_ANSWER_BYTES};
use crate::http::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::Response;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::time::Instant;
use tollgate::config::UpstreamKind;
use tollgate::engine::{Decision, TenantLevels};
use tollgate::model::CallResult;
use tollgate::reason::{Outcome, Reason};
use tracing::Instrument;

/// Runs the call to its end and answers the caller.
pub async fn run(s: Shared, call: GatewayCall) -> Response {
    let g = &s.gateway;
    let mut attempts = 0;
    loop {
        let (decision, levels) = match admit(&s, &call).await {
            Ok(answer) => answer,
            Err(e) => return axum::response::IntoResponse::into_response(e),
        };
        if decision.outcome == Outcome::DuplicateCompleted && call.replay.is_some() {
            if let Some(answer) = replay::fetch(&s, &call.tenant, &call.key, levels.as_ref()).await
            {
                count(&s, &call, "replayed");
                return answer;
            }
        }
        if decision.outcome != Outcome::Accepted {
            count(&s, &call, "refused");
            return refusal(&decision, levels.as_ref());
        }
        attempts += 1;
        let attempt = decision.attempt.unwrap_or(1);
        tracing::info!(tenant = %call.tenant, key = %call.key, attempt, model = %call.model, "gateway call");
        let Some(target) = target(g, &call, &decision) else {
            // Only a configuration changed under the running server could get here.
            tracing::error!(tenant = %call.tenant, model = %call.model, deployment = ?decision.deployment, "no such deployment");
            return lost(
                &s,
                &call,
                attempt,
                "no such deployment",
                levels.as_ref(),
                None,
            )
            .await;
        };
        let sent = Routed {
            deployment: decision.deployment.clone().unwrap_or_default(),
            model: decision.served_model.clone(),
            attempts,
        };
        let mut request = upstream_request(target, &call, &decision);
        let span = crate::telemetry::upstream(
            call.dialect.operation(),
            match target.0.kind {
                UpstreamKind::Openai => "openai",
                UpstreamKind::Anthropic => "anthropic",
            },
            decision.served_model.as_deref().unwrap_or(&call.model),
            &sent.deployment,
        );
        crate::telemetry::inject(&span, request.headers_mut());
        let deadline = deadline_instant(&s, call.deadline_ms);
        let started = Instant::now();
        let answered = upstream::send(&g.client, request, deadline)
            .instrument(span.clone())
            .await;
        match answered {
            Sent::Answer(response) if call.stream => {
                crate::telemetry::upstream_answered(&span, response.status().as_u16(), None);
                return stream(
                    s.clone(),
                    call,
                    (decision, sent),
                    levels,
                    response,
                    started,
                    deadline,
                );
            }
            Sent::Answer(response) => {
                let limits = upstream::provider_limits(response.headers());
                let read = tokio::time::timeout_at(
                    deadline,
                    upstream::read_all(response.into_body(), MAX_ANSWER_BYTES),
                )
                .await;
                observe(&s.metrics.gateway_upstream_seconds, &call, started);
                let body = match read {
                    Ok(Ok(body)) => body,
                    Ok(Err(e)) => {
                        return lost(&s, &call, attempt, &e, levels.as_ref(), Some(&sent)).await
                    }
                    Err(_) => {
                        return lost(&s, &call, attempt, "deadline", levels.as_ref(), Some(&sent))
                            .await
                    }
                };
                let parsed = serde_json::from_slice::<Value>(&body).ok();
                let usage = parsed.as_ref().and_then(|v| call.dialect.usage_of(v));
                if let Some(id) = parsed.as_ref().and_then(owned::response_id) {
                    if owned::keeps_response(&call) {
                        // Recorded before the caller can learn the id.
                        owned::record(&s, &call, sent.served(&call), &sent.deployment, id).await;
                    }
                }
                crate::telemetry::upstream_answered(&span, 200, usage.as_ref());
                drop(span);
                let mut response = Response::new(Body::from(body.clone()));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                decorate(&mut response, levels.as_ref(), &decision);
                let answer = call.replay.and_then(|r| {
                    r.save(StatusCode::OK, response.headers(), &body, s.clock.now_ms())
                });
                sent.mark(response.headers_mut());
                let ending = Ending {
                    usage,
                    answer,
                    limits,
                    ..Ending::of(CallResult::Succeeded)
                };
                finish(&s, &call, attempt, ending).await;
                count(&s, &call, "succeeded");
                return response;
            }
            Sent::Refused {
                refusal,
                status,
                body,
                limits,
            } => {
                observe(&s.metrics.gateway_upstream_seconds, &call, started);
                crate::telemetry::upstream_answered(&span, status.as_u16(), None);
                drop(span);
                tracing::info!(tenant = %call.tenant, key = %call.key, attempt, kind = refusal.kind, status = status.as_u16(), "upstream refused");
                let ending = Ending {
                    failure: Some(refusal.kind),
                    provider_retry_after_ms: refusal.retry_after_ms,
                    limits,
                    ..Ending::of(CallResult::Failed)
                };
                let verdict = finish(&s, &call, attempt, ending).await;
                let retry_at =
                    verdict.and_then(|v| v.eligible.then_some(v.not_before_ms).flatten());
                if let (Some(at), true) = (retry_at, attempts < g.max_attempts) {
                    if at < call.deadline_ms {
                        let wait = (at - s.clock.now_ms()).max(0) as u64;
                        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                        continue;
                    }
                }
                count(&s, &call, "failed");
                let mut response = passed_on(status, body, levels.as_ref());
                sent.mark(response.headers_mut());
                return response;
            }
            Sent::Lost(why) => {
                return lost(&s, &call, attempt, &why, levels.as_ref(), Some(&sent)).await
            }
        }
    }
}

/// The decision, and the tenant's buckets after it (one writer job).
async fn admit(
    s: &AppState,
    call: &GatewayCall,
) -> Result<(Decision, Option<TenantLevels>), openai::ApiError> {
    let span = crate::telemetry::admission(&call.request);
    let waiting = s.engine.config().waiting;
    let (request, now) = (call.request.clone(), s.clock.now_ms());
    let wait = waiting.enabled.then_some(waiting.max_wait_ms);
    let admitted = s
        .writer
        .admit_with_levels_waiting(request, now, wait)
        .instrument(span.clone())
        .await;
    if let Ok((d, _)) = &admitted {
        crate::telemetry::waited(&span, d.waited_ms);
    }
    match admitted {
        Ok((d, levels)) => {
            crate::telemetry::decided(&span, &d);
            let reason = d.reason.map_or("", |r| r.as_str());
            s.metrics
                .decisions
                .with_label_values(&[d.outcome.as_str(), reason])
                .inc();
            Ok((d, levels))
        }
        Err(tollgate::writer::Failure::Unavailable(e)) => {
            tracing::warn!(error = %e, "store unavailable");
            Err(openai::ApiError::new(
                503,
                "store_unavailable",
                "the store is unavailable; retry shortly",
            )
            .retry_after(crate::http::STORE_RETRY_AFTER_MS))
        }
        Err(e) => {
            tracing::error!(error = %e, "store failure");
            Err(openai::ApiError::new(500, "internal", "store failure"))
        }
    }
}

pub(super) async fn levels(s: &AppState, tenant: &str) -> Option<TenantLevels> {
    s.writer
        .tenant_levels(tenant.to_string(), s.clock.now_ms())
        .await
        .ok()
        .flatten()
}

/// Where an attempt went, as the caller's answer says: `x-tollgate-deployment`,
/// `x-tollgate-attempts` and, when a fallback model served, `x-tollgate-model`.
struct Routed {
    deployment: String,
    model: Option<String>,
    attempts: u32,
}

impl Routed {
    /// The model whose deployment served: the fallback, or the one asked for.
    fn served<'a>(&'a self, call: &'a GatewayCall) -> &'a str {
        self.model.as_deref().unwrap_or(&call.model)
    }

    fn mark(&self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.deployment) {
            headers.insert("x-tollgate-deployment", v);
        }
        headers.insert("x-tollgate-attempts", HeaderValue::from(self.attempts));
        if let Some(v) = self
            .model
            .as_deref()
            .and_then(|m| HeaderValue::from_str(m).ok())
        {
            headers.insert("x-tollgate-model", v);
        }
    }
}

/// The deployment the engine reserved for this attempt (of the fallback model, when one
/// serves), and the model's name to send.
fn target<'g>(
    g: &'g Gateway,
    call: &GatewayCall,
    decision: &Decision,
) -> Option<(&'g DeploymentRoute, Option<&'g str>)> {
    let model = decision.served_model.as_deref().unwrap_or(&call.model);
    let (served, route) = g.models.get_key_value(model)?;
    let d = route.deployments.get(decision.deployment.as_deref()?)?;
    let fallback = decision.served_model.is_some().then_some(served.as_str());
    Some((d, fallback))
}

/// The request sent upstream, to the dialect's path at the deployment's upstream: the
/// caller's body with the deployment's model name (or the fallback model's), the plan's
/// output limit, and the usage chunk asked for on chat streams; the upstream's key.
fn upstream_request(
    (route, fallback): (&DeploymentRoute, Option<&str>),
    call: &GatewayCall,
    decision: &Decision,
) -> Request<Full<Bytes>> {
    let mut body = call.body.clone();
    if let Some(m) = route.upstream_model.as_deref().or(fallback) {
        body.insert("model".into(), json!(m));
    }
    let limit = CallLimit {
        field: call.limit_field,
        planned: decision
            .max_output_tokens
            .unwrap_or(call.request.max_output_tokens),
    };
    call.dialect.prepare(&mut body, &limit, call.stream);
    let url = format!("{}/{}", route.base_url, call.dialect.path());
    let mut request = Request::post(&url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::ACCEPT,
            if call.stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        );
    match (route.kind, &route.api_key) {
        (UpstreamKind::Openai, Some(k)) => {
            request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        (UpstreamKind::Anthropic, Some(k)) => request = request.header("x-api-key", k),
        (_, None) => {}
    }
    for (name, value) in &call.upstream_headers {
        request = request.header(name, value);
    }
    request
        .body(Full::new(Bytes::from(Value::Object(body).to_string())))
        .expect("a valid request")
}

fn deadline_instant(s: &AppState, deadline_ms: i64) -> tokio::time::Instant {
    let left = (deadline_ms - s.clock.now_ms()).max(0) as u64;
    tokio::time::Instant::now() + std::time::Duration::from_millis(left)
}

/// The outcome is unknown: recorded so (the slot stays held), answered 502.
async fn lost(
    s: &Shared,
    call: &GatewayCall,
    attempt: u32,
    why: &str,
    levels: Option<&TenantLevels>,
    sent: Option<&Routed>,
) -> Response {
    tracing::warn!(tenant = %call.tenant, key = %call.key, attempt, why, "upstream outcome unknown");
    finish(s, call, attempt, Ending::of(CallResult::Unknown)).await;
    count(s, call, "unknown");
    let mut response = openai::error(
        502,
        "unknown_outcome",
        "the upstream call may have happened, and its answer was lost; it is not retried",
    );
    if let Some(l) = levels {
        openai::rate_limit_headers(response.headers_mut(), l);
    }
    openai::should_retry(response.headers_mut(), false);
    if let Some(sent) = sent {
        sent.mark(response.headers_mut());
    }
    response
}

/// tollgate's own refusal in OpenAI's shape, with the engine's sentence as its message and
/// the shortfall's numbers beside it. A deadline the call cannot meet is a client error
/// (400): the request as sent cannot be served, and the SDKs would retry a 5xx.
fn refusal(d: &Decision, levels: Option<&TenantLevels>) -> Response {
    let (code, message) = match d.outcome {
        Outcome::DuplicateActive => (
            "duplicate_active",
            "duplicate_active: a call with this Idempotency-Key is in progress".to_string(),
        ),
        Outcome::DuplicateCompleted => (
            "duplicate_completed",
            "duplicate_completed: a call with this Idempotency-Key has ended and its answer is not kept (replay off, expired, too large, or the call did not succeed)".to_string(),
        ),
        Outcome::Conflict => (
            "conflict",
            "conflict: this Idempotency-Key was used for another request".to_string(),
        ),
        _ => (
            d.reason.map_or("rejected", |r| r.as_str()),
            d.message
                .clone()
                .unwrap_or_else(|| "refused by tollgate".to_string()),
        ),
    };
    let status = match (d.outcome, d.reason) {
        (Outcome::DuplicateCompleted, _) => 409,
        (_, Some(Reason::DeadlineExceeded)) => 400,
        _ => d.http,
    };
    let mut extra = serde_json::Map::new();
    if let Some(s) = &d.shortfall {
        extra.insert("limit".into(), json!(s.limit));
        extra.insert("requested".into(), json!(s.requested));
        extra.insert("available".into(), json!(s.available));
        extra.insert("unit".into(), json!(s.unit));
    }
    if let Some(ms) = d.retry_after_ms {
        extra.insert("retry_after_ms".into(), json!(ms));
    }
    if let Some(m) = &d.policy_message {
        extra.insert("policy_message".into(), json!(m));
    }
    if let Some(ms) = d.waited_ms {
        extra.insert("waited_ms".into(), json!(ms));
    }
    let mut response = openai::error_with(status, code, &message, extra);
    let headers = response.headers_mut();
    mark_waited(headers, d);
    if let Some(l) = levels {
        openai::rate_limit_headers(headers, l);
    }
    if let Some(r) = d.reason {
        if let Ok(v) = HeaderValue::from_str(r.as_str()) {
            headers.insert("x-tollgate-reason", v);
        }
    }
    match d.retry_after_ms {
        // Waiting cures it: the SDK's own loop may wait and retry.
        Some(ms) => openai::retry_after_headers(headers, ms),
        None => openai::should_retry(headers, false),
    }
    response
}

/// The provider's final refusal, passed on: the gateway has done the retrying.
fn passed_on(status: StatusCode, body: Bytes, levels: Option<&TenantLevels>) -> Response {
    let mut response = if body.is_empty() {
        openai::error(
            status.as_u16(),
            "upstream_error",
            "the upstream refused the call",
        )
    } else {
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    if let Some(l) = levels {
        openai::rate_limit_headers(response.headers_mut(), l);
    }
    openai::should_retry(response.headers_mut(), false);
    response
}

/// `x-tollgate-waited-ms`, when the call waited in the waiting room.
fn mark_waited(headers: &mut HeaderMap, decision: &Decision) {
    if let Some(ms) = decision.waited_ms {
        headers.insert("x-tollgate-waited-ms", HeaderValue::from(ms));
    }
}

/// Rate-limit headers and the degraded mark on a successful answer.
fn decorate(response: &mut Response, levels: Option<&TenantLevels>, decision: &Decision) {
    mark_waited(response.headers_mut(), decision);
    if let Some(l) = levels {
        openai::rate_limit_headers(response.headers_mut(), l);
    }
    if decision.degraded == Some(true) {
        response
            .headers_mut()
            .insert("x-tollgate-degraded", HeaderValue::from_static("true"));
    }
    if let Some(v) = decision
        .policy_message
        .as_deref()
        .and_then(|m| HeaderValue::from_bytes(m.as_bytes()).ok())
    {
        response
            .headers_mut()
            .insert("x-tollgate-policy-message", v);
    }
}

fn count(s: &AppState, call: &GatewayCall, outcome: &str) {
    s.metrics
        .gateway_calls
        .with_label_values(&[&call.tenant, &call.model, outcome])
        .inc();
}

fn observe(histogram: &prometheus::HistogramVec, call: &GatewayCall, started: Instant) {
    histogram
        .with_label_values(&[&call.model])
        .observe(started.elapsed().as_secs_f64());
}

/// Passes a stream on event by event, reading it to its end even if the caller leaves,
/// and completes the operation with the usage of its last chunk.
fn stream(
    s: Shared,
    call: GatewayCall,
    (decision, sent): (Decision, Routed),
    levels: Option<TenantLevels>,
    upstream: axum::http::Response<hyper::body::Incoming>,
    started: Instant,
    deadline: tokio::time::Instant,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let attempt = decision.attempt.unwrap_or(1);
    let limits = upstream::provider_limits(upstream.headers());
    let mut response_head = HeaderMap::new();
    response_head.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response_head.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(v) = decision
        .policy_message
        .as_deref()
        .and_then(|m| HeaderValue::from_bytes(m.as_bytes()).ok())
    {
        response_head.insert("x-tollgate-policy-message", v);
    }
    if decision.degraded == Some(true) {
        response_head.insert("x-tollgate-degraded", HeaderValue::from_static("true"));
    }
    let kept_head = response_head.clone();
    // The stream's task stays in the request's span (its log lines carry the trace).
    let span = call.span.clone();
    let holder = (sent.served(&call).to_string(), sent.deployment.clone());
    let relay = async move {
        // The events as the caller gets them, kept for a repeat while within the bound.
        let mut kept: Option<Vec<u8>> = call.replay.map(|_| Vec::new());
        let mut body = upstream.into_body();
        let mut splitter = Splitter::new(call.dialect);
        let (mut usage, mut done, mut first) = (None, false, true);
        // A kept response's id is recorded before the caller gets the event that says it.
        let mut unrecorded = owned::keeps_response(&call);
        let mut caller_here = true;
        let failure: Option<String> = loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => break Some("deadline".into()),
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(format!("connection lost: {e}")),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let events = match splitter.push(&data) {
                Ok(events) => events,
                Err(e) => break Some(e),
            };
            for event in events {
                if first {
                    first = false;
                    observe(&s.metrics.gateway_ttft_seconds, &call, started);
                }
                if unrecorded {
                    if let Some(id) = owned::response_id_in_event(&event.raw) {
                        unrecorded = false;
                        owned::record(&s, &call, &holder.0, &holder.1, &id).await;
                    }
                }
                done |= event.done;
                usage = call.dialect.merge(usage, event.usage);
                let pass = !event.usage_only || call.caller_wants_usage;
                if let (Some(k), Some(r), true) = (&mut kept, call.replay, pass) {
                    if k.len() + event.raw.len() <= r.max_bytes {
                        k.extend_from_slice(&event.raw);
                    } else {
                        kept = None;
                    }
                }
                if pass && caller_here && tx.send(Ok(Bytes::from(event.raw))).await.is_err() {
                    // The caller left; the answer is still read to learn its usage.
                    caller_here = false;
                }
            }
        };
        observe(&s.metrics.gateway_upstream_seconds, &call, started);
        match failure {
            None if done || (usage.is_some() && call.dialect.usage_ends_stream()) => {
                let answer = match (call.replay, kept) {
                    (Some(r), Some(events)) => {
                        r.save(StatusCode::OK, &kept_head, &events, s.clock.now_ms())
                    }
                    _ => None,
                };
                let ending = Ending {
                    usage,
                    answer,
                    limits,
                    ..Ending::of(CallResult::Succeeded)
                };
                finish(&s, &call, attempt, ending).await;
                count(&s, &call, "succeeded");
            }
            failure => {
                let why = failure.unwrap_or_else(|| "the stream ended before its end".into());
                tracing::warn!(tenant = %call.tenant, key = %call.key, attempt, why, "upstream stream cut off: outcome unknown");
                finish(&s, &call, attempt, Ending::of(CallResult::Unknown)).await;
                count(&s, &call, "unknown");
                let error = call.dialect.cut_off_event();
                let _ = tx.send(Ok(Bytes::from(error))).await;
            }
        }
    };
    tokio::spawn(relay.instrument(span));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.headers_mut() = response_head;
    decorate(&mut response, levels.as_ref(), &decision);
    sent.mark(response.headers_mut());
    response
}
