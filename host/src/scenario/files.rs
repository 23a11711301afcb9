//! Where scenarios and the policies they name come from: scenario files under folders, a
//! built-in policy, a `.wasm` path, or a test fixture by name.

use crate::runtime::builtin;
use std::path::{Path, PathBuf};

/// The folder of test fixture components (`policies/fixtures/`, built beside the binary's
/// own policies but not carried in it): `TOLLGATE_FIXTURES` when set, else where this build
/// wrote them.
pub fn default_fixtures() -> PathBuf {
    std::env::var_os("TOLLGATE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("TOLLGATE_BUILD_FIXTURES")))
}

/// Resolves a policy a scenario names: a built-in policy, a `.wasm` path (tried beside the
/// scenario file, then from the working directory), or a test fixture's name, read from
/// `fixtures`.
pub fn resolve_policy(spec: &str, base: Option<&Path>, fixtures: &Path) -> Result<Vec<u8>, String> {
    builtin::resolve(spec, base).or_else(|not_found| fixture(spec, fixtures).ok_or(not_found))
}

/// A test fixture's component by name (lower-case letters, digits and `-`: never a path).
fn fixture(name: &str, fixtures: &Path) -> Option<Vec<u8>> {
    let is_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    is_name
        .then(|| std::fs::read(fixtures.join(format!("{name}.wasm"))).ok())
        .flatten()
}

/// Scenario files under `paths` (files as given, folders searched for `*.json`), sorted.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|e| format!("{}: {e}", p.display()))?;
            found.sort();
            out.extend(found);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(format!("{}: no such file or folder", p.display()));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    Ok(())
}
