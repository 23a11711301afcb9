//! The engine: admission, completion, dispatch and policy activation over a [`Store`] and a
//! policy, with time always passed in (`now_ms`), never read behind the caller's back.
//!
//! Each public operation is one store transaction. The policy decides inside it from a
//! snapshot; the host checks the plan and executes it, so a wrong policy cannot break an
//! invariant.

mod admission;
mod batch;
mod budgets;
mod builder;
mod clock;
mod completion;
mod decision;
mod deployments;
mod directory;
mod dispatch;
mod fingerprint;
mod groups;
mod housekeeping;
#[cfg(test)]
mod isolation;
mod leases;
mod owned;
mod shadow;
mod stored_policy;
mod swap;
mod waiting;

pub(crate) use batch::{Answer, Job};
pub use batch::{Answers, Batch, Ticket};
pub use builder::{EngineBuilder, StartError, Started};
pub use clock::JobTimes;
pub use completion::{Completion, CompletionAnswer, CompletionError, Reconciliation, SavedAnswer};
pub use decision::Decision;
pub use deployments::{Health, HealthState, ProviderLimits};
pub use directory::{DirectoryApplied, DirectoryError, KeyInfo};
pub use dispatch::{Claim, DispatchAnswer, DispatchReason};
pub use housekeeping::{OperationsPage, Page, Sweep, MOST_PER_PAGE, SWEEP_ROWS};
pub use leases::{LeaseKeep, HOLDER_LIFE_MS};
pub use owned::{valid_object_id, MAX_OBJECT_ID_BYTES};
pub use shadow::{Disagreement, OutcomePair, PlanShape, ShadowReport, RECENT_DISAGREEMENTS};
pub use stored_policy::Adopted;
pub use swap::{NoVerifier, PolicyIdentity, SwapError, Verifier};
pub use waiting::{
    bounds as waiting_bounds, estimated_exec_ms, frees_at, give_up_at, given_up, waiter_for,
    waits_for, Full, Waiter, WaitingRoom,
};

use crate::alerts::Alert;
use crate::config::Config;
use crate::model::{names, JobRef, OpState, Operation, Route};
use crate::runtime::{Decider, DecisionView, Jitter, Params, Runtime};
use crate::spend::SpendRow;
use crate::store::{Store, StoreError, Tx};
use budgets::{BucketRef, Budgets};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

/// A route as the policy's world spells it.
fn wit_route(route: Route) -> crate::runtime::Route {
    match route {
        Route::Interactive => crate::runtime::Route::Interactive,
        Route::Durable => crate::runtime::Route::Durable,
    }
}

/// A priority as the policy's world spells it.
fn wit_priority(p: crate::model::Priority) -> crate::runtime::Priority {
    match p {
        crate::model::Priority::Critical => crate::runtime::Priority::Critical,
        crate::model::Priority::Standard => crate::runtime::Priority::Standard,
        crate::model::Priority::Sheddable => crate::runtime::Priority::Sheddable,
    }
}

/// The active policy and the one before it (for rollback).
struct Policies {
    active: Arc<dyn Decider>,
    previous: Option<Arc<dyn Decider>>,
}

