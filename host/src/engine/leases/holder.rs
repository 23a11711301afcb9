//! A holder's reservations through its leases: taking credits (from its lease, else from
//! the shared row with a new lease sized to its demand), refunds and releases, what its
//! policy is shown, and the rows its batches name.

use super::rows::{
    credits_micro, granted_row, lease_row, lease_writes, leased_row, read_lease, remaining_write,
    slots_budget, RowWrite, SharedRow,
};
use super::{is_shared_bucket, is_shared_scope};
use crate::bucket::{self, Limits, Shortage};
use crate::lease::{self, Lease, Shared, Slice};
use crate::store::{Prefetch, StoreError, Tx};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

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

/// What a holder took in the current and the last second: credits of one budget, or its
/// reservations from every shared budget.
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

/// A holder's meters.
#[derive(Default)]
struct Meters {
    /// Credits taken from each budget.
    by_budget: HashMap<String, Meter>,
    /// Reservations from shared budgets, one per budget per admission (see
    /// [`lease::LEASE_FROM_RESERVATIONS`]).
    reservations: Meter,
}

/// One engine as a holder of leases on the budgets it shares with other engines.
pub(crate) struct Holder {
    pub(super) id: String,
    /// Live holders at the last renewal (this one included); 1 until another registers.
    pub(super) live: AtomicU32,
    meters: Mutex<Meters>,
    /// Each shared row's level (micro-credits) when this holder last read it: what its
    /// policy is shown while it leases, so that showing it takes no shared row's lock. Also
    /// each deployment's pause (when it ends) and failure counts, read the same way.
    seen: Mutex<HashMap<String, i64>>,
    /// What providers last said is left of a deployment's requests or tokens, in the
    /// answers to this holder's own calls: kept here while it leases, so that learning it
    /// takes no shared row's lock (each holder hears the provider's count of every holder's
    /// calls in its own answers).
    said: Mutex<HashMap<String, bucket::State>>,
}

impl Holder {
    pub fn new(id: String) -> Self {
        Holder {
            id,
            live: AtomicU32::new(1),
            meters: Mutex::new(Meters::default()),
            seen: Mutex::new(HashMap::new()),
            said: Mutex::new(HashMap::new()),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether reservations go through leases now: only while other holders are live.
    pub fn leasing(&self) -> bool {
        self.live.load(Ordering::Relaxed) > 1
    }

    pub(super) fn lease(&self, tx: &mut dyn Tx, budget: &str) -> Result<Option<Lease>, StoreError> {
        read_lease(tx, &self.id, budget)
    }

    pub(super) fn lease_writes(&self, budget: &str, lease: Option<Lease>, out: &mut Vec<RowWrite>) {
        lease_writes(&self.id, budget, lease, out)
    }

    pub fn saw(&self, budget: &str, level_micro: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(budget) {
            Some(level) => *level = level_micro,
            None => {
                seen.insert(budget.to_string(), level_micro);
            }
        }
    }

    /// What this holder last saw of row `key` (a level, a time or a count), if it read it.
    pub fn seen(&self, key: &str) -> Option<i64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(key).copied()
    }

    /// Records what a provider said is left of bucket `name` (of `limits`), lowered to
    /// `said` until `updated_ms`; a word already lower stays.
    pub fn heard(&self, name: &str, limits: Limits, said: bucket::State, now_ms: i64) {
        let mut words = self.said.lock().unwrap_or_else(|e| e.into_inner());
        let lower = match words.get(name) {
            Some(s) => s.refilled(limits, now_ms).balance_micro > said.balance_micro,
            None => true,
        };
        if lower {
            words.insert(name.to_string(), said);
        }
    }

    /// What the provider's last word leaves of bucket `name` now (`None`: none heard, or
    /// it has refilled whole).
    pub fn said_level(&self, name: &str, limits: Limits, now_ms: i64) -> Option<bucket::State> {
        let mut words = self.said.lock().unwrap_or_else(|e| e.into_inner());
        let level = words.get(name)?.refilled(limits, now_ms);
        if level.balance_micro >= limits.capacity_micro {
            words.remove(name);
            return None;
        }
        Some(level)
    }

    /// Counts `credits` sent against the provider's last word on bucket `name`.
    pub fn spend_said(&self, name: &str, limits: Limits, credits: u64, now_ms: i64) {
        let mut words = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = words.get_mut(name) {
            let level = s.refilled(limits, now_ms);
            *s = bucket::State {
                balance_micro: level
                    .balance_micro
                    .saturating_sub(credits_micro(credits))
                    .max(0),
                ..level
            };
        }
    }

    /// Names in `hint` the rows a reservation from `row` through this holder reaches: its
    /// lease, and the shared row with what is leased of it only while it reserves from
    /// them directly.
    pub fn hint_budget(&self, row: SharedRow, hint: &mut Prefetch) {
        let budget = row.budget();
        hint.buckets.push(lease_row(&self.id, &budget));
        hint.buckets.push(granted_row(&self.id, &budget));
        if !self.leasing() {
            hint.buckets.push(leased_row(&budget));
            match row {
                SharedRow::Bucket(b) => hint.buckets.push(b.name.clone()),
                SharedRow::Slots(s) => hint.slots.push(s.scope.clone()),
            }
        }
    }

    /// Counts a reservation of `micro` from `budget`: the demand for that budget, and
    /// whether this holder is busy enough to lease ([`lease::worth_leasing`]).
    fn demand(&self, budget: &str, micro: i64, now_ms: i64) -> (i64, bool) {
        let mut meters = self.meters.lock().unwrap_or_else(|e| e.into_inner());
        meters.reservations.add(1, now_ms);
        let busy = lease::worth_leasing(meters.reservations.demand());
        let demand = match meters.by_budget.get_mut(budget) {
            Some(meter) => {
                meter.add(micro, now_ms);
                meter.demand()
            }
            None => {
                let mut meter = Meter::default();
                meter.add(micro, now_ms);
                meters.by_budget.insert(budget.to_string(), meter);
                meter.demand()
            }
        };
        (demand, busy)
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
        let (demand, busy) = self.demand(&budget, need, now_ms);
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
        let slice = if live > 1 && busy {
            lease::size(level, live, demand, need)
        } else {
            Slice::Direct
        };
        match slice {
            Slice::Lease(size) => {
                // A slot count is kept in whole slots: a lease of a part of one would
                // strand that part when it came back.
                let size = match row {
                    SharedRow::Slots(_) => size - size.rem_euclid(crate::bucket::MICRO),
                    SharedRow::Bucket(_) => size,
                };
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
}
