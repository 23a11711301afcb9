//! The host imports of the world, served from one decision's [`DecisionView`] under a
//! budget of host calls.

use super::bindings;
use super::{
    BucketKind, BucketLevel, DecisionView, SlotLevel, SlotScope, HOST_CALLS_PER_CALL,
    MAX_PARAM_NAME_BYTES,
};
use wasmtime::StoreLimits;

/// The per-decision store data.
pub(super) struct HostState {
    view: DecisionView,
    pub(super) limits: StoreLimits,
    /// Host calls this guest call may still make (see [`HOST_CALLS_PER_CALL`]).
    host_calls_left: u32,
}

impl HostState {
    pub(super) fn new(view: DecisionView, limits: StoreLimits) -> Self {
        HostState {
            view,
            limits,
            host_calls_left: HOST_CALLS_PER_CALL,
        }
    }

    /// Counts one host call, trapping the guest once its budget is spent.
    fn host_call(&mut self) -> wasmtime::Result<()> {
        match self.host_calls_left.checked_sub(1) {
            Some(left) => {
                self.host_calls_left = left;
                Ok(())
            }
            None => Err(wasmtime::Error::msg(format!(
                "the policy made more than {HOST_CALLS_PER_CALL} host calls in one call"
            ))),
        }
    }
}

impl bindings::tollgate::policy::types::Host for HostState {}

impl bindings::tollgate::policy::host::Host for HostState {
    fn now_ms(&mut self) -> wasmtime::Result<i64> {
        self.host_call()?;
        Ok(self.view.now_ms)
    }

    fn param(&mut self, name: String) -> wasmtime::Result<Option<f64>> {
        self.host_call()?;
        if name.len() > MAX_PARAM_NAME_BYTES {
            return Err(wasmtime::Error::msg(format!(
                "the policy asked for a parameter name of {} bytes (at most {MAX_PARAM_NAME_BYTES})",
                name.len()
            )));
        }
        Ok(self.view.params.get(&name).copied())
    }

    fn tenant_weight(&mut self) -> wasmtime::Result<u32> {
        self.host_call()?;
        Ok(self.view.weight)
    }

    fn bucket(&mut self, kind: BucketKind) -> wasmtime::Result<Option<BucketLevel>> {
        self.host_call()?;
        Ok(self.view.bucket(kind))
    }

    fn slots(&mut self, scope: SlotScope) -> wasmtime::Result<Option<SlotLevel>> {
        self.host_call()?;
        Ok(self.view.slots(scope))
    }

    fn random(&mut self, upper: u64) -> wasmtime::Result<u64> {
        self.host_call()?;
        Ok(self.view.jitter.below_inclusive(upper))
    }
}
