//! Unit tests of a policy with plain `cargo test`: a mock host whose levels, parameters,
//! time and draws a test sets, and which keeps the policy's log lines.
//!
//! ```ignore
//! use tollgate_guest::testing::MockHost;
//! let host = MockHost::new().now_ms(1_000).param("busy_retry_after_ms", 500.0);
//! let (answer, logs) = host.run(|| MyPolicy::admit(MockHost::request("acme", "k1")));
//! ```

use super::{
    BucketKind, BucketLevel, LogLevel, Priority, Request, Route, SlotLevel, SlotScope,
};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use std::cell::RefCell;

/// What the host lends a policy during one decision, as a test sets it.
#[derive(Clone, Debug)]
pub struct MockHost {
    now_ms: i64,
    params: Vec<(String, f64)>,
    strings: Vec<(String, String)>,
    weight: u32,
    buckets: Vec<(BucketKind, BucketLevel)>,
    slots: Vec<(SlotScope, SlotLevel)>,
    draw: u64,
}

impl Default for MockHost {
    fn default() -> Self {
        Self::new()
    }
}

impl MockHost {
    /// Time 0, no parameters, weight 1, no buckets or slot limits, draws of 0.
    pub fn new() -> Self {
        MockHost {
            now_ms: 0,
            params: Vec::new(),
            strings: Vec::new(),
            weight: 1,
            buckets: Vec::new(),
            slots: Vec::new(),
            draw: 0,
        }
    }

    /// The decision's logical time.
    pub fn now_ms(mut self, ms: i64) -> Self {
        self.now_ms = ms;
        self
    }

    /// A numeric `policy_params` value.
    pub fn param(mut self, name: &str, value: f64) -> Self {
        self.params.push((name.to_string(), value));
        self
    }

    /// A string `policy_params` value.
    pub fn param_string(mut self, name: &str, value: &str) -> Self {
        self.strings.push((name.to_string(), value.to_string()));
        self
    }

    /// The tenant's weight.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// A bucket's level.
    pub fn bucket(mut self, kind: BucketKind, available: u64, capacity: u64) -> Self {
        self.buckets.push((
            kind,
            BucketLevel {
                available,
                capacity,
                refill_per_s: 0.0,
            },
        ));
        self
    }

    /// A concurrency scope's level.
    pub fn slots(mut self, scope: SlotScope, in_use: u32, limit: u32) -> Self {
        self.slots.push((scope, SlotLevel { in_use, limit }));
        self
    }

    /// What every `random(upper)` answers (capped at `upper`).
    pub fn draw(mut self, value: u64) -> Self {
        self.draw = value;
        self
    }

    /// Runs `f` (a call of the policy) against this host and returns its answer with the
    /// log lines it wrote.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<(LogLevel, String)>) {
        let (out, current) = self.run_current(f);
        (out, current.logs)
    }

    /// Runs `f` against this host and returns its answer with what it last `explain`ed.
    pub fn explained<T>(&self, f: impl FnOnce() -> T) -> (T, Option<String>) {
        let (out, current) = self.run_current(f);
        (out, current.explained)
    }

    /// Runs `f` against this host and returns its answer with the number of host calls it
    /// made: each one crosses the sandbox's boundary, so a policy's test can bound them.
    pub fn count_host_calls<T>(&self, f: impl FnOnce() -> T) -> (T, u32) {
        let (out, current) = self.run_current(f);
        (out, current.calls)
    }

    fn run_current<T>(&self, f: impl FnOnce() -> T) -> (T, Current) {
        CURRENT.with(|c| {
            *c.borrow_mut() = Some(Current {
                host: self.clone(),
                logs: Vec::new(),
                calls: 0,
                explained: None,
            })
        });
        let out = f();
        let current = CURRENT.with(|c| c.borrow_mut().take());
        (out, current.expect("the mock host outlives the call"))
    }

    /// An interactive request of 100 input and 100 output tokens, deadline at one minute.
    pub fn request(tenant: &str, key: &str) -> Request {
        Request {
            tenant: tenant.to_string(),
            key: key.to_string(),
            route: Route::Interactive,
            input_tokens: 100,
            optional_context_tokens: 0,
            max_output_tokens: 100,
            deadline_ms: 60_000,
            size_bytes: 0,
            attempt: 1,
            model: None,
            priority: Priority::Standard,
            labels: Vec::new(),
        }
    }
}

struct Current {
    host: MockHost,
    logs: Vec<(LogLevel, String)>,
    calls: u32,
    explained: Option<String>,
}

std::thread_local! {
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut Current) -> T) -> T {
    CURRENT.with(|c| {
        let mut current = c.borrow_mut();
        let current = current
            .as_mut()
            .expect("host imports called outside MockHost::run");
        current.calls += 1;
        f(current)
    })
}

/// The host imports of the world, served by the running [`MockHost`].
pub mod host {
    use super::*;

    /// The decision's logical time in milliseconds.
    pub fn now_ms() -> i64 {
        with(|c| c.host.now_ms)
    }

