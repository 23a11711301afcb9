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

use super::budgets::{BucketRef, Refusal, SlotRef};
use super::leases::{Holder, RowWrite, SharedRow, Taken};
use crate::alerts::{crossings, Alert, AlertRule};
use crate::bucket::{self, Limits, Shortage};
use crate::config::{Concurrency, Config, Deployment, Routing};
use crate::explain::{Shortfall, Unit};
use crate::model::names;
use crate::reason::Reason;
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

    /// What the deployment is now, as `inspect` shows it.
    pub fn health(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<Health, StoreError> {
        let failures = tx.slots_in_use(&self.failures)?;
        let paused_until = self.paused_until(tx, now_ms, None)?;
        let state = match (paused_until, failures >= EJECT_AFTER_FAILURES) {
            (Some(_), true) => HealthState::Ejected,
            (Some(_), false) => HealthState::Paused,
            (None, true) => HealthState::Probing,
            (None, false) => HealthState::Healthy,
        };
        Ok(Health {
            model: self.model.to_string(),
            deployment: self.deployment.name.clone(),
            state,
            until_ms: paused_until,
            failures,
            in_flight: tx.slots_in_use(&self.slots)?,
            concurrency_limit: self.concurrency_limit(tx)?,
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

    /// Whether this deployment can take a call of `tokens` now: the spends and slot count to
    /// write, with a score for the choice, or how long until it could. Through `holder`'s
    /// leases, its configured buckets and concurrency are only looked at here: the chosen
    /// deployment's are taken by [`Chosen::take`].
    fn check(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        tokens: u64,
        holder: Option<&Holder>,
    ) -> Result<Check, StoreError> {
        let seeing = seeing(holder);
        let paused = |ms: i64| Check::Short {
            wait: Some((ms - now_ms) as u64),
            busy: false,
            short: Some(Shortfall {
                limit: self.pause.clone(),
                requested: 1,
                available: 0,
                unit: Unit::Requests,
                capacity: None,
                output_tokens: None,
            }),
        };
        if let Some(until) = self.paused_until(tx, now_ms, seeing)? {
            return Ok(paused(until));
        }
        // After an ejection's cool-down, one probe call decides: taking it pauses the
        // deployment again for a cool-down's length, which its success ends. One call at a
        // time: a holder that saw it probing decides on the rows themselves.
        let mut probing = self.count(tx, &self.failures, seeing)? >= EJECT_AFTER_FAILURES;
        if probing && seeing.is_some() {
            if let Some(until) = self.paused_until(tx, now_ms, None)? {
                return Ok(paused(until));
            }
            probing = tx.slots_in_use(&self.failures)? >= EJECT_AFTER_FAILURES;
        }
        let mut short: Option<Shortfall> = None;
        let mut spends = Vec::new();
        let mut leased = Vec::new();
        let mut said = Vec::new();
        let mut headroom = 1.0f64;
        let mut wait: Option<u64> = Some(0);
        let wanted: [(&BucketRef, u64, bool, Unit); 2] = [
            (&self.requests, 1, self.requests_configured, Unit::Requests),
            (&self.tokens, tokens, self.tokens_configured, Unit::Tokens),
        ];
        for (b, credits, configured, unit) in wanted {
            if credits == 0 {
                continue;
            }
            // What the provider last said, where this holder keeps it.
            let word = seeing.and_then(|h| h.said_level(&b.name, b.limits, now_ms));
            let (level, stored) = match holder {
                Some(h) if configured => {
                    let micro = h.level_micro(tx, SharedRow::Bucket(b), now_ms)?;
                    let view = bucket::State {
                        balance_micro: micro,
                        updated_ms: now_ms,
                    };
                    (
                        word.filter(|w| w.balance_micro < micro).unwrap_or(view),
                        None,
                    )
                }
                _ if seeing.is_some() => {
                    (word.unwrap_or(bucket::State::full(b.limits, now_ms)), None)
                }
                _ => {
                    let stored = tx.bucket(&b.name)?;
                    let level = match stored {
                        Some(s) => s.refilled(b.limits, now_ms),
                        None => bucket::State::full(b.limits, now_ms),
                    };
                    (level, stored)
                }
            };
            // Paused (or lowered until the provider's reset): no refill before `updated_ms`.
            let paused_ms = (level.updated_ms - now_ms).max(0) as u64;
            match level.spend(b.limits, credits) {
                Ok(next) => {
                    if configured {
                        headroom = headroom
                            .min(next.balance_micro as f64 / b.limits.capacity_micro.max(1) as f64);
                    }
                    if word.is_some() {
                        said.push((b.name.clone(), b.limits, credits));
                    }
                    if holder.is_some() && configured {
                        leased.push((
                            BucketRef {
                                name: b.name.clone(),
                                limits: b.limits,
                            },
                            credits,
                            unit,
                        ));
                    } else if seeing.is_none()
                        && (configured
                            || stored.is_some_and(|s| s.balance_micro < b.limits.capacity_micro))
                    {
                        // An unlimited bucket at its full level needs no row.
                        spends.push(Spend {
                            name: b.name.clone(),
                            limits: b.limits,
                            before: level,
                            after: next,
                        });
                    }
                }
                Err(shortage) => {
                    let w = match shortage {
                        Shortage::RetryAfterMs(ms) => Some(ms + paused_ms),
                        Shortage::NoRefill if paused_ms > 0 => Some(paused_ms),
                        // Credits in other holders' leases come back within a lease's life.
                        Shortage::NoRefill if seeing.is_some() && configured => {
                            Some(crate::lease::LIFE_MS as u64)
                        }
                        Shortage::NoRefill | Shortage::NeverFits => None,
                    };
                    wait = match (wait, w) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    short.get_or_insert(Shortfall {
                        limit: b.name.clone(),
                        requested: credits,
                        available: level.whole_credits().max(0) as u64,
                        unit,
                        capacity: None,
                        output_tokens: None,
                    });
                }
            }
        }
        let limit = self.concurrency_limit(tx)?;
        let leased_slots = holder.and(self.leased_slots());
        let in_use = match (holder, &leased_slots, limit) {
            (Some(h), Some(s), Some(_)) => {
                let free = h.level_micro(tx, SharedRow::Slots(s), now_ms)? / bucket::MICRO;
                (i64::from(s.limit) - free).clamp(0, i64::from(u32::MAX)) as u32
            }
            // Leased without a limit: nothing to look at before taking one.
            (Some(_), Some(_), None) => 0,
            _ => tx.slots_in_use(&self.slots)?,
        };
        if let Some(limit) = limit {
            if in_use >= limit {
                short.get_or_insert(Shortfall {
                    limit: self.slots.clone(),
                    requested: 1,
                    available: 0,
                    unit: Unit::Slots,
                    capacity: None,
                    output_tokens: None,
                });
                // A slot frees when a call ends: when, only the policy's estimate says.
                return Ok(Check::Short {
                    wait: None,
                    busy: true,
                    short,
                });
            }
            headroom = headroom.min(f64::from(limit - in_use) / f64::from(limit));
        }
        if let Some(short) = short {
            return Ok(Check::Short {
                wait,
                busy: false,
                short: Some(short),
            });
        }
        Ok(Check::Fits(Chosen {
            model: self.model.to_string(),
            name: self.deployment.name.clone(),
            spends,
            leased,
            direct_slot: match leased_slots {
                Some(_) => None,
                None => Some((self.slots.clone(), in_use)),
            },
            leased_slot: leased_slots,
            said,
            writes: Vec::new(),
            alerts: Vec::new(),
            score: self.deployment.weight * headroom,
            probe: probing.then(|| (self.pause.clone(), now_ms.saturating_add(EJECT_BASE_MS))),
        }))
    }

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

/// What one deployment's check found.
enum Check {
    Fits(Chosen),
    Short {
        /// Until it could take the call (`None`: waiting alone cannot tell).
        wait: Option<u64>,
        /// Whether its concurrency is what is short.
        busy: bool,
        short: Option<Shortfall>,
    },
}

/// One bucket of a deployment as the reservation leaves it.
struct Spend {
    name: String,
    limits: Limits,
    before: bucket::State,
    after: bucket::State,
}

/// A deployment chosen and checked, not yet written: [`Chosen::take`] takes what it
/// reserves through leases, [`Chosen::apply`] writes it all.
pub(crate) struct Chosen {
    pub model: String,
    pub name: String,
    /// Buckets written directly.
    spends: Vec<Spend>,
    /// Configured buckets reserved through the holder's leases: credits, and their unit.
    leased: Vec<(BucketRef, u64, Unit)>,
    /// Its slot count and what was in use, written directly.
    direct_slot: Option<(String, u32)>,
    /// Its concurrency, reserved through the holder's lease.
    leased_slot: Option<SlotRef>,
    /// Credits counted against the provider's word the holder keeps.
    said: Vec<(String, Limits, u64)>,
    /// What taking the leased budgets writes, and the alerts they cross.
    writes: Vec<RowWrite>,
    alerts: Vec<Alert>,
    score: f64,
    /// For a probe: the pause row, and until when the probe holds the deployment.
    probe: Option<(String, i64)>,
}

impl Chosen {
    /// Takes what it reserves through `holder`'s leases (from its lease, else from the
    /// shared row), writing nothing yet; what was short, and how long to wait, when it
    /// cannot.
    fn take(
        &mut self,
        tx: &mut dyn Tx,
        holder: Option<&Holder>,
        rules: &[AlertRule],
        now_ms: i64,
    ) -> Result<Result<(), (Shortfall, Option<u64>)>, StoreError> {
        let Some(h) = holder else {
            return Ok(Ok(()));
        };
        for (b, credits, unit) in &self.leased {
            match h.spend(tx, SharedRow::Bucket(b), *credits, now_ms)? {
                Taken::Spent {
                    writes,
                    before_micro,
                    after_micro,
                } => {
                    self.writes.extend(writes);
                    let at = |balance_micro| bucket::State {
                        balance_micro,
                        updated_ms: now_ms,
                    };
                    let (before, after) = (at(before_micro), at(after_micro));
                    self.alerts
                        .extend(crossings(rules, &b.name, b.limits, before, after, now_ms));
                }
                Taken::Short {
                    available_micro,
                    shortage,
                } => {
                    let short = Shortfall {
                        limit: b.name.clone(),
                        requested: *credits,
                        available: (available_micro / bucket::MICRO).max(0) as u64,
                        unit: *unit,
                        capacity: None,
                        output_tokens: None,
                    };
                    let wait = match shortage {
                        Shortage::RetryAfterMs(ms) => Some(ms),
                        Shortage::NoRefill | Shortage::NeverFits => None,
                    };
                    return Ok(Err((short, wait)));
                }
            }
        }
        if let Some(s) = &self.leased_slot {
            match h.spend(tx, SharedRow::Slots(s), 1, now_ms)? {
                Taken::Spent { writes, .. } => self.writes.extend(writes),
                Taken::Short {
                    available_micro, ..
                } => {
                    let free = (available_micro / bucket::MICRO).max(0) as u64;
                    let short = Shortfall {
                        limit: s.scope.clone(),
                        requested: 1,
                        available: free,
                        unit: Unit::Slots,
                        capacity: None,
                        output_tokens: None,
                    };
                    return Ok(Err((short, None)));
                }
            }
        }
        Ok(Ok(()))
    }

    /// Writes the deployment's spends, with the alerts of `rules` they cross, and takes its
    /// slot (in the caller's transaction); counts the call against the provider's word
    /// `holder` keeps.
    pub fn apply(
        self,
        tx: &mut dyn Tx,
        holder: Option<&Holder>,
        rules: &[AlertRule],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for s in &self.spends {
            tx.set_bucket(&s.name, s.after)?;
            for alert in crossings(rules, &s.name, s.limits, s.before, s.after, now_ms) {
                tx.put_alert(&alert)?;
            }
        }
        for w in &self.writes {
            w.apply(tx)?;
        }
        for alert in &self.alerts {
            tx.put_alert(alert)?;
        }
        if let Some((pause, until_ms)) = &self.probe {
            let held = bucket::State {
                balance_micro: 0,
                updated_ms: *until_ms,
            };
            tx.set_bucket(pause, held)?;
            if let Some(h) = holder {
                h.saw(pause, *until_ms);
            }
        }
        if let Some(h) = holder {
            for (name, limits, credits) in &self.said {
                h.spend_said(name, *limits, *credits, now_ms);
            }
        }
        match &self.direct_slot {
            Some((scope, in_use)) => tx.set_slots_in_use(scope, in_use + 1),
            None => Ok(()),
        }
    }
}

/// What a choice among deployments asks for.
pub(crate) struct Ask<'a> {
    /// Tokens the call reserves.
    pub tokens: u64,
    /// The deployment whose attempt just failed: chosen only when no other can.
    pub avoid: Option<&'a str>,
    /// The retry-after of a refusal for want of concurrency (the policy's estimate).
    pub busy_retry_after_ms: Option<u64>,
    /// A uniform draw in [0, 2^64), the same for the same call (the engine's seed, the
    /// tenant, the key and the attempt), so a replay or a simulation chooses alike.
    pub draw: u64,
}

/// Chooses the deployment of `model` to reserve for a call, reading `tx` but writing
/// nothing. Among those that can take the call, one is drawn with a probability
/// proportional to weight × headroom (the smallest fraction its request bucket, token
/// bucket and concurrency keep after this call; 1 where unlimited); `ask.avoid` and
/// deployments of weight 0 only when no other can. Through `holder`'s leases the drawn one
/// is taken at once, and another drawn if it cannot be. None can: a `deployment_capacity`
/// refusal whose retry-after is the earliest any could.
pub(crate) fn choose(
    tx: &mut dyn Tx,
    config: &Config,
    model: &str,
    now_ms: i64,
    ask: &Ask<'_>,
    holder: Option<&Holder>,
) -> Result<Result<Chosen, Refusal>, StoreError> {
    // Those that fit, by class: preferred (not avoided) and weighted first.
    let mut fits: Vec<((bool, bool), Chosen)> = Vec::new();
    let mut earliest: Option<u64> = None;
    let mut first_short = None;
    let busy_retry_after_ms = ask.busy_retry_after_ms;
    for d in DeploymentBudgets::of(config, model) {
        match d.check(tx, now_ms, ask.tokens, holder)? {
            Check::Fits(c) => {
                let class = (
                    ask.avoid != Some(c.name.as_str()),
                    d.deployment.weight > 0.0,
                );
                fits.push((class, c));
            }
            Check::Short { wait, busy, short } => {
                let w = if busy { busy_retry_after_ms } else { wait };
                if let Some(w) = w {
                    earliest = Some(earliest.map_or(w, |e: u64| e.min(w)));
                }
                if first_short.is_none() {
                    first_short = short;
                }
            }
        }
    }
    while let Some(best) = fits.iter().map(|(class, _)| *class).max() {
        let pool: Vec<usize> = (0..fits.len()).filter(|&i| fits[i].0 == best).collect();
        // A weight of 0 draws by headroom alone; a deployment that fits always has a chance.
        let score = |i: usize| fits[i].1.score.max(1e-9);
        let total: f64 = pool.iter().map(|&i| score(i)).sum();
        let mut point = (ask.draw >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut pick = pool[pool.len() - 1];
        for &i in &pool {
            if point < score(i) {
                pick = i;
                break;
            }
            point -= score(i);
        }
        let (_, mut chosen) = fits.swap_remove(pick);
        match chosen.take(tx, holder, &config.alerts, now_ms)? {
            Ok(()) => return Ok(Ok(chosen)),
            Err((short, wait)) => {
                if let Some(w) = wait {
                    earliest = Some(earliest.map_or(w, |e: u64| e.min(w)));
                }
                first_short.get_or_insert(short);
            }
        }
    }
    Ok(Err(Refusal {
        reason: Reason::DeploymentCapacity,
        retry_after_ms: earliest,
        shortfall: first_short,
    }))
}

/// The draw of one call's attempt: FNV-1a of the engine's seed, the tenant, the key and
/// the attempt, mixed (SplitMix64's finaliser).
pub(crate) fn draw(seed: u64, tenant: &str, key: &str, attempt: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in tenant
        .bytes()
        .chain([0])
        .chain(key.bytes())
        .chain(attempt.to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
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
    let Some(d) = config
        .routing
        .get(model)
        .and_then(|r| r.deployments.iter().find(|d| d.name == name))
    else {
        // Configured away since: nothing to learn.
        return Ok(());
    };
    let can_eject = can_move(config.routing.get(model));
    let d = DeploymentBudgets::new(model, d);
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
            // A probe's success ends the ejection at once.
            if reached && tx.slots_in_use(&d.failures)? >= EJECT_AFTER_FAILURES {
                let over = bucket::State {
                    balance_micro: 0,
                    updated_ms: now_ms,
                };
                tx.set_bucket(&d.pause, over)?;
            }
            for row in [&d.failures, &d.ejections] {
                if reached && tx.slots_in_use(row)? > 0 {
                    tx.set_slots_in_use(row, 0)?;
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
            let pause = end
                .provider_retry_after_ms
                .map_or(DEFAULT_PAUSE_MS, |ms| ms.min(EJECT_MAX_MS as u64) as i64);
            d.pause(tx, now_ms, now_ms.saturating_add(pause))?;
            if adaptive {
                set_limit(tx, &backoff)?;
            }
        }
        // Only a model with somewhere else to send its calls ejects a deployment: a lone one
        // goes on taking them (its provider's retry-after still pauses it).
        (CallResult::Failed, Some("unavailable" | "connect_failed")) if !can_eject => {
            if let Some(ms) = end.provider_retry_after_ms {
                d.pause(
                    tx,
                    now_ms,
                    now_ms.saturating_add(ms.min(EJECT_MAX_MS as u64) as i64),
                )?;
            }
        }
        (CallResult::Failed, Some("unavailable" | "connect_failed")) => {
            let failures = tx.slots_in_use(&d.failures)?.saturating_add(1);
            tx.set_slots_in_use(&d.failures, failures)?;
            if let Some(ms) = end.provider_retry_after_ms {
                d.pause(
                    tx,
                    now_ms,
                    now_ms.saturating_add(ms.min(EJECT_MAX_MS as u64) as i64),
                )?;
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

/// A deployment's state, as `inspect`, `/metrics` and the dashboard show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Taking calls.
    Healthy,
    /// Paused by a 429 until its retry-after.
    Paused,
    /// Ejected after consecutive failures, until its cool-down ends.
    Ejected,
    /// Its cool-down over: one call at a time decides whether it is healthy again.
    Probing,
}

impl HealthState {
    /// Its number in `tollgate_deployment_state` (0 healthy, 1 paused, 2 ejected, 3 probing).
    pub fn number(self) -> i64 {
        match self {
            HealthState::Healthy => 0,
            HealthState::Paused => 1,
            HealthState::Ejected => 2,
            HealthState::Probing => 3,
        }
    }
}

/// A deployment's health and load.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Health {
    /// The gateway model.
    pub model: String,
    /// The deployment's name.
    pub deployment: String,
    /// Healthy, paused, ejected or probing.
    pub state: HealthState,
    /// When a pause or an ejection ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// Consecutive failures.
    pub failures: u32,
    /// Calls in flight.
    pub in_flight: u32,
    /// Its concurrency limit now (configured or learned), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
}
