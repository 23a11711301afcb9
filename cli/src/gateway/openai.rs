//! OpenAI's wire conventions the gateway answers in: the error body, the rate-limit headers
//! (durations as OpenAI writes them), `Retry-After`/`retry-after-ms`, and `x-should-retry`,
//! which tells the OpenAI SDKs whether their own retry loop may try again.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::json;
use tollgate::engine::TenantLevels;
use tollgate::runtime::BucketLevel;

/// An error the gateway answers before any call went upstream.
#[derive(Debug)]
pub struct ApiError {
    status: u16,
    code: String,
    message: String,
    /// When waiting cures it: how long, for `Retry-After` and the SDKs' own retry loops.
    retry_after_ms: Option<u64>,
}

impl ApiError {
    /// An error of `status` with a `code` word and a sentence for people.
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The same error, cured by waiting `ms`: answered with `Retry-After`, `retry-after-ms`
    /// and the reason in `x-tollgate-reason`.
    pub fn retry_after(self, ms: u64) -> Self {
        ApiError {
            retry_after_ms: Some(ms),
            ..self
        }
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = error(self.status, &self.code, &self.message);
        if let Some(ms) = self.retry_after_ms {
            let headers = response.headers_mut();
            retry_after_headers(headers, ms);
            if let Ok(v) = HeaderValue::from_str(&self.code) {
                headers.insert("x-tollgate-reason", v);
            }
        }
        response
    }
}

/// An error answer: `{"error": {"message", "type", "code"}}`.
pub fn error(status: u16, code: &str, message: &str) -> Response {
    error_with(status, code, message, serde_json::Map::new())
}

/// An error answer with more members in its `error` object (a refusal's `limit`,
/// `requested`, `available`, `retry_after_ms`): the SDKs keep the whole body.
pub fn error_with(
    status: u16,
    code: &str,
    message: &str,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Response {
    let kind = match status {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        _ => "api_error",
    };
    let mut inner = json!({"message": message, "type": kind, "code": code, "param": null});
    if let serde_json::Value::Object(o) = &mut inner {
        o.extend(extra);
    }
    let body = json!({ "error": inner });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A duration as OpenAI's rate-limit headers write it: `17ms`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let seconds = if rest % 1000 == 0 {
        format!("{}s", rest / 1000)
    } else {
        let s = format!("{:.3}", rest as f64 / 1000.0);
        format!("{}s", s.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// What a reset header says of a bucket that never refills: a hundred years, a duration
/// every parser of these headers reads, and longer than any deployment waits.
const NEVER_MS: u64 = 100 * 8_760 * 3_600_000;

/// Time until a bucket is full again ([`NEVER_MS`] when it does not refill).
fn reset_ms(b: &BucketLevel) -> u64 {
    let missing = b.capacity.saturating_sub(b.available);
    if missing == 0 {
        return 0;
    }
    if b.refill_per_s <= 0.0 {
        return NEVER_MS;
    }
    ((missing as f64 * 1000.0 / b.refill_per_s).ceil() as u64).min(NEVER_MS)
}

fn set(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// OpenAI's six rate-limit headers for the tenant's request and token buckets.
pub fn rate_limit_headers(headers: &mut HeaderMap, levels: &TenantLevels) {
    let pairs = [
        (
            &levels.requests,
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
        ),
        (
            &levels.tokens,
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ),
    ];
    for (bucket, [limit, remaining, reset]) in pairs {
        set(headers, limit, bucket.capacity.to_string());
        set(headers, remaining, bucket.available.to_string());
        set(headers, reset, duration(reset_ms(bucket)));
    }
    budget_headers(headers, levels);
}

/// What is left of the tightest money budget of the tenant and its groups, and when it is
/// full again (RFC 3339; absent when it never refills).
fn budget_headers(headers: &mut HeaderMap, levels: &TenantLevels) {
    let Some(m) = levels.money else {
        return;
    };
    set(
        headers,
        "x-tollgate-budget-remaining-microusd",
        m.remaining_microusd.to_string(),
    );
    if let Some(at) = m.resets_at_ms {
        set(
            headers,
            "x-tollgate-budget-resets",
            tollgate::spend::rfc3339(at),
        );
    }
}

/// `Retry-After` (whole seconds, rounded up) and `retry-after-ms`.
pub fn retry_after_headers(headers: &mut HeaderMap, ms: u64) {
    set(headers, "retry-after", ms.div_ceil(1000).to_string());
    set(headers, "retry-after-ms", ms.to_string());
}

/// Whether the OpenAI SDKs may retry this answer themselves.
pub fn should_retry(headers: &mut HeaderMap, retry: bool) {
    set(headers, "x-should-retry", retry.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_cured_by_waiting_says_how_long_and_why() {
        use axum::response::IntoResponse;
        let plain = ApiError::new(500, "internal", "store failure").into_response();
        assert!(plain.headers().get("retry-after").is_none());
        let r = ApiError::new(503, "store_unavailable", "retry shortly")
            .retry_after(1500)
            .into_response();
        assert_eq!(r.status(), 503);
        let h = r.headers();
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h["retry-after-ms"], "1500");
        assert_eq!(h["x-tollgate-reason"], "store_unavailable");
    }

    #[test]
    fn durations_are_written_as_openai_writes_them() {
        assert_eq!(duration(0), "0ms");
        assert_eq!(duration(17), "17ms");
        assert_eq!(duration(1000), "1s");
        assert_eq!(duration(1500), "1.5s");
        assert_eq!(duration(360_000), "6m0s");
        assert_eq!(duration(3_723_000), "1h2m3s");
        assert_eq!(duration(61_250), "1m1.25s");
    }

    #[test]
    fn resets_are_the_time_until_full() {
        let b = |available, refill_per_s| BucketLevel {
            available,
            capacity: 100,
            refill_per_s,
        };
        assert_eq!(reset_ms(&b(100, 0.0)), 0);
        assert_eq!(reset_ms(&b(40, 10.0)), 6000);
        assert_eq!(duration(reset_ms(&b(40, 0.0))), "876000h0m0s");
    }
}
