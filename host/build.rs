//! Builds the policy components under `policies/` so that `cargo build` of the host alone
//! yields every module the conformance runner and the tests need.
//!
//! In the style of wasmtime's test-programs: a nested `cargo build` for
//! `wasm32-unknown-unknown` in its own target directory, then each core module is turned
//! into a component with `wit-component`. The production policies are listed in
//! `policies.rs` for `include_bytes!` (they ship in the binary); the test fixtures are
//! written to `components/` for the tests and the conformance runner, and never ship.
//!
//! Everything it writes, the nested build's own target directory included, is under
//! `OUT_DIR`: a library built from a read-only checkout or as another project's dependency
//! writes nothing beside its sources.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";
fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    for watched in ["wit", "guest", "policies"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    check_target_installed(&rustc);

    let target_dir = out_dir.join("policies");
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root.join("policies"))
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "--target-dir",
        ])
        .arg(&target_dir);
    // Nothing of the outer build (clippy's wrapper, host RUSTFLAGS, coverage) may leak in.
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("failed to run cargo for the policy components");
    assert!(
        status.success(),
        "building the policy components under policies/ failed"
    );

    // The members of policies/Cargo.toml: those under `fixtures/` are built for the tests
    // only, the others are carried by the binary.
    let members = workspace_members(&root.join("policies/Cargo.toml"));
    let components = target_dir.join("components");
    fs::create_dir_all(&components).unwrap();
    let mut listing = String::from(
        "/// The production policy components built from `policies/`, by name.\n\
         pub const BUILTIN: &[(&str, &[u8])] = &[\n",
    );
    for member in &members {
        let production = !member.starts_with("fixtures/");
        let name = member.rsplit('/').next().unwrap();
        let module_path = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("policy_{}.wasm", name.replace('-', "_")));
        let module = fs::read(&module_path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", module_path.display()));
        let component = wit_component::ComponentEncoder::default()
            .module(&module)
            .and_then(|encoder| encoder.validate(true).encode())
            .unwrap_or_else(|e| panic!("making a component of policy {name}: {e:?}"));
        let component_path = components.join(format!("{name}.wasm"));
        fs::write(&component_path, &component).unwrap();
        if production {
            let shipped = out_dir.join(format!("{name}.wasm"));
            fs::write(&shipped, component).unwrap();
            writeln!(
                listing,
                "    ({name:?}, include_bytes!({:?})),",
                shipped.display().to_string()
            )
            .unwrap();
        }
    }
    listing.push_str("];\n");
    fs::write(out_dir.join("policies.rs"), listing).unwrap();
    // Where the fixtures are, for the conformance runner and the tests of this build.
    println!(
        "cargo:rustc-env=TOLLGATE_BUILD_FIXTURES={}",
        components.display()
    );
}

/// Fails the build with the command that fixes it when the wasm target is missing.
fn check_target_installed(rustc: &str) {
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let installed = sysroot
        .map(|s| {
            Path::new(&s)
                .join("lib/rustlib")
                .join(TARGET)
                .join("lib")
                .is_dir()
        })
        .unwrap_or(false);
    if !installed {
        panic!(
            "\n\nThe policy components need the {TARGET} target, which is not installed.\n\
             Install it with:\n\n    rustup target add {TARGET}\n\n"
        );
    }
}

/// The `members` of a Cargo workspace manifest, as written.
fn workspace_members(manifest: &Path) -> Vec<String> {
    let text = fs::read_to_string(manifest).unwrap();
    let start = text
        .find("members = [")
        .expect("policies/Cargo.toml lists its members");
    let list = &text[start..];
    let list = &list[..list.find(']').unwrap()];
    list.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.split('"').skip(1).step_by(2))
        .map(str::to_string)
        .collect()
}
