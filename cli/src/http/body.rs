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

/// A body that is one JSON object of `T`'s shape; a refusal says what the parser found.
pub(crate) fn json_body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, Refusal> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    validate::from_object(&mut json)
        .and_then(|body| json.end().map(|()| body))
        .map_err(|e| {
            // What the parser found, and where, bounded: the caller's own input.
            let mut why = e.to_string();
            if why.len() > MAX_WHY_BYTES {
                why.truncate(why.floor_char_boundary(MAX_WHY_BYTES));
                why.push('…');
            }
            let mut refusal = refuse(Rejection::InvalidRequest);
            refusal.message = format!("{} ({why})", refusal.message);
            refusal
        })
}

/// The most of a parser's message a refusal repeats.
const MAX_WHY_BYTES: usize = 200;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        n: u64,
    }

    #[test]
    fn a_refused_body_says_what_was_wrong_and_where_within_bounds() {
        let wrong = |text: String| match json_body::<Body>(&Bytes::from(text)) {
            Ok(b) => panic!("{b:?} was taken"),
            Err(r) => r.message,
        };
        let m = wrong(r#"{"n": "seven"}"#.into());
        assert!(
            m.starts_with("invalid_request: the request is malformed ("),
            "{m}"
        );
        assert!(m.contains("invalid type") && m.contains("column"), "{m}");
        let m = wrong(r#"{"n": 1, "extra": 2}"#.into());
        assert!(m.contains("unknown field `extra`"), "{m}");
        let m = wrong(format!(r#"{{"{}é": 1}}"#, "x".repeat(500)));
        assert!(m.len() < 400 && m.ends_with("…)"), "{m}");
        assert!(matches!(
            json_body::<Body>(&Bytes::from(r#"{"n": 7}"#)),
            Ok(Body { n: 7 })
        ));
    }
}
