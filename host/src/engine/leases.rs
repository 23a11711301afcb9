//! The engine's side of leases (docs/design.md, "Leases for shared budgets"): which budgets
//! are leased, the rows a holder keeps, reserving, refunding and releasing through its
//! leases, and the keeper that renews a holder's registration and returns expired leases.
//! The arithmetic is [`crate::lease`]'s; this module reads and writes its rows.
//!
//! A *holder* is one engine serving from a store other engines share (a replica on
//! PostgreSQL). Its leases are kept in bucket rows no other holder writes, so the store's
//! row locks keep replicas apart as they do for tenants' rows:
//!
//! - `lease:<holder>:<budget>`: what is left of the lease (`balance_micro`) and when it
//!   expires (`updated_ms`);
//! - `lease.granted:<holder>:<budget>`: what was moved into it;
//! - `lease.leased:<budget>`: the credits granted to every lease not given back, beside the
//!   shared row (only a holder that holds the shared row's lock writes it).
//!
//! A slot count is leased as a budget that never refills, of its limit (`<budget>` is
//! `slots:<scope>`). While one holder is live, it reserves from the shared rows directly, as
//! an engine of its own store always does.

use super::budgets::{BucketRef, SlotRef};
use crate::bucket::{Limits, Shortage, State, MICRO};
use crate::lease::{self, Lease, Shared, Slice};
use crate::model::names;
use crate::store::{Prefetch, StoreError, Tx};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// The meta row that lists holders: holder id to when its registration lapses (store ms).
pub const HOLDERS_META: &str = "lease.holders";
/// How long a holder's registration lives past its last renewal.
pub const HOLDER_LIFE_MS: i64 = 3_000;
/// How long a lapsed holder stays listed, so that the sweep returns its leases.
const FORGET_AFTER_MS: i64 = 30_000;

/// Whether bucket `name` is shared by tenants, and so leased: the global request bucket, a
/// model's budgets and a group's.
pub(crate) fn is_shared_bucket(name: &str) -> bool {
    name == names::GLOBAL_REQUESTS || name.starts_with("model.") || name.starts_with("group.")
}

/// Whether slot scope `scope` is shared, and so leased: the global one.
pub(crate) fn is_shared_scope(scope: &str) -> bool {
    scope == names::GLOBAL_SLOTS
}

fn slots_budget(scope: &str) -> String {
    format!("slots:{scope}")
}

fn lease_row(holder: &str, budget: &str) -> String {
    format!("lease:{holder}:{budget}")
}

fn granted_row(holder: &str, budget: &str) -> String {
    format!("lease.granted:{holder}:{budget}")
}

fn leased_row(budget: &str) -> String {
    format!("lease.leased:{budget}")
}

