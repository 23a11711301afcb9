//! The SDK for writing tollgate policies in Rust.
//!
//! A policy is a WebAssembly component of the `tollgate:policy/policy@0.3.0` world
//! (`wit/0.3.0/policy.wit`).
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

/// Bindings generated from `wit/0.3.0/policy.wit`.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/0.3.0",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "export_policy_component",
        default_bindings_module: "tollgate_guest::bindings",
    });
}

/// Exports a type implementing [`Policy`] as the component's `decide`. Only a wasm build
/// exports anything: a native build (`cargo test` with [`testing::MockHost`]) has no
/// component to export from.
#[macro_export]
macro_rules! export_policy {
    ($ty:ident) => {
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::export_policy_component!($ty);
        /// The policy's `admit`, for native tools (and so that a native build uses it).
        #[cfg(not(target_arch = "wasm32"))]
        #[doc(hidden)]
        pub static __TOLLGATE_POLICY_ADMIT: fn($crate::Request) -> $crate::Admission =
            <$ty as $crate::Policy>::admit;
    };
}
pub use bindings::exports::tollgate::policy::decide::Guest as Policy;
/// The host imports. Inside the sandbox they are the host's; in a native build (`cargo
/// test`) they read the [`testing::MockHost`] a test installed.
#[cfg(target_arch = "wasm32")]
pub use bindings::tollgate::policy::host;
#[cfg(not(target_arch = "wasm32"))]
pub use testing::host;

#[cfg(not(target_arch = "wasm32"))]
extern crate std;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub use bindings::tollgate::policy::types::{
    Admission, BucketKind, BucketLevel, Failure, FailureReport, GiveUpReason, LogLevel, Plan,
    PolicyInfo, Priority, Refusal, RefusalReason, Request, RetryDecision, Route, SlotLevel,
    SlotScope,
};

pub use standard::{degrade, param_or, reservation};
