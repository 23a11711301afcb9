//! A loaded policy: the world it was built for, the [`Decider`] interface the engine decides
//! through, and [`LoadedPolicy`], which instantiates a component afresh for each guest call.

use super::ahead::{Ahead, Ready, SlotsHeld};
use super::bindings::{Policy, PolicyPre};
use super::error::bounded;
use super::host::{HostState, LogContext};
use super::limits::{CORE_INSTANCES_PER_CALL, MAX_POLICY_MEMORY, MEMORIES_PER_CALL};
use super::{
    world_v1, world_v3, Admission, CallObserver, DecisionView, FailureReport, PolicyDigest,
    PolicyFault, PolicyInfo, PolicyLimits, Request, RetryDecision,
};
use std::fmt;
use std::sync::Arc;
use wasmtime::component::{ComponentExportIndex, ComponentNamedList, Lift, Lower, TypedFunc};
use wasmtime::{Store, StoreLimitsBuilder};

/// The world a component was built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorldVersion {
    /// `tollgate:policy@0.1.0`.
    V0_1,
    /// `tollgate:policy@0.2.0`.
    V0_2,
    /// `tollgate:policy@0.3.0`: 0.2.0 with the `explain` import.
    V0_3,
}

impl WorldVersion {
    /// The version as WIT spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "0.1.0",
            WorldVersion::V0_2 => "0.2.0",
            WorldVersion::V0_3 => "0.3.0",
        }
    }
}

impl fmt::Display for WorldVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the engine decides with: a policy behind the WIT interface's shapes. Implemented by
/// wasm components ([`LoadedPolicy`]) and by native Rust rules (the benchmarks' native build of
/// the standard rules), so both run through the same host interface.
pub trait Decider: Send + Sync {
    /// The SHA-256 of what decides.
    fn digest(&self) -> &PolicyDigest;
    /// The name and version it gives itself.
    fn info(&self) -> &PolicyInfo;
    /// The world of a component; `None` for rules compiled into the host.
    fn world(&self) -> Option<WorldVersion> {
        None
    }
    /// Plans or refuses one admission.
    fn admit(&self, view: DecisionView, req: &Request) -> Result<Admission, PolicyFault>;
    /// As [`Decider::admit`], with the words the policy gave the caller about it, if any.
    fn admit_explained(
        &self,
        view: DecisionView,
        req: &Request,
    ) -> Result<(Admission, Option<String>), PolicyFault> {
        self.admit(view, req).map(|a| (a, None))
    }
    /// Retries or gives up after a failure.
    fn on_failure(
        &self,
        view: DecisionView,
        report: &FailureReport,
    ) -> Result<RetryDecision, PolicyFault>;
    /// Checks its own parameters; `Err` refuses activation.
    fn self_check(&self, view: DecisionView) -> Result<Result<(), String>, PolicyFault>;
    /// Fresh instances made ahead and ready now, and the calls that found theirs ready
    /// since it was loaded (both 0 for what makes none ahead).
    fn instances_ahead(&self) -> (u64, u64) {
        (0, 0)
    }
}

impl Decider for LoadedPolicy {
    fn digest(&self) -> &PolicyDigest {
        &self.digest
    }
    fn info(&self) -> &PolicyInfo {
        &self.info
    }
    fn world(&self) -> Option<WorldVersion> {
        Some(self.world)
    }
    fn admit(&self, view: DecisionView, req: &Request) -> Result<Admission, PolicyFault> {
        LoadedPolicy::admit(self, view, req)
    }
    fn admit_explained(
        &self,
        view: DecisionView,
        req: &Request,
    ) -> Result<(Admission, Option<String>), PolicyFault> {
        LoadedPolicy::admit_explained(self, view, req)
    }
    fn on_failure(
        &self,
        view: DecisionView,
        report: &FailureReport,
    ) -> Result<RetryDecision, PolicyFault> {
        LoadedPolicy::on_failure(self, view, report)
    }
    fn self_check(&self, view: DecisionView) -> Result<Result<(), String>, PolicyFault> {
        LoadedPolicy::self_check(self, view)
    }
    fn instances_ahead(&self) -> (u64, u64) {
        LoadedPolicy::instances_ahead(self)
    }
}

/// The interface a policy of the newest world exports.
pub(super) const DECIDE_EXPORT: &str = "tollgate:policy/decide@0.2.0";

/// A component's instance factory, typed by its world.
pub(super) enum Pre {
    V0_1(world_v1::PolicyPre<HostState>),
    V0_2(PolicyPre<HostState>),
    V0_3(world_v3::PolicyPre<HostState>),
}

impl Pre {
    pub(super) fn instance_pre(&self) -> &wasmtime::component::InstancePre<HostState> {
        match self {
            Pre::V0_1(p) => p.instance_pre(),
            Pre::V0_2(p) => p.instance_pre(),
            Pre::V0_3(p) => p.instance_pre(),
        }
    }
}

