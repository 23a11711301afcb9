//! A Rust project: `cargo build` for `wasm32-unknown-unknown` with the sandbox's link
//! flags, then `wit-component` in-process.

use super::{describe, Built};
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";
/// The link flags every policy is built with: a 16 KiB stack and 64 KiB of initial memory,
/// which the SDK's call arena is sized for (`CARGO_ENCODED_RUSTFLAGS` separates by 0x1f).
const RUSTFLAGS: &str =
    "-C\x1flink-arg=-zstack-size=16384\x1f-C\x1flink-arg=--initial-memory=65536";

/// Builds the Rust project in `dir` into a component at `out` (default:
/// `DIR/target/NAME.wasm`, NAME the crate's).
pub fn build(dir: &Path, out: Option<&Path>) -> Result<Built, String> {
    let manifest = dir.join("Cargo.toml");
    check_target_installed()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--release", "--target", TARGET, "--lib"])
        .args([
            "--message-format",
            "json-render-diagnostics",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS)
        .env_remove("RUSTFLAGS")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo build failed ({})", output.status));
    }
    let module_path = cdylib(&output.stdout)
        .ok_or("cargo built no cdylib: the project's [lib] needs crate-type = [\"cdylib\"]")?;
    let module =
        std::fs::read(&module_path).map_err(|e| format!("{}: {e}", module_path.display()))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| format!("making a component of {}: {e:#}", module_path.display()))?;
    let stem = module_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("policy")
        .replace('_', "-");
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => dir.join("target").join(format!("{stem}.wasm")),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(&path, &component).map_err(|e| format!("{}: {e}", path.display()))?;
    describe(&path, &component)
}

/// The `.wasm` of the cdylib in cargo's JSON messages.
fn cdylib(messages: &[u8]) -> Option<PathBuf> {
    let text = String::from_utf8_lossy(messages);
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect::<Vec<_>>()
        })
        .rfind(|p| p.extension().is_some_and(|e| e == "wasm"))
}

/// Fails with the command that fixes it when the wasm target is missing.
fn check_target_installed() -> Result<(), String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("running rustc: {e} (install Rust from https://rustup.rs)"))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    if Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .is_dir()
    {
        Ok(())
    } else {
        Err(format!(
            "the {TARGET} target is not installed: run `rustup target add {TARGET}`"
        ))
    }
}