/// A shared budget as leases see it: a bucket, or a slot count.
#[derive(Clone, Copy)]
pub(crate) enum SharedRow<'a> {
    Bucket(&'a BucketRef),
    Slots(&'a SlotRef),
}

impl SharedRow<'_> {
    /// The budget's name in lease rows.
    fn budget(&self) -> String {
        match self {
            SharedRow::Bucket(b) => b.name.clone(),
            SharedRow::Slots(s) => slots_budget(&s.scope),
        }
    }

    /// The budget's limits: a slot count is a budget of its limit that never refills.
    fn limits(&self) -> Limits {
        match self {
            SharedRow::Bucket(b) => b.limits,
            SharedRow::Slots(s) => Limits {
                capacity_micro: i64::from(s.limit) * MICRO,
                refill_milli_per_s: 0,
                period: None,
            },
        }
    }

    /// The shared row and the credits leased out of it.
    fn read(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<Shared, StoreError> {
        let leased_micro = tx
            .bucket(&leased_row(&self.budget()))?
            .map_or(0, |s| s.balance_micro.max(0));
        let bucket = match self {
            SharedRow::Bucket(b) => tx
                .bucket(&b.name)?
                .unwrap_or_else(|| State::full(b.limits, now_ms)),
            SharedRow::Slots(s) => State {
                balance_micro: (i64::from(s.limit) - i64::from(tx.slots_in_use(&s.scope)?)) * MICRO,
                updated_ms: 0,
            },
        };
        Ok(Shared {
            bucket,
            leased_micro,
        })
    }

    /// The writes that store `shared`, read as `was` (its leased credits are written only
    /// when they changed).
    fn writes(&self, was: Shared, shared: Shared, out: &mut Vec<RowWrite>) {
        if shared.leased_micro != was.leased_micro {
            out.push(RowWrite::Bucket(
                leased_row(&self.budget()),
                State {
                    balance_micro: shared.leased_micro,
                    updated_ms: 0,
                },
            ));
        }
        match self {
            SharedRow::Bucket(b) => out.push(RowWrite::Bucket(b.name.clone(), shared.bucket)),
            SharedRow::Slots(s) => {
                let free = shared.bucket.balance_micro.div_euclid(MICRO);
                let in_use = (i64::from(s.limit) - free).clamp(0, i64::from(u32::MAX));
                out.push(RowWrite::Slots(s.scope.clone(), in_use as u32));
            }
        }
    }
}

/// One row a reservation through leases writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RowWrite {
    Bucket(String, State),
    Slots(String, u32),
}

impl RowWrite {
    pub fn apply(&self, tx: &mut dyn Tx) -> Result<(), StoreError> {
        match self {
            RowWrite::Bucket(name, state) => tx.set_bucket(name, *state),
            RowWrite::Slots(scope, in_use) => tx.set_slots_in_use(scope, *in_use),
        }
    }
}

/// What taking credits from a shared budget came to.
pub(crate) enum Taken {
    /// The rows to write, and the credits known unspent before and after (micro-credits):
    /// the shared row's and all that is leased out, for alert thresholds. Credits leased
    /// out count as unspent until their lease is given back, so an alert may come late by
    /// at most what is leased out, never early; a spend from a lease alone changes nothing
    /// known (both the same).
    Spent {
        writes: Vec<RowWrite>,
        before_micro: i64,
        after_micro: i64,
    },
    /// Short: what this holder could take now, and how long to wait.
    Short {
        available_micro: i64,
        shortage: Shortage,
    },
}

/// Credits a holder took from one budget in the current and the last second.
#[derive(Clone, Copy, Default)]
struct Meter {
    second: i64,
    this_second: i64,
    last_second: i64,
}

impl Meter {
    fn add(&mut self, micro: i64, now_ms: i64) {
        let second = now_ms.div_euclid(1000);
        if second != self.second {
            self.last_second = if second == self.second + 1 {
                self.this_second
            } else {
                0
            };
            self.this_second = 0;
            self.second = second;
        }
        self.this_second = self.this_second.saturating_add(micro);
    }

    /// The demand until the next renewal: a second's worth at the rate seen.
    fn demand(&self) -> i64 {
        self.this_second.max(self.last_second)
    }
}

/// One engine as a holder of leases on the budgets it shares with other engines.
pub(crate) struct Holder {
    id: String,
    /// Live holders at the last renewal (this one included); 1 until another registers.
    live: AtomicU32,
    meters: Mutex<HashMap<String, Meter>>,
    /// Each shared row's level (micro-credits) when this holder last read it: what its
    /// policy is shown while it leases, so that showing it takes no shared row's lock.
    seen: Mutex<HashMap<String, i64>>,
}

/// What one renewal of a holder did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseKeep {
    /// Holders whose registration is live, this one included.
    pub live_holders: u32,
    /// Expired leases given back to their shared rows (any holder's).
    pub returned: u32,
}

