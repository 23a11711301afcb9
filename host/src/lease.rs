//! Leases: slices of a shared budget (a bucket every tenant shares, or a slot count) that a
//! holder (a replica, or a writer's shard) admits against without touching the shared row
//! (docs/design.md, "Leases for shared budgets"). Pure arithmetic of the stored rows and the
//! time, as [`crate::bucket`] is; the stores keep the rows.
//!
//! What holds, whatever the holders do or however they die: a lease only moves credits out
//! of the shared row, and a refund or a return puts back at most what was taken. The shared
//! row refills only up to its capacity less what is leased out, so its balance plus every
//! lease's remainder never exceeds the capacity, and what all holders admit together never
//! exceeds what the budget supplied (its capacity, plus its refill over the time).

use crate::bucket::{Limits, Shortage, State};

/// How long a lease lives past its last use, in milliseconds of the store's clock.
pub const LIFE_MS: i64 = 2_000;

/// A holder leases only once it reserves from shared budgets at least this many times a
/// second (every budget an admission names counts once): a holder that seldom reserves
/// locks the shared rows seldom, so it reserves from them directly, which is exact at once
/// (a lease's spent credits refill only once the lease is back). A busy holder leases every
/// shared budget, the seldom used ones too, so that its batches lock no shared row.
pub const LEASE_FROM_RESERVATIONS: i64 = 16;

/// Whether a holder that reserves `per_s` times a second should lease: see
/// [`LEASE_FROM_RESERVATIONS`].
pub fn worth_leasing(per_s: i64) -> bool {
    per_s >= LEASE_FROM_RESERVATIONS
}

/// A shared budget's row: its bucket, and the credits granted to leases that have not been
/// given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    /// The balance not leased out.
    pub bucket: State,
    /// The sum of the live leases' `granted_micro`.
    pub leased_micro: i64,
}

/// One holder's slice of one shared budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Micro-credits moved out of the shared row into this lease.
    pub granted_micro: i64,
    /// What is left of them.
    pub remaining_micro: i64,
    /// When it goes back to the shared row unless used again.
    pub expires_ms: i64,
}

/// How a holder reserves from a shared budget now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slice {
    /// Take a lease of this many micro-credits.
    Lease(i64),
    /// The budget is too low to share out: reserve from the shared row, as without leases.
    Direct,
}

/// The slice for a holder whose demand until its next renewal is `demand_micro`, when `live`
/// holders share a row holding `level_micro`; `unit_micro` is one admission's worth. A slice
/// is at most the level over twice the live holders, so every holder with demand gets one
/// and a low budget is not stranded in one lease; below one unit per share, holders reserve
/// from the row directly (slower, exact, first come first served).
pub fn size(level_micro: i64, live: u32, demand_micro: i64, unit_micro: i64) -> Slice {
    let share = level_micro.max(0) / (2 * i64::from(live.max(1)));
    let unit = unit_micro.max(1);
    if share < unit {
        return Slice::Direct;
    }
    Slice::Lease(demand_micro.max(unit).min(share))
}

impl Shared {
    /// A shared budget nobody leases from yet.
    pub fn new(bucket: State) -> Self {
        Shared {
            bucket,
            leased_micro: 0,
        }
    }

    /// The row refilled to `now_ms`: a refill, and a period's reset, fill it up to its
    /// capacity less what is leased out; a row that does not refill keeps what it holds.
    pub fn refilled(self, limits: Limits, now_ms: i64) -> Self {
        let unleased = self.unleased(limits);
        let bucket = if limits.refill_milli_per_s > 0 {
            self.bucket.refilled(unleased, now_ms)
        } else {
            let next = self.bucket.refilled(limits, now_ms);
            let reset = now_ms > self.bucket.updated_ms
                && limits
                    .resets_at(self.bucket.updated_ms)
                    .is_some_and(|at| now_ms >= at);
            State {
                balance_micro: if reset {
                    unleased.capacity_micro
                } else {
                    next.balance_micro
                },
                ..next
            }
        };
        Shared { bucket, ..self }
    }

