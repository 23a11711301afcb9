//! The SDK for writing tollgate policies in Rust.
//!
//! A policy is a WebAssembly component of the `tollgate:policy/policy` world (`wit/policy.wit`).
//! It decides; the host reserves. Implement [`Policy`] and export it:
//!
//! ```ignore
//! use tollgate_guest::{export_policy, host, standard, Admission, FailureReport, Policy,
//!                      PolicyInfo, Refusal, RefusalReason, Request, RetryDecision};
//!
//! struct QuietHours;
//!
//! impl Policy for QuietHours {
//!     fn describe() -> PolicyInfo {
//!         PolicyInfo { name: "quiet-hours".into(), version: "1.0.0".into() }
//!     }
//!     fn self_check() -> Result<(), String> {
//!         standard::self_check()
//!     }
//!     fn admit(req: Request) -> Admission {
//!         // Refuse big generations during the first second of every minute, else the standard rules.
//!         if host::now_ms().rem_euclid(60_000) < 1_000 && req.max_output_tokens > 1_000 {
//!             return Admission::Refuse(Refusal { reason: RefusalReason::Overloaded, retry_after_ms: Some(1_000) });
//!         }
//!         standard::admit(&req)
//!     }
//!     fn on_failure(report: FailureReport) -> RetryDecision {
//!         standard::on_failure(&report)
//!     }
//! }
//!
//! export_policy!(QuietHours);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-unknown-unknown` and turn the module
//! into a component (the tollgate build does this for everything under `policies/`).

#![no_std]

extern crate alloc;

pub mod standard;

#[cfg(target_arch = "wasm32")]
pub mod arena;

#[cfg(all(target_arch = "wasm32", feature = "call-arena"))]
#[global_allocator]
static ALLOCATOR: arena::CallArena = arena::CallArena::new();

/// Bindings generated from `wit/policy.wit`.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "export_policy",
        default_bindings_module: "tollgate_guest::bindings",
    });
}

pub use bindings::export_policy;
pub use bindings::exports::tollgate::policy::decide::Guest as Policy;
pub use bindings::tollgate::policy::host;
pub use bindings::tollgate::policy::types::{
    Admission, BucketKind, BucketLevel, Failure, FailureReport, GiveUpReason, Plan, PolicyInfo,
    Refusal, RefusalReason, Request, RetryDecision, Route, SlotLevel, SlotScope,
};

pub use standard::{param_or, reservation};