impl Holder {
    pub fn new(id: String) -> Self {
        Holder {
            id,
            live: AtomicU32::new(1),
            meters: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether reservations go through leases now: only while other holders are live.
    pub fn leasing(&self) -> bool {
        self.live.load(Ordering::Relaxed) > 1
    }

    fn lease(&self, tx: &mut dyn Tx, budget: &str) -> Result<Option<Lease>, StoreError> {
        read_lease(tx, &self.id, budget)
    }

    fn lease_writes(&self, budget: &str, lease: Option<Lease>, out: &mut Vec<RowWrite>) {
        lease_writes(&self.id, budget, lease, out)
    }

    fn saw(&self, budget: &str, level_micro: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(budget.to_string(), level_micro);
    }

    fn demand(&self, budget: &str, micro: i64, now_ms: i64) -> i64 {
        let mut meters = self.meters.lock().unwrap_or_else(|e| e.into_inner());
        let meter = meters.entry(budget.to_string()).or_default();
        meter.add(micro, now_ms);
        meter.demand()
    }

    /// Takes `credits` from `row` for this holder: from its lease while it holds enough,
    /// else from the shared row, taking a new lease sized to its demand while other holders
    /// are live and the row holds enough to share out.
    pub fn spend(
        &self,
        tx: &mut dyn Tx,
        row: SharedRow,
        credits: u64,
        now_ms: i64,
    ) -> Result<Taken, StoreError> {
        let budget = row.budget();
        let limits = row.limits();
        let need = credits_micro(credits);
        let demand = self.demand(&budget, need, now_ms);
        let held = self.lease(tx, &budget)?;
        let mut writes = Vec::new();
        if let Some(l) = held {
            if let Some(next) = l.spend(credits, now_ms) {
                // Only what is left changes (and the expiry with it).
                writes.push(remaining_write(&self.id, &budget, next));
                return Ok(Taken::Spent {
                    writes,
                    before_micro: 0,
                    after_micro: 0,
                });
            }
        }
        // The lease is short or gone: the shared row, with the lease's remainder back in it.
        let was = row.read(tx, now_ms)?;
        let mut shared = was;
        if let Some(l) = held {
            shared = shared.give_back(limits, l, now_ms);
            self.lease_writes(&budget, None, &mut writes);
        }
        let shared = shared.refilled(limits, now_ms);
        let level = shared.bucket.balance_micro;
        let unspent = |s: Shared| s.bucket.balance_micro.saturating_add(s.leased_micro);
        let known_before = unspent(was.refilled(limits, now_ms));
        let live = self.live.load(Ordering::Relaxed);
        let slice = if live > 1 {
            lease::size(level, live, demand, need)
        } else {
            Slice::Direct
        };
        match slice {
            Slice::Lease(size) => {
                let (next, taken) = shared.take(limits, size.max(need), now_ms);
                if let Some(spent) = taken.spend(credits, now_ms) {
                    self.saw(&budget, next.bucket.balance_micro);
                    row.writes(was, next, &mut writes);
                    self.lease_writes(&budget, Some(spent), &mut writes);
                    return Ok(Taken::Spent {
                        writes,
                        before_micro: known_before,
                        after_micro: unspent(next).saturating_sub(need),
                    });
                }
            }
            Slice::Direct => {}
        }
        match shared.spend(limits, credits, now_ms) {
            Ok(next) => {
                self.saw(&budget, next.bucket.balance_micro);
                row.writes(was, next, &mut writes);
                Ok(Taken::Spent {
                    writes,
                    before_micro: known_before,
                    after_micro: unspent(next),
                })
            }
            Err(shortage) => Ok(Taken::Short {
                available_micro: level.max(0),
                shortage: self.shortage(shortage, shared, need, limits),
            }),
        }
    }

    /// A shortage of the shared row as a refusal says it: credits other holders lease come
    /// back within a lease's life, so a budget short only of those is worth a retry then.
    fn shortage(&self, shortage: Shortage, shared: Shared, need: i64, limits: Limits) -> Shortage {
        if need > limits.capacity_micro || shared.leased_micro <= 0 {
            return shortage;
        }
        match shortage {
            Shortage::RetryAfterMs(ms) => Shortage::RetryAfterMs(ms.min(lease::LIFE_MS as u64)),
            Shortage::NoRefill | Shortage::NeverFits => {
                Shortage::RetryAfterMs(lease::LIFE_MS as u64)
            }
        }
    }

    /// Gives back `credits` of an admission: into this holder's live lease up to what it
    /// was granted, the rest to the shared row.
    pub fn refund(
        &self,
        tx: &mut dyn Tx,
        row: SharedRow,
        credits: u64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let budget = row.budget();
        let limits = row.limits();
        let mut writes = Vec::new();
        let over = match self.lease(tx, &budget)? {
            Some(l) if !l.expired(now_ms) => {
                let (next, over) = l.refund(credits);
                writes.push(remaining_write(&self.id, &budget, next));
                over
            }
            _ => credits_micro(credits),
        };
        if over > 0 {
            let was = row.read(tx, now_ms)?;
            row.writes(was, was.refund_micro(limits, over, now_ms), &mut writes);
        }
        writes.iter().try_for_each(|w| w.apply(tx))
    }

    /// What this holder sees of `row`: its own live lease, and the shared level, read now
    /// while it reserves from the shared rows directly, as last read while it leases.
    pub fn level_micro(
        &self,
        tx: &mut dyn Tx,
        row: SharedRow,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        let budget = row.budget();
        let own = self
            .lease(tx, &budget)?
            .filter(|l| !l.expired(now_ms))
            .map_or(0, |l| l.remaining_micro);
        let shared = if self.leasing() {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.get(&budget).copied().unwrap_or(0)
        } else {
            let level = row.read(tx, now_ms)?.refilled(row.limits(), now_ms);
            level.bucket.balance_micro
        };
        Ok(shared.saturating_add(own))
    }

    /// Rewrites the rows of a batch's hint for this holder: its lease rows beside every
    /// shared budget; the shared rows themselves only while it reserves from them directly
    /// (with other holders live, it reaches a shared row only to renew a lease, and then
    /// takes its lock if it is free).
    pub fn hint(&self, hint: &mut Prefetch) {
        let leasing = self.leasing();
        let mut budgets: Vec<String> = Vec::new();
        hint.buckets.retain(|name| {
            if !is_shared_bucket(name) {
                return true;
            }
            budgets.push(name.clone());
            !leasing
        });
        hint.slots.retain(|scope| {
            if !is_shared_scope(scope) {
                return true;
            }
            budgets.push(slots_budget(scope));
            !leasing
        });
        for budget in budgets {
            hint.buckets.push(lease_row(&self.id, &budget));
            hint.buckets.push(granted_row(&self.id, &budget));
            if !leasing {
                hint.buckets.push(leased_row(&budget));
            }
        }
        hint.buckets.sort();
        hint.buckets.dedup();
    }

    /// The rows [`Holder::keep`] names, so that it runs beside other holders' batches: the
    /// holders' registrations and this holder's own leases.
    pub fn keep_hint(&self, listed: &[String], budgets: &[SharedRow]) -> Prefetch {
        let mut hint = Prefetch {
            meta: vec![HOLDERS_META.to_string()],
            complete: true,
            ..Prefetch::default()
        };
        hint.buckets
            .extend(listed.iter().chain([&self.id]).map(|h| registration_row(h)));
        for row in budgets {
            let budget = row.budget();
            hint.buckets.push(lease_row(&self.id, &budget));
            hint.buckets.push(granted_row(&self.id, &budget));
        }
        hint.buckets.sort();
        hint.buckets.dedup();
        hint
    }

    /// Renews this holder's registration, gives back its own expired leases and those of
    /// holders whose registration lapsed (a dead holder's), and counts the live holders.
    /// Reaches a shared row only to give a lease back to it. Says whether the list of
    /// holders must change (this holder is not on it, or one lapsed long ago), which
    /// [`Holder::relist`] does with the store to itself.
    pub fn keep(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        now_ms: i64,
    ) -> Result<(LeaseKeep, bool), StoreError> {
        let listed = listed_holders(tx)?;
        let lapses = now_ms.saturating_add(HOLDER_LIFE_MS);
        tx.set_bucket(
            &registration_row(&self.id),
            State {
                balance_micro: 0,
                updated_ms: lapses,
            },
        )?;
        let mut live = 1;
        let mut relist = !listed.contains(&self.id);
        let mut sweep = vec![self.id.clone()];
        for holder in listed.iter().filter(|h| **h != self.id) {
            let until = tx
                .bucket(&registration_row(holder))?
                .map_or(0, |r| r.updated_ms);
            if until > now_ms {
                live += 1;
            } else {
                sweep.push(holder.clone());
                relist |= now_ms >= until.saturating_add(FORGET_AFTER_MS);
            }
        }
        let mut returned = 0;
        for row in budgets {
            let budget = row.budget();
            let mut shared: Option<(Shared, Shared)> = None;
            let mut writes = Vec::new();
            for holder in &sweep {
                let Some(l) = read_lease(tx, holder, &budget)? else {
                    continue;
                };
                if !l.expired(now_ms) {
                    continue;
                }
                let (was, current) = match shared {
                    Some(s) => s,
                    None => {
                        let was = row.read(tx, now_ms)?;
                        (was, was)
                    }
                };
                shared = Some((was, current.give_back(row.limits(), l, now_ms)));
                lease_writes(holder, &budget, None, &mut writes);
                returned += 1;
            }
            if let Some((was, s)) = shared {
                self.saw(
                    &budget,
                    s.refilled(row.limits(), now_ms).bucket.balance_micro,
                );
                row.writes(was, s, &mut writes);
            }
            writes.iter().try_for_each(|w| w.apply(tx))?;
        }
        self.live.store(live, Ordering::Relaxed);
        Ok((
            LeaseKeep {
                live_holders: live,
                returned,
            },
            relist,
        ))
    }

    /// Refreshes what this holder's policy is shown of each shared row while it leases.
    pub fn look(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for row in budgets {
            let level = row.read(tx, now_ms)?.refilled(row.limits(), now_ms);
            self.saw(&row.budget(), level.bucket.balance_micro);
        }
        Ok(())
    }

    /// Rewrites the list of holders (with the store to itself): this one on it, and those
    /// lapsed for long, whose leases the sweep has returned, off it.
    pub fn relist(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<(), StoreError> {
        let mut listed = listed_holders(tx)?;
        let mut kept = Vec::with_capacity(listed.len() + 1);
        for holder in listed.drain(..) {
            let until = tx
                .bucket(&registration_row(&holder))?
                .map_or(0, |r| r.updated_ms);
            if holder == self.id || now_ms < until.saturating_add(FORGET_AFTER_MS) {
                kept.push(holder);
            }
        }
        if !kept.contains(&self.id) {
            kept.push(self.id.clone());
        }
        kept.sort();
        tx.set_meta(
            HOLDERS_META,
            &serde_json::to_string(&kept).unwrap_or_default(),
        )
    }

    /// Gives back every lease of this holder and lets its registration lapse now (a holder
    /// that stops): its credits are at once the others'.
    pub fn stop(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for row in budgets {
            let budget = row.budget();
            if let Some(l) = self.lease(tx, &budget)? {
                let mut writes = Vec::new();
                let was = row.read(tx, now_ms)?;
                row.writes(was, was.give_back(row.limits(), l, now_ms), &mut writes);
                self.lease_writes(&budget, None, &mut writes);
                writes.iter().try_for_each(|w| w.apply(tx))?;
            }
        }
        tx.set_bucket(
            &registration_row(&self.id),
            State {
                balance_micro: 0,
                updated_ms: now_ms,
            },
        )?;
        self.live.store(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The holders listed in the store (live or lapsed).
pub(crate) fn listed_holders(tx: &mut dyn Tx) -> Result<Vec<String>, StoreError> {
    Ok(tx
        .meta(HOLDERS_META)?
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default())
}

/// A holder's registration: a bucket row whose `updated_ms` is when it lapses.
fn registration_row(holder: &str) -> String {
    format!("lease.holder:{holder}")
}

/// `holder`'s lease of `budget`, if it holds one.
fn read_lease(tx: &mut dyn Tx, holder: &str, budget: &str) -> Result<Option<Lease>, StoreError> {
    let Some(granted) = tx.bucket(&granted_row(holder, budget))? else {
        return Ok(None);
    };
    if granted.balance_micro <= 0 {
        return Ok(None);
    }
    let left = tx.bucket(&lease_row(holder, budget))?.unwrap_or(State {
        balance_micro: 0,
        updated_ms: 0,
    });
    Ok(Some(Lease {
        granted_micro: granted.balance_micro,
        remaining_micro: left.balance_micro,
        expires_ms: left.updated_ms,
    }))
}

/// The write of what is left of `holder`'s lease of `budget`, and its expiry.
fn remaining_write(holder: &str, budget: &str, lease: Lease) -> RowWrite {
    RowWrite::Bucket(
        lease_row(holder, budget),
        State {
            balance_micro: lease.remaining_micro,
            updated_ms: lease.expires_ms,
        },
    )
}

/// The writes that store `lease` as `holder`'s of `budget` (`None`: it is gone).
fn lease_writes(holder: &str, budget: &str, lease: Option<Lease>, out: &mut Vec<RowWrite>) {
    let l = lease.unwrap_or(Lease {
        granted_micro: 0,
        remaining_micro: 0,
        expires_ms: 0,
    });
    out.push(remaining_write(holder, budget, l));
    out.push(RowWrite::Bucket(
        granted_row(holder, budget),
        State {
            balance_micro: l.granted_micro,
            updated_ms: l.expires_ms,
        },
    ));
}

fn credits_micro(credits: u64) -> i64 {
    i64::try_from(i128::from(credits) * i128::from(MICRO)).unwrap_or(i64::MAX)
}

impl<S: crate::store::Store> super::Engine<S> {
    /// This engine as a holder of leases, once [`Engine::hold_leases`] made it one.
    ///
    /// [`Engine::hold_leases`]: super::Engine::hold_leases
    pub(crate) fn holder(&self) -> Option<&std::sync::Arc<Holder>> {
        self.holder.get()
    }

    /// Makes this engine a holder of leases under `id` (unique among the engines sharing
    /// its store): from the next [`Engine::keep_leases`] that finds another holder live, it
    /// reserves the budgets tenants share through leases (docs/design.md, "Leases for
    /// shared budgets"). For an engine whose store other engines share (replicas on
    /// PostgreSQL); the service does it at start. A second call changes nothing.
    ///
    /// [`Engine::keep_leases`]: super::Engine::keep_leases
    /// [`Engine::hold_leases`]: super::Engine::hold_leases
    pub fn hold_leases(&self, id: &str) {
        let _ = self
            .holder
            .set(std::sync::Arc::new(Holder::new(id.to_string())));
    }

    /// Makes this engine a holder of leases under a random id when its store has a clock of
    /// its own, which is a store other engines may share (PostgreSQL).
    pub(super) fn hold_leases_if_shared(&self) -> Result<(), StoreError> {
        if self.store_clock_ms()?.is_some() {
            let mut bytes = [0u8; 8];
            getrandom::getrandom(&mut bytes)
                .map_err(|e| StoreError::Schema(format!("no random source: {e}")))?;
            self.hold_leases(&crate::runtime::hex(&bytes));
        }
        Ok(())
    }

    /// Holders of leases live at this engine's last renewal, itself included (1 for an
    /// engine that holds none).
    pub fn live_lease_holders(&self) -> u32 {
        self.holder()
            .map_or(1, |h| h.live.load(Ordering::Relaxed).max(1))
    }

    /// The id this engine holds leases under, if it holds them.
    pub fn lease_holder(&self) -> Option<&str> {
        self.holder().map(|h| h.id())
    }

    /// Every budget tenants share in the configuration: the global request bucket, the
    /// models' and the groups' budgets, and the global slots.
    fn shared_budgets(&self) -> (Vec<BucketRef>, SlotRef) {
        use super::budgets::Budgets;
        let config = self.config();
        let mut buckets = vec![Budgets::global_requests(&config)];
        for (model, m) in config.models.iter().flatten() {
            let shared = [
                m.requests.map(|b| (names::model_requests(model), b)),
                m.tokens.map(|b| (names::model_tokens(model), b)),
            ];
            buckets.extend(shared.into_iter().flatten().map(|(name, b)| BucketRef {
                name,
                limits: b.limits(),
            }));
        }
        buckets.extend(Budgets::of_groups(&config));
        (buckets, Budgets::global_slots(&config))
    }

    /// Credits leased out of each shared budget now (whole credits; none listed when no
    /// lease is out), for `inspect`: the shared rows show what is not leased.
    pub(super) fn leased_out(&self, tx: &mut dyn Tx) -> Result<BTreeMap<String, i64>, StoreError> {
        let mut out = BTreeMap::new();
        if self.holder().is_none() {
            return Ok(out);
        }
        let (buckets, slots) = self.shared_budgets();
        let budgets = buckets
            .iter()
            .map(|b| b.name.clone())
            .chain([slots_budget(&slots.scope)]);
        for budget in budgets {
            let n = tx
                .bucket(&leased_row(&budget))?
                .map_or(0, |s| s.balance_micro.max(0) / MICRO);
            if n > 0 {
                out.insert(budget, n);
            }
        }
        Ok(out)
    }

    /// Renews this holder's registration, gives back expired leases (its own, and a dead
    /// holder's) and counts the live holders, at `now_ms` (the store's clock): one
    /// transaction beside other holders' batches (and, when a holder joins or is forgotten,
    /// one with the store to itself), run by housekeeping about twice a second. `None` for
    /// an engine that holds no leases.
    ///
    /// # Errors
    /// The store's failure (nothing of it was written).
    pub fn keep_leases(&self, now_ms: i64) -> Result<Option<LeaseKeep>, StoreError> {
        let Some(holder) = self.holder().cloned() else {
            return Ok(None);
        };
        let (buckets, slots) = self.shared_budgets();
        let rows: Vec<SharedRow> = buckets
            .iter()
            .map(SharedRow::Bucket)
            .chain([SharedRow::Slots(&slots)])
            .collect();
        let listed = self.read(listed_holders)?;
        let hint = holder.keep_hint(&listed, &rows);
        let (kept, relist) = self.named(&hint, |tx| holder.keep(tx, &rows, now_ms))?;
        if relist {
            self.transaction(|tx| holder.relist(tx, now_ms))?;
        }
        if holder.leasing() {
            // What the policy is shown of the shared rows, read without their locks' wait:
            // a batch of its own that names them, at most twice a second.
            let look = Prefetch {
                buckets: buckets
                    .iter()
                    .map(|b| b.name.clone())
                    .chain(rows.iter().map(|r| leased_row(&r.budget())))
                    .collect(),
                slots: vec![slots.scope.clone()],
                complete: true,
                ..Prefetch::default()
            };
            self.named(&look, |tx| holder.look(tx, &rows, now_ms))?;
        }
        Ok(Some(kept))
    }

    /// Gives back every lease this engine holds and takes it off the holders' list (a
    /// replica that stops), at `now_ms` (the store's clock).
    ///
    /// # Errors
    /// The store's failure (nothing of it was written; the leases expire on their own).
    pub fn stop_leases(&self, now_ms: i64) -> Result<(), StoreError> {
        let Some(holder) = self.holder().cloned() else {
            return Ok(());
        };
        let (buckets, slots) = self.shared_budgets();
        let rows: Vec<SharedRow> = buckets
            .iter()
            .map(SharedRow::Bucket)
            .chain([SharedRow::Slots(&slots)])
            .collect();
        self.transaction(|tx| holder.stop(tx, &rows, now_ms))
    }
}
