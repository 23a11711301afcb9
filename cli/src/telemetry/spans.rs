//! The spans of a request, named and given attributes after OpenTelemetry's semantic
//! conventions where they have one (HTTP; GenAI's `gen_ai.*`) and `tollgate.*` otherwise.
//! Each is built under [`super::TARGET`], so with no exporter each call here returns a
//! disabled span at the cost of one check.

use super::TARGET;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer};
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::time::{Instant, SystemTime};
use tollgate::engine::{Claim, Decision};
use tollgate::model::{CallResult, Request, Usage};
use tollgate::writer::Stamps;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

/// The W3C trace context (`traceparent`, `tracestate`) a request arrived with, if any.
pub fn extract(headers: &HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Writes `span`'s trace context into `headers` (`traceparent`, `tracestate`); nothing
/// when the span is disabled.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    if span.is_disabled() {
        return;
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeadersMut(headers));
}

/// `span`'s trace context as a `traceparent` value, when it is sampled.
fn traceparent(span: &Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let mut headers = HeaderMap::new();
    inject(span, &mut headers);
    let value = headers.get("traceparent")?.to_str().ok()?;
    value.ends_with("-01").then(|| value.to_string())
}

/// An operation key as traces show it: the first 16 hex digits of its SHA-256 (a key
/// may carry what a trace receiver should not keep).
pub fn key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Sets a numeric attribute (as an integer: `record` would hand it over as text).
pub fn number(span: &Span, key: &'static str, n: u64) {
    if !span.is_disabled() {
        span.set_attribute(key, i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// The server span of one HTTP request, a child of the caller's trace context when it sent
/// one. `route` is the matched route's pattern, when known.
pub fn server_span(
    method: &axum::http::Method,
    path: &str,
    route: Option<&str>,
    headers: &HeaderMap,
) -> Span {
    let name = match route {
        Some(r) => format!("{method} {r}"),
        None => method.to_string(),
    };
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = %name,
        otel.kind = "server",
        "http.request.method" = %method,
        "url.path" = path,
        "http.route" = route,
    );
    if !span.is_disabled() {
        let _ = span.set_parent(extract(headers));
    }
    span
}

/// When the call waited in the waiting room: a `tollgate.wait` child of its admission's
/// span, from when it began waiting to now, with `tollgate.waited_ms`.
pub fn waited(admission: &Span, waited_ms: Option<u64>) {
    let Some(ms) = waited_ms else {
        return;
    };
    let cx = admission.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let tracer = opentelemetry::global::tracer("tollgate");
    let now = SystemTime::now();
    let mut span = tracer
        .span_builder("tollgate.wait")
        .with_start_time(now - std::time::Duration::from_millis(ms))
        .with_attributes([KeyValue::new(
            "tollgate.waited_ms",
            i64::try_from(ms).unwrap_or(i64::MAX),
        )])
        .start_with_context(&tracer, &cx);
    span.end_with_timestamp(now);
}

/// The span of one admission (the writer's steps become its children).
pub fn admission(request: &Request) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "tollgate.admission",
        "tollgate.tenant" = %request.tenant,
        "tollgate.operation_key_hash" = Empty,
        "tollgate.route" = match request.route {
            tollgate::model::Route::Interactive => "interactive",
            tollgate::model::Route::Durable => "durable",
        },
        "gen_ai.request.model" = request.model.as_deref(),
        "tollgate.outcome" = Empty,
        "tollgate.reason" = Empty,
        "tollgate.deployment" = Empty,
        "tollgate.policy" = Empty,
        "tollgate.refused_by" = Empty,
    );
    if !span.is_disabled() {
        span.record(
            "tollgate.operation_key_hash",
            key_hash(&request.key).as_str(),
        );
    }
    span
}

/// A durable admission's `traceparent`, to be stored with its job.
pub fn durable_context(request: &mut Request, span: &Span) {
    if request.route == tollgate::model::Route::Durable {
        request.trace_context = traceparent(span);
    }
}

/// Records the decision on its admission span: outcome, reason, attempt, deployment, the
/// policy that decided and, for a refusal by a limit, which one.
pub fn decided(span: &Span, d: &Decision) {
    if span.is_disabled() {
        return;
    }
    span.record("tollgate.outcome", d.outcome.as_str());
    if let Some(r) = d.reason {
        span.record("tollgate.reason", r.as_str());
        span.set_status(opentelemetry::trace::Status::error(r.as_str()));
    }
    if let Some(a) = d.attempt {
        number(span, "tollgate.attempt", u64::from(a));
    }
    if let Some(dep) = &d.deployment {
        span.record("tollgate.deployment", dep.as_str());
    }
    if let Some(p) = &d.policy {
        span.record("tollgate.policy", p.as_str());
    }
    if let Some(s) = &d.shortfall {
        span.record("tollgate.refused_by", s.limit.as_str());
    }
}