/// Admission control and fair dispatch over one store.
///
/// Every call takes the time as an argument and runs as one store transaction; only a
/// fresh acceptance authorises a provider call.
///
/// ```
/// use std::sync::Arc;
/// use tollgate::config::Config;
/// use tollgate::engine::Completion;
/// use tollgate::reason::Outcome;
/// use tollgate::runtime::{builtin, Runtime};
/// use tollgate::store::SqliteStore;
/// use tollgate::Engine;
///
/// let config = Config::from_json(&serde_json::json!({"tenants": {"acme": {}}})).unwrap();
/// let runtime = Runtime::new().unwrap();
/// let policy = runtime
///     .load(builtin::get("standard").unwrap(), config.policy_limits())
///     .unwrap();
/// let engine = Engine::new(config, SqliteStore::in_memory().unwrap(), runtime, Arc::new(policy));
///
/// let request = serde_json::json!({"tenant": "acme", "key": "k1", "route": "interactive",
///     "input_tokens": 10, "max_output_tokens": 10, "deadline_ms": 60_000});
/// let decision = engine.admit(&request, 0).unwrap();
/// assert_eq!(decision.outcome, Outcome::Accepted);
/// assert!(decision.authorises_call());
/// let done = engine.complete(&Completion::succeeded("acme", "k1"), 500).unwrap();
/// assert!(done.ok);
/// // The same key again is answered from the operation, and authorises nothing.
/// assert!(!engine.admit(&request, 1_000).unwrap().authorises_call());
/// ```
pub struct Engine<S: Store> {
    /// Replaced whole when the store's tenants change (see `directory`); a decision reads
    /// it under the store's lock, so one transaction sees one configuration.
    config: RwLock<Arc<Config>>,
    params: Arc<Params>,
    runtime: Runtime,
    store: Mutex<S>,
    policies: RwLock<Policies>,
    /// A candidate asked beside the active policy, never enforced.
    shadow: RwLock<Option<Arc<shadow::Shadow>>>,
    /// The generation of the store's policy state this engine has taken up.
    policy_generation: std::sync::atomic::AtomicI64,
    /// The keys of the store's directory, by hash (empty until `adopt_directory`).
    keys: RwLock<Arc<directory::KeyTable>>,
    /// The generation of the store's directory this engine has taken up.
    directory_generation: std::sync::atomic::AtomicI64,
    /// Where the next housekeeping sweep resumes.
    sweep_cursor: housekeeping::Cursor,
    /// This engine as a holder of leases on shared budgets, once it serves from a store
    /// other engines share ([`Engine::hold_leases`]).
    holder: std::sync::OnceLock<Arc<leases::Holder>>,
}

/// How long a sender holds the alerts it took before another may take them again.
pub const ALERT_HOLD_MS: i64 = 30_000;

/// What `inspect` shows (docs/scenarios.md).
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// Bucket name to whole credits available now.
    pub buckets: BTreeMap<String, i64>,
    /// Period budget name to when it is full again (epoch milliseconds).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resets_at: BTreeMap<String, i64>,
    /// Period budget name to its limit, whole credits (spent this period: the limit less
    /// what `buckets` shows).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub period_limits: BTreeMap<String, i64>,
    /// Shared budget to the credits leased out of it to replicas or writer shards (a slot
    /// scope as `slots:<scope>`), spent or not. `buckets` and `slots` show each budget
    /// whole: what is unspent in leases counts as available (a slot as free). Empty (and
    /// left out) unless engines lease.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub leased: BTreeMap<String, i64>,
    /// Slot scope to calls in flight.
    pub slots: BTreeMap<String, u32>,
    /// Tenant to queued durable jobs, retries waiting included.
    pub queues: BTreeMap<String, u32>,
    /// Tenant to how long its oldest queued job has waited, in milliseconds (0 when none
    /// waits): the head of each dispatch band, measured from when it entered the queue.
    /// For metrics; left out of the inspection's JSON, which says what is held, not when.
    #[serde(skip)]
    pub queue_age_ms: BTreeMap<String, i64>,
    /// The operations of the page asked for, by tenant and key (none for levels only).
    pub operations: Vec<OperationView>,
    /// The cursor of the next page of operations, when there may be more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Whether the downstream is marked available.
    pub downstream_available: bool,
    /// The active policy.
    pub policy: PolicyIdentity,
    /// Each gateway model's deployments (`deployment.<model>.<name>`): healthy, paused,
    /// ejected or probing, with its calls in flight and concurrency limit.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub deployments: BTreeMap<String, Health>,
}

/// A tenant's request and token buckets, as rate-limit headers show them.
#[derive(Clone, Copy, Debug)]
pub struct TenantLevels {
    /// The tenant's request bucket.
    pub requests: crate::runtime::BucketLevel,
    /// The tenant's token bucket.
    pub tokens: crate::runtime::BucketLevel,
    /// The tightest money budget of the tenant and its groups (`None`: no money budget).
    pub money: Option<MoneyLevel>,
}

/// What is left of a money budget, and when it is full again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoneyLevel {
    /// Micro-dollars left.
    pub remaining_microusd: u64,
    /// When it is full again (epoch ms): a period budget's reset, or when a refilling one
    /// has refilled (`None`: it never refills).
    pub resets_at_ms: Option<i64>,
}