/// A compiled, world-checked policy, ready to instantiate cheaply for each decision.
pub struct LoadedPolicy {
    /// The SHA-256 of the component.
    pub digest: PolicyDigest,
    /// The name and version it gave itself.
    pub info: PolicyInfo,
    /// The world it was built for.
    pub world: WorldVersion,
    pub(super) pre: Pre,
    /// The exports called per decision, looked up once: a decision instantiates and
    /// fetches only the one it calls (the bindings would fetch and type-check all four).
    pub(super) admit: ComponentExportIndex,
    pub(super) on_failure: ComponentExportIndex,
    pub(super) observer: Option<CallObserver>,
    pub(super) limits: PolicyLimits,
    /// The digest as log lines name it.
    pub(super) digest_hex: Arc<str>,
    /// Instances made ahead on a thread of their own, when the runtime asks for them
    /// ([`super::Runtime::set_instances_ahead`]).
    pub(super) ahead: Option<Ahead>,
}

impl fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.info.name, self.info.version, self.digest
        )
    }
}

impl LoadedPolicy {
    /// Runs one guest call in a fresh instance with fuel and memory limits, through the
    /// bindings of the component's world (which fetch and type-check every export).
    pub(super) fn call<T>(
        &self,
        view: DecisionView,
        v3: impl FnOnce(&world_v3::Policy, &mut Store<HostState>) -> wasmtime::Result<T>,
        v2: impl FnOnce(&Policy, &mut Store<HostState>) -> wasmtime::Result<T>,
        v1: impl FnOnce(&world_v1::Policy, &mut Store<HostState>) -> wasmtime::Result<T>,
    ) -> Result<T, PolicyFault> {
        self.observed(|| {
            let mut store = self.store(view, String::new())?;
            let instantiation = |e: wasmtime::Error| PolicyFault::of("instantiation: ", &e);
            let result = match &self.pre {
                Pre::V0_3(pre) => {
                    let instance = pre.instantiate(&mut store).map_err(instantiation)?;
                    v3(&instance, &mut store)
                }
                Pre::V0_2(pre) => {
                    let instance = pre.instantiate(&mut store).map_err(instantiation)?;
                    v2(&instance, &mut store)
                }
                Pre::V0_1(pre) => {
                    let instance = pre.instantiate(&mut store).map_err(instantiation)?;
                    v1(&instance, &mut store)
                }
            };
            store.data_mut().flush_output();
            result.map_err(|e| PolicyFault::of("", &e))
        })
    }

    /// Runs `call`, telling the observer how long it took.
    fn observed<T>(&self, call: impl FnOnce() -> Result<T, PolicyFault>) -> Result<T, PolicyFault> {
        let started = std::time::Instant::now();
        let result = call();
        if let Some(observe) = &self.observer {
            observe(started.elapsed());
        }
        result
    }

    /// A store for one guest call about operation `key`, with its fuel and memory limits.
    fn store(&self, view: DecisionView, key: String) -> Result<Store<HostState>, PolicyFault> {
        new_store(
            self.pre.instance_pre().component().engine(),
            &self.limits,
            &self.digest_hex,
            view,
            key,
        )
    }

    /// Starts the thread that keeps `depth` fresh instances of this policy ready for
    /// [`LoadedPolicy::call_export`] and drops the used ones.
    pub(super) fn make_instances_ahead(&mut self, depth: usize, slots: SlotsHeld) {
        let pre = self.pre.instance_pre().clone();
        let (limits, digest_hex) = (self.limits, self.digest_hex.clone());
        self.ahead = Ahead::start(depth, slots, move || {
            let view = DecisionView::scratch(Arc::default());
            fresh(&pre, &limits, &digest_hex, view, String::new()).ok()
        });
    }

    /// Instances made ahead and ready now, and calls that found theirs ready so far (both 0
    /// when none are made ahead).
    pub fn instances_ahead(&self) -> (u64, u64) {
        self.ahead.as_ref().map_or((0, 0), Ahead::counts)
    }

