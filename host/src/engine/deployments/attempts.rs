//! Learning from how an attempt ended: what the provider says is left, pauses on a 429,
//! ejections after failures, and the adaptive concurrency limit.

use super::{
    learned, seeing, DeploymentBudgets, ProviderLimits, ADAPTIVE_BACKOFF, ADAPTIVE_MAX,
    ADAPTIVE_MIN, DEFAULT_PAUSE_MS, EJECT_AFTER_FAILURES, EJECT_BASE_MS, EJECT_MAX_MS, MILLI,
};
use crate::bucket;
use crate::config::{Concurrency, Config, Routing};
use crate::engine::leases::Holder;
use crate::store::{StoreError, Tx};

impl DeploymentBudgets<'_> {
    /// Lowers the balances to what the provider says is left; never raises them. Calls
    /// sent but not yet seen by the provider when it answered may go past what it said by
    /// at most the calls in flight: the provider refuses those, and they move on.
    ///
    /// While `holder` leases, what the provider says stays with it (see [`Holder::heard`]).
    fn learn(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        limits: &ProviderLimits,
        holder: Option<&Holder>,
    ) -> Result<(), StoreError> {
        let pairs = [
            (
                &self.requests,
                limits.remaining_requests,
                limits.reset_requests_ms,
                self.requests_configured,
            ),
            (
                &self.tokens,
                limits.remaining_tokens,
                limits.reset_tokens_ms,
                self.tokens_configured,
            ),
        ];
        for (b, remaining, reset_ms, configured) in pairs {
            let Some(remaining) = remaining else { continue };
            let seeing = seeing(holder);
            let level = match seeing {
                Some(h) => h
                    .said_level(&b.name, b.limits, now_ms)
                    .unwrap_or(bucket::State::full(b.limits, now_ms)),
                None => b.level(tx, now_ms)?,
            };
            let said = i64::try_from(remaining)
                .unwrap_or(i64::MAX)
                .saturating_mul(bucket::MICRO);
            if said >= level.balance_micro {
                continue;
            }
            // A configured bucket goes on refilling at its rate; an unlimited one holds what
            // the provider said until the provider's reset.
            let updated_ms = match (configured, reset_ms) {
                (false, Some(ms)) => now_ms.saturating_add(ms.min(EJECT_MAX_MS as u64) as i64),
                (false, None) => now_ms.saturating_add(DEFAULT_PAUSE_MS),
                (true, _) => level.updated_ms,
            };
            let lowered = bucket::State {
                balance_micro: said,
                updated_ms: updated_ms.max(level.updated_ms),
            };
            match seeing {
                Some(h) => h.heard(&b.name, b.limits, lowered, now_ms),
                None => tx.set_bucket(&b.name, lowered)?,
            }
        }
        Ok(())
    }
}

/// How one attempt sent to a deployment ended, as the engine learns from it.
pub(crate) struct AttemptEnd<'a> {
    pub result: crate::model::CallResult,
    pub failure: Option<&'a str>,
    pub provider_retry_after_ms: Option<u64>,
    pub limits: Option<&'a ProviderLimits>,
}

