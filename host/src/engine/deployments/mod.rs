//! Deployments: a gateway model's capacity, as budgets. Each deployment of a model (a key,
//! a region, a provider) has a request bucket, a token bucket and a concurrency scope in the
//! store, shared by every replica; an admission reserves one deployment's in the same
//! transaction as the tenant's, global and model budgets, so no deployment is ever sent
//! more than it can take. What the provider reports keeps them true: its remaining
//! requests and tokens lower the balances, a 429 pauses the deployment until its
//! retry-after, consecutive failures eject it for a cool-down, and an adaptive limit learns
//! its concurrency (`docs/gateway.md`).
//!
//! Every piece of a deployment's state is an ordinary bucket or slot row
//! (`deployment.<model>.<name>.*`), so it is locked, batched and replicated as the other
//! budgets are:
//! - a pause or an ejection is a row (`.pause`, kept as a bucket row) whose time is when it
//!   ends; a provider's lowered balance does not refill before the provider's reset (a
//!   bucket never refills before its `updated_ms`);
//! - consecutive failures, ejections in a row and the learned limit are counts in slot rows.
//!
//! An engine that holds leases (a replica, or a shard on PostgreSQL) reserves a deployment's
//! configured buckets and its concurrency (unless adaptive) through its leases, as it does
//! the other shared budgets. While other holders are live it reads the pause and failure
//! rows as last seen (refreshed with each renewal, and at once when it writes them), and
//! keeps what providers say to itself: an admission then locks none of the deployment's
//! rows (docs/design.md, "Leases for shared budgets").

mod attempts;
mod choice;
mod health;

pub(crate) use attempts::{can_move, end_attempt, AttemptEnd};
pub(crate) use choice::{choose, draw, Ask, Chosen};
pub use health::{Health, HealthState};

use super::budgets::{BucketRef, SlotRef};
use super::leases::{Holder, SharedRow};
use crate::bucket::{self, Limits};
use crate::config::{Concurrency, Config, Deployment};
use crate::model::names;
use crate::store::{Prefetch, StoreError, Tx};

/// Consecutive failures (5xx, refused connections) that eject a deployment.
pub const EJECT_AFTER_FAILURES: u32 = 3;
/// The first ejection's cool-down; each ejection in a row doubles it, up to [`EJECT_MAX_MS`].
pub const EJECT_BASE_MS: i64 = 5_000;
/// The longest cool-down.
pub const EJECT_MAX_MS: i64 = 300_000;
/// A 429 without a retry-after pauses its deployment this long.
pub const DEFAULT_PAUSE_MS: i64 = 1_000;
/// An adaptive limit starts here, and stays within [`ADAPTIVE_MIN`, `ADAPTIVE_MAX`].
pub const ADAPTIVE_INITIAL: u32 = 8;
/// The lowest adaptive limit.
pub const ADAPTIVE_MIN: u32 = 1;
/// The highest adaptive limit.
pub const ADAPTIVE_MAX: u32 = 1_000;
/// What a 429 or a timeout multiplies an adaptive limit by (Netflix's AIMD backoff ratio).
pub const ADAPTIVE_BACKOFF: f64 = 0.9;
/// The learned limit is kept in thousandths, so that a success adds a fraction of a call.
const MILLI: u32 = 1000;

/// A concurrency with no configured limit is leased as a slot count this large, so that its
/// calls in flight are counted as a limited one's are.
pub(crate) const UNLIMITED_SLOTS: u32 = 1 << 30;

/// The holder that reads deployments' state rows as last seen and keeps what providers say
/// to itself: one that leases now (others are live).
fn seeing(holder: Option<&Holder>) -> Option<&Holder> {
    holder.filter(|h| h.leasing())
}

/// A bucket that no configuration limits: a provider's report may still lower it for a
/// while (it then refills at once when the provider said it resets).
const UNLIMITED: Limits = Limits {
    capacity_micro: 1_000_000_000_000 * bucket::MICRO,
    refill_milli_per_s: 1_000_000_000_000 * 1000,
    period: None,
};

