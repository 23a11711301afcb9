//! The gateway's HTTP client to the providers, and how it reads what they answered: a
//! refusal before any answer (nothing done, safe to retry if the kind allows) is told apart
//! from an answer that was cut off (the outcome is unknown).

use axum::body::Bytes;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// One client, shared by every call: connections to each provider are kept alive.
pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for `http://` and `https://` upstreams (rustls, Mozilla's roots).
pub fn client() -> HttpClient {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(https)
}

/// How a call that got no usable answer ended, as a failure kind of the contract.
#[derive(Debug)]
pub struct Refusal {
    /// `rate_limited`, `unavailable`, `connect_failed`, `auth_failed` or `bad_request`.
    pub kind: &'static str,
    /// The provider's own retry-after, when it gave one.
    pub retry_after_ms: Option<u64>,
}

/// What sending a request led to.
pub enum Sent {
    /// The provider answered 2xx: the body is still to be read.
    Answer(Response<Incoming>),
    /// The provider refused before doing the work (or could not be reached): its status,
    /// headers and body are passed on if the call is not retried.
    Refused {
        /// Why, as a failure kind.
        refusal: Refusal,
        /// The provider's status (502 when it could not be reached).
        status: StatusCode,
        /// The provider's body, if any.
        body: Bytes,
    },
    /// The request may have reached the provider and no answer came: outcome unknown.
    Lost(String),
}

/// Sends `request`, waiting at most until `deadline` for the answer's head.
pub async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    deadline: tokio::time::Instant,
) -> Sent {
    let response = match tokio::time::timeout_at(deadline, client.request(request)).await {
        Err(_) => return Sent::Lost("no answer before the deadline".into()),
        Ok(Err(e)) if e.is_connect() => {
            return Sent::Refused {
                refusal: Refusal {
                    kind: "connect_failed",
                    retry_after_ms: None,
                },
                status: StatusCode::BAD_GATEWAY,
                body: Bytes::new(),
            }
        }
        Ok(Err(e)) => return Sent::Lost(format!("connection lost: {e}")),
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    if status.is_success() {
        return Sent::Answer(response);
    }
    let kind = match status.as_u16() {
        429 => "rate_limited",
        401 | 403 => "auth_failed",
        500..=599 => "unavailable",
        _ => "bad_request",
    };
    let retry_after_ms = retry_after(response.headers());
    // A refusal's body is small; one that does not come is not worth waiting for.
    let body =
        match tokio::time::timeout_at(deadline, read_all(response.into_body(), 1 << 20)).await {
            Ok(Ok(b)) => b,
            _ => Bytes::new(),
        };
    Sent::Refused {
        refusal: Refusal {
            kind,
            retry_after_ms,
        },
        status,
        body,
    }
}

/// The provider's retry-after: `retry-after-ms`, else `retry-after` in seconds.
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    let read = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    if let Some(ms) = read("retry-after-ms") {
        return (ms.is_finite() && ms >= 0.0).then_some(ms.ceil() as u64);
    }
    let s = read("retry-after")?;
    (s.is_finite() && s >= 0.0).then_some((s * 1000.0).ceil() as u64)
}

/// A body read whole, refused past `limit` bytes.
pub async fn read_all(body: Incoming, limit: usize) -> Result<Bytes, String> {
    use http_body_util::BodyExt;
    http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_milliseconds_first() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(2000));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(150));
        h.insert("retry-after-ms", "-5".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }
}
