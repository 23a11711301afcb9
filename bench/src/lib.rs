//! The benchmarks of tollgate as a library, so that the `tollgate-bench` binary, its tests
//! and the examples share them. Figures are printed, never asserted.

// The guest SDK's `standard.rs`, compiled natively by `native`, names `alloc`.
extern crate alloc;

pub mod gateway;
pub mod http;
pub mod latency;
pub mod native;
pub mod policies;
pub mod redis_peer;
pub mod simulate;
pub mod soak;
pub mod store;
pub mod waiting;
