//! What goes wrong with a policy: a component that cannot be loaded, a guest call that
//! faulted, and the bound on any text from a policy that reaches a log or a caller.

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
    pub(super) fn of(prefix: &str, error: &wasmtime::Error) -> Self {
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
pub(super) fn bounded(message: String) -> String {
    bounded_to(message, MAX_MESSAGE_BYTES)
}

/// `message` cut to at most `max` bytes at a character boundary, followed, when cut, by how
/// long it was.
pub(super) fn bounded_to(mut message: String, max: usize) -> String {
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
