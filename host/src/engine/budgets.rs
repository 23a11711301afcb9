//! The budgets one reservation touches, checked together and spent together.

use crate::bucket::{self, Limits, Shortage};
use crate::config::{Config, TenantConfig};
use crate::model::names;
use crate::reason::Reason;
use crate::runtime::{BucketLevel, SlotLevel};
use crate::store::{StoreError, Tx};

/// A named bucket and its configured limits.
pub(crate) struct BucketRef {
    pub name: String,
    pub limits: Limits,
}

impl BucketRef {
    /// The bucket refilled to `now_ms` (every bucket starts full).
    pub fn level(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<bucket::State, StoreError> {
        Ok(match tx.bucket(&self.name)? {
            Some(s) => s.refilled(self.limits, now_ms),
            None => bucket::State::full(self.limits, now_ms),
        })
    }

    pub fn bucket_level(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<BucketLevel, StoreError> {
        let s = self.level(tx, now_ms)?;
        Ok(BucketLevel {
            available: s.whole_credits().max(0) as u64,
            capacity: (self.limits.capacity_micro / bucket::MICRO) as u64,
            refill_per_s: self.limits.refill_milli_per_s as f64 / 1000.0,
        })
    }

    /// Whether `credits` can never fit this bucket, however long one waits.
    pub fn never_fits(&self, credits: u64) -> bool {
        i128::from(credits) * i128::from(bucket::MICRO) > i128::from(self.limits.capacity_micro)
    }

    /// Returns unused credits, never above capacity.
    pub fn refund(&self, tx: &mut dyn Tx, credits: u64, now_ms: i64) -> Result<(), StoreError> {
        let s = self.level(tx, now_ms)?.refund(self.limits, credits);
        tx.set_bucket(&self.name, s)
    }
}

/// A concurrency scope and its limit.
pub(crate) struct SlotRef {
    pub scope: String,
    pub limit: u32,
}

impl SlotRef {
    pub fn level(&self, tx: &mut dyn Tx) -> Result<SlotLevel, StoreError> {
        Ok(SlotLevel {
            in_use: tx.slots_in_use(&self.scope)?,
            limit: self.limit,
        })
    }
}

/// Releases one slot of `scope`. Callers release only what an operation records as held,
/// and clear that record in the same transaction, so a slot is never released twice.
pub(crate) fn release_slot(tx: &mut dyn Tx, scope: &str) -> Result<(), StoreError> {
    let n = tx.slots_in_use(scope)?;
    tx.set_slots_in_use(scope, n.saturating_sub(1))
}

/// A refusal: a bounded reason and, when waiting can cure it, how long to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub reason: Reason,
    pub retry_after_ms: Option<u64>,
}

/// What one reservation needs.
pub(crate) struct Needs {
    /// One credit from the tenant and the global request buckets.
    pub requests: bool,
    /// Tokens from the tenant token bucket.
    pub tokens: u64,
    /// A global slot, and a tenant slot when the tenant has a limit.
    pub slots: bool,
    /// The retry-after for slot refusals (the policy's estimate).
    pub busy_retry_after_ms: Option<u64>,
}

/// A checked reservation, not yet written: [`Reservation::apply`] spends it.
pub(crate) struct Reservation {
    spends: Vec<(String, bucket::State)>,
    tenant_slot: Option<(String, u32)>,
    global_slot: Option<(String, u32)>,
}

/// Slots a reservation took.
pub(crate) struct Taken {
    pub global_slot: bool,
    pub tenant_slot: bool,
}

impl Reservation {
    /// Writes every spend of the reservation (in the caller's transaction).
    pub fn apply(self, tx: &mut dyn Tx) -> Result<Taken, StoreError> {
        for (name, state) in &self.spends {
            tx.set_bucket(name, *state)?;
        }
        for (scope, in_use) in self.tenant_slot.iter().chain(self.global_slot.iter()) {
            tx.set_slots_in_use(scope, in_use + 1)?;
        }
        Ok(Taken {
            global_slot: self.global_slot.is_some(),
            tenant_slot: self.tenant_slot.is_some(),
        })
    }
}

/// Every budget of one tenant.
pub(crate) struct Budgets {
    pub tenant_requests: BucketRef,
    pub global_requests: BucketRef,
    pub tenant_tokens: BucketRef,
    pub tenant_slots: Option<SlotRef>,
    pub global_slots: SlotRef,
}

impl Budgets {
    pub fn global_requests(config: &Config) -> BucketRef {
        BucketRef {
            name: names::GLOBAL_REQUESTS.into(),
            limits: config.global_requests.limits(),
        }
    }