/// Learns from how an attempt on deployment `name` of `model` ended (its answer's limits,
/// pauses, failures, ejections, the adaptive limit). The slot is released apart, when the
/// attempt's termination is known.
///
/// While `holder` leases, it learns the provider's word for itself, and reaches the pause
/// and failure rows only to change them (a success resets failures only where it saw some).
pub(crate) fn end_attempt(
    tx: &mut dyn Tx,
    config: &Config,
    model: &str,
    name: &str,
    now_ms: i64,
    end: &AttemptEnd<'_>,
    holder: Option<&Holder>,
) -> Result<(), StoreError> {
    use crate::model::CallResult;
    let Some(d) = DeploymentBudgets::find(config, model, name) else {
        // Configured away since: nothing to learn.
        return Ok(());
    };
    let can_eject = can_move(config.routing.get(model));
    // Until when the provider's retry-after pauses the deployment, if it gave one.
    let retry_after = end
        .provider_retry_after_ms
        .map(|ms| now_ms.saturating_add(ms.min(EJECT_MAX_MS as u64) as i64));
    let seeing = seeing(holder);
    if let Some(l) = end.limits {
        d.learn(tx, now_ms, l, holder)?;
    }
    // Whether the pause and failure rows were reached (and so are read again for `seeing`).
    let mut reached = true;
    let adaptive = d.deployment.max_concurrency == Some(Concurrency::Adaptive);
    let set_limit = |tx: &mut dyn Tx, f: &dyn Fn(u32) -> u32| -> Result<(), StoreError> {
        let now = learned(tx.slots_in_use(&d.limit)?);
        let next = f(now).clamp(ADAPTIVE_MIN * MILLI, ADAPTIVE_MAX * MILLI);
        if next != now || tx.slots_in_use(&d.limit)? == 0 {
            tx.set_slots_in_use(&d.limit, next)?;
        }
        Ok(())
    };
    match (end.result, end.failure) {
        (CallResult::Succeeded, _) => {
            reached = match seeing {
                Some(h) => [&d.failures, &d.ejections]
                    .iter()
                    .any(|row| h.seen(row).is_some_and(|n| n > 0)),
                None => true,
            };
            if reached {
                // A probe's success ends the ejection at once.
                if tx.slots_in_use(&d.failures)? >= EJECT_AFTER_FAILURES {
                    let over = bucket::State {
                        balance_micro: 0,
                        updated_ms: now_ms,
                    };
                    tx.set_bucket(&d.pause, over)?;
                }
                for row in [&d.failures, &d.ejections] {
                    if tx.slots_in_use(row)? > 0 {
                        tx.set_slots_in_use(row, 0)?;
                    }
                }
            }
            // Additive increase while the limit was reached (the call ends with the
            // deployment full): one call more per limit's worth of such successes (a round
            // trip's, as TCP does). A limit that was not reached learns nothing.
            if adaptive {
                let in_use = tx.slots_in_use(&d.slots)?;
                set_limit(tx, &|l| {
                    let whole = (l / MILLI).max(1);
                    if in_use >= whole {
                        l + MILLI * MILLI / l.max(1)
                    } else {
                        l
                    }
                })?;
            }
        }
        (CallResult::Failed, Some("rate_limited")) => {
            let until = retry_after.unwrap_or(now_ms.saturating_add(DEFAULT_PAUSE_MS));
            d.pause(tx, now_ms, until)?;
            if adaptive {
                set_limit(tx, &backoff)?;
            }
        }
        // Only a model with somewhere else to send its calls ejects a deployment: a lone one
        // goes on taking them (its provider's retry-after still pauses it).
        (CallResult::Failed, Some("unavailable" | "connect_failed")) if !can_eject => {
            if let Some(until) = retry_after {
                d.pause(tx, now_ms, until)?;
            }
        }
        (CallResult::Failed, Some("unavailable" | "connect_failed")) => {
            let failures = tx.slots_in_use(&d.failures)?.saturating_add(1);
            tx.set_slots_in_use(&d.failures, failures)?;
            if let Some(until) = retry_after {
                d.pause(tx, now_ms, until)?;
            }
            if failures >= EJECT_AFTER_FAILURES {
                let ejections = tx.slots_in_use(&d.ejections)?.saturating_add(1);
                tx.set_slots_in_use(&d.ejections, ejections)?;
                let cool = EJECT_BASE_MS
                    .saturating_mul(1i64 << (ejections - 1).min(16))
                    .min(EJECT_MAX_MS);
                d.pause(tx, now_ms, now_ms.saturating_add(cool))?;
            }
        }
        (CallResult::Unknown, _) if adaptive => {
            reached = false;
            set_limit(tx, &backoff)?
        }
        _ => reached = false,
    }
    match seeing {
        Some(h) if reached => d.remember(tx, h),
        _ => Ok(()),
    }
}

/// Multiplicative decrease, in thousandths.
fn backoff(l: u32) -> u32 {
    ((f64::from(l) * ADAPTIVE_BACKOFF).floor() as u32).max(ADAPTIVE_MIN * MILLI)
}

/// Whether a model's call can move elsewhere after a failure (another deployment, or a
/// fallback model): the provider's retry-after then pauses the deployment, not the call.
pub(crate) fn can_move(routing: Option<&Routing>) -> bool {
    routing.is_some_and(|r| r.deployments.len() > 1 || !r.fallbacks.is_empty())
}
