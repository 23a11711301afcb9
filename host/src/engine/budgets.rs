//! The budgets one reservation touches, checked together and spent together.

use super::leases::{self, Holder, RowWrite, SharedRow};
use crate::alerts::{crossings, Alert, AlertRule};
use crate::bucket::{self, Limits, Shortage};
use crate::config::{Config, Price, TenantConfig};
use crate::explain::{Shortfall, Unit};
use crate::model::names;
use crate::reason::Reason;
use crate::runtime::{BucketLevel, SlotLevel};
use crate::store::{StoreError, Tx};
use std::sync::Arc;

/// A named bucket and its configured limits.
#[derive(Clone)]
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
        Ok(self.level_of(s.whole_credits().max(0) as u64))
    }

    /// This bucket's level as the policy sees it, with `available` credits.
    pub fn level_of(&self, available: u64) -> BucketLevel {
        BucketLevel {
            available,
            capacity: (self.limits.capacity_micro / bucket::MICRO) as u64,
            refill_per_s: self.limits.refill_milli_per_s as f64 / 1000.0,
        }
    }

    /// Whether `credits` can never fit this bucket, however long one waits.
    pub fn never_fits(&self, credits: u64) -> bool {
        i128::from(credits) * i128::from(bucket::MICRO) > i128::from(self.limits.capacity_micro)
    }

    /// What a refusal says of `tokens` that can never fit this bucket.
    pub fn never_fits_shortfall(&self, tokens: u64) -> Shortfall {
        let capacity = (self.limits.capacity_micro / bucket::MICRO).max(0) as u64;
        Shortfall {
            limit: self.name.clone(),
            requested: tokens,
            available: capacity,
            unit: Unit::Tokens,
            capacity: Some(capacity),
            output_tokens: None,
        }
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
    /// What a refusal of this scope says, with `in_use` slots taken.
    fn shortfall(&self, in_use: u32) -> Shortfall {
        Shortfall {
            limit: self.scope.clone(),
            requested: 1,
            available: u64::from(self.limit.saturating_sub(in_use)),
            unit: Unit::Slots,
            capacity: None,
            output_tokens: None,
        }
    }

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

/// Releases one slot of the shared `slots` (its limit as configured): through `holder`'s
/// lease when the engine holds leases, else as [`release_slot`].
pub(crate) fn release_shared_slot(
    tx: &mut dyn Tx,
    holder: Option<&Holder>,
    slots: &SlotRef,
    now_ms: i64,
) -> Result<(), StoreError> {
    match holder {
        Some(h) => h.refund(tx, SharedRow::Slots(slots), 1, now_ms),
        None => release_slot(tx, &slots.scope),
    }
}

/// A refusal: a bounded reason, the limit that was short and, when waiting can cure it,
/// how long to wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub reason: Reason,
    pub retry_after_ms: Option<u64>,
    pub shortfall: Option<Shortfall>,
}

/// What one reservation needs.
pub(crate) struct Needs {
    /// One credit from the tenant and the global request buckets.
    pub requests: bool,
    /// Tokens from the tenant token bucket (and the model's token buckets).
    pub tokens: u64,
    /// Micro-dollars from the tenant's money budget (0 when the call is not priced).
    pub cost_microusd: u64,
    /// A global slot, and a tenant slot when the tenant has a limit.
    pub slots: bool,
    /// The retry-after for slot refusals (the policy's estimate).
    pub busy_retry_after_ms: Option<u64>,
}

