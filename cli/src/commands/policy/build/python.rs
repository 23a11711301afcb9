//! A Python project: `app.py` with a class `Decide`, built by componentize-py against the
//! project's world (`wit/0.3.0`, or an earlier project's `wit/0.2.0`) with its `sdk/` on
//! the module path.

use super::{beside_executable, check_layout, finish, reusing, run, Built, Reuse};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The module componentize-py builds.
pub const SOURCE: &str = "app.py";
/// The componentize-py this SDK is built and tested with (the project's requirements.txt).
const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// Builds the Python project in `dir` into `path` (both absolute).
pub fn build(dir: &Path, path: &Path, reuse: Reuse) -> Result<Built, String> {
    let world = check_layout(dir, "sdk/tollgate_policy/__init__.py")?;
    let tool = componentize_py(dir)?;
    let version = Command::new(&tool)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let toolchain = format!("{} {version}", tool.display());
    reusing(dir, path, &toolchain, reuse, || {
        let mut command = Command::new(&tool);
        command
            .current_dir(dir)
            .args(["-d", world, "-w", "policy", "componentize"])
            .args(["-p", "sdk", "-p", ".", "app", "-o"])
            .arg(path);
        run(command, "componentize-py")?;
        finish(path)
    })
}

/// componentize-py: `TOLLGATE_COMPONENTIZE_PY`, else the project's `.venv`, else one on
/// `PATH`, else the one this repository's setup installed beside the executable
/// (`target/polyglot-venv`), else installed into the project's `.venv` from its
/// requirements.txt.
fn componentize_py(dir: &Path) -> Result<PathBuf, String> {
    if let Some(tool) = std::env::var_os("TOLLGATE_COMPONENTIZE_PY") {
        return Ok(PathBuf::from(tool));
    }
    let venv = dir.join(".venv");
    let local = venv.join("bin/componentize-py");
    if local.is_file() {
        return Ok(local);
    }
    let on_path = Command::new("componentize-py")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if on_path {
        return Ok(PathBuf::from("componentize-py"));
    }
    if let Some(tool) = beside_executable("polyglot-venv/bin/componentize-py") {
        return Ok(tool);
    }
    eprintln!(
        "componentize-py not found: installing it into {}",
        venv.display()
    );
    let mut make = Command::new("python3");
    make.args(["-m", "venv"]).arg(&venv);
    run(make, "python3 -m venv (Python 3.10 or later is needed)")?;
    let requirements = dir.join("requirements.txt");
    let mut install = Command::new(venv.join("bin/pip"));
    install.args(["install", "--quiet"]);
    if requirements.is_file() {
        install.arg("-r").arg(&requirements);
    } else {
        install.arg(COMPONENTIZE_PY);
    }
    run(install, "pip install componentize-py")?;
    Ok(local)
}
