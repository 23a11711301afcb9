//! The wasmtime embedding: one [`wasmtime::Engine`], each component compiled once, and a
//! fresh, limited `Store` and instance for every decision, so that no decision can see state
//! another left in guest memory and a faulted instance is never reused.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, HasSelf, Lift, Linker, Lower, TypedFunc,
};
use wasmtime::{Engine, Store, StoreLimitsBuilder};

/// The world `tollgate:policy@0.2.0`: the host decides with its types, the older world is
/// adapted to it (`world_v1`), and the newest (`world_v3`, 0.3.0) shares them.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/0.2.0",
        world: "policy",
        // Every host function may trap: that is how a decision's host-call budget ends it.
        imports: { default: trappable },
    });
}

pub use bindings::tollgate::policy::types::{
    Admission, BucketKind, BucketLevel, Failure, FailureReport, GiveUpReason, LogLevel, Plan,
    PolicyInfo, Priority, Refusal, RefusalReason, Request, RetryDecision, Route, SlotLevel,
    SlotScope,
};
use bindings::{Policy, PolicyPre};
use host::{HostState, LogContext};

pub mod builtin;
mod compiled_cache;
mod digest;
mod host;
mod sealed_wasi;
mod view;
mod world_v1;
mod world_v3;

pub use compiled_cache::CompiledCache;
pub use digest::{hex, PolicyDigest};
pub use host::{log_lines_dropped, LOG_LINES_PER_CALL, MAX_LOG_LINE_BYTES};
pub use sealed_wasi::{contexts_made as wasi_contexts_made, MAX_OUTPUT_BYTES};
pub use view::{DecisionView, Jitter, Params};

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

/// The most linear memory any policy may be allowed per call (`limits.policy_memory_bytes`):
/// the size of each slot of the instance pool.
pub const MAX_POLICY_MEMORY: u64 = 1 << 30;

/// What one policy may use: its size, and per guest call its memory and fuel. Set by the
/// configuration's `limits` (docs/configuration.md); past any bound the call traps and the
/// decision fails closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyLimits {
    /// Largest component accepted, in bytes.
    pub max_bytes: u64,
    /// Linear memory one call may grow to, in bytes (at most [`MAX_POLICY_MEMORY`]).
    pub memory_bytes: u64,
    /// Fuel for one guest call (about one unit per wasm instruction).
    pub fuel: u64,
}

impl PolicyLimits {
    /// Fits an interpreter's component: 64 MiB of component (componentize-py's is 18 MB,
    /// componentize-js's 12 MB), 64 MiB of memory (either runs the standard rules in under
    /// 16 MiB) and 20 million units of fuel per call (about 2 ms of guest work on the
    /// reference machine; a standard decision takes a few thousand units in Rust, under a
    /// million in Python and under three million in JavaScript, whose first call is dearest).
    pub const DEFAULT: PolicyLimits = PolicyLimits {
        max_bytes: 64 << 20,
        memory_bytes: 64 << 20,
        fuel: 20_000_000,
    };

    /// These limits with no bound on the component's size (for components already
    /// accepted, such as those kept in the store).
    pub fn any_size(self) -> Self {
        PolicyLimits {
            max_bytes: u64::MAX,
            ..self
        }
    }
}

impl Default for PolicyLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}
/// Host calls one guest call may make. Fuel counts only guest instructions, and a host
/// call costs far more than the few units of fuel its guest side does, so without a bound
/// a module could spend a decision's fuel on millions of them. A standard decision makes
/// about ten.
pub const HOST_CALLS_PER_CALL: u32 = 1_000;
/// Longest `policy_params` name, in bytes. A longer name passed to `param` traps: the host
/// copies every string argument, and a module asking for a 16 MiB name in a loop held one
/// decision for minutes on the reference machine.
pub const MAX_PARAM_NAME_BYTES: usize = 256;
/// How a core wasm module starts (magic and version 1); a component has another version
/// and layer. A policy author's build makes a core module first.
const CORE_MODULE_HEADER: &[u8] = b"\0asm\x01\0\0\0";

/// Core instances and memories one guest call may have (a componentize-py component has
/// about a dozen instances; a Rust one has one or two).
const CORE_INSTANCES_PER_CALL: u32 = 32;
const MEMORIES_PER_CALL: u32 = 2;