    /// Moves up to `size_micro` into a new lease expiring [`LIFE_MS`] after `now_ms`: at
    /// most what the row holds after its refill.
    pub fn take(self, limits: Limits, size_micro: i64, now_ms: i64) -> (Self, Lease) {
        let row = self.refilled(limits, now_ms);
        let moved = size_micro.clamp(0, row.bucket.balance_micro.max(0));
        let shared = Shared {
            bucket: State {
                balance_micro: row.bucket.balance_micro - moved,
                ..row.bucket
            },
            leased_micro: row.leased_micro + moved,
        };
        let lease = Lease {
            granted_micro: moved,
            remaining_micro: moved,
            expires_ms: now_ms.saturating_add(LIFE_MS),
        };
        (shared, lease)
    }

    /// Takes `credits` from the row itself (a [`Slice::Direct`] admission).
    pub fn spend(self, limits: Limits, credits: u64, now_ms: i64) -> Result<Self, Shortage> {
        let row = self.refilled(limits, now_ms);
        Ok(Shared {
            bucket: row.bucket.spend(row.unleased(limits), credits)?,
            ..row
        })
    }

    /// Puts `lease`'s remainder back (a holder's renewal or stop, or the sweep of an expired
    /// lease): the lease is gone after this.
    pub fn give_back(self, limits: Limits, lease: Lease, now_ms: i64) -> Self {
        let row = self.refilled(limits, now_ms);
        let shared = Shared {
            leased_micro: (row.leased_micro - lease.granted_micro).max(0),
            ..row
        };
        shared.add(limits, lease.remaining_micro)
    }

    /// Gives back `credits` of an admission that no lease of the refunding holder takes.
    pub fn refund(self, limits: Limits, credits: u64, now_ms: i64) -> Self {
        self.refilled(limits, now_ms)
            .add(limits, credits_micro(credits))
    }

    /// As [`Shared::refund`], of micro-credits (what a lease could not take back).
    pub fn refund_micro(self, limits: Limits, micro: i64, now_ms: i64) -> Self {
        self.refilled(limits, now_ms).add(limits, micro.max(0))
    }

    /// Adds `micro` to the row. A refilling row is capped at its capacity less what is leased
    /// out, so that a burst never finds more than the capacity in the row and the leases
    /// together; a row that never refills (a hard or a period budget) is capped at its
    /// capacity, so that a refund is never lost: what it returns was taken from the budget,
    /// and the row, the leases and the admissions together never hold more than it.
    fn add(self, limits: Limits, micro: i64) -> Self {
        let cap = if limits.refill_milli_per_s > 0 {
            self.unleased(limits).capacity_micro
        } else {
            limits.capacity_micro
        };
        Shared {
            bucket: State {
                balance_micro: self.bucket.balance_micro.saturating_add(micro).min(cap),
                ..self.bucket
            },
            ..self
        }
    }

    /// The limits the row itself keeps to: capacity less what is leased out.
    fn unleased(self, limits: Limits) -> Limits {
        Limits {
            capacity_micro: (limits.capacity_micro - self.leased_micro).max(0),
            ..limits
        }
    }
}

impl Lease {
    /// Whether the lease is past its life at `now_ms` (then only the sweep may touch it).
    pub fn expired(&self, now_ms: i64) -> bool {
        now_ms >= self.expires_ms
    }

    /// Takes `credits` for an admission, and lives [`LIFE_MS`] from `now_ms`; `None` when it
    /// lacks them or has expired.
    pub fn spend(self, credits: u64, now_ms: i64) -> Option<Lease> {
        let need = credits_micro(credits);
        if self.expired(now_ms) || need > self.remaining_micro {
            return None;
        }
        Some(Lease {
            remaining_micro: self.remaining_micro - need,
            expires_ms: now_ms.saturating_add(LIFE_MS),
            ..self
        })
    }

