//! The alert sender: posts the budget alerts the engine wrote to its outbox, each to its
//! rule's webhook, as JSON signed with `x-tollgate-signature: sha256=<hex>` (HMAC-SHA256 of
//! the body under the secret in the rule's `secret_env`). A 2xx answer acknowledges it;
//! anything else, or no answer, tries again after a backoff that doubles to five minutes.
//! The outbox is in the store, so alerts survive restarts and any replica may send them
//! (at least once: the payload's `id` is for the receiver to deduplicate by).

use crate::gateway::upstream::{client, HttpClient};
use crate::http::Shared;
use axum::body::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::Full;
use sha2::Sha256;
use std::time::Duration;
use tollgate::alerts::Alert;

/// How often the outbox is read.
const EVERY: Duration = Duration::from_millis(500);
/// Alerts taken per round.
const PER_ROUND: u32 = 32;
/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// Posts one alert; whether the webhook acknowledged it.
async fn post(http: &HttpClient, alert: &Alert) -> bool {
    let mut request = hyper::Request::post(&alert.webhook)
        .header("content-type", "application/json")
        .header("x-tollgate-alert-id", &alert.id);
    if let Some(var) = &alert.secret_env {
        match std::env::var(var) {
            Ok(secret) => {
                let sig = signature(secret.as_bytes(), alert.payload.as_bytes());
                request = request.header("x-tollgate-signature", sig);
            }
            Err(_) => {
                tracing::warn!(alert = %alert.id, variable = %var, "the alert's secret variable is not set: not sent");
                return false;
            }
        }
    }
    let Ok(request) = request.body(Full::new(Bytes::from(alert.payload.clone()))) else {
        tracing::warn!(alert = %alert.id, webhook = %alert.webhook, "the alert's webhook is not a valid URL");
        return false;
    };
    match tokio::time::timeout(POST_TIMEOUT, http.request(request)).await {
        Ok(Ok(response)) if response.status().is_success() => true,
        Ok(Ok(response)) => {
            tracing::warn!(alert = %alert.id, status = %response.status(), "the webhook refused an alert; it is tried again");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(alert = %alert.id, error = %e, "an alert could not be posted; it is tried again");
            false
        }
        Err(_) => {
            tracing::warn!(alert = %alert.id, "an alert's post timed out; it is tried again");
            false
        }
    }
}

/// Reads the outbox and posts what is due, until the process ends.
pub async fn send_forever(state: Shared) {
    let http = client();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        let engine = state.engine.clone();
        let now_ms = state.clock.now_ms();
        let due =
            tokio::task::spawn_blocking(move || engine.take_due_alerts(now_ms, PER_ROUND)).await;
        let Ok(Ok(due)) = due else {
            continue;
        };
        for alert in &due {
            let ok = post(&http, alert).await;
            let engine = state.engine.clone();
            let alert = alert.clone();
            let now_ms = state.clock.now_ms();
            let _ =
                tokio::task::spawn_blocking(move || engine.alert_posted(&alert, ok, now_ms)).await;
        }
        let engine = state.engine.clone();
        if let Ok(Ok(n)) = tokio::task::spawn_blocking(move || engine.pending_alerts()).await {
            state
                .metrics
                .alerts_pending
                .set(n.min(i64::MAX as u64) as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn signatures_are_rfc_4231_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