/// Bytes of each memory and table a reset restores in place when the kernel lists dirty
/// pages: an interpreter's decision dirties a few MiB.
const KEEP_RESIDENT_WITH_SCAN: usize = 16 << 20;

/// Whether the machine has no swap in use (`/proc/swaps` lists none).
fn no_swap() -> bool {
    std::fs::read_to_string("/proc/swaps")
        .is_ok_and(|s| s.lines().skip(1).all(|l| l.trim().is_empty()))
}

/// Instances that may be live at once (decisions, self-checks and smoke decisions of
/// candidates). Past that an instantiation fails, and the decision fails closed.
pub const POOL_SLOTS: u32 = 256;

/// A policy that could not be loaded, with what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("policy is {size} bytes, over the limit of {limit}")]
    /// Over `limits.max_policy_bytes`.
    TooBig {
        /// The component's size.
        size: usize,
        /// The limit.
        limit: u64,
    },
    /// Not a valid component.
    #[error("not a valid component: {0}")]
    Compile(String),
    /// A component of another world: a missing or mistyped import or export.
    #[error("component does not satisfy a tollgate:policy world (0.3.0, 0.2.0 or 0.1.0): {0}")]
    World(String),
    /// Its self-check failed, with its message.
    #[error("policy self-check failed: {0}")]
    SelfCheck(String),
    /// It faulted while describing or checking itself.
    #[error("policy faulted while being checked: {0}")]
    Fault(PolicyFault),
}

/// A guest call that trapped, ran out of fuel or memory, or broke the contract.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyFault(pub String);

impl PolicyFault {
    /// The fault of a failed guest call, [`bounded`]: its cause first (`wasm trap: all
    /// fuel consumed`, say), then the whole chain, whose wasm backtrace has a line per
    /// frame of the guest's stack and is what gets cut.
    fn of(prefix: &str, error: &wasmtime::Error) -> Self {
        let cause = error.root_cause().to_string();
        let message = if error.chain().count() > 1 {
            format!("{prefix}{cause}; {error:#}")
        } else {
            format!("{prefix}{error:#}")
        };
        PolicyFault(bounded(message))
    }
}

/// Longest text from a policy call that goes on into a log line or an HTTP answer, in bytes.
/// A self-check's message is the module's own, and a trap's backtrace has a line per frame
/// of the guest's stack: a hostile module could otherwise put megabytes into either.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] at a character boundary, followed, when
/// cut, by how long it was.
fn bounded(message: String) -> String {
    bounded_to(message, MAX_MESSAGE_BYTES)
}

/// `message` cut to at most `max` bytes at a character boundary, followed, when cut, by how
/// long it was.
fn bounded_to(mut message: String, max: usize) -> String {
    let total = message.len();
    if total > max {
        let cut = (0..=max)
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0);
        message.truncate(cut);
        message.push_str(&format!(" … ({total} bytes in all)"));
    }
    message
}

/// The one wasmtime engine of the process and the linker holding the host imports.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    /// Compiled components by digest: identical bytes compile once per process, so swapping
    /// back to a version seen before costs an instantiation check, not a compilation.
    compiled: Arc<Mutex<HashMap<PolicyDigest, Component>>>,
    /// Compiled components kept on disk across processes, when set.
    disk: Option<CompiledCache>,
    /// Components this runtime compiled (not found in either cache).
    compilations: Arc<AtomicU64>,
    observer: Option<CallObserver>,
}

/// Told how long each guest call took (instantiation included), for metrics.
pub type CallObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

