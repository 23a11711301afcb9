//! The wasmtime runtime every command starts, with compiled components kept on disk so
//! that a restart or a second command does not compile the same component again.
//!
//! The folder is `TOLLGATE_COMPILED_CACHE` when set (`off`: none), else
//! `$XDG_CACHE_HOME/tollgate/compiled`, else `$HOME/.cache/tollgate/compiled`.

use std::path::PathBuf;
use tollgate::runtime::{CompiledCache, Runtime};

/// Where compiled components are kept, if anywhere.
pub fn compiled_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("TOLLGATE_COMPILED_CACHE") {
        return (dir != "off").then(|| PathBuf::from(dir));
    }
    var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|base| base.join("tollgate").join("compiled"))
}

/// The process's runtime.
pub fn runtime() -> Result<Runtime, String> {
    let runtime = Runtime::new().map_err(|e| format!("starting wasmtime: {e:#}"))?;
    Ok(match compiled_cache_dir() {
        Some(dir) => runtime.with_compiled_cache(CompiledCache::new(dir)),
        None => runtime,
    })
}
