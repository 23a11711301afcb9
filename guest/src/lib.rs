//! The SDK for writing tollgate policies in Rust.
//!
//! A policy is a WebAssembly component of the `tollgate:policy/policy` world (`wit/policy.wit`).
//! It decides; the host reserves. Implement [`Policy`] and export it with
//! [`export_policy!`]. A complete policy, compiled with this repository's tests, is
//! `policies/fixtures/quiet-hours/src/lib.rs`; `docs/writing-policies.md` walks through it
//! and through building the module into a component.

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
