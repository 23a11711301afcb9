//! Calls that cost nothing, passed through with the caller's authentication only. Nothing
//! is admitted or spent; the caller's key is checked and never sent upstream.
//! - `POST /v1/messages/count_tokens`: to the first deployment of the model named.
//!
//! (Stored responses, which belong to one tenant, are `owned`'s.)

use super::{caller, upstream, Shared, MAX_ANSWER_BYTES};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Request};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use serde_json::Value;
use tollgate::config::UpstreamKind;

/// How long one upstream may take to answer a pass-through call.
const PASS_TIMEOUT_MS: u64 = 30_000;

/// `POST /v1/messages/count_tokens`: the body sent to the model's first deployment, with
/// the upstream's key and the caller's `anthropic-version`; the answer passed back.
pub async fn count_tokens(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let headers = super::anthropic::caller_headers(headers);
    let answer = count(&s, &headers, body).await;
    super::anthropic::translate(answer).await
}

async fn count(s: &Shared, headers: &HeaderMap, body: Body) -> Response {
    if let Err(e) = caller(s, headers) {
        return e.into_response();
    }
    let limit = s.engine.config().max_request_bytes;
    let bytes = match crate::http::body::read_body(headers, body, limit).await {
        Ok(b) => b,
        Err(r) => {
            return super::openai::error(
                r.status.as_u16(),
                r.reason,
                "the request body was refused",
            )
        }
    };
    let model = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("model").and_then(Value::as_str).map(str::to_string));
    let Some(model) = model else {
        return super::openai::error(400, "invalid_request", "`model` must be a string");
    };
    let g = &s.gateway;
    let route = g.models.get(&model).and_then(|m| {
        (m.kind == UpstreamKind::Anthropic)
            .then(|| m.deployments.values().next())
            .flatten()
    });
    let Some(d) = route else {
        return super::openai::error(
            404,
            "model_not_found",
            &format!("the model `{model}` is not served here by an anthropic upstream"),
        );
    };
    let mut request = Request::post(format!("{}/v1/messages/count_tokens", d.base_url))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(k) = &d.api_key {
        request = request.header("x-api-key", k);
    }
    for (name, value) in
        super::anthropic::upstream_headers(super::dialect::Dialect::Messages, headers)
    {
        request = request.header(name, value);
    }
    let Ok(request) = request.body(Full::new(bytes)) else {
        return super::openai::error(400, "invalid_request", "the request could not be sent");
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(PASS_TIMEOUT_MS);
    let answer = match tokio::time::timeout_at(deadline, g.client.request(request)).await {
        Ok(Ok(a)) => a,
        _ => {
            return super::openai::error(502, "upstream_error", "the upstream could not be reached")
        }
    };
    let status = answer.status();
    match upstream::read_all(answer.into_body(), MAX_ANSWER_BYTES).await {
        Ok(body) => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(_) => super::openai::error(502, "upstream_error", "the upstream's answer was cut off"),
    }
}
