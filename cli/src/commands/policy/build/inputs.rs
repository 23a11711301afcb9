//! What a build of an interpreted project (Python, TypeScript, JavaScript) is made from, as
//! one SHA-256: every file of the project (its sources, its copy of the SDK and the world,
//! its requirements), the toolchain that builds it and this `tollgate`. The digest is kept
//! beside the component (`NAME.wasm.inputs`); a build whose inputs have that digest and
//! whose component is still there reuses it instead of running the toolchain again.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tollgate::runtime::hex;

/// Folders that are the build's output or a toolchain's install, never its input.
const SKIPPED: &[&str] = &[
    "target",
    "node_modules",
    ".venv",
    "__pycache__",
    ".git",
    ".mypy_cache",
];

/// Most files one project may hold before the reuse check gives up (and builds).
const MOST_FILES: usize = 10_000;

/// The digest of a project's inputs, `toolchain` naming what builds it (its path and
/// version). `None` when the folder cannot be read whole: then the project is built.
pub fn digest(dir: &Path, toolchain: &str) -> Option<String> {
    let mut files = Vec::new();
    collect(dir, dir, 0, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    h.update(format!("tollgate {}\0", env!("CARGO_PKG_VERSION")));
    h.update(format!("toolchain {toolchain}\0"));
    for relative in files {
        let bytes = std::fs::read(dir.join(&relative)).ok()?;
        h.update(relative.to_string_lossy().as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Some(hex(&h.finalize()))
}

/// Deepest folder followed (links are followed, so a loop must end somewhere).
const MOST_DEPTH: usize = 32;

fn collect(root: &Path, dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Option<()> {
    if depth > MOST_DEPTH {
        return None;
    }
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        let path = entry.path();
        let name = entry.file_name();
        // A link counts as what it points to: a project may link its SDK and world.
        let meta = std::fs::metadata(&path).ok()?;
        if meta.is_dir() {
            if SKIPPED.iter().any(|s| name == *s) {
                continue;
            }
            collect(root, &path, depth + 1, out)?;
        } else if meta.is_file() {
            out.push(path.strip_prefix(root).ok()?.to_path_buf());
            if out.len() > MOST_FILES {
                return None;
            }
        }
    }
    Some(())
}

/// Where the digest of the inputs that made `component` is kept.
pub fn stamp_path(component: &Path) -> PathBuf {
    let mut name = component.as_os_str().to_owned();
    name.push(".inputs");
    PathBuf::from(name)
}

/// Whether `component` exists and was built from inputs with `digest`.
pub fn up_to_date(component: &Path, digest: &str) -> bool {
    component.is_file()
        && std::fs::read_to_string(stamp_path(component)).is_ok_and(|s| s.trim() == digest)
}

/// Records that `component` was built from inputs with `digest` (a failure to record only
/// means the next build runs the toolchain again).
pub fn record(component: &Path, digest: &str) {
    let _ = std::fs::write(stamp_path(component), format!("{digest}\n"));
}

/// The custom section a built component carries its source digest in.
pub const SOURCE_SECTION: &str = "tollgate-source-sha256";

/// Appends the custom section [`SOURCE_SECTION`] holding `digest` to the component file at
/// `component` (a custom section may follow any section of a component).
pub fn embed(component: &Path, digest: &str) -> Result<(), String> {
    let mut bytes =
        std::fs::read(component).map_err(|e| format!("{}: {e}", component.display()))?;
    bytes.extend(custom_section(SOURCE_SECTION, digest.as_bytes()));
    std::fs::write(component, bytes).map_err(|e| format!("{}: {e}", component.display()))
}

/// A custom section: id 0, its size, the name (length-prefixed) and the payload.
fn custom_section(name: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = leb128(name.len() as u64);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    let mut out = vec![0u8];
    out.extend(leb128(body.len() as u64));
    out.extend(body);
    out
}

fn leb128(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// Forgets what made `component`, before a build that may fail halfway.
pub fn forget(component: &Path) {
    let _ = std::fs::remove_file(stamp_path(component));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_follows_sources_and_toolchain_and_ignores_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("app.py"), "print(1)").unwrap();
        std::fs::create_dir_all(p.join("sdk")).unwrap();
        std::fs::write(p.join("sdk/x.py"), "x = 1").unwrap();
        let first = digest(p, "componentize-py 0.25.1").unwrap();
        // Outputs and installs do not count.
        for skipped in ["target", "node_modules", ".venv", "__pycache__"] {
            std::fs::create_dir_all(p.join(skipped)).unwrap();
            std::fs::write(p.join(skipped).join("f"), "anything").unwrap();
        }
        assert_eq!(digest(p, "componentize-py 0.25.1").unwrap(), first);
        // The toolchain, a source and the SDK do.
        assert_ne!(digest(p, "componentize-py 0.26.0").unwrap(), first);
        std::fs::write(p.join("sdk/x.py"), "x = 2").unwrap();
        let changed = digest(p, "componentize-py 0.25.1").unwrap();
        assert_ne!(changed, first);
        std::fs::rename(p.join("sdk/x.py"), p.join("sdk/y.py")).unwrap();
        assert_ne!(digest(p, "componentize-py 0.25.1").unwrap(), changed);
        // A linked folder counts as its files; a loop of links is no digest, not a hang.
        #[cfg(unix)]
        {
            let linked = tempfile::tempdir().unwrap();
            std::os::unix::fs::symlink(p.join("sdk"), linked.path().join("sdk")).unwrap();
            let through_link = digest(linked.path(), "t").unwrap();
            std::fs::remove_file(p.join("sdk/y.py")).unwrap();
            assert_ne!(digest(linked.path(), "t").unwrap(), through_link);
            std::fs::write(p.join("sdk/y.py"), "x = 2").unwrap();
            std::os::unix::fs::symlink(linked.path(), linked.path().join("loop")).unwrap();
            assert_eq!(digest(linked.path(), "t"), None);
        }

        let component = p.join("target/p.wasm");
        assert!(!up_to_date(&component, &first));
        std::fs::write(&component, b"wasm").unwrap();
        record(&component, &first);
        assert!(up_to_date(&component, &first));
        assert!(!up_to_date(&component, &changed));
        forget(&component);
        assert!(!up_to_date(&component, &first));
    }
}
