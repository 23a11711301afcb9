//! How leases are stored: the rows of a shared budget, a holder's lease of it and a
//! holder's registration, all bucket rows (and the list of holders in `meta`), so that the
//! stores' row locks, prefetch and write-back serve them as they serve tenants' rows.

use super::HOLDERS_META;
use crate::bucket::{Limits, State, MICRO};
use crate::engine::budgets::{BucketRef, SlotRef};
use crate::lease::{Lease, Shared};
use crate::store::{StoreError, Tx};

pub(crate) fn slots_budget(scope: &str) -> String {
    format!("slots:{scope}")
}

pub(super) fn lease_row(holder: &str, budget: &str) -> String {
    format!("lease:{holder}:{budget}")
}

pub(super) fn granted_row(holder: &str, budget: &str) -> String {
    format!("lease.granted:{holder}:{budget}")
}

pub(super) fn leased_row(budget: &str) -> String {
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
    pub(super) fn budget(&self) -> String {
        match self {
            SharedRow::Bucket(b) => b.name.clone(),
            SharedRow::Slots(s) => slots_budget(&s.scope),
        }
    }

    /// The budget's limits: a slot count is a budget of its limit that never refills.
    pub(super) fn limits(&self) -> Limits {
        match self {
            SharedRow::Bucket(b) => b.limits,
            SharedRow::Slots(s) => Limits {
                capacity_micro: i64::from(s.limit) * MICRO,
                refill_milli_per_s: 0,
                period: None,
            },
        }
    }

    /// The shared row and the credits leased out of it, both reached in one go (a batch
    /// that did not name them locks them only if free at once).
    pub(super) fn read(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<Shared, StoreError> {
        let mut hint = crate::store::Prefetch {
            buckets: vec![leased_row(&self.budget())],
            ..crate::store::Prefetch::default()
        };
        match self {
            SharedRow::Bucket(b) => hint.buckets.push(b.name.clone()),
            SharedRow::Slots(s) => hint.slots.push(s.scope.clone()),
        }
        tx.reach(&hint)?;
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
    pub(super) fn writes(&self, was: Shared, shared: Shared, out: &mut Vec<RowWrite>) {
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

/// The holders listed in the store (live or lapsed).
pub(super) fn listed_holders(tx: &mut dyn Tx) -> Result<Vec<String>, StoreError> {
    Ok(tx
        .meta(HOLDERS_META)?
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default())
}

/// A holder's registration: a bucket row whose `updated_ms` is when it lapses.
pub(super) fn registration_row(holder: &str) -> String {
    format!("lease.holder:{holder}")
}

/// `holder`'s lease of `budget`, if it holds one.
pub(super) fn read_lease(
    tx: &mut dyn Tx,
    holder: &str,
    budget: &str,
) -> Result<Option<Lease>, StoreError> {
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
pub(super) fn remaining_write(holder: &str, budget: &str, lease: Lease) -> RowWrite {
    RowWrite::Bucket(
        lease_row(holder, budget),
        State {
            balance_micro: lease.remaining_micro,
            updated_ms: lease.expires_ms,
        },
    )
}

/// The writes that store `lease` as `holder`'s of `budget` (`None`: it is gone).
pub(super) fn lease_writes(
    holder: &str,
    budget: &str,
    lease: Option<Lease>,
    out: &mut Vec<RowWrite>,
) {
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

pub(super) fn credits_micro(credits: u64) -> i64 {
    i64::try_from(i128::from(credits) * i128::from(MICRO)).unwrap_or(i64::MAX)
}
