//! `tollgate policy build`: a policy project's component, made by its language's own
//! toolchain, then loaded and described as activation would see it.
//!
//! The language is the project's: `Cargo.toml` is Rust, `app.py` is Python (componentize-py),
//! `policy.ts` is TypeScript (the TypeScript compiler, then as JavaScript), `policy.js` is
//! JavaScript (componentize-js, the builder `jco componentize` wraps). An interpreted
//! project's component is reused when its inputs (sources, SDK, world, toolchain) are those
//! it was built from ([`inputs`]); cargo decides that for Rust.

mod inputs;
mod javascript;
mod python;
mod rust;
mod typescript;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use tollgate::runtime::hex;

/// A built component.
pub struct Built {
    pub path: PathBuf,
    pub size: usize,
    pub world: String,
    pub sha256: String,
    pub name: String,
    /// For an interpreted project: the SHA-256 of what it was built from, stable where the
    /// component's own bytes are not ([`inputs`]).
    pub source_sha256: Option<String>,
}

impl Built {
    /// The lines `policy build` prints.
    pub fn print(&self) {
        println!("{}", self.path.display());
        println!("size\t{} bytes", self.size);
        println!("world\ttollgate:policy@{}", self.world);
        println!("sha256\t{}", self.sha256);
        if let Some(s) = &self.source_sha256 {
            println!("source_sha256\t{s}");
        }
        println!("policy\t{}", self.name);
    }
}

/// Whether a build may reuse a component made from the same inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Reuse it when its inputs are unchanged.
    WhenUnchanged,
    /// Run the toolchain again whatever the inputs.
    Never,
}

/// Builds the project in `dir` into a component at `out` (default: `DIR/target/NAME.wasm`).
pub fn build(dir: &Path, out: Option<&Path>, reuse: Reuse) -> Result<Built, String> {
    let interpreted: fn(&Path, &Path, Reuse) -> Result<Built, String> =
        if dir.join("Cargo.toml").is_file() {
            // cargo rebuilds only what changed.
            return rust::build(dir, out);
        } else if dir.join(python::SOURCE).is_file() {
            python::build
        } else if dir.join(typescript::SOURCE).is_file() {
            typescript::build
        } else if dir.join(javascript::SOURCE).is_file() {
            javascript::build
        } else {
            return Err(format!(
                "{}: not a policy project (no Cargo.toml, {}, {} or {}; make one with \
             `tollgate policy new NAME --lang rust|python|typescript|javascript`)",
                dir.display(),
                python::SOURCE,
                typescript::SOURCE,
                javascript::SOURCE
            ));
        };
    // The interpreters' toolchains run in other folders: every path they get is absolute.
    let dir = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = output_path(&dir, out)?;
    interpreted(&dir, &path, reuse)
}

/// Runs `make` (the toolchain) unless the component at `path` was made from inputs with the
/// same digest as `dir`'s with `toolchain` (its path and version); records the digest of
/// what it built.
fn reusing(
    dir: &Path,
    path: &Path,
    toolchain: &str,
    reuse: Reuse,
    make: impl FnOnce() -> Result<Built, String>,
) -> Result<Built, String> {
    let digest = inputs::digest(dir, toolchain);
    if let (Some(d), Reuse::WhenUnchanged) = (&digest, reuse) {
        if inputs::up_to_date(path, d) {
            eprintln!(
                "{}: sources, SDK and toolchain unchanged since the last build: reused",
                path.display()
            );
            return Ok(Built {
                source_sha256: digest,
                ..finish(path)?
            });
        }
    }
    inputs::forget(path);
    let mut built = make()?;
    if let Some(d) = digest {
        // The component carries the digest of its sources, for whoever reads it later.
        inputs::embed(path, &d)?;
        inputs::record(path, &d);
        built = Built {
            source_sha256: Some(d),
            ..finish(path)?
        };
    }
    Ok(built)
}

/// Where the component of the project in `dir` (absolute) goes, as an absolute path:
/// `out`, else `DIR/target/NAME.wasm`, NAME the project folder's.
fn output_path(dir: &Path, out: Option<&Path>) -> Result<PathBuf, String> {
    let path = match out {
        Some(p) => std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("policy");
            dir.join("target").join(format!("{name}.wasm"))
        }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    Ok(path)
}

/// The worlds a project may build against, newest first: a project made by an earlier
/// release carries an earlier world (and an SDK for it), and keeps building against it.
const WORLDS: [&str; 2] = ["wit/0.3.0", "wit/0.2.0"];

/// The world and SDK a Python or JavaScript project builds against, which `policy new`
/// writes into it: the world's folder, relative to the project.
fn check_layout(dir: &Path, sdk: &str) -> Result<&'static str, String> {
    let world = WORLDS
        .into_iter()
        .find(|w| dir.join(w).join("policy.wit").is_file())
        .ok_or_else(|| {
            format!(
                "{}: missing {}/policy.wit (`tollgate policy new` writes it into a project)",
                dir.display(),
                WORLDS[0]
            )
        })?;
    if !dir.join(sdk).exists() {
        return Err(format!(
            "{}: missing {sdk} (`tollgate policy new` writes it into a project)",
            dir.display()
        ));
    }
    Ok(world)
}

/// `relative` in the build folder this `tollgate` runs from (`target/` of a checkout), where
/// the repository's own setup (`.ci/run`, or the tests) installs the Python and JavaScript
/// toolchains; `None` when it is not there.
fn beside_executable(relative: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join(relative);
    path.exists().then_some(path)
}

/// Runs `command`, all its output going to this process's stderr (stdout is the build's
/// answer); an error names `what` failed.
fn run(mut command: Command, what: &str) -> Result<(), String> {
    let status = command
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .stderr(std::process::Stdio::inherit())
        .status()
        .map_err(|e| format!("running {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Reads the component a toolchain wrote and describes it.
fn finish(path: &Path) -> Result<Built, String> {
    let component = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    describe(path, &component)
}

/// What a component file is: its size, world, hash and the name it gives itself.
pub fn describe(path: &Path, component: &[u8]) -> Result<Built, String> {
    let runtime = tollgate_cli::runtime::runtime()?;
    let loaded = runtime
        .load(
            component,
            tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Built {
        path: path.to_path_buf(),
        size: component.len(),
        world: loaded.world.to_string(),
        sha256: hex(&Sha256::digest(component)),
        name: format!("{} {}", loaded.info.name, loaded.info.version),
        source_sha256: None,
    })
}