/// What the provider said of its own limits on one answer (OpenAI's `x-ratelimit-*`,
/// Anthropic's `anthropic-ratelimit-*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderLimits {
    /// Requests left in the provider's window.
    #[serde(default)]
    pub remaining_requests: Option<u64>,
    /// Tokens left in the provider's window.
    #[serde(default)]
    pub remaining_tokens: Option<u64>,
    /// Until the request budget is whole again, in ms.
    #[serde(default)]
    pub reset_requests_ms: Option<u64>,
    /// Until the token budget is whole again, in ms.
    #[serde(default)]
    pub reset_tokens_ms: Option<u64>,
}

/// One deployment of one model, with its rows' names and limits.
pub(crate) struct DeploymentBudgets<'a> {
    pub model: &'a str,
    pub deployment: &'a Deployment,
    pub requests: BucketRef,
    pub tokens: BucketRef,
    requests_configured: bool,
    tokens_configured: bool,
    pub slots: String,
    pause: String,
    failures: String,
    ejections: String,
    limit: String,
}

impl<'a> DeploymentBudgets<'a> {
    pub fn new(model: &'a str, d: &'a Deployment) -> Self {
        let bucket = |name: String, b: Option<crate::config::BucketConfig>| BucketRef {
            name,
            limits: b.map_or(UNLIMITED, |b| b.limits()),
        };
        DeploymentBudgets {
            model,
            deployment: d,
            requests: bucket(names::deployment_requests(model, &d.name), d.requests),
            tokens: bucket(names::deployment_tokens(model, &d.name), d.tokens),
            requests_configured: d.requests.is_some(),
            tokens_configured: d.tokens.is_some(),
            slots: names::deployment_slots(model, &d.name),
            pause: names::deployment_pause(model, &d.name),
            failures: names::deployment_failures(model, &d.name),
            ejections: names::deployment_ejections(model, &d.name),
            limit: names::deployment_limit(model, &d.name),
        }
    }

