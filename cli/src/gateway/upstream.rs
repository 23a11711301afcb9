//! The gateway's HTTP client to the providers, and how it reads what they answered: a
//! refusal before any answer (nothing done, safe to retry if the kind allows) is told apart
//! from an answer that was cut off (the outcome is unknown).

use axum::body::Bytes;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tollgate::engine::ProviderLimits;

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
        /// What the provider said of its limits.
        limits: Option<ProviderLimits>,
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
                limits: None,
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
    let limits = provider_limits(response.headers());
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
        limits,
    }
}

/// What a provider's answer says of its limits: OpenAI's `x-ratelimit-remaining-*` and
/// `x-ratelimit-reset-*` (durations such as `1s`, `6m0s`, `17ms`), Anthropic's
/// `anthropic-ratelimit-*-remaining` (its resets are dates: the default pause applies).
pub fn provider_limits(headers: &HeaderMap) -> Option<ProviderLimits> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &str| text(name)?.parse::<u64>().ok();
    let limits = ProviderLimits {
        remaining_requests: number("x-ratelimit-remaining-requests")
            .or_else(|| number("anthropic-ratelimit-requests-remaining")),
        remaining_tokens: number("x-ratelimit-remaining-tokens")
            .or_else(|| number("anthropic-ratelimit-tokens-remaining")),
        reset_requests_ms: text("x-ratelimit-reset-requests").and_then(duration_ms),
        reset_tokens_ms: text("x-ratelimit-reset-tokens").and_then(duration_ms),
    };
    (limits != ProviderLimits::default()).then_some(limits)
}

/// A duration as OpenAI writes it (`6m0s`, `1.5s`, `17ms`, `1h2m3s`), in whole ms rounded up.
fn duration_ms(text: &str) -> Option<u64> {
    let mut total = 0.0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += n * unit;
        rest = &rest[len..];
    }
    (total.is_finite() && total >= 0.0).then(|| (total * 1000.0).ceil() as u64)
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
    fn provider_limits_read_openai_and_anthropic_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(provider_limits(&h), None);
        h.insert("x-ratelimit-remaining-requests", "59".parse().unwrap());
        h.insert("x-ratelimit-remaining-tokens", "149984".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        h.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
        let l = provider_limits(&h).unwrap();
        assert_eq!(l.remaining_requests, Some(59));
        assert_eq!(l.remaining_tokens, Some(149_984));
        assert_eq!(l.reset_requests_ms, Some(1000));
        assert_eq!(l.reset_tokens_ms, Some(360_000));
        let mut a = HeaderMap::new();
        a.insert(
            "anthropic-ratelimit-requests-remaining",
            "7".parse().unwrap(),
        );
        assert_eq!(provider_limits(&a).unwrap().remaining_requests, Some(7));
        for (text, ms) in [
            ("17ms", Some(17)),
            ("1.5s", Some(1500)),
            ("1h2m3s", Some(3_723_000)),
            ("", None),
            ("5x", None),
            ("m", None),
        ] {
            assert_eq!(duration_ms(text), ms, "{text}");
        }
    }

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