    /// A refund of `credits` that the lease's holder received, whichever of its leases (or
    /// the row) the admission was made from: what fits under `granted_micro` goes back into
    /// this lease; the rest (micro-credits) is for the shared row. An admission need not
    /// remember its lease, and a holder's refunds mostly stay off the shared row.
    pub fn refund(self, credits: u64) -> (Lease, i64) {
        let back = credits_micro(credits);
        let room = self.granted_micro - self.remaining_micro;
        let into = back.min(room).max(0);
        let lease = Lease {
            remaining_micro: self.remaining_micro + into,
            ..self
        };
        (lease, back - into)
    }
}

fn credits_micro(credits: u64) -> i64 {
    i64::try_from(i128::from(credits) * i128::from(crate::bucket::MICRO)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::MICRO;
    use proptest::prelude::*;

    #[test]
    fn slices_shrink_with_the_level_and_go_direct_below_a_unit_per_share() {
        let unit = MICRO;
        assert_eq!(
            size(1_000 * unit, 4, 10 * unit, unit),
            Slice::Lease(10 * unit)
        );
        assert_eq!(
            size(1_000 * unit, 4, 500 * unit, unit),
            Slice::Lease(125 * unit)
        );
        // No demand seen yet: one admission's worth.
        assert_eq!(size(1_000 * unit, 4, 0, unit), Slice::Lease(unit));
        assert_eq!(size(8 * unit, 4, 10 * unit, unit), Slice::Lease(unit));
        assert_eq!(size(7 * unit, 4, 10 * unit, unit), Slice::Direct);
        assert_eq!(size(-5, 0, 10, 0), Slice::Direct);
        assert!(!worth_leasing(15));
        assert!(worth_leasing(16));
    }

    #[test]
    fn a_refilling_row_leaves_room_for_what_is_leased_out() {
        let limits = Limits::from_credits(10.0, 1.0);
        let shared = Shared::new(State::full(limits, 0));
        let (shared, lease) = shared.take(limits, 4 * MICRO, 0);
        assert_eq!(
            (shared.bucket.balance_micro, lease.remaining_micro),
            (6 * MICRO, 4 * MICRO)
        );
        // A minute of refill fills the row to 6, not 10: the lease holds the other 4.
        let later = shared.refilled(limits, 60_000);
        assert_eq!(later.bucket.balance_micro, 6 * MICRO);
        let lease = lease.spend(3, 100).unwrap();
        let back = later.give_back(limits, lease, 60_000);
        assert_eq!(
            (back.bucket.balance_micro, back.leased_micro),
            (7 * MICRO, 0)
        );
        // An expired lease admits nothing.
        assert_eq!(lease.spend(1, lease.expires_ms), None);
        // A refund fills the lease up to what it was granted; the rest is the row's.
        let (lease, rest) = lease.refund(5);
        assert_eq!((lease.remaining_micro, rest), (4 * MICRO, 2 * MICRO));
    }

    #[test]
    fn a_period_row_resets_to_what_is_not_leased_and_a_hard_row_keeps_every_refund() {
        let hour = crate::calendar::Calendar::new(crate::calendar::Period::Hour, "UTC").unwrap();
        let limits = Limits::per_period(10.0, hour);
        let (shared, lease) = Shared::new(State::full(limits, 0)).take(limits, 4 * MICRO, 0);
        let spent = shared.spend(limits, 6, 1_000).unwrap();
        assert_eq!(spent.bucket.balance_micro, 0);
        // The next hour: the row is full less the lease still out.
        let next = spent.refilled(limits, 3_600_000);
        assert_eq!(next.bucket.balance_micro, 6 * MICRO);
        let back = next.give_back(limits, lease, 3_600_000);
        assert_eq!(
            (back.bucket.balance_micro, back.leased_micro),
            (10 * MICRO, 0)
        );
        // A hard budget: a refund reaches the row whole while a lease is out.
        let hard = Limits::from_credits(10.0, 0.0);
        let (shared, _lease) = Shared::new(State::full(hard, 0)).take(hard, 4 * MICRO, 0);
        let shared = shared.spend(hard, 6, 0).unwrap().refund(hard, 6, 5_000);
        assert_eq!(shared.bucket.balance_micro, 6 * MICRO);
    }

    /// What one step of the property test does.
    #[derive(Clone, Debug)]
    enum Step {
        /// A holder admits a call of this many credits.
        Admit(u8),
        /// One of the outstanding admissions (by index, modulo) gets its credits back,
        /// through the step's holder (not always the one that admitted it).
        Refund(usize),
        /// A holder stops cleanly: its lease goes back.
        Stop,
        /// A holder dies: its lease stays in the store until a sweep finds it expired.
        Die,
        /// Any holder sweeps the expired leases.
        Sweep,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1u8..6).prop_map(Step::Admit),
            2 => any::<usize>().prop_map(Step::Refund),
            1 => Just(Step::Stop),
            1 => Just(Step::Die),
            1 => Just(Step::Sweep),
        ]
    }

    /// Where an outstanding admission's credits came from.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum From {
        Lease(usize),
        Direct,
    }

    /// The store as the holders share it: the row, and every lease row by id with its holder.
    struct World {
        limits: Limits,
        shared: Shared,
        leases: Vec<Option<(usize, Lease)>>,
        /// Each live holder's current lease id (`None` for a dead holder's slot: it restarts
        /// with no lease), and whether it is alive.
        holders: Vec<(bool, Option<usize>)>,
        /// Admissions not refunded: credits and where they came from.
        outstanding: Vec<(u64, From)>,
        admitted: u64,
        refunded: u64,
    }

    impl World {
        fn live(&self) -> u32 {
            self.holders.iter().filter(|h| h.0).count() as u32
        }

        fn lease_of(&self, holder: usize) -> Option<(usize, Lease)> {
            let id = self.holders[holder].1?;
            self.leases[id].map(|(_, l)| (id, l))
        }

        /// The holder admits `credits` at `now`: from its lease, else a new lease sized by
        /// [`size`], else directly. Whether it was admitted.
        fn admit(&mut self, holder: usize, credits: u64, now: i64) -> bool {
            self.holders[holder].0 = true;
            if let Some((id, lease)) = self.lease_of(holder) {
                if let Some(l) = lease.spend(credits, now) {
                    self.leases[id] = Some((holder, l));
                    self.outstanding.push((credits, From::Lease(id)));
                    self.admitted += credits;
                    return true;
                }
                // Renewal: what is left goes back in the same transaction as the new slice.
                self.shared = self.shared.give_back(self.limits, lease, now);
                self.leases[id] = None;
                self.holders[holder].1 = None;
            }
            let level = self.shared.refilled(self.limits, now).bucket.balance_micro;
            let unit = credits_micro(credits);
            match size(level, self.live(), 4 * unit, unit) {
                Slice::Lease(n) => {
                    let (shared, lease) = self.shared.take(self.limits, n, now);
                    self.shared = shared;
                    let id = self.leases.len();
                    self.holders[holder].1 = Some(id);
                    match lease.spend(credits, now) {
                        Some(l) => {
                            self.leases.push(Some((holder, l)));
                            self.outstanding.push((credits, From::Lease(id)));
                            self.admitted += credits;
                            true
                        }
                        None => {
                            self.leases.push(Some((holder, lease)));
                            false
                        }
                    }
                }
                Slice::Direct => match self.shared.spend(self.limits, credits, now) {
                    Ok(s) => {
                        self.shared = s;
                        self.outstanding.push((credits, From::Direct));
                        self.admitted += credits;
                        true
                    }
                    Err(_) => false,
                },
            }
        }

        fn refund(&mut self, holder: usize, index: usize, now: i64) {
            if self.outstanding.is_empty() {
                return;
            }
            let (credits, _) = self.outstanding.swap_remove(index % self.outstanding.len());
            self.refunded += credits;
            match self.lease_of(holder) {
                // Into the refunding holder's lease, expired or not (its row is still there).
                Some((id, lease)) => {
                    let (lease, rest) = lease.refund(credits);
                    self.leases[id] = Some((holder, lease));
                    let shared = self.shared.refilled(self.limits, now);
                    self.shared = shared.add(self.limits, rest);
                }
                None => self.shared = self.shared.refund(self.limits, credits, now),
            }
        }

        fn stop(&mut self, holder: usize, now: i64) {
            if let Some((id, lease)) = self.lease_of(holder) {
                self.shared = self.shared.give_back(self.limits, lease, now);
                self.leases[id] = None;
            }
            self.holders[holder] = (false, None);
        }

        fn die(&mut self, holder: usize) {
            self.holders[holder] = (false, None);
        }

        fn sweep(&mut self, now: i64) {
            for id in 0..self.leases.len() {
                if let Some((_, lease)) = self.leases[id] {
                    if lease.expired(now) {
                        self.shared = self.shared.give_back(self.limits, lease, now);
                        self.leases[id] = None;
                        for h in &mut self.holders {
                            if h.1 == Some(id) {
                                h.1 = None;
                            }
                        }
                    }
                }
            }
        }

        fn leased_remaining(&self) -> i64 {
            self.leases
                .iter()
                .flatten()
                .map(|(_, l)| l.remaining_micro)
                .sum()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn holders_never_admit_more_than_the_budget_and_every_lease_comes_back(
            capacity in 0u32..120,
            refill in prop_oneof![Just(0.0), 0.5f64..20.0],
            holders in 1usize..6,
            steps in proptest::collection::vec((0i64..1_500, 0usize..6, step()), 1..150),
        ) {
            let limits = Limits::from_credits(f64::from(capacity), refill);
            let mut w = World {
                limits,
                shared: Shared::new(State::full(limits, 0)),
                leases: Vec::new(),
                holders: vec![(true, None); holders],
                outstanding: Vec::new(),
                admitted: 0,
                refunded: 0,
            };
            let mut now = 0i64;
            for (advance, who, step) in steps {
                now += advance;
                let holder = who % holders;
                match step {
                    Step::Admit(c) => { w.admit(holder, u64::from(c), now); }
                    Step::Refund(i) => w.refund(holder, i, now),
                    Step::Stop => w.stop(holder, now),
                    Step::Die => w.die(holder),
                    Step::Sweep => w.sweep(now),
                }
                // Never more than the budget: what is admitted and not refunded never
                // exceeds what it supplied (its capacity and its refill so far), and a
                // refilling row and its leases hold no more than its capacity (a burst).
                let row = w.shared.refilled(limits, now);
                prop_assert!(row.bucket.balance_micro <= limits.capacity_micro);
                prop_assert!(w.leased_remaining() <= row.leased_micro);
                if refill > 0.0 {
                    // As stored, before the next refill would clip it.
                    prop_assert!(
                        w.shared.bucket.balance_micro + w.shared.leased_micro
                            <= limits.capacity_micro
                    );
                }
                let supplied = i128::from(limits.capacity_micro)
                    + i128::from(limits.refill_milli_per_s) * i128::from(now);
                let held = i128::from(w.admitted - w.refunded) * i128::from(MICRO);
                prop_assert!(held <= supplied, "{held} > {supplied}");
                if refill == 0.0 {
                    // A hard budget loses nothing either: every credit is in the row, in a
                    // lease or in an admission.
                    prop_assert_eq!(
                        i128::from(row.bucket.balance_micro + w.leased_remaining()) + held,
                        i128::from(limits.capacity_micro)
                    );
                }
            }
            // Every lease, a dead holder's included, is back one life after its last use.
            now += LIFE_MS;
            w.sweep(now);
            prop_assert!(w.leases.iter().all(Option::is_none));
            let row = w.shared.refilled(limits, now);
            prop_assert_eq!(row.leased_micro, 0);
            if refill == 0.0 {
                let held = i64::try_from(w.admitted - w.refunded).unwrap() * MICRO;
                prop_assert_eq!(row.bucket.balance_micro + held, limits.capacity_micro);
            }
            // No holder with demand starves: whatever the budget still holds, each of them
            // in turn can admit a call of one credit.
            for holder in 0..holders {
                let level = w.shared.refilled(limits, now).bucket.balance_micro;
                prop_assert_eq!(w.admit(holder, 1, now), level >= MICRO, "holder {}", holder);
            }
        }
    }
}
