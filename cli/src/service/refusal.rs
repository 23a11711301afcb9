//! The service's error answers, `{"outcome": "rejected", "reason": word, "message": ...}`,
//! and `Retry-After` on any answer that carries a retry-after.

use super::*;

/// The service's error answers: `{"outcome": "rejected", "reason": word, "message": text}`.
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) reason: &'static str,
    pub(super) retry_after_ms: Option<u64>,
    /// The sentence for people; the reason's own when none is given.
    pub(crate) message: Option<String>,
    /// The request's field at fault, for a request refused by validation.
    pub(super) field: Option<String>,
}

pub(super) fn refuse(status: u16, reason: &'static str) -> Refusal {
    Refusal {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        reason,
        retry_after_ms: None,
        message: None,
        field: None,
    }
}

/// A refusal for one of the engine's reasons (validation, say), in the engine's words.
pub(super) fn refuse_for(reason: Reason) -> Refusal {
    Refusal {
        message: Some(tollgate::explain::message(reason, None, None, None)),
        ..refuse(reason.http(), reason.as_str())
    }
}

/// A request refused by validation: the reason, and the field and what is wrong with it.
pub(super) fn refuse_for_request(e: &tollgate::validate::RequestError) -> Refusal {
    let reason = e.reason();
    Refusal {
        message: Some(tollgate::explain::message(
            reason,
            None,
            Some(&e.to_string()),
            None,
        )),
        field: Some(e.field().to_string()),
        ..refuse(reason.http(), reason.as_str())
    }
}

impl Refusal {
    /// The sentence this refusal says.
    pub(crate) fn text(&self) -> String {
        if let Some(m) = &self.message {
            return m.clone();
        }
        let what = match self.reason {
            "unauthorized" => "no key, or a key tollgate does not know",
            "forbidden" => "this key's role may not do this",
            "not_claimed" => "the attempt is not claimed by this worker",
            "no_shadow_policy" => "no shadow policy is installed",
            "not_found" => "nothing is at this path",
            "unknown_operation" => "no operation has this key",
            "method_not_allowed" => "this path does not take this method",
            "timeout" => "the request body did not arrive in time",
            "too_large" => "the request body is larger than limits.max_request_bytes",
            "internal" => "an internal error; nothing was spent",
            "stopping" => "the server is stopping; retry on another replica",
            "store_unavailable" => "the store is unavailable; nothing was spent",
            "writer_stopped" => "the server's writer has stopped; nothing was spent",
            "invalid_request" => "the request is malformed",
            _ => "refused",
        };
        match self.retry_after_ms {
            Some(ms) => format!(
                "{}: {what}; retry in {}",
                self.reason,
                tollgate::explain::seconds(ms)
            ),
            None => format!("{}: {what}", self.reason),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut body =
            json!({"outcome": "rejected", "reason": self.reason, "message": self.text()});
        if let Some(ms) = self.retry_after_ms {
            body["retry_after_ms"] = json!(ms);
        }
        if let Some(field) = &self.field {
            body["field"] = json!(field);
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
