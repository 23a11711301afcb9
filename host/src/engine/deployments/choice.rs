//! Choosing a deployment for a call: each checked against its budgets, pause and
//! concurrency (through the holder's leases where it holds them), one drawn by weight and
//! headroom, taken, and written with the admission.

use super::{seeing, DeploymentBudgets, EJECT_AFTER_FAILURES, EJECT_BASE_MS};
use crate::alerts::{crossings, Alert, AlertRule};
use crate::bucket::{self, Limits, Shortage};
use crate::config::Config;
use crate::engine::budgets::{BucketRef, Refusal, SlotRef};
use crate::engine::leases::{Holder, RowWrite, SharedRow, Taken};
use crate::explain::{Shortfall, Unit};
use crate::reason::Reason;
use crate::store::{StoreError, Tx};

impl DeploymentBudgets<'_> {
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
                        leased.push((b.clone(), credits, unit));
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
