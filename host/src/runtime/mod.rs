//! The wasmtime embedding: one [`wasmtime::Engine`], each component compiled once, and a
//! fresh, limited `Store` and instance for every decision, so that no decision can see state
//! another left in guest memory and a faulted instance is never reused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::Engine;

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
use host::HostState;

mod ahead;
pub mod builtin;
mod compiled_cache;
mod digest;
mod error;
mod host;
mod limits;
mod policy;
mod sealed_wasi;
mod view;
mod world_v1;
mod world_v3;

pub use compiled_cache::CompiledCache;
pub use digest::{hex, unhex32, PolicyDigest};
pub use host::{log_lines_dropped, LOG_LINES_PER_CALL, MAX_LOG_LINE_BYTES};
pub use sealed_wasi::{contexts_made as wasi_contexts_made, MAX_OUTPUT_BYTES};
pub use view::{DecisionView, Jitter, Params};

use ahead::AheadSlots;
use error::bounded_to;
pub use error::{LoadError, PolicyFault, MAX_MESSAGE_BYTES};
use limits::{
    no_swap, CORE_INSTANCES_PER_CALL, CORE_MODULE_HEADER, KEEP_RESIDENT_WITH_SCAN,
    MEMORIES_PER_CALL,
};
pub use limits::{
    PolicyLimits, PoolConfig, HOST_CALLS_PER_CALL, MAX_PARAM_NAME_BYTES, MAX_POLICY_MEMORY,
    POOL_SLOTS,
};
pub use policy::{Decider, LoadedPolicy, WorldVersion};
use policy::{Pre, DECIDE_EXPORT};

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
    /// The instance pool it was made with.
    pool: PoolConfig,
    /// Fresh instances each policy it loads keeps ready (0: each call instantiates its own).
    instances_ahead: usize,
    /// The pool slots its policies' instances made ahead may hold, all together.
    ahead_slots: AheadSlots,
}

/// Components larger than this make at most two instances ahead (see
/// [`Runtime::set_instances_ahead`]): an interpreter's, whose instances each hold megabytes.
pub const LARGE_COMPONENT_BYTES: usize = 1 << 20;

/// Told how long each guest call took (instantiation included, unless the instance was
/// made ahead), for metrics.
pub type CallObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

impl Runtime {
    /// The process's one engine, with the sandbox's limits and the default pool of
    /// instances ([`PoolConfig::default`]).
    ///
    /// # Errors
    /// When wasmtime cannot make its engine (the address space for the pool cannot be
    /// reserved, say).
    pub fn new() -> wasmtime::Result<Self> {
        Self::with_pool(PoolConfig::default())
    }

    /// As [`Runtime::new`], with an instance pool of `pool`'s size.
    ///
    /// # Errors
    /// When `pool` is out of its bounds (see [`PoolConfig::check`]), or wasmtime cannot
    /// make its engine.
    pub fn with_pool(pool: PoolConfig) -> wasmtime::Result<Self> {
        let pool_config = pool.check().map_err(wasmtime::Error::msg)?;
        let (slots, max_memory) = (pool_config.slots, pool_config.max_memory_bytes);
        let mut config = wasmtime::Config::new();
        config.consume_fuel(true);
        // Each pool slot reserves room for the largest memory a policy may be allowed;
        // only what a policy touches is ever backed.
        config.memory_reservation(max_memory);
        config.memory_guard_size(64 << 10);
        // A fresh instance per decision is the isolation guarantee; the pooling allocator
        // makes it cheap (slots are reused, memory reset by copy-on-write, pages kept resident).
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        // An interpreter's component is a dozen core instances sharing one or two memories.
        pool.total_component_instances(slots)
            .total_core_instances(slots * CORE_INSTANCES_PER_CALL)
            .total_memories(slots * MEMORIES_PER_CALL)
            .total_tables(slots * CORE_INSTANCES_PER_CALL)
            .max_core_instances_per_component(CORE_INSTANCES_PER_CALL)
            .max_memories_per_component(MEMORIES_PER_CALL)
            .max_tables_per_component(CORE_INSTANCES_PER_CALL)
            .max_memory_size(max_memory as usize)
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
            pool: pool_config,
            instances_ahead: 0,
            // Decisions made in place keep at least half the pool, or 64 slots.
            ahead_slots: AheadSlots::new(slots - (slots / 2).min(64)),
        })
    }

    /// The instance pool this runtime was made with.
    pub fn pool(&self) -> PoolConfig {
        self.pool
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
    ///
    /// ```
    /// use tollgate::runtime::{builtin, PolicyLimits, Runtime};
    ///
    /// let runtime = Runtime::new().unwrap();
    /// let standard = runtime
    ///     .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
    ///     .unwrap();
    /// assert_eq!(standard.info.name, "standard");
    /// assert!(runtime.load(b"not a component", PolicyLimits::DEFAULT).is_err());
    /// ```
    ///
    /// # Errors
    /// [`LoadError`]: too big, not a component, not of a world this host serves, or its
    /// description faulted.
    pub fn load(&self, bytes: &[u8], limits: PolicyLimits) -> Result<LoadedPolicy, LoadError> {
        // No call may grow past what a pool slot holds.
        let limits = PolicyLimits {
            memory_bytes: limits.memory_bytes.min(self.pool.max_memory_bytes),
            ..limits
        };
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
            ahead: None,
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
        // An interpreter's component (megabytes of it) makes instances of megabytes each,
        // and a decision of hundreds of microseconds: two made ahead are enough, and hold
        // that memory twice rather than a dozen times.
        let depth = if bytes.len() > LARGE_COMPONENT_BYTES {
            self.instances_ahead.min(2)
        } else {
            self.instances_ahead
        };
        if depth > 0 {
            if let Some(slots) = self.ahead_slots.hold(depth) {
                policy.make_instances_ahead(depth, slots);
            }
        }
        Ok(policy)
    }
}

impl Runtime {
    /// Has every policy loaded from now on keep up to `depth` fresh instances ready, made
    /// (and the used ones dropped, in bunches of half as many) on a thread of its own: a
    /// decision then neither instantiates nor resets memory on the caller's thread. Still
    /// one fresh instance per call. A policy makes instances ahead only while the pool
    /// slots they may hold fit in what is set aside for them (all of the pool but half of
    /// it or 64 slots, whichever is fewer, shared by every policy this runtime loads);
    /// beyond that, and with 0, each call instantiates its own. A component larger than
    /// [`LARGE_COMPONENT_BYTES`] makes at most two ahead.
    pub fn set_instances_ahead(&mut self, depth: usize) {
        self.instances_ahead = depth;
    }

    /// Fresh instances each policy loaded from now on keeps ready (see
    /// [`Runtime::set_instances_ahead`]).
    pub fn instances_ahead(&self) -> usize {
        self.instances_ahead
    }

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

#[cfg(test)]
mod tests;