    /// A numeric `policy_params` value.
    pub fn param(name: &str) -> Option<f64> {
        with(|c| c.host.params.iter().rev().find(|(n, _)| n == name).map(|(_, v)| *v))
    }

    /// A string `policy_params` value.
    pub fn param_string(name: &str) -> Option<String> {
        with(|c| {
            c.host
                .strings
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        })
    }

    /// Keeps a log line for the test to read.
    pub fn log(level: LogLevel, message: &str) {
        with(|c| c.logs.push((level, message.to_string())))
    }

    /// The tenant's weight.
    pub fn tenant_weight() -> u32 {
        with(|c| c.host.weight)
    }

    /// A bucket's level; none unless the test set it.
    pub fn bucket(kind: BucketKind) -> Option<BucketLevel> {
        with(|c| c.host.buckets.iter().rev().find(|(k, _)| *k == kind).map(|(_, l)| *l))
    }

    /// A scope's slots; none unless the test set them.
    pub fn slots(scope: SlotScope) -> Option<SlotLevel> {
        with(|c| c.host.slots.iter().rev().find(|(s, _)| *s == scope).map(|(_, l)| *l))
    }

    /// The test's draw, capped at `upper`.
    pub fn random(upper: u64) -> u64 {
        with(|c| c.host.draw.min(upper))
    }

    /// Keeps the words for the test to read ([`MockHost::explained`]); the last call wins.
    pub fn explain(message: &str) {
        with(|c| c.explained = Some(message.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{standard, Admission, RefusalReason};

    #[test]
    fn the_standard_rules_run_against_the_mock_host() {
        let mut req = MockHost::request("acme", "k");
        req.priority = Priority::Sheddable;
        let busy = MockHost::new()
            .param("shed_sheddable_at_slot_fraction", 0.5)
            .slots(SlotScope::Global, 4, 8);
        let (answer, _) = busy.run(|| standard::admit(&req));
        assert!(matches!(
            answer,
            Admission::Refuse(r) if r.reason == RefusalReason::Overloaded
        ));
        let (answer, logs) = MockHost::new().run(|| standard::admit(&req));
        assert!(matches!(answer, Admission::Admit(p) if p.max_output_tokens == 100));
        assert!(logs.is_empty());
    }

    #[test]
    fn the_standard_rules_read_only_the_parameters_they_need() {
        // Interactive: the degradation threshold, global slots, the token-shortage switch,
        // the two execution-time terms and the busy retry-after.
        let host = MockHost::new().slots(SlotScope::Global, 1, 8);
        let (_, calls) = host.count_host_calls(|| standard::admit(&MockHost::request("a", "k")));
        assert_eq!(calls, 6);
        // Durable: the execution-time terms and the busy retry-after only.
        let mut durable = MockHost::request("a", "k");
        durable.route = Route::Durable;
        let (_, calls) = host.count_host_calls(|| standard::admit(&durable));
        assert_eq!(calls, 3);
        // A parameter read twice in one decision is asked once.
        let (_, calls) = host.count_host_calls(|| {
            let p = standard::Params::new();
            p.busy_retry_after_ms() + p.busy_retry_after_ms()
        });
        assert_eq!(calls, 1);
        // Degraded under slot pressure: the cap is read then, and the answer is unchanged.
        let full = MockHost::new()
            .param("degrade_at_slot_fraction", 0.5)
            .param("degraded_max_output_tokens", 40.0)
            .slots(SlotScope::Global, 4, 8);
        let (answer, calls) =
            full.count_host_calls(|| standard::admit(&MockHost::request("a", "k")));
        assert!(matches!(answer, Admission::Admit(p) if p.max_output_tokens == 40));
        assert_eq!(calls, 6);
    }

    #[test]
    fn degrade_caps_the_output_drops_the_context_and_recomputes_the_estimate() {
        let mut req = MockHost::request("acme", "k");
        req.max_output_tokens = 2_000;
        req.optional_context_tokens = 300;
        let host = MockHost::new()
            .param("exec_base_ms", 500.0)
            .param("exec_ms_per_output_token", 20.0);
        let (plan, _) = host.run(|| standard::plan(&req));
        assert_eq!(
            (plan.max_output_tokens, plan.optional_context_tokens),
            (2_000, 300)
        );
        assert_eq!(plan.estimated_exec_ms, 40_500);
        let (cut, _) = host.run(|| standard::degrade(plan, 128));
        assert_eq!((cut.max_output_tokens, cut.optional_context_tokens), (128, 0));
        assert_eq!(cut.estimated_exec_ms, 500 + 128 * 20);
        assert_eq!(cut.busy_retry_after_ms, plan.busy_retry_after_ms);
        // Never raised, never below one token.
        let (same, _) = host.run(|| standard::degrade(cut, 4_000));
        assert_eq!(same.max_output_tokens, 128);
        let (one, _) = host.run(|| standard::degrade(cut, 0));
        assert_eq!((one.max_output_tokens, one.estimated_exec_ms), (1, 520));
    }
}