/// One operation as `inspect` and `tollgate ops` show it.
#[derive(Clone, Debug, Serialize)]
pub struct OperationView {
    /// The tenant the operation belongs to.
    pub tenant: String,
    /// The caller's operation key.
    pub key: String,
    /// Where the operation is in its life.
    pub state: OpState,
    /// The current attempt, from 1.
    pub attempt: u32,
    /// Tokens the current attempt reserved.
    pub reserved_tokens: u64,
    /// The output cap the call must use (reduced when degraded).
    pub max_output_tokens: u64,
    /// Micro-dollars the current attempt reserved from the tenant's money budget.
    #[serde(skip_serializing_if = "is_zero")]
    pub reserved_cost_microusd: u64,
    /// Whether the policy reduced the request.
    pub degraded: bool,
    /// The caller's reference to the saved answer, once succeeded.
    pub result_ref: Option<String>,
    /// The content hash of the policy that made the latest decision on it.
    pub policy: String,
    /// What the provider reported as used, by class, once the attempt ended with usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::model::Usage>,
    /// The model serving the call, when it is a gateway model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The deployment the current attempt was sent to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
}

impl OperationView {
    fn of(op: &Operation) -> Self {
        OperationView {
            tenant: op.tenant.clone(),
            key: op.key.clone(),
            state: op.state,
            attempt: op.attempt,
            reserved_tokens: op.reserved_tokens,
            max_output_tokens: op.max_output_tokens,
            reserved_cost_microusd: op.reserved_cost_microusd,
            degraded: op.degraded,
            result_ref: op.result_ref.clone(),
            policy: op.policy_digest.clone(),
            usage: op.usage,
            model: op.model.clone(),
            deployment: op.deployment.clone(),
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

const DOWNSTREAM: &str = "downstream_available";

impl<S: Store> Engine<S> {
    /// An engine on `store`, deciding with `policy` (already loaded and checked).
    pub fn new(config: Config, store: S, runtime: Runtime, policy: Arc<dyn Decider>) -> Self {
        let params = Arc::new(Params {
            numbers: config.policy_params.clone(),
            strings: config.policy_strings.clone(),
        });
        Engine {
            config: RwLock::new(Arc::new(config)),
            params,
            runtime,
            store: Mutex::new(store),
            policies: RwLock::new(Policies {
                active: policy,
                previous: None,
            }),
            shadow: RwLock::new(None),
            policy_generation: std::sync::atomic::AtomicI64::new(-1),
            keys: RwLock::default(),
            directory_generation: std::sync::atomic::AtomicI64::new(-1),
            sweep_cursor: housekeeping::Cursor::default(),
            holder: std::sync::OnceLock::new(),
        }
    }

    /// The configuration the engine enforces now.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The policy new decisions use. A decision holds this `Arc` for its whole run, so a
    /// swap meanwhile cannot change the version it decides with.
    pub fn active_policy(&self) -> Arc<dyn Decider> {
        self.policies
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .active
            .clone()
    }

    fn transaction<T>(
        &self,
        f: impl FnOnce(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store.transaction(f)
    }

    /// Runs `f`, which only reads rows written with the store held whole (meta, policies,
    /// tenants, keys): on a shared store it runs beside other replicas' batches instead of
    /// stopping them, so the frequent checks for another replica's changes cost them nothing.
    fn read<T>(
        &self,
        f: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let hint = crate::store::Prefetch {
            complete: true,
            ..Default::default()
        };
        self.named(&hint, f)
    }

    /// Runs `f` in one transaction that names the rows `hint` lists (all it writes): on a
    /// shared store it runs beside other replicas' batches that touch none of them.
    fn named<T>(
        &self,
        hint: &crate::store::Prefetch,
        mut f: impl FnMut(&mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let mut answers = store.transaction_batch(1, hint, |_, tx| f(tx))?;
        answers
            .pop()
            .unwrap_or_else(|| Err(StoreError::Schema("a read answered nothing".into())))
    }

    /// Marks the downstream provider available or not; while it is not, nothing is claimed
    /// and interactive admissions are refused.
    pub fn set_downstream(&self, available: bool) -> Result<(), StoreError> {
        self.transaction(|tx| tx.set_meta(DOWNSTREAM, if available { "1" } else { "0" }))
    }

    /// Writes one small row (`meta.write_probe`, the time given), to learn whether the
    /// store can write now: what a writer that found it unable does while idle.
    ///
    /// # Errors
    /// The store's error when it cannot write ([`StoreError::is_unavailable`] for a full
    /// disk or a lost connection).
    pub fn probe_write(&self, now_ms: i64) -> Result<(), StoreError> {
        self.transaction(|tx| tx.set_meta("write_probe", &now_ms.to_string()))
    }

    /// The state of every budget, slot, queue and operation at `now_ms`.
    pub fn inspect(&self, now_ms: i64) -> Result<Inspection, StoreError> {
        self.transaction(|tx| self.inspect_in(tx, now_ms, Some(&Page::all())))
    }

    fn inspect_in(
        &self,
        tx: &mut dyn Tx,
        now_ms: i64,
        operations: Option<&Page>,
    ) -> Result<Inspection, StoreError> {
        let policy = PolicyIdentity::of(self.active_policy().as_ref());
        let mut buckets = BTreeMap::new();
        let mut resets_at = BTreeMap::new();
        let mut period_limits = BTreeMap::new();
        // Each budget whole: what sits unspent in holders' leases is available too.
        let in_leases = self.in_leases(tx)?;
        let mut record = |tx: &mut dyn Tx, b: &BucketRef| -> Result<(), StoreError> {
            let mut level = b.level(tx, now_ms)?;
            if let Some(held) = in_leases.get(&b.name) {
                level.balance_micro = level
                    .balance_micro
                    .saturating_add(held.unspent_micro)
                    .min(b.limits.capacity_micro);
            }
            buckets.insert(b.name.clone(), level.whole_credits());
            if let Some(at) = b.limits.resets_at(level.updated_ms) {
                resets_at.insert(b.name.clone(), at);
                period_limits.insert(
                    b.name.clone(),
                    b.limits.capacity_micro / crate::bucket::MICRO,
                );
            }
            Ok(())
        };
        let mut slots = BTreeMap::new();
        let mut queues = BTreeMap::new();
        let mut queue_age_ms = BTreeMap::new();
        record(tx, &Budgets::global_requests(&self.config()))?;
        // A slot free in a holder's lease is not in use.
        let in_use = |scope: &str, counted: u32| {
            let free_in_leases = in_leases
                .get(&leases::slots_budget(scope))
                .map_or(0, |held| held.unspent_micro / crate::bucket::MICRO);
            counted.saturating_sub(u32::try_from(free_in_leases).unwrap_or(u32::MAX))
        };
        let global = tx.slots_in_use(names::GLOBAL_SLOTS)?;
        slots.insert(
            names::GLOBAL_SLOTS.to_string(),
            in_use(names::GLOBAL_SLOTS, global),
        );
        for b in Budgets::of_models(&self.config()) {
            record(tx, &b)?;
        }
        for (name, tenant) in &self.config().tenants {
            for b in Budgets::of_tenant(name, tenant) {
                record(tx, &b)?;
            }
            if tenant.concurrency.is_some() {
                let scope = names::tenant_slots(name);
                slots.insert(scope.clone(), tx.slots_in_use(&scope)?);
            }
            let depth = tx.queue_depth(name)?;
            queues.insert(name.clone(), depth);
            queue_age_ms.insert(name.clone(), oldest_wait_ms(tx, name, depth, now_ms)?);
        }
        for b in Budgets::of_groups(&self.config()) {
            record(tx, &b)?;
        }
        let config = self.config();
        let mut deployments = BTreeMap::new();
        for model in config.routing.keys() {
            for d in deployments::DeploymentBudgets::of(&config, model) {
                for (b, configured) in [
                    (&d.requests, d.deployment.requests.is_some()),
                    (&d.tokens, d.deployment.tokens.is_some()),
                ] {
                    if configured {
                        record(tx, b)?;
                    }
                }
                let mut health = d.health(tx, now_ms)?;
                health.in_flight = in_use(&d.slots, health.in_flight);
                slots.insert(d.slots.clone(), health.in_flight);
                deployments.insert(names::deployment(model, &d.deployment.name), health);
            }
        }
        let (operations, next) = match operations {
            Some(page) => {
                let page = housekeeping::page_in(tx, None, page)?;
                (page.operations, page.next)
            }
            None => (Vec::new(), None),
        };
        let downstream_available = downstream_available(tx)?;
        Ok(Inspection {
            buckets,
            resets_at,
            period_limits,
            leased: in_leases
                .iter()
                .map(|(budget, held)| (budget.clone(), held.leased_micro / crate::bucket::MICRO))
                .filter(|&(_, n)| n > 0)
                .collect(),
            slots,
            queues,
            queue_age_ms,
            operations,
            next,
            downstream_available,
            policy,
            deployments,
        })
    }

    /// A tenant's request and token buckets now; `None` when the tenant is not configured.
    pub(super) fn tenant_levels_in(
        &self,
        tx: &mut dyn Tx,
        tenant: &str,
        now_ms: i64,
    ) -> Result<Option<TenantLevels>, StoreError> {
        let config = self.config();
        let Some(t) = config.tenant(tenant) else {
            return Ok(None);
        };
        let mut money: Option<MoneyLevel> = None;
        let tenant_cost = t.cost_microusd.map(|b| BucketRef {
            name: names::tenant_cost(tenant),
            limits: b.limits(),
        });
        let group_cost = Budgets::of_tenant_groups(&config, t)
            .into_iter()
            .filter(|b| b.name.ends_with(".cost_microusd"));
        for b in tenant_cost.into_iter().chain(group_cost) {
            let level = b.level(tx, now_ms)?;
            let remaining = level.whole_credits().max(0) as u64;
            if money.is_some_and(|m| m.remaining_microusd <= remaining) {
                continue;
            }
            let missing = b.limits.capacity_micro.saturating_sub(level.balance_micro);
            let resets_at_ms = match b.limits.resets_at(level.updated_ms) {
                Some(at) => Some(at),
                None if missing <= 0 => Some(now_ms),
                None if b.limits.refill_milli_per_s > 0 => {
                    let rate = b.limits.refill_milli_per_s;
                    Some(now_ms.saturating_add((missing + rate - 1) / rate))
                }
                None => None,
            };
            money = Some(MoneyLevel {
                remaining_microusd: remaining,
                resets_at_ms,
            });
        }
        Ok(Some(TenantLevels {
            requests: Budgets::tenant_requests(tenant, t).bucket_level(tx, now_ms)?,
            tokens: Budgets::tenant_tokens(tenant, t).bucket_level(tx, now_ms)?,
            money,
        }))
    }

    /// One operation of one tenant, if it exists.
    pub fn operation(&self, tenant: &str, key: &str) -> Result<Option<OperationView>, StoreError> {
        self.transaction(|tx| Ok(tx.operation(tenant, key)?.as_ref().map(OperationView::of)))
    }

    /// Every operation's whole record (slots held, reservations outstanding), for audits
    /// such as the invariant tests.
    pub fn operation_records(&self) -> Result<Vec<Operation>, StoreError> {
        self.transaction(|tx| tx.operations())
    }

    /// The spend ledger's rows of the hours from `from_ms` to `to_ms` (exclusive).
    pub fn spend(&self, from_ms: i64, to_ms: i64) -> Result<Vec<SpendRow>, StoreError> {
        self.transaction(|tx| tx.spend_rows(from_ms, to_ms))
    }

    /// Takes at most `limit` alerts due at `now_ms` to post, and holds them for
    /// [`ALERT_HOLD_MS`] so that no other sender (another replica's) takes them meanwhile.
    pub fn take_due_alerts(&self, now_ms: i64, limit: u32) -> Result<Vec<Alert>, StoreError> {
        self.transaction(|tx| {
            let due = tx.due_alerts(now_ms, limit)?;
            for a in &due {
                tx.alert_tried(&a.id, a.attempts, now_ms + ALERT_HOLD_MS, None)?;
            }
            Ok(due)
        })
    }

    /// Records a post of `alert`: acknowledged (sent for good), or failed (tried again
    /// after a backoff that doubles).
    pub fn alert_posted(&self, alert: &Alert, ok: bool, now_ms: i64) -> Result<(), StoreError> {
        let attempts = alert.attempts.saturating_add(1);
        let (next_ms, sent_ms) = match ok {
            true => (now_ms, Some(now_ms)),
            false => (now_ms + crate::alerts::backoff_ms(attempts), None),
        };
        self.transaction(|tx| tx.alert_tried(&alert.id, attempts, next_ms, sent_ms))
    }

    /// Alerts in the outbox not yet acknowledged.
    pub fn pending_alerts(&self) -> Result<u64, StoreError> {
        self.transaction(|tx| tx.pending_alerts())
    }

    /// Queue depth per configured tenant.
    pub fn queue_depths(&self) -> Result<BTreeMap<String, u32>, StoreError> {
        self.transaction(|tx| {
            let mut out = BTreeMap::new();
            for name in self.config().tenants.keys() {
                out.insert(name.clone(), tx.queue_depth(name)?);
            }
            Ok(out)
        })
    }

    /// The snapshot a policy decides from, for one tenant (and model) at `now_ms`.
    fn view(
        &self,
        tx: &mut dyn Tx,
        tenant: &str,
        model: Option<&str>,
        key: &str,
        attempt: u32,
        now_ms: i64,
    ) -> Result<DecisionView, StoreError> {
        let jitter = Jitter::new(self.config().seed, tenant, key, attempt);
        let config = self.config();
        let Some(t) = config.tenant(tenant) else {
            // An operation stored under a tenant no longer configured: nothing to read.
            let mut view = DecisionView::scratch(self.params.clone());
            (view.now_ms, view.jitter) = (now_ms, jitter);
            (
                view.global_requests,
                view.tenant_requests,
                view.tenant_tokens,
            ) = (None, None, None);
            (view.global_slots, view.tenant_slots) = (None, None);
            return Ok(view);
        };
        let budgets = Budgets::for_request(&config, tenant, t, model).held_by(self.holder());
        let level = |tx: &mut dyn Tx, b: &Option<BucketRef>| match b {
            Some(b) => budgets.bucket_level(tx, b, now_ms).map(Some),
            None => Ok(None),
        };
        Ok(DecisionView {
            model_requests: level(tx, &budgets.model_requests)?,
            model_tokens: level(tx, &budgets.model_tokens)?,
            tenant_model_tokens: level(tx, &budgets.tenant_model_tokens)?,
            tenant_cost: level(tx, &budgets.tenant_cost)?,
            now_ms,
            params: self.params.clone(),
            weight: t.weight,
            global_requests: Some(budgets.bucket_level(tx, &budgets.global_requests, now_ms)?),
            tenant_requests: Some(budgets.tenant_requests.bucket_level(tx, now_ms)?),
            tenant_tokens: Some(budgets.tenant_tokens.bucket_level(tx, now_ms)?),
            global_slots: Some(budgets.global_slot_level(tx, now_ms)?),
            tenant_slots: match &budgets.tenant_slots {
                Some(s) => Some(s.level(tx)?),
                None => None,
            },
            jitter,
        })
    }
}

fn downstream_available(tx: &mut dyn Tx) -> Result<bool, StoreError> {
    Ok(tx.meta(DOWNSTREAM)?.as_deref() != Some("0"))
}

fn job_ref(tenant: &str, key: &str) -> JobRef {
    JobRef {
        tenant: tenant.to_string(),
        key: key.to_string(),
    }
}

/// How long the oldest of `tenant`'s `depth` queued jobs has waited at `now_ms`: the
/// longest of its bands' heads, from when each entered the queue (0 for an empty queue).
fn oldest_wait_ms(
    tx: &mut dyn Tx,
    tenant: &str,
    depth: u32,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let mut oldest = 0;
    if depth == 0 {
        return Ok(oldest);
    }
    for band in crate::model::Priority::BANDS {
        let Some(head) = tx.ready_head(tenant, band, i64::MAX)? else {
            continue;
        };
        let since = tx
            .operation(tenant, &head.key)?
            .and_then(|op| op.state_since_ms);
        if let Some(since) = since {
            oldest = oldest.max(now_ms.saturating_sub(since));
        }
    }
    Ok(oldest)
}

/// An engine over an in-memory store with the standard policy, for unit tests.
#[cfg(test)]
pub(crate) fn test_engine(config: &serde_json::Value) -> Engine<crate::store::SqliteStore> {
    let config = Config::from_json(config).unwrap();
    test_engine_on(&config, crate::store::SqliteStore::in_memory().unwrap())
}

/// An engine over `store` with the standard policy, for unit tests.
#[cfg(test)]
pub(crate) fn test_engine_on<S: Store>(config: &Config, store: S) -> Engine<S> {
    use crate::runtime::{builtin, PolicyLimits};
    let runtime = Runtime::new().unwrap();
    let policy = runtime
        .load(
            builtin::get("standard").unwrap(),
            PolicyLimits::DEFAULT.any_size(),
        )
        .unwrap();
    Engine::new(config.clone(), store, runtime, Arc::new(policy))
}
