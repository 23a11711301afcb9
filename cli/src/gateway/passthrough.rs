//! Calls that cost nothing, passed through with the caller's authentication only:
//! `GET` and `DELETE /v1/responses/{id}` (a stored response, read or removed). Nothing is
//! admitted or spent; the caller's key is checked and never sent upstream. A response lives
//! at the provider account that made it, so each upstream is asked in name order until one
//! knows it (any answer but 404).

use super::{caller, upstream, Shared, MAX_ANSWER_BYTES};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;

/// How long one upstream may take to answer a pass-through call.
const PASS_TIMEOUT_MS: u64 = 30_000;

/// `GET` or `DELETE /v1/responses/{id}`.
pub async fn response(
    State(s): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = caller(&s, &headers) {
        return e.into_response();
    }
    if id.is_empty()
        || id.len() > 256
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return super::openai::error(
            400,
            "invalid_request",
            "a response id is letters, digits, `_` and `-`",
        );
    }
    let g = &s.gateway;
    let mut last: Option<Response> = None;
    for (base_url, key) in &g.upstreams {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(format!("{base_url}/responses/{id}"))
            .header(header::ACCEPT, "application/json");
        if let Some(k) = key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let Ok(request) = request.body(Full::new(Bytes::new())) else {
            continue;
        };
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(PASS_TIMEOUT_MS);
        let answer = match tokio::time::timeout_at(deadline, g.client.request(request)).await {
            Ok(Ok(a)) => a,
            _ => continue,
        };
        let status = answer.status();
        let body = match upstream::read_all(answer.into_body(), MAX_ANSWER_BYTES).await {
            Ok(b) => b,
            Err(_) => continue,
        };
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if status != StatusCode::NOT_FOUND {
            return response;
        }
        last = Some(response);
    }
    last.unwrap_or_else(|| {
        super::openai::error(502, "upstream_error", "no upstream could be reached")
    })
}
