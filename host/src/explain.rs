//! What a refusal says to people: the shortfall behind it (which limit, what was asked, what
//! was there) and the one sentence made of it, e.g. `token_budget: needs 1,509 tokens, 1,001
//! available in tenant.acme.tokens; retry in 26 s`.

use crate::reason::Reason;
use serde::Serialize;

/// Longest message a policy may attach to a refusal or a degradation, in bytes; a longer one
/// is cut at a character boundary.
pub const MAX_POLICY_MESSAGE_BYTES: usize = 256;

/// The unit a shortfall counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Credits of a request bucket.
    Requests,
    /// Tokens of a token bucket.
    Tokens,
    /// Micro-dollars of a money budget.
    Microusd,
    /// Concurrency slots.
    Slots,
    /// Jobs of a durable queue.
    Jobs,
    /// Milliseconds (a deadline).
    Ms,
}

impl Unit {
    fn word(self, n: u64) -> &'static str {
        match (self, n == 1) {
            (Unit::Requests, true) => "request",
            (Unit::Requests, false) => "requests",
            (Unit::Tokens, true) => "token",
            (Unit::Tokens, false) => "tokens",
            (Unit::Microusd, _) => "micro-dollars",
            (Unit::Slots, true) => "slot",
            (Unit::Slots, false) => "slots",
            (Unit::Jobs, true) => "job",
            (Unit::Jobs, false) => "jobs",
            (Unit::Ms, _) => "ms",
        }
    }
}

/// The limit that refused, with what the request needed of it and what it held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    /// The limit's name: a bucket (`tenant.acme.tokens`), a slot scope (`tenant.acme`,
    /// `global`), a queue (`queue.acme`) or `deadline`.
    pub limit: String,
    /// What the request needed of it.
    pub requested: u64,
    /// What it held at the time (for a deadline: the milliseconds left before it).
    pub available: u64,
    /// What both numbers count.
    pub unit: Unit,
    /// For a budget that can never hold the request: its capacity.
    #[serde(skip)]
    pub capacity: Option<u64>,
    /// For a deadline: the output tokens the estimate is for.
    #[serde(skip)]
    pub output_tokens: Option<u64>,
}

/// `1509` as `1,509`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A wait or a duration for people: `0.4 s`, `26 s`, `12 min`, `3 h`.
pub fn seconds(ms: u64) -> String {
    match ms {
        0..=9_999 => format!("{:.1} s", ms as f64 / 1000.0),
        10_000..=599_999 => format!("{} s", ms.div_ceil(1000)),
        600_000..=10_799_999 => format!("{} min", ms.div_ceil(60_000)),
        _ => format!("{} h", ms.div_ceil(3_600_000)),
    }
}

/// What a shortfall says: `needs 1,509 tokens, 1,001 available in tenant.acme.tokens`.
fn shortfall_text(s: &Shortfall) -> String {
    let needs = format!(
        "needs {} {}",
        thousands(s.requested),
        s.unit.word(s.requested)
    );
    if let Some(cap) = s.capacity {
        return format!(
            "{needs}, {} holds at most {} {}",
            s.limit,
            thousands(cap),
            s.unit.word(cap)
        );
    }
    match s.unit {
        Unit::Slots => format!("{needs}, {} free in {}", thousands(s.available), s.limit),
        Unit::Jobs => format!("{needs}, {} of room in {}", thousands(s.available), s.limit),
        _ => format!(
            "{needs}, {} available in {}",
            thousands(s.available),
            s.limit
        ),
    }
}

/// What a reason says when no shortfall is known.
fn plain_text(reason: Reason) -> &'static str {
    match reason {
        Reason::InvalidRequest => "a field is missing, of the wrong type or out of range",
        Reason::UnknownTenant => "the tenant is not configured",
        Reason::TooLarge => "the request is larger than any budget can ever hold",
        Reason::TenantRate => "the tenant's request budget is short",
        Reason::TokenBudget => "the tenant's token budget is short",
        Reason::TenantConcurrency => "the tenant's concurrency limit is reached",
        Reason::QueueFull => "the tenant's queue is full",
        Reason::RetryTooEarly => "the next attempt may not start yet",
        Reason::GlobalRate => "the global request budget is short",
        Reason::GlobalConcurrency => "the global concurrency limit is reached",
        Reason::Overloaded => "refused by the policy under load",
        Reason::DownstreamUnavailable => "the downstream is marked unavailable",
        Reason::PolicyError => {
            "the policy faulted or broke its contract; the call was refused and nothing spent"
        }
        Reason::DeadlineExceeded => "the call cannot finish before its deadline",
        Reason::UnknownOutcomePending => {
            "the last call under this key has an unknown outcome; reconcile it first"
        }
        Reason::ModelRate => "the model's request budget is short",
        Reason::ModelTokenBudget => "the model's token budget is short",
        Reason::CostBudget => "the tenant's money budget is short",
        Reason::DeploymentCapacity => "no deployment of the model can take the call now",
        Reason::GroupBudget => "a budget of the tenant's group is short",
    }
}

