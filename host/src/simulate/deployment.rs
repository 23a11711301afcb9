//! A provider deployment as the simulation enforces it: its own windows of requests and
//! tokens a minute, its own calls at once, and the rate-limit report its answers carry
//! (what OpenAI's `x-ratelimit-remaining-*` and `x-ratelimit-reset-*` headers say), so that
//! the engine learns from it as the gateway does from a real provider.

use super::file::{Failures, ProviderDeployment};
use crate::engine::ProviderLimits;

/// A per-minute limit as a provider keeps it: a minute's worth, refilled continuously.
#[derive(Clone, Copy, Debug)]
struct Window {
    per_minute: f64,
    level: f64,
    updated_ms: i64,
}

impl Window {
    fn new(per_minute: u64) -> Self {
        Window {
            per_minute: per_minute as f64,
            level: per_minute as f64,
            updated_ms: 0,
        }
    }

    fn refill(&mut self, now_ms: i64) {
        let elapsed = (now_ms - self.updated_ms).max(0) as f64;
        self.level = (self.level + elapsed * self.per_minute / 60_000.0).min(self.per_minute);
        self.updated_ms = now_ms;
    }

    /// How long until `n` fit (0: they fit now).
    fn wait_ms(&self, n: f64) -> u64 {
        if n <= self.level {
            0
        } else if n > self.per_minute {
            u64::MAX
        } else {
            ((n - self.level) * 60_000.0 / self.per_minute).ceil() as u64
        }
    }

    /// Until the window is whole again.
    fn reset_ms(&self) -> u64 {
        ((self.per_minute - self.level) * 60_000.0 / self.per_minute).ceil() as u64
    }
}

/// One simulated deployment: its limits and what it has taken.
pub(super) struct Deployment {
    pub name: String,
    pub concurrency: Option<u32>,
    pub failures: Option<Failures>,
    reports_limits: bool,
    requests: Option<Window>,
    tokens: Option<Window>,
    /// Calls it is serving.
    pub in_flight: u32,
}

/// Whether a deployment takes a call, and what its answer reports.
pub(super) enum Taken {
    /// It serves the call.
    Yes(Option<ProviderLimits>),
    /// It refuses with 429: the retry-after, and what it reports.
    RateLimited(u64, Option<ProviderLimits>),
}

impl Deployment {
    pub fn new(name: &str, spec: &ProviderDeployment) -> Self {
        Deployment {
            name: name.to_string(),
            concurrency: spec.concurrency,
            failures: spec.failures.clone(),
            reports_limits: spec.reports_limits,
            requests: spec.requests_per_minute.map(Window::new),
            tokens: spec.tokens_per_minute.map(Window::new),
            in_flight: 0,
        }
    }

    /// Takes a call of `tokens` (its prompt and output limit) at `now_ms`, or refuses it
    /// past a window or its concurrency (retrying after `busy_retry_after_ms` for the latter).
    pub fn take(&mut self, now_ms: i64, tokens: u64, busy_retry_after_ms: u64) -> Taken {
        for w in [&mut self.requests, &mut self.tokens].into_iter().flatten() {
            w.refill(now_ms);
        }
        if self.concurrency.is_some_and(|c| self.in_flight >= c) {
            return Taken::RateLimited(busy_retry_after_ms, self.report());
        }
        let wait = [(self.requests, 1.0), (self.tokens, tokens as f64)]
            .into_iter()
            .filter_map(|(w, n)| w.map(|w| w.wait_ms(n)))
            .max()
            .unwrap_or(0);
        if wait > 0 {
            return Taken::RateLimited(wait.min(3_600_000), self.report());
        }
        if let Some(w) = &mut self.requests {
            w.level -= 1.0;
        }
        if let Some(w) = &mut self.tokens {
            w.level -= tokens as f64;
        }
        self.in_flight += 1;
        Taken::Yes(self.report())
    }

    /// What its answer says is left, as a provider's headers do.
    fn report(&self) -> Option<ProviderLimits> {
        if !self.reports_limits || (self.requests.is_none() && self.tokens.is_none()) {
            return None;
        }
        let left = |w: &Window| w.level.max(0.0).floor() as u64;
        Some(ProviderLimits {
            remaining_requests: self.requests.as_ref().map(left),
            remaining_tokens: self.tokens.as_ref().map(left),
            reset_requests_ms: self.requests.as_ref().map(Window::reset_ms),
            reset_tokens_ms: self.tokens.as_ref().map(Window::reset_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_refuses_past_its_minute_and_reports_what_is_left() {
        let spec = ProviderDeployment {
            requests_per_minute: Some(60),
            reports_limits: true,
            ..ProviderDeployment::default()
        };
        let mut d = Deployment::new("east", &spec);
        for _ in 0..60 {
            assert!(matches!(d.take(0, 10, 1000), Taken::Yes(_)));
        }
        match d.take(0, 10, 1000) {
            Taken::RateLimited(wait, Some(l)) => {
                assert_eq!(wait, 1000);
                assert_eq!(l.remaining_requests, Some(0));
                assert_eq!(l.reset_requests_ms, Some(60_000));
            }
            _ => panic!("the 61st call in a minute must be refused"),
        }
        // A second later one request has come back.
        assert!(
            matches!(d.take(1000, 10, 1000), Taken::Yes(Some(l)) if l.remaining_requests == Some(0))
        );
    }

    #[test]
    fn concurrency_refuses_the_call_beyond_it() {
        let spec = ProviderDeployment {
            concurrency: Some(1),
            ..ProviderDeployment::default()
        };
        let mut d = Deployment::new("east", &spec);
        assert!(matches!(d.take(0, 1, 250), Taken::Yes(None)));
        assert!(matches!(d.take(0, 1, 250), Taken::RateLimited(250, None)));
        d.in_flight -= 1;
        assert!(matches!(d.take(0, 1, 250), Taken::Yes(None)));
    }
}