    /// The deployments of `model` (none: the model is not a gateway model).
    pub fn of(config: &'a Config, model: &'a str) -> Vec<DeploymentBudgets<'a>> {
        config
            .routing
            .get_key_value(model)
            .map(|(m, r)| r.deployments.iter().map(|d| Self::new(m, d)).collect())
            .unwrap_or_default()
    }

    /// Deployment `name` of `model` as configured now (`None`: configured away since).
    pub fn find(config: &'a Config, model: &'a str, name: &str) -> Option<Self> {
        let (model, routing) = config.routing.get_key_value(model)?;
        let d = routing.deployments.iter().find(|d| d.name == name)?;
        Some(Self::new(model, d))
    }

    /// Releases the slot of a call that ended: through `holder`'s lease where it holds
    /// leases and the concurrency is leased, else from the row.
    pub fn release_slot(
        &self,
        tx: &mut dyn Tx,
        holder: Option<&Holder>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        match (holder, self.leased_slots()) {
            (Some(h), Some(slots)) => h.refund(tx, SharedRow::Slots(&slots), 1, now_ms),
            _ => super::budgets::release_slot(tx, &self.slots),
        }
    }

    /// Returns a call's unused tokens to the token bucket, where one is configured:
    /// through `holder`'s leases where it holds them.
    pub fn refund_tokens(
        &self,
        tx: &mut dyn Tx,
        holder: Option<&Holder>,
        unused: u64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        match (holder, self.tokens_configured) {
            (_, false) => Ok(()),
            (Some(h), true) => h.refund(tx, SharedRow::Bucket(&self.tokens), unused, now_ms),
            (None, true) => self.tokens.refund(tx, unused, now_ms),
        }
    }

    /// Names in `hint` every row an admission or a completion through it may reach. With
    /// a holder, its leases instead of the leased shared rows; while it leases, not the
    /// rows it reads as last seen either (reached, if written, only when free at once).
    pub fn hint(&self, holder: Option<&Holder>, hint: &mut Prefetch) {
        let seeing = seeing(holder).is_some();
        let configured = [
            (&self.requests, self.requests_configured),
            (&self.tokens, self.tokens_configured),
        ];
        for (b, configured) in configured {
            match holder {
                Some(h) if configured => h.hint_budget(SharedRow::Bucket(b), hint),
                _ if !seeing => hint.buckets.push(b.name.clone()),
                _ => {}
            }
        }
        match (holder, self.leased_slots()) {
            (Some(h), Some(s)) => h.hint_budget(SharedRow::Slots(&s), hint),
            _ => hint.slots.push(self.slots.clone()),
        }
        if self.deployment.max_concurrency == Some(Concurrency::Adaptive) {
            hint.slots.push(self.limit.clone());
        }
        if !seeing {
            hint.buckets.push(self.pause.clone());
            hint.slots.push(self.failures.clone());
            hint.slots.push(self.ejections.clone());
        }
    }

    /// Its concurrency as a leased slot count: its limit, or [`UNLIMITED_SLOTS`] without
    /// one; `None` for an adaptive limit, whose count all holders share directly.
    pub fn leased_slots(&self) -> Option<SlotRef> {
        let limit = match self.deployment.max_concurrency {
            Some(Concurrency::Adaptive) => return None,
            Some(Concurrency::Fixed(n)) => n,
            None => UNLIMITED_SLOTS,
        };
        Some(SlotRef {
            scope: self.slots.clone(),
            limit,
        })
    }

    /// Its configured buckets, the budgets a holder leases.
    pub fn leased_buckets(&self) -> impl Iterator<Item = &BucketRef> {
        [
            (&self.requests, self.requests_configured),
            (&self.tokens, self.tokens_configured),
        ]
        .into_iter()
        .filter(|(_, configured)| *configured)
        .map(|(b, _)| b)
    }

    /// The rows a holder reads as last seen while it leases: the pause (a bucket row),
    /// then the failure and ejection counts (slot rows).
    pub fn seen_rows(&self) -> (&str, [&str; 2]) {
        (&self.pause, [&self.failures, &self.ejections])
    }

    /// Records what the transaction holds of the rows `holder` reads as last seen, after
    /// it wrote them.
    fn remember(&self, tx: &mut dyn Tx, holder: &Holder) -> Result<(), StoreError> {
        let until = tx.bucket(&self.pause)?.map_or(0, |s| s.updated_ms);
        holder.saw(&self.pause, until);
        for row in [&self.failures, &self.ejections] {
            holder.saw(row, i64::from(tx.slots_in_use(row)?));
        }
        Ok(())
    }

    /// A count kept in a slot row: as last seen by `seeing`, else read now.
    fn count(
        &self,
        tx: &mut dyn Tx,
        row: &str,
        seeing: Option<&Holder>,
    ) -> Result<u32, StoreError> {
        Ok(match seeing {
            Some(h) => h
                .seen(row)
                .map_or(0, |n| n.clamp(0, i64::from(u32::MAX)) as u32),
            None => tx.slots_in_use(row)?,
        })
    }

    /// The concurrency limit now: configured, learned, or none.
    fn concurrency_limit(&self, tx: &mut dyn Tx) -> Result<Option<u32>, StoreError> {
        Ok(match self.deployment.max_concurrency {
            None => None,
            Some(Concurrency::Fixed(n)) => Some(n),
            Some(Concurrency::Adaptive) => Some(learned(tx.slots_in_use(&self.limit)?) / MILLI),
        })
    }

    /// When its pause or ejection ends, if it is paused at `now_ms`: as last seen by
    /// `seeing`, else read now.
    fn paused_until(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        seeing: Option<&Holder>,
    ) -> Result<Option<i64>, StoreError> {
        let until = match seeing {
            Some(h) => h.seen(&self.pause),
            None => tx.bucket(&self.pause)?.map(|s| s.updated_ms),
        };
        Ok(until.filter(|&t| t > now_ms))
    }

    /// Stops new calls until `until_ms` (a 429's retry-after, or an ejection); a pause
    /// already longer stays.
    fn pause(&self, tx: &mut dyn Tx, now_ms: i64, until_ms: i64) -> Result<(), StoreError> {
        let until = self
            .paused_until(tx, now_ms, None)?
            .map_or(until_ms, |t| t.max(until_ms));
        tx.set_bucket(
            &self.pause,
            bucket::State {
                balance_micro: 0,
                updated_ms: until,
            },
        )
    }
}

/// The learned limit in thousandths, from its row (0: never learned, the initial limit).
fn learned(stored: u32) -> u32 {
    if stored == 0 {
        ADAPTIVE_INITIAL * MILLI
    } else {
        stored.clamp(ADAPTIVE_MIN * MILLI, ADAPTIVE_MAX * MILLI)
    }
}
