//! The simulation's events: what happens next and when, in the order the event loop pops
//! them (the earliest first, ties in the order they were made).

use crate::engine::ProviderLimits;
use std::cmp::Ordering;

/// How a provider call ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Call {
    Succeeded {
        output_tokens: u64,
    },
    Failed {
        kind: &'static str,
        retry_after_ms: Option<u64>,
    },
    Unknown {
        output_tokens: u64,
    },
}

#[derive(Debug)]
pub(super) enum Event {
    /// A caller (re)asks for admission.
    Admit(u32),
    /// A provider call ends.
    CallEnd {
        op: u32,
        attempt: u32,
        worker: Option<u32>,
        /// Whether the call held one of the provider's places.
        held: bool,
        /// The simulated deployment it was sent to, and whether it held one of its places.
        deployment: Option<(usize, bool)>,
        /// What the deployment's answer said of its limits.
        limits: Option<ProviderLimits>,
        call: Call,
    },
    /// An unknown call is found to have succeeded.
    Reconcile {
        op: u32,
        attempt: u32,
        output_tokens: u64,
    },
    /// A worker asks for work.
    Poll(u32),
    /// A waiting call's give-up or refill time: the waiting room is looked at.
    Wake,
    /// The time series take a point.
    Sample,
}

/// An event at its time; `seq` orders events of one time as they were made.
pub(super) struct Timed {
    pub(super) t: i64,
    pub(super) seq: u64,
    pub(super) event: Event,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.t, self.seq) == (other.t, other.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    /// Reversed: the heap pops the earliest event, ties in the order they were made.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.t, other.seq).cmp(&(self.t, self.seq))
    }
}
