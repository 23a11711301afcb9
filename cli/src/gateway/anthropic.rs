//! Anthropic's side of the gateway's boundary: a caller's key accepted in `x-api-key` as
//! well as `Authorization: Bearer`; the `anthropic-version` and `anthropic-beta` headers
//! carried upstream (the caller's key never is); and every answer on an Anthropic route
//! told in Anthropic's words: errors as `{"type":"error","error":{"type",...}}` and
//! tollgate's limits as `anthropic-ratelimit-*` headers, resets as RFC 3339 times.

use super::dialect::Dialect;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use serde_json::{json, Value};

/// The API version sent upstream when the caller names none.
pub const DEFAULT_VERSION: &str = "2023-06-01";
/// The largest error body rewritten (tollgate's own are a few hundred bytes).
const MAX_ERROR_BYTES: usize = 1 << 20;

/// The caller's headers with an `x-api-key` read as the caller's key where no
/// `Authorization` is given.
pub fn caller_headers(mut headers: HeaderMap) -> HeaderMap {
    if !headers.contains_key(header::AUTHORIZATION) {
        let bearer = headers
            .get("x-api-key")
            .and_then(|k| k.to_str().ok())
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok());
        if let Some(v) = bearer {
            headers.insert(header::AUTHORIZATION, v);
        }
    }
    headers
}

/// The caller's headers a call of `dialect` carries upstream.
pub fn upstream_headers(dialect: Dialect, headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    if dialect != Dialect::Messages {
        return Vec::new();
    }
    let version = headers
        .get("anthropic-version")
        .cloned()
        .unwrap_or(HeaderValue::from_static(DEFAULT_VERSION));
    let mut out = vec![(HeaderName::from_static("anthropic-version"), version)];
    if let Some(beta) = headers.get("anthropic-beta") {
        out.push((HeaderName::from_static("anthropic-beta"), beta.clone()));
    }
    out
}

/// An answer of the gateway told in Anthropic's words (an upstream's own error, already in
/// them, is left as it is).
pub async fn translate(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    rate_limit_headers(&mut parts.headers);
    if parts.status.is_success() {
        return Response::from_parts(parts, body);
    }
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BYTES).await else {
        let error = json!({"type": "error", "error": {"type": "api_error",
                           "message": "the error could not be read"}});
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(error.to_string()));
    };
    let rewritten = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) if o.get("type").is_none() => {
            o.get("error").and_then(Value::as_object).map(|e| {
                let mut inner = serde_json::Map::new();
                inner.insert("type".into(), json!(error_type(parts.status.as_u16())));
                for (k, v) in e {
                    if !matches!(k.as_str(), "type" | "param") {
                        inner.insert(k.clone(), v.clone());
                    }
                }
                json!({"type": "error", "error": inner}).to_string()
            })
        }
        _ => None,
    };
    match rewritten {
        Some(text) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(text))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` as Anthropic names them
/// (`anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`), each reset the time
/// at which the bucket is full again.
fn rate_limit_headers(headers: &mut HeaderMap) {
    for unit in ["requests", "tokens"] {
        for field in ["limit", "remaining", "reset"] {
            let from = format!("x-ratelimit-{field}-{unit}");
            let Some(value) = headers.remove(from.as_str()) else {
                continue;
            };
            let value = match field {
                "reset" => value
                    .to_str()
                    .ok()
                    .and_then(parse_duration_ms)
                    .and_then(rfc3339_after)
                    .and_then(|t| HeaderValue::from_str(&t).ok()),
                _ => Some(value),
            };
            if let (Ok(name), Some(v)) = (
                HeaderName::from_bytes(format!("anthropic-ratelimit-{unit}-{field}").as_bytes()),
                value,
            ) {
                headers.insert(name, v);
            }
        }
    }
}

/// Milliseconds of a duration as the OpenAI headers write it (`250ms`, `1.5s`, `6m0s`,
/// `1h2m3s`).
fn parse_duration_ms(text: &str) -> Option<u64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().ok();
    }
    let mut total = 0.0f64;
    let mut number = String::new();
    for c in text.chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            'h' | 'm' | 's' => {
                let n: f64 = number.parse().ok()?;
                number.clear();
                total += n * match c {
                    'h' => 3_600_000.0,
                    'm' => 60_000.0,
                    _ => 1000.0,
                };
            }
            _ => return None,
        }
    }
    (number.is_empty() && total.is_finite()).then_some(total.round() as u64)
}

/// The RFC 3339 time `ms` from now (UTC, whole seconds, rounded up).
fn rfc3339_after(ms: u64) -> Option<String> {
    let at = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()?
        .checked_add(time::Duration::seconds(
            ms.div_ceil(1000).min(i64::MAX as u64) as i64,
        ))?;
    at.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_the_openai_headers_write_them() {
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("1.5s"), Some(1500));
        assert_eq!(parse_duration_ms("6m0s"), Some(360_000));
        assert_eq!(parse_duration_ms("1h2m3s"), Some(3_723_000));
        assert_eq!(parse_duration_ms("soon"), None);
        for ms in [0, 999, 1000, 61_500, 7_300_000] {
            assert_eq!(
                parse_duration_ms(&super::super::openai::duration(ms)),
                Some(ms)
            );
        }
    }

    #[tokio::test]
    async fn tollgates_refusal_is_told_in_anthropics_shape_and_headers() {
        let mut refusal =
            super::super::openai::error(429, "tenant_tokens", "needs 500 tokens, 20 available");
        refusal.headers_mut().insert(
            "x-ratelimit-remaining-tokens",
            HeaderValue::from_static("20"),
        );
        refusal
            .headers_mut()
            .insert("x-ratelimit-reset-tokens", HeaderValue::from_static("2s"));
        let answer = translate(refusal).await;
        assert_eq!(answer.status(), 429);
        let h = answer.headers();
        assert_eq!(h["anthropic-ratelimit-tokens-remaining"], "20");
        assert!(h["anthropic-ratelimit-tokens-reset"]
            .to_str()
            .unwrap()
            .ends_with('Z'));
        assert!(!h.contains_key("x-ratelimit-remaining-tokens"));
        let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "tenant_tokens");
        assert_eq!(v["error"]["message"], "needs 500 tokens, 20 available");
    }
}
