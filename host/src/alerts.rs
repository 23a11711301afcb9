//! Budget alerts: a rule names budgets by pattern and the fractions of their limit at which
//! to tell a webhook. A reservation that carries a budget's spend across a fraction writes an
//! alert to the store's outbox in the same transaction; a sender (the service's) posts it
//! until the webhook acknowledges it. Each crossing is written once per period: its id is the
//! budget, the fraction and the period (a period budget's own; a day for a bucket that
//! refills), so a refund and a second crossing in the same period add nothing.

use crate::bucket::{Limits, State, MICRO};
use crate::config::ConfigError;
use serde::{Deserialize, Serialize};

/// One rule of the `alerts` section.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertRule {
    /// The budgets it watches: a bucket name, `*` matching any run of characters
    /// (`group.*.cost_microusd`).
    pub budget: String,
    /// Fractions of the limit spent, from above 0 to 1, at which to alert.
    #[serde(default = "default_at")]
    pub at: Vec<f64>,
    /// Where to post: an `http://` or `https://` URL.
    pub webhook: String,
    /// The environment variable holding the HMAC-SHA256 secret that signs each post.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
}

fn default_at() -> Vec<f64> {
    vec![0.5, 0.8, 1.0]
}

/// Most rules a configuration may have.
pub const MAX_RULES: usize = 64;

impl AlertRule {
    /// The rule's fields, checked; `i` is its place in the section.
    pub(crate) fn check(&self, i: usize) -> Result<(), ConfigError> {
        let field = |f: &str| format!("alerts[{i}].{f}");
        if self.budget.is_empty() || self.budget.len() > 512 {
            return Err(ConfigError(format!("{}: 1 to 512 bytes", field("budget"))));
        }
        if self.at.is_empty()
            || self.at.len() > 16
            || !self
                .at
                .iter()
                .all(|f| f.is_finite() && *f > 0.0 && *f <= 1.0)
        {
            return Err(ConfigError(format!(
                "{}: 1 to 16 fractions, each above 0 and at most 1",
                field("at")
            )));
        }
        if !(self.webhook.starts_with("http://") || self.webhook.starts_with("https://")) {
            return Err(ConfigError(format!(
                "{}: {:?} is not an http:// or https:// URL",
                field("webhook"),
                self.webhook
            )));
        }
        if self.secret_env.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError(format!(
                "{}: an environment variable's name",
                field("secret_env")
            )));
        }
        Ok(())
    }

    /// Whether the rule watches bucket `name`.
    pub fn watches(&self, name: &str) -> bool {
        glob(&self.budget, name)
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// An alert waiting in the outbox, or sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// The crossing's id: budget, fraction and period (what a receiver deduplicates by).
    pub id: String,
    /// The budget crossed.
    pub budget: String,
    /// Where to post it.
    pub webhook: String,
    /// The environment variable of its secret (none: unsigned).
    pub secret_env: Option<String>,
    /// The body posted (JSON).
    pub payload: String,
    /// Posts tried so far.
    pub attempts: u32,
    /// When the next post may be tried (epoch ms).
    pub next_ms: i64,
}

/// The crossings of one spend of bucket `name` from `before` to `after`, as alerts to
/// write (each rule's fractions that the spend carried its bucket across).
pub fn crossings(
    rules: &[AlertRule],
    name: &str,
    limits: Limits,
    before: State,
    after: State,
    now_ms: i64,
) -> Vec<Alert> {
    let capacity = limits.capacity_micro;
    if capacity <= 0 || after.balance_micro >= before.balance_micro {
        return Vec::new();
    }
    let spent = |s: State| (capacity - s.balance_micro.min(capacity)) as f64 / capacity as f64;
    let (was, now) = (spent(before), spent(after));
    let period_end = limits.resets_at(after.updated_ms.max(now_ms));
    let period = period_end.unwrap_or(now_ms - now_ms.rem_euclid(crate::spend::DAY_MS));
    let mut out = Vec::new();
    for rule in rules.iter().filter(|r| r.watches(name)) {
        for &at in &rule.at {
            if was < at && now >= at - 1e-12 {
                let id = format!("{name}@{at}@{period}");
                let payload = serde_json::json!({
                    "id": id,
                    "budget": name,
                    "threshold": at,
                    "spent": (capacity - after.balance_micro.min(capacity)) / MICRO,
                    "limit": capacity / MICRO,
                    "resets_at": period_end.map(crate::spend::rfc3339),
                    "at": crate::spend::rfc3339(now_ms),
                });
                out.push(Alert {
                    id,
                    budget: name.to_string(),
                    webhook: rule.webhook.clone(),
                    secret_env: rule.secret_env.clone(),
                    payload: payload.to_string(),
                    attempts: 0,
                    next_ms: now_ms,
                });
            }
        }
    }
    out
}