/// A checked reservation, not yet written: [`Reservation::apply`] spends it.
pub(crate) struct Reservation {
    spends: Vec<(String, bucket::State)>,
    /// What spends through leases write (leases, and shared rows when one is renewed).
    leased: Vec<RowWrite>,
    /// Whether the global slot was taken through a lease (its writes are in `leased`).
    leased_global_slot: bool,
    /// Alerts the spends cross, written with them.
    alerts: Vec<Alert>,
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
        for write in &self.leased {
            write.apply(tx)?;
        }
        for alert in &self.alerts {
            tx.put_alert(alert)?;
        }
        for (scope, in_use) in self.tenant_slot.iter().chain(self.global_slot.iter()) {
            tx.set_slots_in_use(scope, in_use + 1)?;
        }
        Ok(Taken {
            global_slot: self.global_slot.is_some() || self.leased_global_slot,
            tenant_slot: self.tenant_slot.is_some(),
        })
    }
}

/// Every budget of one tenant's request (for one model, when it names one).
pub(crate) struct Budgets {
    pub tenant_requests: BucketRef,
    pub global_requests: BucketRef,
    pub tenant_tokens: BucketRef,
    pub model_requests: Option<BucketRef>,
    pub model_tokens: Option<BucketRef>,
    pub tenant_model_tokens: Option<BucketRef>,
    /// The tenant's money budget, when both it and the model's price are configured.
    pub tenant_cost: Option<BucketRef>,
    /// The request budgets of the tenant's group and of every group above it.
    pub group_requests: Vec<BucketRef>,
    /// The token budgets of the tenant's group and of every group above it.
    pub group_tokens: Vec<BucketRef>,
    /// The money budgets of the tenant's group and of every group above it, when the
    /// model has a price.
    pub group_cost: Vec<BucketRef>,
    pub price: Option<Price>,
    /// The alert rules, checked against every spend.
    pub alerts: Arc<Vec<AlertRule>>,
    pub tenant_slots: Option<SlotRef>,
    pub global_slots: SlotRef,
    /// The engine as a holder of leases on shared budgets, when it shares its store.
    pub holder: Option<Arc<Holder>>,
}

impl Budgets {
    /// These budgets reserved and refunded through `holder`'s leases (none: directly).
    pub fn held_by(self, holder: Option<&Arc<Holder>>) -> Self {
        Budgets {
            holder: holder.cloned(),
            ..self
        }
    }

    /// The holder, when `b` is a shared budget it leases.
    fn holder_of(&self, b: &BucketRef) -> Option<&Holder> {
        self.holder
            .as_deref()
            .filter(|_| leases::is_shared_bucket(&b.name))
    }

    /// What the policy sees of bucket `b`: through this engine's leases when it holds them.
    pub fn bucket_level(
        &self,
        tx: &mut dyn Tx,
        b: &BucketRef,
        now_ms: i64,
    ) -> Result<BucketLevel, StoreError> {
        match self.holder_of(b) {
            Some(h) => {
                let micro = h.level_micro(tx, SharedRow::Bucket(b), now_ms)?;
                Ok(b.level_of((micro / bucket::MICRO).max(0) as u64))
            }
            None => b.bucket_level(tx, now_ms),
        }
    }