/// The whole sentence of a refusal: the reason, what was asked and available (or the
/// policy's own words), and when to retry.
pub fn message(
    reason: Reason,
    shortfall: Option<&Shortfall>,
    policy_message: Option<&str>,
    retry_after_ms: Option<u64>,
) -> String {
    let body = match (shortfall, policy_message) {
        (Some(s), _) if s.unit == Unit::Ms => format!(
            "estimated {:.1} s for {}, deadline in {}",
            s.requested as f64 / 1000.0,
            s.output_tokens.map_or("the call".to_string(), |n| format!(
                "{} output {}",
                thousands(n),
                Unit::Tokens.word(n)
            )),
            seconds(s.available)
        ),
        (Some(s), _) => shortfall_text(s),
        (None, Some(m)) => m.to_string(),
        (None, None) => plain_text(reason).to_string(),
    };
    let mut text = format!("{}: {body}", reason.as_str());
    if let (Some(_), Some(m)) = (shortfall, policy_message) {
        text.push_str(&format!(" ({m})"));
    }
    match retry_after_ms {
        Some(ms) => text.push_str(&format!("; retry in {}", seconds(ms))),
        None if shortfall.is_some_and(|s| s.capacity.is_some()) => {
            text.push_str("; reduce the request, waiting cannot cure it")
        }
        None if matches!(
            reason,
            Reason::TenantRate
                | Reason::TokenBudget
                | Reason::GlobalRate
                | Reason::ModelRate
                | Reason::ModelTokenBudget
                | Reason::CostBudget
                | Reason::GroupBudget
        ) =>
        {
            text.push_str("; the budget does not refill, waiting cannot cure it")
        }
        None if matches!(
            reason,
            Reason::TenantConcurrency | Reason::GlobalConcurrency | Reason::QueueFull
        ) =>
        {
            text.push_str("; retry when a call ends")
        }
        None => {}
    }
    text
}

/// A policy's message as the host keeps it: trimmed, without control characters, at most
/// [`MAX_POLICY_MESSAGE_BYTES`]; empty is none.
pub fn bounded_policy_message(raw: &str) -> Option<String> {
    let clean: String = raw
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = clean.trim();
    if trimmed.is_empty() {
        return None;
    }
    let mut end = trimmed.len().min(MAX_POLICY_MESSAGE_BYTES);
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    Some(trimmed[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_509), "1,509");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(seconds(400), "0.4 s");
        assert_eq!(seconds(25_001), "26 s");
        assert_eq!(seconds(720_000), "12 min");
        assert_eq!(seconds(7_200_000 * 2), "4 h");
    }

    #[test]
    fn a_budget_refusal_names_what_was_asked_and_available() {
        let s = Shortfall {
            limit: "tenant.acme.tokens".into(),
            requested: 1_509,
            available: 1_001,
            unit: Unit::Tokens,
            capacity: None,
            output_tokens: None,
        };
        assert_eq!(
            message(Reason::TokenBudget, Some(&s), None, Some(25_400)),
            "token_budget: needs 1,509 tokens, 1,001 available in tenant.acme.tokens; retry in 26 s"
        );
        let never = Shortfall {
            capacity: Some(1_000),
            ..s.clone()
        };
        assert_eq!(
            message(Reason::TooLarge, Some(&never), None, None),
            "too_large: needs 1,509 tokens, tenant.acme.tokens holds at most 1,000 tokens; reduce the request, waiting cannot cure it"
        );
        let deadline = Shortfall {
            limit: "deadline".into(),
            requested: 59_200,
            available: 30_000,
            unit: Unit::Ms,
            capacity: None,
            output_tokens: Some(2_950),
        };
        assert_eq!(
            message(Reason::DeadlineExceeded, Some(&deadline), None, None),
            "deadline_exceeded: estimated 59.2 s for 2,950 output tokens, deadline in 30 s"
        );
    }

    #[test]
    fn a_policy_message_is_bounded_and_shown() {
        assert_eq!(bounded_policy_message("  \n "), None);
        assert_eq!(
            bounded_policy_message("free tier:\nupgrade").as_deref(),
            Some("free tier: upgrade")
        );
        let long = "é".repeat(300);
        let cut = bounded_policy_message(&long).unwrap();
        assert!(cut.len() <= MAX_POLICY_MESSAGE_BYTES && cut.chars().all(|c| c == 'é'));
        assert_eq!(
            message(
                Reason::Overloaded,
                None,
                Some("free tier is paused at peak"),
                Some(2000)
            ),
            "overloaded: free tier is paused at peak; retry in 2.0 s"
        );
    }
}