/// When a post that failed `attempts` times may be tried again: a second, doubling to five
/// minutes.
pub fn backoff_ms(attempts: u32) -> i64 {
    1000i64.saturating_mul(1 << attempts.min(9)).min(300_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::{Calendar, Period};

    fn rule(budget: &str, at: &[f64]) -> AlertRule {
        AlertRule {
            budget: budget.into(),
            at: at.to_vec(),
            webhook: "http://127.0.0.1:9/hook".into(),
            secret_env: None,
        }
    }

    #[test]
    fn patterns_match_runs_of_characters() {
        assert!(glob("group.*.cost_microusd", "group.org.cost_microusd"));
        assert!(glob("group.*.cost_microusd", "group.a.b.cost_microusd"));
        assert!(!glob("group.*.cost_microusd", "group.org.tokens"));
        assert!(glob("*", "anything"));
        assert!(glob("tenant.acme.requests", "tenant.acme.requests"));
        assert!(!glob("tenant.acme.requests", "tenant.acme.requests2"));
        assert!(glob("a*b*c", "abc") && glob("a*b*c", "aXbYc") && !glob("a*b*c", "acb"));
    }

    #[test]
    fn a_spend_across_fractions_writes_one_alert_each_with_the_period_in_its_id() {
        let month = Calendar::new(Period::Month, "UTC").unwrap();
        let limits = Limits::per_period(100.0, month);
        let state = |left: i64| State {
            balance_micro: left * MICRO,
            updated_ms: 0,
        };
        let rules = [rule("group.*", &[0.5, 0.8, 1.0]), rule("tenant.*", &[0.1])];
        let alerts = crossings(
            &rules,
            "group.org.cost_microusd",
            limits,
            state(60),
            state(15),
            0,
        );
        let ids: Vec<&str> = alerts.iter().map(|a| a.id.as_str()).collect();
        // 40% to 85% spent: 0.5 and 0.8, not 1.0; the tenant rule does not watch it.
        assert_eq!(
            ids,
            vec![
                "group.org.cost_microusd@0.5@2678400000",
                "group.org.cost_microusd@0.8@2678400000"
            ]
        );
        let body: serde_json::Value = serde_json::from_str(&alerts[0].payload).unwrap();
        assert_eq!(
            (body["spent"].as_i64(), body["limit"].as_i64()),
            (Some(85), Some(100))
        );
        assert_eq!(body["resets_at"], "1970-02-01T00:00:00.000Z");
        // Exactly at the limit is a crossing of 1.0; a refund is none.
        assert_eq!(
            crossings(&rules, "group.x", limits, state(1), state(0), 0).len(),
            1
        );
        assert!(crossings(&rules, "group.x", limits, state(0), state(10), 0).is_empty());
    }

    #[test]
    fn bad_rules_name_the_field() {
        let mut r = rule("*", &[0.5]);
        assert!(r.check(0).is_ok());
        r.at = vec![1.5];
        assert!(r.check(2).unwrap_err().0.contains("alerts[2].at"));
        r.at = vec![0.5];
        r.webhook = "ftp://x".into();
        assert!(r.check(0).unwrap_err().0.contains("webhook"));
        assert_eq!(backoff_ms(0), 1000);
        assert_eq!(backoff_ms(20), 300_000);
    }
}