impl Runtime {
    /// The process's one engine, with the sandbox's limits and a pool of instances.
    pub fn new() -> wasmtime::Result<Self> {
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true);
        // Each pool slot reserves room for the largest memory a configuration may allow;
        // only what a policy touches is ever backed.
        config.memory_reservation(MAX_POLICY_MEMORY);
        config.memory_guard_size(64 << 10);
        // A fresh instance per decision is the isolation guarantee; the pooling allocator
        // makes it cheap (slots are reused, memory reset by copy-on-write, pages kept resident).
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        // An interpreter's component is a dozen core instances sharing one or two memories.
        pool.total_component_instances(POOL_SLOTS)
            .total_core_instances(POOL_SLOTS * CORE_INSTANCES_PER_CALL)
            .total_memories(POOL_SLOTS * MEMORIES_PER_CALL)
            .total_tables(POOL_SLOTS * CORE_INSTANCES_PER_CALL)
            .max_core_instances_per_component(CORE_INSTANCES_PER_CALL)
            .max_memories_per_component(MEMORIES_PER_CALL)
            .max_tables_per_component(CORE_INSTANCES_PER_CALL)
            .max_memory_size(MAX_POLICY_MEMORY as usize)
            .linear_memory_keep_resident(256 << 10)
            .table_keep_resident(16 << 10);
        // Where the kernel can list the pages a decision dirtied (PAGEMAP_SCAN, Linux 6.7+),
        // a slot is reset by restoring just those pages and stays mapped: an interpreter's
        // decision then costs half as much as with the pages dropped and faulted in again.
        // Only without swap: a dirty page swapped out is not seen by the scan, and would
        // carry one decision's memory into the next (wasmtime PR 14357).
        if no_swap() {
            pool.pagemap_scan(wasmtime::Enabled::Auto)
                .linear_memory_keep_resident(KEEP_RESIDENT_WITH_SCAN)
                .table_keep_resident(KEEP_RESIDENT_WITH_SCAN);
        }
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        Policy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        world_v1::Policy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        world_v3::Policy::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        sealed_wasi::add_to_linker(&mut linker)?;
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
            compiled: Arc::default(),
            disk: None,
            compilations: Arc::default(),
            observer: None,
        })
    }

    /// Keeps compiled components in `cache` too, and looks there before compiling.
    pub fn with_compiled_cache(mut self, cache: CompiledCache) -> Self {
        self.disk = Some(cache);
        self
    }

    /// How many components this runtime has compiled (a cache hit compiles nothing).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// Compiles a component, checks it against the world, and asks it to describe itself.
    /// The self-check is separate: see [`LoadedPolicy::self_check`].
    pub fn load(&self, bytes: &[u8], limits: PolicyLimits) -> Result<LoadedPolicy, LoadError> {
        if bytes.len() as u64 > limits.max_bytes {
            return Err(LoadError::TooBig {
                size: bytes.len(),
                limit: limits.max_bytes,
            });
        }
        let digest = PolicyDigest::of(bytes);
        let component = self.compile(&digest, bytes)?;
        // The world is the one whose `decide` the component exports; without either, the
        // newest world's checks name what is missing.
        let exports = |name| component.get_export_index(None, name).is_some();
        let world = if exports(world_v3::DECIDE_EXPORT) {
            WorldVersion::V0_3
        } else if exports(world_v1::DECIDE_EXPORT) && !exports(DECIDE_EXPORT) {
            WorldVersion::V0_1
        } else {
            WorldVersion::V0_2
        };
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::World(format!("{e:#}")))?;
        let world_error = |e: wasmtime::Error| LoadError::World(format!("{e:#}"));
        let (pre, decide_export) = match world {
            WorldVersion::V0_1 => (
                Pre::V0_1(world_v1::PolicyPre::new(instance_pre).map_err(world_error)?),
                world_v1::DECIDE_EXPORT,
            ),
            WorldVersion::V0_2 => (
                Pre::V0_2(PolicyPre::new(instance_pre).map_err(world_error)?),
                DECIDE_EXPORT,
            ),
            WorldVersion::V0_3 => (
                Pre::V0_3(world_v3::PolicyPre::new(instance_pre).map_err(world_error)?),
                world_v3::DECIDE_EXPORT,
            ),
        };
        let export = |name: &str| {
            let component = pre.instance_pre().component();
            component
                .get_export_index(None, decide_export)
                .and_then(|decide| component.get_export_index(Some(&decide), name))
                .ok_or_else(|| LoadError::World(format!("no export `{decide_export}#{name}`")))
        };
        let digest_hex: Arc<str> = digest.to_string().into();
        let mut policy = LoadedPolicy {
            world,
            observer: self.observer.clone(),
            digest,
            info: PolicyInfo {
                name: String::new(),
                version: String::new(),
            },
            admit: export("admit")?,
            on_failure: export("on-failure")?,
            pre,
            limits,
            digest_hex,
        };
        // The first instantiation goes through the bindings, which type-check every export
        // of `decide` against the world: from here on, `call_export` may trust the types.
        let view = DecisionView::scratch(Arc::default());
        let info = policy
            .call(
                view,
                |p, s| p.tollgate_policy_decide().call_describe(s),
                |p, s| p.tollgate_policy_decide().call_describe(s),
                |p, s| {
                    let info = p.tollgate_policy_decide().call_describe(s)?;
                    Ok(world_v1::info(info))
                },
            )
            .map_err(LoadError::Fault)?;
        if info.name.is_empty() || info.name.len() > 128 || info.version.len() > 128 {
            return Err(LoadError::World(
                "describe must give a name of 1 to 128 bytes and a version of at most 128".into(),
            ));
        }
        policy.info = info;
        Ok(policy)
    }
}

