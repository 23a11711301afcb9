//! tollgate: admission control and fair scheduling for expensive provider calls.
//!
//! The map, top-down:
//! - [`runtime`]: wasmtime, limits, policy digests; policies as sandboxed components.
//! - [`store`]: the narrow storage interface and its SQLite backend.
//! - [`engine`]: admission, completion, dispatch and policy activation over a store.
//! - [`bucket`]: token-bucket arithmetic, pure and clock-free.
//! - [`config`], [`validate`], [`model`], [`reason`]: the vocabulary.
//! - [`scenario`]: the conformance runner for scenario files.
//! - [`service`]: `tollgate serve`, the engine behind HTTP.

pub mod bench;
pub mod bucket;
pub mod config;
pub mod engine;
pub mod model;
pub mod native;
pub mod reason;
pub mod runtime;
pub mod scenario;
pub mod service;
pub mod store;
pub mod validate;

pub use engine::Engine;

// The guest SDK's `standard.rs`, compiled natively by `native`, names `alloc`.
extern crate alloc;
