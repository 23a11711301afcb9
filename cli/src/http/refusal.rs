//! The service's error answers, `{"outcome": "rejected", "reason": word, "message": ...}`,
//! and `Retry-After` on any answer that carries a retry-after.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use tollgate::reason::Reason;

/// The service's own refusals, one row each: its status, its reason word and what it means.
/// Every check above the engine answers with one of these (the engine's own reasons come
/// through [`refuse_for`] in its words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// 400: the body, a path segment or a query is malformed.
    InvalidRequest,
    /// 401: no key, or a key tollgate does not know.
    Unauthorized,
    /// 403: the key's role may not do this.
    Forbidden,
    /// 403: a worker reported an attempt it did not claim.
    NotClaimed,
    /// 404: no shadow policy is installed.
    NoShadowPolicy,
    /// 404: nothing is at this path.
    NotFound,
    /// 404: no operation has this key.
    UnknownOperation,
    /// 405: the path does not take this method.
    MethodNotAllowed,
    /// 408: the body did not arrive in time.
    Timeout,
    /// 413: the body is larger than `limits.max_request_bytes`.
    TooLarge,
    /// 500: an internal error; nothing was spent.
    Internal,
    /// 503: the server is stopping.
    Stopping,
    /// 503: the store cannot be reached now.
    StoreUnavailable,
    /// 503: the writer thread has stopped.
    WriterStopped,
}

impl Rejection {
    /// The HTTP status.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Rejection::InvalidRequest => StatusCode::BAD_REQUEST,
            Rejection::Unauthorized => StatusCode::UNAUTHORIZED,
            Rejection::Forbidden | Rejection::NotClaimed => StatusCode::FORBIDDEN,
            Rejection::NoShadowPolicy | Rejection::NotFound | Rejection::UnknownOperation => {
                StatusCode::NOT_FOUND
            }
            Rejection::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::Timeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Rejection::Stopping | Rejection::StoreUnavailable | Rejection::WriterStopped => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The reason word of the answer's `reason`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Rejection::InvalidRequest => "invalid_request",
            Rejection::Unauthorized => "unauthorized",
            Rejection::Forbidden => "forbidden",
            Rejection::NotClaimed => "not_claimed",
            Rejection::NoShadowPolicy => "no_shadow_policy",
            Rejection::NotFound => "not_found",
            Rejection::UnknownOperation => "unknown_operation",
            Rejection::MethodNotAllowed => "method_not_allowed",
            Rejection::Timeout => "timeout",
            Rejection::TooLarge => "too_large",
            Rejection::Internal => "internal",
            Rejection::Stopping => "stopping",
            Rejection::StoreUnavailable => "store_unavailable",
            Rejection::WriterStopped => "writer_stopped",
        }
    }

    /// What it means, for people.
    fn what(self) -> &'static str {
        match self {
            Rejection::InvalidRequest => "the request is malformed",
            Rejection::Unauthorized => "no key, or a key tollgate does not know",
            Rejection::Forbidden => "this key's role may not do this",
            Rejection::NotClaimed => "the attempt is not claimed by this worker",
            Rejection::NoShadowPolicy => "no shadow policy is installed",
            Rejection::NotFound => "nothing is at this path",
            Rejection::UnknownOperation => "no operation has this key",
            Rejection::MethodNotAllowed => "this path does not take this method",
            Rejection::Timeout => "the request body did not arrive in time",
            Rejection::TooLarge => "the request body is larger than limits.max_request_bytes",
            Rejection::Internal => "an internal error; nothing was spent",
            Rejection::Stopping => "the server is stopping; retry on another replica",
            Rejection::StoreUnavailable => "the store is unavailable; nothing was spent",
            Rejection::WriterStopped => "the server's writer has stopped; nothing was spent",
        }
    }
}

/// The service's error answers: `{"outcome": "rejected", "reason": word, "message": text}`.
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) reason: &'static str,
    pub(crate) retry_after_ms: Option<u64>,
    /// The sentence for people.
    pub(crate) message: String,
    /// The request's field at fault, for a request refused by validation.
    pub(crate) field: Option<String>,
}

/// One of the service's own refusals, in its own words.
pub(crate) fn refuse(rejection: Rejection) -> Refusal {
    Refusal {
        status: rejection.status(),
        reason: rejection.reason(),
        retry_after_ms: None,
        message: format!("{}: {}", rejection.reason(), rejection.what()),
        field: None,
    }
}

/// One of the service's own refusals, cured by waiting `ms`: the sentence says so and the
/// answer carries `Retry-After`.
pub(crate) fn refuse_until(rejection: Rejection, ms: u64) -> Refusal {
    Refusal {
        retry_after_ms: Some(ms),
        message: format!(
            "{}: {}; retry in {}",
            rejection.reason(),
            rejection.what(),
            tollgate::explain::seconds(ms)
        ),
        ..refuse(rejection)
    }
}

/// A refusal for one of the engine's reasons, in the engine's words.
fn engine_refusal(reason: Reason, message: String) -> Refusal {
    Refusal {
        status: StatusCode::from_u16(reason.http()).unwrap_or(StatusCode::BAD_REQUEST),
        reason: reason.as_str(),
        retry_after_ms: None,
        message,
        field: None,
    }
}

/// A refusal for one of the engine's reasons (validation, say), in the engine's words.
pub(crate) fn refuse_for(reason: Reason) -> Refusal {
    engine_refusal(reason, tollgate::explain::message(reason, None, None, None))
}

/// A request refused by validation: the reason, and the field and what is wrong with it.
pub(crate) fn refuse_for_request(e: &tollgate::validate::RequestError) -> Refusal {
    let reason = e.reason();
    let message = tollgate::explain::message(reason, None, Some(&e.to_string()), None);
    Refusal {
        field: Some(e.field().to_string()),
        ..engine_refusal(reason, message)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut body =
            json!({"outcome": "rejected", "reason": self.reason, "message": self.message});
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
pub(crate) fn with_retry_after(
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