/// The upstream call of a gateway attempt (a client span, after GenAI's conventions).
pub fn upstream(operation: &str, provider: &str, model: &str, deployment: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "upstream",
        otel.name = %format!("{operation} {model}"),
        otel.kind = "client",
        "gen_ai.operation.name" = operation,
        "gen_ai.provider.name" = provider,
        "gen_ai.request.model" = model,
        "tollgate.deployment" = deployment,
    )
}

/// What the upstream answered: its status, and the tokens it reported when known.
pub fn upstream_answered(span: &Span, status: u16, usage: Option<&Usage>) {
    if span.is_disabled() {
        return;
    }
    number(span, "http.response.status_code", u64::from(status));
    if status >= 400 {
        span.set_status(opentelemetry::trace::Status::error(format!(
            "HTTP {status}"
        )));
    }
    if let Some(u) = usage {
        number(span, "gen_ai.usage.input_tokens", u.input_tokens);
        number(span, "gen_ai.usage.output_tokens", u.output_tokens);
    }
}

/// The report of how a call ended, a child of `parent` (the request's span, which a
/// stream keeps open until its end).
pub fn completion(parent: &Span, result: CallResult, usage: Option<&Usage>) -> Span {
    let result = match result {
        CallResult::Succeeded => "succeeded",
        CallResult::Failed => "failed",
        CallResult::Unknown => "unknown",
    };
    let span = tracing::info_span!(
        target: TARGET,
        parent: parent,
        "tollgate.completion",
        "tollgate.result" = result,
    );
    if let Some(u) = usage {
        number(&span, "gen_ai.usage.input_tokens", u.input_tokens);
        number(&span, "gen_ai.usage.output_tokens", u.output_tokens);
    }
    span
}

/// Each claimed job's dispatch, in the trace of its admission when it has one, linked to
/// the worker's request (the current span); `started` is when the claim began.
pub fn dispatched(claims: &[Claim], worker: &str, started: SystemTime) {
    let current = Span::current();
    if current.is_disabled() {
        return;
    }
    let tracer = opentelemetry::global::tracer("tollgate");
    let link = current.context().span().span_context().clone();
    for claim in claims {
        let mut headers = HeaderMap::new();
        if let Some(v) = claim
            .traceparent
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert("traceparent", v);
        }
        let parent = match claim.traceparent {
            Some(_) => extract(&headers),
            None => current.context(),
        };
        let mut span = tracer
            .span_builder("tollgate.dispatch")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_links(vec![opentelemetry::trace::Link::with_context(link.clone())])
            .with_attributes([
                KeyValue::new("tollgate.tenant", claim.tenant.clone()),
                KeyValue::new("tollgate.operation_key_hash", key_hash(&claim.key)),
                KeyValue::new("tollgate.attempt", i64::from(claim.attempt)),
                KeyValue::new("tollgate.worker", worker.to_string()),
            ])
            .start_with_context(&tracer, &parent);
        span.end();
    }
}

/// The writer's steps for one traced job, as children of `parent` at the times the writer
/// noted: its wait in the queue, its policy call, and the batch's commit.
pub fn writer_spans(parent: &Span, stamps: &Stamps) {
    let cx = parent.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let tracer = opentelemetry::global::tracer("tollgate");
    let (now, wall) = (Instant::now(), SystemTime::now());
    let at = |t: Instant| wall - now.saturating_duration_since(t);
    let child = |name: &'static str, from: Instant, to: Instant, attributes: Vec<KeyValue>| {
        let mut span = tracer
            .span_builder(name)
            .with_start_time(at(from))
            .with_attributes(attributes)
            .start_with_context(&tracer, &cx);
        span.end_with_timestamp(at(to));
    };
    let jobs = KeyValue::new("tollgate.batch.jobs", stamps.batch_jobs as i64);
    child(
        "tollgate.writer.queue",
        stamps.queued,
        stamps.batch_started,
        vec![jobs.clone()],
    );
    if let Some((from, to)) = stamps.job.and_then(|j| j.policy) {
        child("tollgate.policy", from, to, Vec::new());
    }
    let decided = stamps.job.map_or(stamps.batch_started, |j| j.decided);
    child(
        "tollgate.store.commit",
        decided,
        stamps.batch_ended,
        vec![jobs],
    );
}