    /// What the policy sees of the global slots: through this engine's lease when it holds
    /// leases (a slot free in another holder's lease shows as taken).
    pub fn global_slot_level(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<SlotLevel, StoreError> {
        let s = &self.global_slots;
        match self.holder.as_deref() {
            Some(h) => {
                let free = h.level_micro(tx, SharedRow::Slots(s), now_ms)? / bucket::MICRO;
                Ok(SlotLevel {
                    in_use: (i64::from(s.limit) - free).clamp(0, i64::from(u32::MAX)) as u32,
                    limit: s.limit,
                })
            }
            None => s.level(tx),
        }
    }

    /// The global concurrency scope and its limit.
    pub fn global_slots(config: &Config) -> SlotRef {
        SlotRef {
            scope: names::GLOBAL_SLOTS.into(),
            limit: config.global_concurrency,
        }
    }

    pub fn global_requests(config: &Config) -> BucketRef {
        BucketRef {
            name: names::GLOBAL_REQUESTS.into(),
            limits: config.global_requests.limits(),
        }
    }

    /// Every bucket of one tenant: requests, tokens, its tokens per model and its money.
    pub fn of_tenant(name: &str, t: &TenantConfig) -> Vec<BucketRef> {
        let mut out = vec![Self::tenant_requests(name, t), Self::tenant_tokens(name, t)];
        out.extend(t.models.iter().map(|(model, b)| BucketRef {
            name: names::tenant_model_tokens(name, model),
            limits: b.limits(),
        }));
        out.extend(t.cost_microusd.map(|b| BucketRef {
            name: names::tenant_cost(name),
            limits: b.limits(),
        }));
        out
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

    /// A model's budgets, as [`Budgets::for_request`] reads them.
    fn model_buckets(
        config: &Config,
        name: &str,
        t: &TenantConfig,
        model: Option<&str>,
    ) -> ModelBuckets {
        let Some((model, m)) = model.and_then(|m| Some((m, config.model(m)?))) else {
            return ModelBuckets::default();
        };
        let bucket = |name: String, b: &crate::config::BucketConfig| BucketRef {
            name,
            limits: b.limits(),
        };
        let price = m.price_microusd_per_token;
        ModelBuckets {
            requests: m.requests.map(|b| bucket(names::model_requests(model), &b)),
            tokens: m.tokens.map(|b| bucket(names::model_tokens(model), &b)),
            tenant_tokens: t
                .models
                .get(model)
                .map(|b| bucket(names::tenant_model_tokens(name, model), b)),
            cost: t
                .cost_microusd
                .filter(|_| price.is_some())
                .map(|b| bucket(names::tenant_cost(name), &b)),
            price,
        }
    }

    /// Every budget of the tenant's group and of the groups above it.
    pub fn of_tenant_groups(config: &Config, t: &TenantConfig) -> Vec<BucketRef> {
        config
            .group_chain_of(t.group.as_deref())
            .into_iter()
            .filter_map(|name| Some((name, config.groups.get(name)?)))
            .flat_map(|(name, g)| g.buckets(name))
            .map(|(name, b)| BucketRef {
                name,
                limits: b.limits(),
            })
            .collect()
    }

    /// Every model's shared budgets (requests, tokens) where configured.
    pub fn of_models(config: &Config) -> Vec<BucketRef> {
        let mut out = Vec::new();
        for (model, m) in config.models.iter().flatten() {
            let shared = [
                m.requests.map(|b| (names::model_requests(model), b)),
                m.tokens.map(|b| (names::model_tokens(model), b)),
            ];
            out.extend(shared.into_iter().flatten().map(|(name, b)| BucketRef {
                name,
                limits: b.limits(),
            }));
        }
        out
    }

    /// Every budget of every group, by bucket name.
    pub fn of_groups(config: &Config) -> Vec<BucketRef> {
        config
            .groups
            .iter()
            .flat_map(|(name, g)| g.buckets(name))
            .map(|(name, b)| BucketRef {
                name,
                limits: b.limits(),
            })
            .collect()
    }

    /// The budgets of a request of tenant `name` for `model` (none: the tenant's own).
    pub fn for_request(config: &Config, name: &str, t: &TenantConfig, model: Option<&str>) -> Self {
        let m = Self::model_buckets(config, name, t, model);
        let mut group_requests = Vec::new();
        let mut group_tokens = Vec::new();
        let mut group_cost = Vec::new();
        for group in config.group_chain_of(t.group.as_deref()) {
            let Some(g) = config.groups.get(group) else {
                continue;
            };
            let bucket = |budget: &str, b: &crate::config::BucketConfig| BucketRef {
                name: names::group_budget(group, budget),
                limits: b.limits(),
            };
            group_requests.extend(g.budgets.requests.map(|b| bucket("requests", &b)));
            group_tokens.extend(g.budgets.tokens.map(|b| bucket("tokens", &b)));
            if m.price.is_some() {
                group_cost.extend(g.budgets.cost_microusd.map(|b| bucket("cost_microusd", &b)));
            }
        }
        Budgets {
            alerts: config.alerts.clone(),
            group_requests,
            group_tokens,
            group_cost,
            tenant_requests: Self::tenant_requests(name, t),
            global_requests: Self::global_requests(config),
            tenant_tokens: Self::tenant_tokens(name, t),
            model_requests: m.requests,
            model_tokens: m.tokens,
            tenant_model_tokens: m.tenant_tokens,
            tenant_cost: m.cost,
            price: m.price,
            tenant_slots: t.concurrency.map(|limit| SlotRef {
                scope: names::tenant_slots(name),
                limit,
            }),
            global_slots: Self::global_slots(config),
            holder: None,
        }
    }

    /// Every token bucket a reservation of tokens draws on.
    pub fn token_buckets(&self) -> impl Iterator<Item = &BucketRef> {
        std::iter::once(&self.tenant_tokens)
            .chain(self.model_tokens.iter())
            .chain(self.tenant_model_tokens.iter())
            .chain(self.group_tokens.iter())
    }

    /// Every money budget a priced call draws on: the tenant's and its groups'.
    pub fn cost_buckets(&self) -> impl Iterator<Item = &BucketRef> {
        self.tenant_cost.iter().chain(self.group_cost.iter())
    }

    fn priced(&self) -> Option<Price> {
        self.price.filter(|_| self.cost_buckets().next().is_some())
    }

    /// Micro-dollars a call of this size reserves from the money budget (0: none).
    pub fn cost(&self, input_and_context: u64, max_output: u64) -> u64 {
        self.priced()
            .map_or(0, |p| p.cost(input_and_context, max_output))
    }

    /// Micro-dollars a reported usage costs, each token class at its price (0: no money
    /// budget).
    pub fn cost_of(&self, usage: &crate::model::Usage) -> u64 {
        self.priced().map_or(0, |p| p.cost_of(usage))
    }

    /// Returns unused tokens to every token bucket and unused micro-dollars to the money
    /// budget, never above capacity.
    pub fn refund(
        &self,
        tx: &mut dyn Tx,
        tokens: u64,
        cost_microusd: u64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let each = (self.token_buckets().map(|b| (b, tokens)))
            .chain(self.cost_buckets().map(|b| (b, cost_microusd)))
            .filter(|&(_, credits)| credits > 0);
        for (b, credits) in each {
            match self.holder_of(b) {
                Some(h) => h.refund(tx, SharedRow::Bucket(b), credits, now_ms)?,
                None => b.refund(tx, credits, now_ms)?,
            }
        }
        Ok(())
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
        let mut leased: Vec<RowWrite> = Vec::new();
        let mut leased_global_slot = false;
        let mut alerts: Vec<Alert> = Vec::new();
        let mut short: Vec<Reason> = Vec::new();
        let mut first_shortfall: Option<Shortfall> = None;
        let mut bucket_short = false;
        let mut curable = true;
        let mut wait_ms = 0u64;

        // In the contract's order of reasons.
        let mut buckets: Vec<(&BucketRef, u64, Reason, Unit)> = Vec::new();
        if needs.requests {
            let unit = Unit::Requests;
            buckets.push((&self.tenant_requests, 1, Reason::TenantRate, unit));
            buckets.push((&self.global_requests, 1, Reason::GlobalRate, unit));
            if let Some(b) = &self.model_requests {
                buckets.push((b, 1, Reason::ModelRate, unit));
            }
            for b in &self.group_requests {
                buckets.push((b, 1, Reason::GroupBudget, unit));
            }
        }
        if needs.tokens > 0 {
            let unit = Unit::Tokens;
            buckets.push((&self.tenant_tokens, needs.tokens, Reason::TokenBudget, unit));
            for b in self.model_tokens.iter().chain(&self.tenant_model_tokens) {
                buckets.push((b, needs.tokens, Reason::ModelTokenBudget, unit));
            }
            for b in &self.group_tokens {
                buckets.push((b, needs.tokens, Reason::GroupBudget, unit));
            }
        }
        if needs.cost_microusd > 0 {
            let unit = Unit::Microusd;
            if let Some(b) = &self.tenant_cost {
                buckets.push((b, needs.cost_microusd, Reason::CostBudget, unit));
            }
            for b in &self.group_cost {
                buckets.push((b, needs.cost_microusd, Reason::GroupBudget, unit));
            }
        }
        for (b, credits, reason, unit) in buckets {
            let spent = match self.holder_of(b) {
                Some(h) => match h.spend(tx, SharedRow::Bucket(b), credits, now_ms)? {
                    leases::Taken::Spent {
                        writes,
                        before_micro,
                        after_micro,
                    } => {
                        leased.extend(writes);
                        let at = |balance_micro| bucket::State {
                            balance_micro,
                            updated_ms: now_ms,
                        };
                        Ok((at(before_micro), at(after_micro)))
                    }
                    leases::Taken::Short {
                        available_micro,
                        shortage,
                    } => Err((available_micro / bucket::MICRO, shortage)),
                },
                None => {
                    let level = b.level(tx, now_ms)?;
                    match level.spend(b.limits, credits) {
                        Ok(next) => {
                            spends.push((b.name.clone(), next));
                            Ok((level, next))
                        }
                        Err(shortage) => Err((level.whole_credits(), shortage)),
                    }
                }
            };
            match spent {
                Ok((level, next)) => {
                    if !self.alerts.is_empty() {
                        alerts.extend(crossings(
                            &self.alerts,
                            &b.name,
                            b.limits,
                            level,
                            next,
                            now_ms,
                        ));
                    }
                }
                Err((available, shortage)) => {
                    short.push(reason);
                    first_shortfall.get_or_insert_with(|| Shortfall {
                        limit: b.name.clone(),
                        requested: credits,
                        available: available.max(0) as u64,
                        unit,
                        capacity: None,
                        output_tokens: None,
                    });
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
                    first_shortfall.get_or_insert_with(|| s.shortfall(n));
                }
                tenant_in_use = Some(n);
            }
            let global = &self.global_slots;
            match self.holder.as_deref() {
                Some(h) => match h.spend(tx, SharedRow::Slots(global), 1, now_ms)? {
                    leases::Taken::Spent { writes, .. } => {
                        leased.extend(writes);
                        leased_global_slot = true;
                    }
                    leases::Taken::Short {
                        available_micro, ..
                    } => {
                        short.push(Reason::GlobalConcurrency);
                        let free = (available_micro / bucket::MICRO).max(0) as u32;
                        first_shortfall.get_or_insert_with(|| {
                            global.shortfall(global.limit.saturating_sub(free))
                        });
                    }
                },
                None => {
                    let n = tx.slots_in_use(&global.scope)?;
                    if n >= global.limit {
                        short.push(Reason::GlobalConcurrency);
                        first_shortfall.get_or_insert_with(|| global.shortfall(n));
                    }
                    global_in_use = Some(n);
                }
            }
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
                shortfall: first_shortfall,
            }));
        }
        Ok(Ok(Reservation {
            spends,
            alerts,
            tenant_slot: self
                .tenant_slots
                .as_ref()
                .zip(tenant_in_use)
                .map(|(s, n)| (s.scope.clone(), n)),
            global_slot: global_in_use.map(|n| (self.global_slots.scope.clone(), n)),
            leased,
            leased_global_slot,
        }))
    }
}

/// The buckets a model adds to a request's budgets.
#[derive(Default)]
struct ModelBuckets {
    requests: Option<BucketRef>,
    tokens: Option<BucketRef>,
    tenant_tokens: Option<BucketRef>,
    cost: Option<BucketRef>,
    price: Option<Price>,
}