    /// Calls one export of `decide` in a fresh instance, with what the policy `explain`ed
    /// during the call. `P` and `R` must be the export's parameter and result types as the
    /// bindings spell them.
    fn call_export<P, R>(
        &self,
        view: DecisionView,
        key: &str,
        export: &ComponentExportIndex,
        params: P,
    ) -> Result<(R, Option<String>), PolicyFault>
    where
        P: ComponentNamedList + Lower,
        R: ComponentNamedList + Lift,
    {
        self.observed(|| {
            let Ready {
                mut store,
                instance,
            } = match self.ahead.as_ref().and_then(Ahead::take) {
                Some(mut ready) => {
                    ready.store.data_mut().begin(view, key.to_string());
                    ready
                }
                None => fresh(
                    self.pre.instance_pre(),
                    &self.limits,
                    &self.digest_hex,
                    view,
                    key.to_string(),
                )?,
            };
            let func = instance
                .get_func(&mut store, export)
                .ok_or_else(|| PolicyFault("the export went missing".into()))?;
            // SAFETY: every instance of `pre` has the component's types, and `load` checked
            // them when it first instantiated it through the bindings; `admit` and
            // `on_failure` pass the types the bindings give these exports.
            let typed = unsafe { TypedFunc::<P, R>::new_unchecked(func) };
            let result = typed.call(&mut store, params);
            store.data_mut().flush_output();
            let words = store.data_mut().take_explanation();
            if let Some(ahead) = &self.ahead {
                ahead.give_back(store);
            }
            result
                .map(|r| (r, words))
                .map_err(|e| PolicyFault::of("", &e))
        })
    }

    /// Plans or refuses one admission, in a fresh instance.
    pub fn admit(&self, view: DecisionView, req: &Request) -> Result<Admission, PolicyFault> {
        self.admit_explained(view, req).map(|(a, _)| a)
    }

    /// As [`LoadedPolicy::admit`], with the words the policy gave for it (world 0.3.0's
    /// `explain`; none for older worlds).
    pub fn admit_explained(
        &self,
        view: DecisionView,
        req: &Request,
    ) -> Result<(Admission, Option<String>), PolicyFault> {
        Ok(match self.world {
            // 0.3.0's records are 0.2.0's.
            WorldVersion::V0_2 | WorldVersion::V0_3 => {
                let ((admission,), words) = self.call_export::<(&Request,), (Admission,)>(
                    view,
                    &req.key,
                    &self.admit,
                    (req,),
                )?;
                (admission, words)
            }
            WorldVersion::V0_1 => {
                let old = world_v1::request(req);
                let ((admission,), _) =
                    self.call_export::<(&_,), (_,)>(view, &req.key, &self.admit, (&old,))?;
                (world_v1::admission(admission), None)
            }
        })
    }

    /// Retries or gives up after a failure, in a fresh instance.
    pub fn on_failure(
        &self,
        view: DecisionView,
        report: &FailureReport,
    ) -> Result<RetryDecision, PolicyFault> {
        Ok(match self.world {
            WorldVersion::V0_2 | WorldVersion::V0_3 => {
                self.call_export::<(&FailureReport,), (RetryDecision,)>(
                    view,
                    &report.key,
                    &self.on_failure,
                    (report,),
                )?
                .0
                 .0
            }
            WorldVersion::V0_1 => {
                let old = world_v1::failure_report(report);
                let ((decision,), _) =
                    self.call_export::<(&_,), (_,)>(view, &report.key, &self.on_failure, (&old,))?;
                world_v1::retry_decision(decision)
            }
        })
    }

    /// Runs the component's self-check, in a fresh instance.
    pub fn self_check(&self, view: DecisionView) -> Result<Result<(), String>, PolicyFault> {
        let verdict = self.call(
            view,
            |p, s| p.tollgate_policy_decide().call_self_check(s),
            |p, s| p.tollgate_policy_decide().call_self_check(s),
            |p, s| p.tollgate_policy_decide().call_self_check(s),
        )?;
        Ok(verdict.map_err(bounded))
    }
}

/// A fresh instance of `pre` in a store of its own (see [`new_store`]).
fn fresh(
    pre: &wasmtime::component::InstancePre<HostState>,
    limits: &PolicyLimits,
    digest_hex: &Arc<str>,
    view: DecisionView,
    key: String,
) -> Result<Ready, PolicyFault> {
    let mut store = new_store(pre.component().engine(), limits, digest_hex, view, key)?;
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| PolicyFault::of("instantiation: ", &e))?;
    Ok(Ready { store, instance })
}

/// A store for one guest call about operation `key` of the policy `digest_hex` names, with
/// its fuel and memory limits.
fn new_store(
    engine: &wasmtime::Engine,
    limits: &PolicyLimits,
    digest_hex: &Arc<str>,
    view: DecisionView,
    key: String,
) -> Result<Store<HostState>, PolicyFault> {
    let store_limits = StoreLimitsBuilder::new()
        .memory_size(limits.memory_bytes.min(MAX_POLICY_MEMORY) as usize)
        .instances(CORE_INSTANCES_PER_CALL as usize)
        .tables(CORE_INSTANCES_PER_CALL as usize)
        .memories(MEMORIES_PER_CALL as usize)
        .trap_on_grow_failure(true)
        .build();
    let log = LogContext {
        digest: digest_hex.clone(),
        key,
    };
    let mut store = Store::new(engine, HostState::new(view, store_limits, log));
    store.limiter(|s| &mut s.limits);
    store
        .set_fuel(limits.fuel)
        .map_err(|e| PolicyFault::of("", &e))?;
    Ok(store)
}