    pub fn tenant_requests(name: &str, t: &TenantConfig) -> BucketRef {
        BucketRef {
            name: names::tenant_requests(name),
            limits: t.requests.limits(),
        }
    }

    pub fn tenant_tokens(name: &str, t: &TenantConfig) -> BucketRef {
        BucketRef {
            name: names::tenant_tokens(name),
            limits: t.tokens.limits(),
        }
    }

    pub fn for_tenant(config: &Config, name: &str, t: &TenantConfig) -> Self {
        Budgets {
            tenant_requests: Self::tenant_requests(name, t),
            global_requests: Self::global_requests(config),
            tenant_tokens: Self::tenant_tokens(name, t),
            tenant_slots: t.concurrency.map(|limit| SlotRef {
                scope: names::tenant_slots(name),
                limit,
            }),
            global_slots: SlotRef {
                scope: names::GLOBAL_SLOTS.into(),
                limit: config.global_concurrency,
            },
        }
    }

    /// Checks every budget `needs` names, then spends them all, or spends nothing and says why.
    pub fn reserve(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        needs: &Needs,
    ) -> Result<Result<Taken, Refusal>, StoreError> {
        match self.check(tx, now_ms, needs)? {
            Ok(r) => Ok(Ok(r.apply(tx)?)),
            Err(refusal) => Ok(Err(refusal)),
        }
    }

    /// Checks every budget `needs` names without writing. With several short budgets the
    /// reason is the first of the contract.s order, and the retry-after is the time until every
    /// short bucket holds what is needed.
    pub fn check(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        needs: &Needs,
    ) -> Result<Result<Reservation, Refusal>, StoreError> {
        let mut spends: Vec<(String, bucket::State)> = Vec::new();
        let mut short: Vec<Reason> = Vec::new();
        let mut bucket_short = false;
        let mut curable = true;
        let mut wait_ms = 0u64;

        let mut buckets: Vec<(&BucketRef, u64, Reason)> = Vec::new();
        if needs.requests {
            buckets.push((&self.tenant_requests, 1, Reason::TenantRate));
            buckets.push((&self.global_requests, 1, Reason::GlobalRate));
        }
        if needs.tokens > 0 {
            buckets.push((&self.tenant_tokens, needs.tokens, Reason::TokenBudget));
        }
        for (b, credits, reason) in buckets {
            let level = b.level(tx, now_ms)?;
            match level.spend(b.limits, credits) {
                Ok(next) => spends.push((b.name.clone(), next)),
                Err(shortage) => {
                    short.push(reason);
                    bucket_short = true;
                    match shortage {
                        Shortage::RetryAfterMs(ms) => wait_ms = wait_ms.max(ms),
                        Shortage::NoRefill | Shortage::NeverFits => curable = false,
                    }
                }
            }
        }
        let mut tenant_in_use = None;
        let mut global_in_use = None;
        if needs.slots {
            if let Some(s) = &self.tenant_slots {
                let n = tx.slots_in_use(&s.scope)?;
                if n >= s.limit {
                    short.push(Reason::TenantConcurrency);
                }
                tenant_in_use = Some(n);
            }
            let n = tx.slots_in_use(&self.global_slots.scope)?;
            if n >= self.global_slots.limit {
                short.push(Reason::GlobalConcurrency);
            }
            global_in_use = Some(n);
        }

        if let Some(&reason) = short.first() {
            let retry_after_ms = match (bucket_short, curable) {
                (true, true) => Some(wait_ms),
                (true, false) => None,
                (false, _) => needs.busy_retry_after_ms,
            };
            return Ok(Err(Refusal {
                reason,
                retry_after_ms,
            }));
        }
        Ok(Ok(Reservation {
            spends,
            tenant_slot: self
                .tenant_slots
                .as_ref()
                .zip(tenant_in_use)
                .map(|(s, n)| (s.scope.clone(), n)),
            global_slot: global_in_use.map(|n| (self.global_slots.scope.clone(), n)),
        }))
    }
}
