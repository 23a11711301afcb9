//! Stored responses, owned: a Responses call the provider keeps (`store` not `false`) is
//! recorded with the caller's tenant and the deployment that answered it before the caller
//! can learn its id, and `GET`, `DELETE /v1/responses/{id}` (and its `input_items` and
//! `cancel`) go to that deployment for that tenant only. Another tenant, or an id tollgate
//! never served, is 404 without any upstream call.

use super::upstream;
use super::{GatewayCall, Shared, MAX_ANSWER_BYTES};
use crate::http::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use serde_json::Value;
use tollgate::config::UpstreamKind;
use tollgate::engine::valid_object_id;
use tollgate::store::OwnedObject;
use tollgate::writer::Failure;

/// The kind of a stored response's record.
pub const RESPONSE: &str = "response";

/// How long the deployment may take to answer a call on a stored response.
const STORED_TIMEOUT_MS: u64 = 30_000;

/// Whether `call` asks the provider to keep its response (a Responses call whose `store`
/// is not `false`: OpenAI's default is to keep it).
pub fn keeps_response(call: &GatewayCall) -> bool {
    call.dialect == super::Dialect::Responses && call.body.get("store") != Some(&Value::Bool(false))
}

/// The response id in a Responses answer (`{"id": ...}`) or stream event
/// (`{"response": {"id": ...}}`).
pub fn response_id(value: &Value) -> Option<&str> {
    let id = value
        .get("response")
        .and_then(|r| r.get("id"))
        .or_else(|| value.get("id"))?
        .as_str()?;
    valid_object_id(id).then_some(id)
}

/// The response id in one stream event's bytes (its `data:` lines), if it carries one.
pub fn response_id_in_event(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    let value: Value = serde_json::from_str(&data).ok()?;
    response_id(&value).map(str::to_string)
}

/// Records that `call`'s tenant made response `id` at `deployment` of `model`. A store
/// that cannot take it now leaves the response unreachable through the gateway (never
/// reachable by another tenant): logged, and the call's answer goes on.
pub async fn record(s: &AppState, call: &GatewayCall, model: &str, deployment: &str, id: &str) {
    let object = OwnedObject {
        kind: RESPONSE.into(),
        id: id.into(),
        model: model.into(),
        deployment: deployment.into(),
        created_ms: s.clock.now_ms(),
    };
    if let Err(e) = s.writer.own_object(call.tenant.clone(), object).await {
        tracing::warn!(tenant = %call.tenant, id, error = %e, "stored response not recorded: it is not reachable through the gateway");
    }
}

/// `GET`, `DELETE /v1/responses/{id}`.
pub async fn response(
    State(s): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    on_response(&s, method, &uri, &headers, &id, "").await
}

/// `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`.
pub async fn response_part(
    State(s): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path((id, part)): Path<(String, String)>,
) -> Response {
    let allowed = matches!(
        (&method, part.as_str()),
        (&Method::GET, "input_items") | (&Method::POST, "cancel")
    );
    if !allowed {
        return super::openai::error(
            404,
            "not_found",
            &format!("{method} /v1/responses/{{id}}/{part} is not served here"),
        );
    }
    on_response(&s, method, &uri, &headers, &id, &format!("/{part}")).await
}

async fn on_response(
    s: &Shared,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    id: &str,
    part: &str,
) -> Response {
    let tenant = match super::caller(s, headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    if !valid_object_id(id) {
        return super::openai::error(
            400,
            "invalid_request",
            "a response id is 1 to 256 letters, digits, `_` and `-`",
        );
    }
    let found = s
        .writer
        .owned_object(tenant.clone(), RESPONSE.into(), id.into())
        .await;
    let object = match found {
        Ok(Some(o)) => o,
        // Another tenant's, or none tollgate served: the same answer, nothing sent.
        Ok(None) => return not_found(id),
        Err(Failure::Unavailable(_)) => {
            return super::openai::ApiError::new(
                503,
                "store_unavailable",
                "the store is unavailable; retry shortly",
            )
            .retry_after(crate::http::STORE_RETRY_AFTER_MS)
            .into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "store failure");
            return super::openai::error(500, "internal", "store failure");
        }
    };
    let g = &s.gateway;
    let route = g
        .models
        .get(&object.model)
        .and_then(|m| m.deployments.get(&object.deployment))
        .filter(|d| d.kind == UpstreamKind::Openai);
    let Some(route) = route else {
        return super::openai::error(
            404,
            "not_found",
            &format!(
                "response {id} is held by deployment `{}` of model `{}`, which is no longer configured here",
                object.deployment, object.model
            ),
        );
    };
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut request = Request::builder()
        .method(method.clone())
        .uri(format!("{}/responses/{id}{part}{query}", route.base_url))
        .header(header::ACCEPT, "application/json");
    if let Some(k) = &route.api_key {
        request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let Ok(request) = request.body(Full::new(Bytes::new())) else {
        return super::openai::error(400, "invalid_request", "the request could not be sent");
    };
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_millis(STORED_TIMEOUT_MS);
    let answer = match tokio::time::timeout_at(deadline, g.client.request(request)).await {
        Ok(Ok(a)) => a,
        _ => {
            return super::openai::error(
                502,
                "upstream_error",
                "the deployment holding the response could not be reached",
            )
        }
    };
    let status = answer.status();
    let content_type = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/json"));
    let read = tokio::time::timeout_at(
        deadline,
        upstream::read_all(answer.into_body(), MAX_ANSWER_BYTES),
    )
    .await;
    let Ok(Ok(body)) = read else {
        return super::openai::error(502, "upstream_error", "the deployment's answer was cut off");
    };
    if method == Method::DELETE && part.is_empty() && (status.is_success() || status == 404) {
        // Gone at the deployment: the record goes too.
        let _ = s
            .writer
            .forget_object(tenant, RESPONSE.into(), id.into())
            .await;
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
}

/// OpenAI's answer for a response it does not have.
fn not_found(id: &str) -> Response {
    super::openai::error(
        404,
        "not_found",
        &format!("Response with id '{id}' not found."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_read_from_answers_and_stream_events() {
        assert_eq!(
            response_id(&json!({"id": "resp_1", "object": "response"})),
            Some("resp_1")
        );
        assert_eq!(
            response_id(&json!({"type": "response.created", "response": {"id": "resp_2"}})),
            Some("resp_2")
        );
        assert_eq!(response_id(&json!({"id": "../etc"})), None);
        let event = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_3\"}}\n\n";
        assert_eq!(response_id_in_event(event).as_deref(), Some("resp_3"));
        assert_eq!(response_id_in_event(b"data: [DONE]\n\n"), None);
    }
}
