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

use super::budgets::{BucketRef, Refusal};
use crate::alerts::{crossings, AlertRule};
use crate::bucket::{self, Limits, Shortage};
use crate::config::{Concurrency, Config, Deployment, Routing};
use crate::explain::{Shortfall, Unit};
use crate::model::names;
use crate::reason::Reason;
use crate::store::{StoreError, Tx};

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

    /// Every row it may read or write: bucket names, then slot scopes.
    pub fn rows(&self) -> ([String; 3], [String; 4]) {
        (
            [
                self.requests.name.clone(),
                self.tokens.name.clone(),
                self.pause.clone(),
            ],
            [
                self.slots.clone(),
                self.failures.clone(),
                self.ejections.clone(),
                self.limit.clone(),
            ],
        )
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
        let paused_until = self.paused_until(tx, now_ms)?;
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

    /// When its pause or ejection ends, if it is paused at `now_ms`.
    fn paused_until(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<Option<i64>, StoreError> {
        Ok(tx
            .bucket(&self.pause)?
            .map(|s| s.updated_ms)
            .filter(|&t| t > now_ms))
    }

    /// Whether this deployment can take a call of `tokens` now: the spends and slot count to
    /// write, with a score for the choice, or how long until it could.
    fn check(&self, tx: &mut dyn Tx, now_ms: i64, tokens: u64) -> Result<Check, StoreError> {
        let mut spends = Vec::new();
        let mut headroom = 1.0f64;
        let mut short: Option<Shortfall> = None;
        let paused = self.paused_until(tx, now_ms)?.map(|t| (t - now_ms) as u64);
        if let Some(ms) = paused {
            short = Some(Shortfall {
                limit: self.pause.clone(),
                requested: 1,
                available: 0,
                unit: Unit::Requests,
                capacity: None,
                output_tokens: None,
            });
            return Ok(Check::Short {
                wait: Some(ms),
                busy: false,
                short,
            });
        }
        let mut wait: Option<u64> = Some(0);
        let wanted: [(&BucketRef, u64, bool, Unit); 2] = [
            (&self.requests, 1, self.requests_configured, Unit::Requests),
            (&self.tokens, tokens, self.tokens_configured, Unit::Tokens),
        ];
        for (b, credits, configured, unit) in wanted {
            if credits == 0 {
                continue;
            }
            let stored = tx.bucket(&b.name)?;
            let level = match stored {
                Some(s) => s.refilled(b.limits, now_ms),
                None => bucket::State::full(b.limits, now_ms),
            };
            // Paused (or lowered until the provider's reset): no refill before `updated_ms`.
            let paused_ms = (level.updated_ms - now_ms).max(0) as u64;
            match level.spend(b.limits, credits) {
                Ok(next) => {
                    if configured {
                        headroom = headroom
                            .min(next.balance_micro as f64 / b.limits.capacity_micro.max(1) as f64);
                    }
                    // An unlimited bucket at its full level needs no row.
                    if configured
                        || stored.is_some_and(|s| s.balance_micro < b.limits.capacity_micro)
                    {
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
        let in_use = tx.slots_in_use(&self.slots)?;
        // After an ejection's cool-down, one probe call decides: taking it pauses the
        // deployment again for a cool-down's length, which its success ends.
        let probing = tx.slots_in_use(&self.failures)? >= EJECT_AFTER_FAILURES;
        if let Some(limit) = self.concurrency_limit(tx)? {
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
            slot: (self.slots.clone(), in_use),
            score: self.deployment.weight * headroom,
            probe: probing.then(|| (self.pause.clone(), now_ms.saturating_add(EJECT_BASE_MS))),
        }))
    }

    /// Lowers the balances to what the provider says is left; never raises them. Calls
    /// sent but not yet seen by the provider when it answered may go past what it said by
    /// at most the calls in flight: the provider refuses those, and they move on.
    fn learn(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        limits: &ProviderLimits,
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
            let level = b.level(tx, now_ms)?;
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
            tx.set_bucket(
                &b.name,
                bucket::State {
                    balance_micro: said,
                    updated_ms: updated_ms.max(level.updated_ms),
                },
            )?;
        }
        Ok(())
    }

    /// Stops new calls until `until_ms` (a 429's retry-after, or an ejection); a pause
    /// already longer stays.
    fn pause(&self, tx: &mut dyn Tx, now_ms: i64, until_ms: i64) -> Result<(), StoreError> {
        let until = self
            .paused_until(tx, now_ms)?
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

/// A deployment chosen and checked, not yet written: [`Chosen::apply`] reserves it.
pub(crate) struct Chosen {
    pub model: String,
    pub name: String,
    spends: Vec<Spend>,
    slot: (String, u32),
    score: f64,
    /// For a probe: the pause row, and until when the probe holds the deployment.
    probe: Option<(String, i64)>,
}

impl Chosen {
    /// Writes the deployment's spends, with the alerts of `rules` they cross, and takes its
    /// slot (in the caller's transaction).
    pub fn apply(
        self,
        tx: &mut dyn Tx,
        rules: &[AlertRule],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for s in &self.spends {
            tx.set_bucket(&s.name, s.after)?;
            for alert in crossings(rules, &s.name, s.limits, s.before, s.after, now_ms) {
                tx.put_alert(&alert)?;
            }
        }
        if let Some((pause, until_ms)) = &self.probe {
            let held = bucket::State {
                balance_micro: 0,
                updated_ms: *until_ms,
            };
            tx.set_bucket(pause, held)?;
        }
        tx.set_slots_in_use(&self.slot.0, self.slot.1 + 1)
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
/// deployments of weight 0 only when no other can. None can: a `deployment_capacity`
/// refusal whose retry-after is the earliest any could.
pub(crate) fn choose(
    tx: &mut dyn Tx,
    config: &Config,
    model: &str,
    now_ms: i64,
    ask: &Ask<'_>,
) -> Result<Result<Chosen, Refusal>, StoreError> {
    // Those that fit, by class: preferred (not avoided) and weighted first.
    let mut fits: Vec<((bool, bool), Chosen)> = Vec::new();
    let mut earliest: Option<u64> = None;
    let mut first_short = None;
    let busy_retry_after_ms = ask.busy_retry_after_ms;
    for d in DeploymentBudgets::of(config, model) {
        match d.check(tx, now_ms, ask.tokens)? {
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
    let Some(best) = fits.iter().map(|(class, _)| *class).max() else {
        return Ok(Err(Refusal {
            reason: Reason::DeploymentCapacity,
            retry_after_ms: earliest,
            shortfall: first_short,
        }));
    };
    let mut pool: Vec<Chosen> = fits
        .into_iter()
        .filter(|(class, _)| *class == best)
        .map(|(_, c)| c)
        .collect();
    // A weight of 0 draws by headroom alone; a deployment that fits always has a chance.
    let score = |c: &Chosen| c.score.max(1e-9);
    let total: f64 = pool.iter().map(score).sum();
    let mut point = (ask.draw >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut pick = pool.len() - 1;
    for (i, c) in pool.iter().enumerate() {
        if point < score(c) {
            pick = i;
            break;
        }
        point -= score(c);
    }
    Ok(Ok(pool.swap_remove(pick)))
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
pub(crate) fn end_attempt(
    tx: &mut dyn Tx,
    config: &Config,
    model: &str,
    name: &str,
    now_ms: i64,
    end: &AttemptEnd<'_>,
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
    let in_use = tx.slots_in_use(&d.slots)?;
    if let Some(l) = end.limits {
        d.learn(tx, now_ms, l)?;
    }
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
            // Additive increase while the limit was reached (the call ends with the
            // deployment full): one call more per limit's worth of such successes (a round
            // trip's, as TCP does). A limit that was not reached learns nothing.
            if adaptive {
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
        (CallResult::Unknown, _) if adaptive => set_limit(tx, &backoff)?,
        _ => {}
    }
    Ok(())
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
