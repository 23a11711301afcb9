//! The world `tollgate:policy@0.3.0`: 0.2.0's records unchanged, and one more host import,
//! `explain`, with which a policy gives the caller words about its refusal or degradation.
//! Its types are 0.2.0's Rust types (the records are the same), so a 0.3.0 component is
//! called exactly as a 0.2.0 one; only its imports differ.

use super::host::HostState;
use super::{BucketKind, BucketLevel, LogLevel, SlotLevel, SlotScope};

#[allow(missing_docs)]
pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/0.3.0",
        world: "policy",
        imports: { default: trappable },
        with: {
            "tollgate:policy/types": crate::runtime::bindings::tollgate::policy::types,
        },
    });
}

pub(super) use bindings::{Policy, PolicyPre};

/// The interface a 0.3.0 policy exports.
pub(super) const DECIDE_EXPORT: &str = "tollgate:policy/decide@0.3.0";

use super::bindings::tollgate::policy::host::Host as V2;

/// 0.2.0's imports, served as they are; `explain` keeps the decision's words.
impl bindings::tollgate::policy::host::Host for HostState {
    fn now_ms(&mut self) -> wasmtime::Result<i64> {
        V2::now_ms(self)
    }
    fn param(&mut self, name: String) -> wasmtime::Result<Option<f64>> {
        V2::param(self, name)
    }
    fn param_string(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        V2::param_string(self, name)
    }
    fn log(&mut self, level: LogLevel, message: String) -> wasmtime::Result<()> {
        V2::log(self, level, message)
    }
    fn tenant_weight(&mut self) -> wasmtime::Result<u32> {
        V2::tenant_weight(self)
    }
    fn bucket(&mut self, kind: BucketKind) -> wasmtime::Result<Option<BucketLevel>> {
        V2::bucket(self, kind)
    }
    fn slots(&mut self, scope: SlotScope) -> wasmtime::Result<Option<SlotLevel>> {
        V2::slots(self, scope)
    }
    fn random(&mut self, upper: u64) -> wasmtime::Result<u64> {
        V2::random(self, upper)
    }
    fn explain(&mut self, message: String) -> wasmtime::Result<()> {
        self.explain(&message)
    }
}