impl Runtime {
    /// Reports the duration of every guest call of policies loaded from now on.
    pub fn set_call_observer(&mut self, observer: CallObserver) {
        self.observer = Some(observer);
    }

    fn compile(&self, digest: &PolicyDigest, bytes: &[u8]) -> Result<Component, LoadError> {
        let cached = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .cloned();
        if let Some(c) = cached {
            return Ok(c);
        }
        if bytes.starts_with(CORE_MODULE_HEADER) {
            return Err(LoadError::Compile(
                "this is a core wasm module, not a component: `tollgate policy build DIR` builds \
                 a policy project into one; for a module built otherwise, \
                 `wasm-tools component new MODULE.wasm -o POLICY.wasm` (docs/writing-policies.md)"
                    .into(),
            ));
        }
        let on_disk = self.disk.as_ref().and_then(|d| d.get(&self.engine, digest));
        let component = match on_disk {
            Some(c) => c,
            None => {
                let c = Component::new(&self.engine, bytes)
                    .map_err(|e| LoadError::Compile(format!("{e:#}")))?;
                self.compilations.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = &self.disk {
                    d.put(&self.engine, digest, &c);
                }
                c
            }
        };
        let mut cache = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        // A bounded cache: a process that sees many versions forgets the old ones.
        if cache.len() >= 32 {
            cache.clear();
        }
        cache.insert(digest.clone(), component.clone());
        Ok(component)
    }
}

/// What the engine decides with: a policy behind the WIT interface's shapes. Implemented by
/// wasm components ([`LoadedPolicy`]) and by native Rust rules (the benchmarks' native build of the standard rules), so both
/// run through the same host interface.
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
}

/// The interface a policy of the newest world exports.
const DECIDE_EXPORT: &str = "tollgate:policy/decide@0.2.0";

/// A component's instance factory, typed by its world.
enum Pre {
    V0_1(world_v1::PolicyPre<HostState>),
    V0_2(PolicyPre<HostState>),
    V0_3(world_v3::PolicyPre<HostState>),
}

