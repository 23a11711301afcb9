//! The `tollgate` executable's parts, kept apart from the `tollgate` library so that
//! embedding the engine does not pull in an HTTP stack:
//! - [`http`]: the floor both HTTP faces stand on (shared state, auth, bodies, refusals,
//!   connection bounds);
//! - [`service`]: `tollgate serve`'s own API, and [`gateway`]: the OpenAI-compatible
//!   gateway, siblings above the floor;
//! - [`server`]: builds the engine and the writer, composes the two faces and serves;
//! - [`runtime`]: the policy runtime as the command line makes it;
//! - [`telemetry`]: traces (OpenTelemetry over OTLP/HTTP) and JSON log lines.

pub mod gateway;
pub mod http;
pub mod runtime;
pub mod server;
pub mod service;
pub mod telemetry;
