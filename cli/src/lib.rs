//! The `tollgate` executable's parts: the HTTP service (`tollgate serve`), kept apart from
//! the `tollgate` library so that embedding the engine does not pull in an HTTP stack.

pub mod service;
