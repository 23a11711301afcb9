//! The `tollgate` executable's parts: the HTTP service (`tollgate serve`) and its OpenAI-compatible
//! gateway, kept apart from
//! the `tollgate` library so that embedding the engine does not pull in an HTTP stack.

pub mod gateway;
pub mod runtime;
pub mod service;
