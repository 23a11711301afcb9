//! The service's error answers, `{"outcome": "rejected", "reason": word}`, and
//! `Retry-After` on any answer that carries a retry-after.

use super::*;

/// The service's error answers: `{"outcome": "rejected", "reason": word}`.
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) reason: &'static str,
    pub(super) retry_after_ms: Option<u64>,
}

pub(super) fn refuse(status: u16, reason: &'static str) -> Refusal {
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
pub(super) fn with_retry_after(
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