impl Pre {
    fn instance_pre(&self) -> &wasmtime::component::InstancePre<HostState> {
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
    pre: Pre,
    /// The exports called per decision, looked up once: a decision instantiates and
    /// fetches only the one it calls (the bindings would fetch and type-check all four).
    admit: ComponentExportIndex,
    on_failure: ComponentExportIndex,
    observer: Option<CallObserver>,
    limits: PolicyLimits,
    /// The digest as log lines name it.
    digest_hex: Arc<str>,
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
    fn call<T>(
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
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes.min(MAX_POLICY_MEMORY) as usize)
            .instances(CORE_INSTANCES_PER_CALL as usize)
            .tables(CORE_INSTANCES_PER_CALL as usize)
            .memories(MEMORIES_PER_CALL as usize)
            .trap_on_grow_failure(true)
            .build();
        let log = LogContext {
            digest: self.digest_hex.clone(),
            key,
        };
        let engine = self.pre.instance_pre().component().engine();
        let mut store = Store::new(engine, HostState::new(view, limits, log));
        store.limiter(|s| &mut s.limits);
        store
            .set_fuel(self.limits.fuel)
            .map_err(|e| PolicyFault::of("", &e))?;
        Ok(store)
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
            let mut store = self.store(view, key.to_string())?;
            let instance = self
                .pre
                .instance_pre()
                .instantiate(&mut store)
                .map_err(|e| PolicyFault::of("instantiation: ", &e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A test fixture this build made (`policies/fixtures/`).
    fn fixture(name: &str) -> Vec<u8> {
        let dir = crate::scenario::default_fixtures();
        crate::scenario::resolve_policy(name, None, &dir).unwrap()
    }

    #[test]
    fn jitter_is_deterministic_and_bounded() {
        let mut a = Jitter::new(7, "acme", "k1", 1);
        let mut b = Jitter::new(7, "acme", "k1", 1);
        let mut c = Jitter::new(7, "acme", "k1", 2);
        let xs: Vec<u64> = (0..50).map(|_| a.below_inclusive(100)).collect();
        let ys: Vec<u64> = (0..50).map(|_| b.below_inclusive(100)).collect();
        let zs: Vec<u64> = (0..50).map(|_| c.below_inclusive(100)).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(xs.iter().all(|&x| x <= 100));
        assert_eq!(Jitter::new(1, "t", "k", 1).below_inclusive(0), 0);
    }

    #[test]
    fn a_compiled_component_is_kept_on_disk_checked_and_recompiled_when_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = builtin::get("standard").unwrap();
        let runtime = || {
            Runtime::new()
                .unwrap()
                .with_compiled_cache(CompiledCache::new(dir.path()))
        };
        let entries = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect::<Vec<_>>()
        };
        // A first process compiles and keeps the result.
        let first = runtime();
        assert_eq!(
            first
                .load(bytes, PolicyLimits::DEFAULT)
                .unwrap()
                .info()
                .name,
            "standard"
        );
        assert_eq!(first.compilations(), 1);
        let kept = entries();
        assert_eq!(kept.len(), 1, "{kept:?}");
        // A second process (a fresh engine) compiles nothing and decides the same way.
        let second = runtime();
        let loaded = second.load(bytes, PolicyLimits::DEFAULT).unwrap();
        assert_eq!(second.compilations(), 0);
        assert_eq!(loaded.digest(), &PolicyDigest::of(bytes));
        // One byte changed, or the entry cut short: never loaded, compiled again, rewritten.
        for damage in [
            |b: &mut Vec<u8>| {
                let i = b.len() / 2;
                b[i] ^= 0x40;
            },
            |b: &mut Vec<u8>| b.truncate(b.len() / 3),
        ] {
            let mut b = std::fs::read(&kept[0]).unwrap();
            damage(&mut b);
            std::fs::write(&kept[0], &b).unwrap();
            let third = runtime();
            assert_eq!(
                third
                    .load(bytes, PolicyLimits::DEFAULT)
                    .unwrap()
                    .info()
                    .name,
                "standard"
            );
            assert_eq!(third.compilations(), 1, "a damaged entry is compiled again");
            let fourth = runtime();
            fourth.load(bytes, PolicyLimits::DEFAULT).unwrap();
            assert_eq!(fourth.compilations(), 0, "and the sound entry is back");
        }
        // Another component has an entry of its own.
        runtime()
            .load(builtin::get("deny-all").unwrap(), PolicyLimits::DEFAULT)
            .unwrap();
        assert_eq!(entries().len(), 2);
    }

    /// Why loading a built-in fixture fails, and the error's text.
    fn load_error(name: &str) -> (LoadError, String) {
        let err = Runtime::new()
            .unwrap()
            .load(&fixture(name), PolicyLimits::DEFAULT)
            .unwrap_err();
        let text = err.to_string();
        (err, text)
    }

    #[test]
    fn broken_policy_is_refused_with_what_is_missing() {
        let (err, text) = load_error("broken");
        assert!(matches!(err, LoadError::World(_)), "{text}");
        assert!(text.contains("tollgate:policy/decide"), "{text}");
    }

    #[test]
    fn a_policy_whose_decision_exports_have_other_types_is_refused_at_load() {
        let (_, text) = load_error("mistyped");
        assert!(text.contains("type mismatch"), "{text}");
    }

    #[test]
    fn not_a_component_is_refused() {
        let rt = Runtime::new().unwrap();
        assert!(matches!(
            rt.load(b"\0asm garbage", PolicyLimits::DEFAULT),
            Err(LoadError::Compile(_))
        ));
        assert!(matches!(
            rt.load(
                &[0u8; 100],
                PolicyLimits {
                    max_bytes: 10,
                    ..PolicyLimits::DEFAULT
                }
            ),
            Err(LoadError::TooBig { .. })
        ));
    }

    #[test]
    fn a_core_module_is_refused_with_how_to_make_a_component() {
        // The smallest core module: the header alone.
        let err = Runtime::new()
            .unwrap()
            .load(b"\0asm\x01\0\0\0", PolicyLimits::DEFAULT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("core wasm module"), "{err}");
        assert!(err.contains("wasm-tools component new"), "{err}");
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary_and_say_how_long_they_were() {
        assert_eq!(bounded("short".into()), "short");
        let exact = "x".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(bounded(exact.clone()), exact);
        // Two-byte characters from the first byte: the cut falls inside one at 1024 + 1.
        let long = format!("x{}", "é".repeat(MAX_MESSAGE_BYTES));
        let cut = bounded(long.clone());
        let (kept, note) = cut.split_once(" … ").unwrap();
        assert!(
            long.starts_with(kept) && kept.len() == MAX_MESSAGE_BYTES - 1,
            "{}",
            kept.len()
        );
        assert_eq!(note, format!("({} bytes in all)", long.len()));
    }

    #[test]
    fn what_a_hostile_module_says_about_itself_is_bounded() {
        let rt = Runtime::new().unwrap();
        let load = |name| rt.load(&fixture(name), PolicyLimits::DEFAULT).unwrap();
        let scratch = || DecisionView::scratch(Arc::default());
        // A self-check failing with 4 MiB of text.
        let message = load("verbose").self_check(scratch()).unwrap().unwrap_err();
        assert!(message.len() < MAX_MESSAGE_BYTES + 64, "{}", message.len());
        assert!(
            message.ends_with(&format!("({} bytes in all)", 4 << 20)),
            "{message}"
        );
        // A trap whose backtrace has a line for every frame of a runaway recursion.
        let fault = faulty_admit("deep-1");
        assert!(fault.0.len() < MAX_MESSAGE_BYTES + 64, "{}", fault.0.len());
        // The cause comes first, so the cut keeps it (the guest's shadow stack runs below
        // address 0 before wasmtime's own stack limit is reached).
        assert!(fault.0.starts_with("wasm trap: "), "{}", fault.0);
        assert!(fault.0.contains("bytes in all"), "{}", fault.0);
    }

    /// The fault of `faulty` deciding on a request with `key`.
    fn faulty_admit(key: &str) -> PolicyFault {
        let faulty = Runtime::new()
            .unwrap()
            .load(&fixture("faulty"), PolicyLimits::DEFAULT)
            .unwrap();
        let request = Request {
            tenant: "acme".into(),
            key: key.into(),
            route: Route::Interactive,
            input_tokens: 1,
            optional_context_tokens: 0,
            max_output_tokens: 1,
            deadline_ms: 1,
            size_bytes: 0,
            attempt: 1,
            model: None,
            priority: Priority::Standard,
            labels: Vec::new(),
        };
        let view = DecisionView::scratch(Arc::default());
        faulty.admit(view, &request).unwrap_err()
    }

    #[test]
    fn host_calls_are_budgeted_and_parameter_names_bounded() {
        // Fuel alone let these run for 140 ms and for minutes: the traps are the host's.
        let chatty = faulty_admit("chatty-1");
        assert!(
            chatty.0.contains("more than 1000 host calls"),
            "{}",
            chatty.0
        );
        let loud = faulty_admit("loud-1");
        assert!(
            loud.0
                .contains(&format!("a parameter name of {} bytes", 16 << 20)),
            "{}",
            loud.0
        );
    }

    fn request(key: &str) -> Request {
        Request {
            tenant: "acme".into(),
            key: key.into(),
            route: Route::Interactive,
            input_tokens: 10,
            optional_context_tokens: 5,
            max_output_tokens: 500,
            deadline_ms: 60_000,
            size_bytes: 0,
            attempt: 1,
            model: Some("gpt-4o".into()),
            priority: Priority::Sheddable,
            labels: vec![("tier".into(), "free".into())],
        }
    }

    /// A component this repository keeps as built for an earlier world (`0.1.0`, `0.2.0`).
    fn kept(world: &str, name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../policies/fixtures/world-{world}/{name}.wasm",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    fn world_v1(name: &str) -> Vec<u8> {
        kept("0.1.0", name)
    }

    #[test]
    fn components_of_every_world_load_and_decide_alike() {
        let rt = Runtime::new().unwrap();
        let old = rt
            .load(&world_v1("standard"), PolicyLimits::DEFAULT)
            .unwrap();
        let v2 = rt
            .load(&kept("0.2.0", "standard"), PolicyLimits::DEFAULT)
            .unwrap();
        let new = rt
            .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
            .unwrap();
        assert_eq!(
            (old.world, v2.world, new.world),
            (WorldVersion::V0_1, WorldVersion::V0_2, WorldVersion::V0_3)
        );
        assert_eq!(old.info.name, "standard");
        let mut view = DecisionView::scratch(Arc::default());
        view.global_slots = Some(SlotLevel {
            in_use: 7,
            limit: 8,
        });
        let params = Params {
            numbers: [("degrade_at_slot_fraction".to_string(), 0.5)].into(),
            strings: Default::default(),
        };
        view.params = Arc::new(params);
        let mut req = request("k");
        req.priority = Priority::Standard;
        let a = old.admit(view.clone(), &req).unwrap();
        let b = new.admit(view.clone(), &req).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(
            format!("{:?}", v2.admit(view.clone(), &req).unwrap()),
            format!("{b:?}")
        );
        assert!(matches!(a, Admission::Admit(p) if p.max_output_tokens == 256));
        let report = FailureReport {
            tenant: "acme".into(),
            key: "k".into(),
            route: Route::Interactive,
            attempt: 1,
            failure: Some(Failure::RateLimited),
            provider_retry_after_ms: Some(700),
            deadline_ms: 60_000,
            max_output_tokens: 10,
            optional_context_tokens: 0,
            input_tokens: 10,
            model: None,
            priority: Priority::Standard,
        };
        let a = old.on_failure(view.clone(), &report).unwrap();
        let b = new.on_failure(view.clone(), &report).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let c = v2.on_failure(view.clone(), &report).unwrap();
        assert_eq!(format!("{c:?}"), format!("{b:?}"));
        // An old module's traps still fail closed.
        let faulty = rt.load(&world_v1("faulty"), PolicyLimits::DEFAULT).unwrap();
        assert!(faulty.admit(view, &request("trap-1")).is_err());
    }

    #[test]
    fn a_policy_reads_model_priority_labels_and_string_params_and_its_log_is_bounded() {
        let rt = Runtime::new().unwrap();
        let p = rt
            .load(&fixture("shed-model"), PolicyLimits::DEFAULT)
            .unwrap();
        let mut view = DecisionView::scratch(Arc::default());
        view.params = Arc::new(Params {
            numbers: Default::default(),
            strings: [("shed_model".to_string(), "gpt-4o".to_string())].into(),
        });
        let shed = p.admit(view.clone(), &request("a")).unwrap();
        assert!(matches!(shed, Admission::Refuse(r) if r.reason == RefusalReason::Overloaded));
        let mut other = request("b");
        other.model = Some("small".into());
        let capped = p.admit(view.clone(), &other).unwrap();
        assert!(matches!(capped, Admission::Admit(p) if p.max_output_tokens == 100));
        let before = log_lines_dropped();
        let mut flood = request("log-flood-1");
        flood.priority = Priority::Standard;
        assert!(
            p.admit(view, &flood).is_ok(),
            "a flood of log lines never traps"
        );
        let dropped = log_lines_dropped() - before;
        assert!(dropped >= u64::from(20 - LOG_LINES_PER_CALL), "{dropped}");
    }

    #[test]
    fn a_policy_that_imports_no_wasi_never_makes_a_wasi_context() {
        let rt = Runtime::new().unwrap();
        let before = wasi_contexts_made();
        let p = rt
            .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
            .unwrap();
        let view = DecisionView::scratch(Arc::default());
        assert!(p.self_check(view.clone()).unwrap().is_ok());
        assert!(matches!(
            p.admit(view, &request("k")).unwrap(),
            Admission::Admit(_)
        ));
        assert_eq!(wasi_contexts_made(), before);
    }

    #[test]
    fn standard_policy_describes_itself() {
        let rt = Runtime::new().unwrap();
        let p = rt
            .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
            .unwrap();
        assert_eq!(p.info.name, "standard");
        assert_eq!(
            p.digest,
            PolicyDigest::of(builtin::get("standard").unwrap())
        );
    }
}
