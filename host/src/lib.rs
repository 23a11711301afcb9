#![warn(missing_docs)]
//! tollgate: admission control and fair scheduling for expensive provider calls.
//!
//! Embed it to decide admissions in your own process: open a [`store`], load a policy with
//! a [`runtime::Runtime`], and drive an [`Engine`] (admit, complete, dispatch, swap). The
//! map, top-down:
//! - [`engine`]: admission, completion, dispatch and policy activation over a store; time
//!   is always an argument.
//! - [`runtime`]: wasmtime, sandbox limits, policy digests; policies as components.
//! - [`store`]: the narrow storage interface, its SQLite backend (embedded, one writer) and
//!   its PostgreSQL backend (shared by replicas; the `postgres` feature, on by default).
//! - [`config`]: one configuration format for every command.
//! - [`validate`], [`shape`]: an admission request checked field by field, and the shape
//!   every JSON body must have.
//! - [`model`], [`reason`], [`explain`]: the vocabulary of requests, operations and
//!   outcomes, and what a refusal says to people.
//! - [`writer`], [`maintenance`]: the one writer that groups work from many callers into
//!   one transaction (an async handle for tokio), and the housekeeping a serving engine
//!   needs.
//! - [`scenario`]: the conformance runner for scenario files, and the verifier swaps use.
//! - [`simulate`]: discrete-event simulation of load, provider and callers over the real engine.
//!
//! The HTTP service (`tollgate serve`) and the command line are the `tollgate-cli` package
//! (`cli/`), so that embedding the engine does not link an HTTP stack.
//!
//! `examples/embed.rs` shows the whole loop in a few dozen lines; `examples/embedder/` is a
//! program of its own that builds the library without PostgreSQL.

pub mod alerts;
pub mod bucket;
pub mod calendar;
pub mod config;
pub mod engine;
pub mod explain;
pub mod lease;
pub mod maintenance;
pub mod model;
pub mod reason;
pub mod runtime;
pub mod scenario;
pub mod shape;
pub mod simulate;
pub mod spend;

pub mod store;
pub mod validate;
pub mod writer;

pub use engine::Engine;
pub use validate::RequestBuilder;
pub use writer::Writer;
