//! Reading what a client sends: bodies bounded in size and time, strict JSON objects, and
//! operation keys from the path.

use super::refusal::{refuse, Refusal, Rejection};
use super::BODY_TIMEOUT;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path};
use axum::http::{header, request::Parts, HeaderMap};
use http_body_util::BodyExt;
use serde::Deserialize;
use tollgate::validate;

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`]; larger bodies are cut off
/// (what the client is still sending is drained by [`linger`]).
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(refuse(Rejection::TooLarge));
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let read = http_body_util::Limited::new(body, limit).collect();
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Err(_) => Err(refuse(Rejection::Timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(refuse(Rejection::TooLarge))
        }
        Ok(Err(_)) => Err(refuse(Rejection::InvalidRequest)),
    }
}

pub(crate) fn json_body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, Refusal> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    validate::from_object(&mut json)
        .and_then(|body| json.end().map(|()| body))
        .map_err(|_| refuse(Rejection::InvalidRequest))
}

/// An operation key (or another name) from the path, percent-decoded; `None` when that is not UTF-8. It never
/// refuses by itself, so that the key and role checks answer first (see [`check_key`]).
pub(crate) struct OpKey(pub(crate) Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for OpKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let key = Path::<String>::from_request_parts(parts, state).await;
        Ok(OpKey(key.ok().map(|Path(k)| k)))
    }
}

/// The operation key, when it is UTF-8 of 1 to 255 characters.
pub(crate) fn check_key(key: OpKey) -> Result<String, Refusal> {
    match key.0 {
        Some(k) if (1..=validate::MAX_KEY_CHARS).contains(&k.chars().count()) => Ok(k),
        _ => Err(refuse(Rejection::InvalidRequest)),
    }
}
