//! Answer replay: a call made with an `Idempotency-Key` keeps its answer (the status, the
//! headers that describe the body, and the body or a stream's events exactly as the caller
//! got them) in the store with its success, for `gateway.replay_ttl_s`. A later call with the
//! same key and body (the engine's `duplicate_completed`) is given that answer back, marked
//! `x-tollgate-replayed: true`, without an upstream call or a second spend. The store
//! keeps it, so every replica on one database replays it.

use super::openai;
use crate::http::AppState;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tollgate::engine::{SavedAnswer, TenantLevels};

/// The headers an answer is kept with: what its body is. Rate-limit headers are the
/// tenant's levels at the time of the replay, never the saved ones.
const KEPT_HEADERS: [&str; 4] = [
    "content-type",
    "cache-control",
    "x-tollgate-degraded",
    "x-tollgate-policy-message",
];

/// What is kept before the body: its status and headers, one JSON line.
#[derive(Serialize, Deserialize)]
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

/// The gateway's replay settings.
#[derive(Clone, Copy, Debug)]
pub struct Replay {
    /// How long an answer is given back, in ms.
    pub ttl_ms: i64,
    /// The largest answer kept.
    pub max_bytes: usize,
}

impl Replay {
    /// The answer to keep of a call that answered `status` with `headers` and `body`, at
    /// `now_ms`; `None` when it is larger than the bound.
    pub fn save(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        now_ms: i64,
    ) -> Option<SavedAnswer> {
        if body.len() > self.max_bytes {
            return None;
        }
        let head = Head {
            status: status.as_u16(),
            headers: KEPT_HEADERS
                .iter()
                .filter_map(|name| {
                    let v = headers.get(*name)?.to_str().ok()?;
                    Some((name.to_string(), v.to_string()))
                })
                .collect(),
        };
        let mut bytes = serde_json::to_vec(&head).ok()?;
        bytes.push(b'\n');
        bytes.extend_from_slice(body);
        Some(SavedAnswer {
            bytes,
            expires_ms: now_ms.saturating_add(self.ttl_ms),
        })
    }
}

/// The kept answer as a response: the same status, headers and body, marked replayed.
fn response(bytes: Vec<u8>, levels: Option<&TenantLevels>) -> Option<Response> {
    let split = bytes.iter().position(|&b| b == b'\n')?;
    let head: Head = serde_json::from_slice(&bytes[..split]).ok()?;
    let body = bytes[split + 1..].to_vec();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(head.status).ok()?;
    let headers = response.headers_mut();
    for (name, value) in head.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(n, v);
        }
    }
    headers.insert("x-tollgate-replayed", HeaderValue::from_static("true"));
    if let Some(l) = levels {
        openai::rate_limit_headers(headers, l);
    }
    Some(response)
}

/// The answer kept for `(tenant, key)`, as a response; `None` when none is kept (it
/// expired, was too large, or the store cannot be read now).
pub async fn fetch(
    s: &AppState,
    tenant: &str,
    key: &str,
    levels: Option<&TenantLevels>,
) -> Option<Response> {
    let saved = s
        .writer
        .saved_answer(tenant.to_string(), key.to_string(), s.clock.now_ms())
        .await;
    match saved {
        Ok(Some(bytes)) => response(bytes, levels),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_saved_answer_comes_back_byte_for_byte_with_its_headers() {
        let replay = Replay {
            ttl_ms: 1_000,
            max_bytes: 64,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            "x-ratelimit-remaining-tokens",
            HeaderValue::from_static("7"),
        );
        let body = b"data: {\"a\":1}\n\ndata: [DONE]\n\n";
        let saved = replay.save(StatusCode::OK, &headers, body, 5).unwrap();
        assert_eq!(saved.expires_ms, 1_005);
        let r = response(saved.bytes, None).unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        assert_eq!(r.headers()["x-tollgate-replayed"], "true");
        assert!(r.headers().get("x-ratelimit-remaining-tokens").is_none());
        let got = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], &body[..]);
        // Over the bound: not kept.
        assert!(replay
            .save(StatusCode::OK, &headers, &[b'x'; 65], 0)
            .is_none());
        assert!(response(b"no head".to_vec(), None).is_none());
    }
}
