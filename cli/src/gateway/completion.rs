//! How a gateway call's attempt ended, reported to the engine. The caller's answer never
//! waits on the store: when the store cannot take a completion (an outage), the
//! completion is kept and offered again, with backoff, until the store takes it or
//! `limits.max_call_ms` has passed. The operation then ends as it would have (its slot
//! released, its usage counted), instead of staying `active` until the sweep makes it
//! `unknown` for a person to reconcile.
//!
//! A kept completion lives in this process: one cut short by a restart, or still refused
//! past `limits.max_call_ms`, is left to the sweep, which makes the operation `unknown`.

use super::GatewayCall;
use super::Shared;
use std::time::Duration;
use tollgate::engine::{Completion, CompletionAnswer, ProviderLimits, SavedAnswer};
use tollgate::model::{CallResult, RetryVerdict, Usage};
use tollgate::writer::Failure;
use tracing::Instrument;

/// The first wait before a kept completion is offered again; it doubles up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(2);

/// One attempt's end, as the gateway saw it.
pub struct Ending {
    pub result: CallResult,
    pub usage: Option<Usage>,
    pub failure: Option<&'static str>,
    pub provider_retry_after_ms: Option<u64>,
    /// The answer kept for a repeated call, saved with the success.
    pub answer: Option<SavedAnswer>,
    /// What the provider said of its limits, for the deployment to learn.
    pub limits: Option<ProviderLimits>,
}

impl Ending {
    pub fn of(result: CallResult) -> Self {
        Ending {
            result,
            usage: None,
            failure: None,
            provider_retry_after_ms: None,
            answer: None,
            limits: None,
        }
    }
}

/// Reports how the attempt ended; the retry verdict after a failure. `None` when the store
/// could not take it now (the completion is then kept, and the caller is not retried for:
/// the verdict is unknown) or did not apply it.
pub async fn finish(
    s: &Shared,
    call: &GatewayCall,
    attempt: u32,
    ending: Ending,
) -> Option<RetryVerdict> {
    if let Some(u) = ending.usage {
        let tokens = &s.metrics.gateway_tokens;
        tokens
            .with_label_values(&[&call.tenant, &call.model, "in"])
            .inc_by(u.input_tokens);
        tokens
            .with_label_values(&[&call.tenant, &call.model, "out"])
            .inc_by(u.output_tokens);
        // The classes, parts of the two above, where the provider reported them.
        for (direction, n) in [
            ("cached_in", u.cached_input_tokens),
            ("cache_write", u.cache_write_tokens),
            ("reasoning", u.reasoning_tokens),
        ] {
            if n > 0 {
                tokens
                    .with_label_values(&[&call.tenant, &call.model, direction])
                    .inc_by(n);
            }
        }
    }
    let completion = Completion {
        result: ending.result,
        usage: ending.usage,
        failure: ending.failure.map(str::to_string),
        provider_retry_after_ms: ending.provider_retry_after_ms,
        answer: ending.answer,
        provider_limits: ending.limits,
        // A report names its attempt: a late one can never end the next attempt.
        attempt: Some(attempt),
        ..Completion::succeeded(&call.tenant, &call.key)
    };
    let span =
        crate::telemetry::completion(&call.span, completion.result, completion.usage.as_ref());
    let submitted = submit(s, completion.clone()).instrument(span).await;
    match submitted {
        Ok(a) => {
            if !a.ok {
                tracing::warn!(tenant = %call.tenant, key = %call.key, attempt, error = ?a.error, "completion not applied");
            }
            a.retry
        }
        Err(Failure::Unavailable(e)) => {
            tracing::warn!(tenant = %call.tenant, key = %call.key, attempt, error = %e, "store unavailable: completion kept and offered again");
            keep(s.clone(), completion);
            None
        }
        Err(e) => {
            tracing::error!(tenant = %call.tenant, key = %call.key, attempt, error = %e, "completion failed");
            None
        }
    }
}

async fn submit(s: &Shared, completion: Completion) -> Result<CompletionAnswer, Failure> {
    s.writer.complete(completion, s.clock.now_ms()).await
}

/// Offers `completion` again until the store takes it, on a task of its own.
fn keep(s: Shared, completion: Completion) {
    let kept = &s.metrics.gateway_completions_kept;
    kept.with_label_values(&["kept"]).inc();
    tokio::spawn(async move {
        let until =
            tokio::time::Instant::now() + Duration::from_millis(s.engine.config().max_call_ms);
        let mut wait = FIRST_WAIT;
        let outcome = loop {
            tokio::time::sleep(wait).await;
            match submit(&s, completion.clone()).await {
                // Not applied: the operation had ended meanwhile (the completion reached the
                // store before its acknowledgement was lost, or it was reconciled).
                Ok(a) if a.ok => break "applied",
                Ok(a) => {
                    tracing::warn!(tenant = %completion.tenant, key = %completion.key, error = ?a.error, "kept completion not applied");
                    break "not_applied";
                }
                Err(Failure::Unavailable(_)) if tokio::time::Instant::now() + wait < until => {
                    wait = (wait * 2).min(MAX_WAIT);
                }
                other => {
                    tracing::error!(tenant = %completion.tenant, key = %completion.key, answer = ?other.err(), "kept completion given up: the sweep will make the operation unknown");
                    break "given_up";
                }
            }
        };
        if outcome == "applied" {
            tracing::info!(tenant = %completion.tenant, key = %completion.key, "kept completion applied");
        }
        s.metrics
            .gateway_completions_kept
            .with_label_values(&[outcome])
            .inc();
    });
}
