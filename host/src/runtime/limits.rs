//! What one policy may use (its size, memory and fuel per call) and the bounds of the
//! instance pool every decision is instantiated from.

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
pub(super) const CORE_MODULE_HEADER: &[u8] = b"\0asm\x01\0\0\0";

/// Core instances and memories one guest call may have (a componentize-py component has
/// about a dozen instances; a Rust one has one or two).
pub(super) const CORE_INSTANCES_PER_CALL: u32 = 32;
pub(super) const MEMORIES_PER_CALL: u32 = 2;

/// Bytes of each memory and table a reset restores in place when the kernel lists dirty
/// pages: an interpreter's decision dirties a few MiB.
pub(super) const KEEP_RESIDENT_WITH_SCAN: usize = 16 << 20;

/// Whether the machine has no swap in use (`/proc/swaps` lists none).
pub(super) fn no_swap() -> bool {
    std::fs::read_to_string("/proc/swaps")
        .is_ok_and(|s| s.lines().skip(1).all(|l| l.trim().is_empty()))
}

/// Instances that may be live at once (decisions, self-checks and smoke decisions of
/// candidates). Past that an instantiation fails, and the decision fails closed.
pub const POOL_SLOTS: u32 = 256;

/// The instance pool a [`super::Runtime`] instantiates every decision from: how many
/// instances may be live at once, and the memory each slot reserves room for.
///
/// The address space reserved is about `slots × memories per call × max_memory_bytes`
/// (512 GiB with the defaults), none of it backed until a policy touches it. The defaults
/// suit the service; a program with few decisions at once and small policies may take
/// less, for a sandbox or a container that caps virtual memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Instances live at once; past that an instantiation fails and the decision fails
    /// closed (at least 1).
    pub slots: u32,
    /// The most linear memory any one policy call may grow to, in bytes (64 KiB, one wasm
    /// page, to [`MAX_POLICY_MEMORY`]). A policy's own limit above it is lowered to it.
    pub max_memory_bytes: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            slots: POOL_SLOTS,
            max_memory_bytes: MAX_POLICY_MEMORY,
        }
    }
}

/// One wasm page: the least memory a pool slot may hold.
const WASM_PAGE: u64 = 64 << 10;

impl PoolConfig {
    /// The pool as asked, or what is wrong with it.
    pub fn check(self) -> Result<Self, String> {
        if self.slots == 0 {
            return Err("the instance pool needs at least 1 slot".into());
        }
        if !(WASM_PAGE..=MAX_POLICY_MEMORY).contains(&self.max_memory_bytes) {
            return Err(format!(
                "the instance pool's max_memory_bytes is {}; it must be from {WASM_PAGE} \
                 (one wasm page) to {MAX_POLICY_MEMORY}",
                self.max_memory_bytes
            ));
        }
        Ok(self)
    }
}
