//! The production policy components built from `policies/` and carried in the binary
//! (`standard`, and `deny-all` as an emergency brake). Test fixtures are not among them.

use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/policies.rs"));

/// The bytes of a built-in policy.
pub fn get(name: &str) -> Option<&'static [u8]> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// The names of the built-in policies.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// A built-in name or a `.wasm` path to the component's bytes. Relative paths are tried
/// beside `base` (a scenario file's folder), then from the working directory.
pub fn resolve(spec: &str, base: Option<&Path>) -> Result<Vec<u8>, String> {
    if let Some(bytes) = get(spec) {
        return Ok(bytes.to_vec());
    }
    if spec.ends_with(".wasm") {
        let candidates: Vec<PathBuf> = base
            .map(|b| b.join(spec))
            .into_iter()
            .chain(std::iter::once(PathBuf::from(spec)))
            .collect();
        for c in &candidates {
            if let Ok(bytes) = std::fs::read(c) {
                return Ok(bytes);
            }
        }
        return Err(format!("policy file {spec} not found"));
    }
    let names: Vec<&str> = names().collect();
    Err(format!(
        "unknown policy {spec:?} (built-in: {}; or a path to a .wasm component)",
        names.join(", ")
    ))
}
