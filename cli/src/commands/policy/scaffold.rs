//! `tollgate policy new`: a ready policy project that builds anywhere with only `tollgate`
//! and the language's toolchain: the SDK and the world are written into it.

use std::fs;
use std::path::Path;

/// A file of the project: its path inside it and its text; in templates (`.in`) and
/// paths, `{name}` stands for the project's name.
struct File {
    path: &'static str,
    text: &'static str,
}

impl File {
    fn template(&self) -> bool {
        !self.path.starts_with("sdk/") && !self.path.starts_with("wit/")
    }
}

/// The Rust project: the templates of `cli/templates/rust/` and the SDK of `guest/` with
/// the world of `wit/0.3.0/`, as this build of tollgate carries them.
const RUST: &[File] = &[
    File {
        path: "Cargo.toml",
        text: include_str!("../../../templates/rust/Cargo.toml.in"),
    },
    File {
        path: ".cargo/config.toml",
        text: include_str!("../../../templates/rust/cargo-config.toml"),
    },
    File {
        path: ".gitignore",
        text: include_str!("../../../templates/rust/gitignore"),
    },
    File {
        path: "README.md",
        text: include_str!("../../../templates/rust/README.md.in"),
    },
    File {
        path: "src/lib.rs",
        text: include_str!("../../../templates/rust/lib.rs.in"),
    },
    File {
        path: "scenarios/{name}.json",
        text: include_str!("../../../templates/rust/scenario.json.in"),
    },
    // The versions the SDK was built and tested with, so that a build needs no resolution.
    File {
        path: "Cargo.lock",
        text: include_str!("../../../../policies/Cargo.lock"),
    },
    File {
        path: "sdk/Cargo.toml",
        text: include_str!("../../../../guest/Cargo.toml"),
    },
    File {
        path: "sdk/src/lib.rs",
        text: include_str!("../../../../guest/src/lib.rs"),
    },
    File {
        path: "sdk/src/standard.rs",
        text: include_str!("../../../../guest/src/standard.rs"),
    },
    File {
        path: "sdk/src/arena.rs",
        text: include_str!("../../../../guest/src/arena.rs"),
    },
    File {
        path: "sdk/src/testing.rs",
        text: include_str!("../../../../guest/src/testing.rs"),
    },
    File {
        path: "wit/0.3.0/policy.wit",
        text: include_str!("../../../../wit/0.3.0/policy.wit"),
    },
];

/// The Python project: the templates of `cli/templates/python/` and the SDK of
/// `guest/python/` with the world of `wit/0.3.0/`.
const PYTHON: &[File] = &[
    File {
        path: "app.py",
        text: include_str!("../../../templates/python/app.py.in"),
    },
    File {
        path: "requirements.txt",
        text: include_str!("../../../templates/python/requirements.txt"),
    },
    File {
        path: ".gitignore",
        text: include_str!("../../../templates/python/gitignore"),
    },
    File {
        path: "README.md",
        text: include_str!("../../../templates/python/README.md.in"),
    },
    File {
        path: "scenarios/{name}.json",
        text: include_str!("../../../templates/rust/scenario.json.in"),
    },
    File {
        path: "sdk/tollgate_policy/__init__.py",
        text: include_str!("../../../../guest/python/tollgate_policy/__init__.py"),
    },
    File {
        path: "sdk/tollgate_policy/standard.py",
        text: include_str!("../../../../guest/python/tollgate_policy/standard.py"),
    },
    File {
        path: "wit/0.3.0/policy.wit",
        text: include_str!("../../../../wit/0.3.0/policy.wit"),
    },
];

/// The JavaScript project: the templates of `cli/templates/javascript/`, then
/// [`JAVASCRIPT_SDK`].
const JAVASCRIPT: &[File] = &[
    File {
        path: "policy.js",
        text: include_str!("../../../templates/javascript/policy.js.in"),
    },
    File {
        path: "package.json",
        text: include_str!("../../../templates/javascript/package.json.in"),
    },
    File {
        path: "jsconfig.json",
        text: include_str!("../../../templates/javascript/jsconfig.json"),
    },
    File {
        path: ".gitignore",
        text: include_str!("../../../templates/javascript/gitignore"),
    },
    File {
        path: "README.md",
        text: include_str!("../../../templates/javascript/README.md.in"),
    },
];

/// The TypeScript project: the templates of `cli/templates/typescript/`, then
/// [`JAVASCRIPT_SDK`] (its types are what the compiler checks against).
const TYPESCRIPT: &[File] = &[
    File {
        path: "policy.ts",
        text: include_str!("../../../templates/typescript/policy.ts.in"),
    },
    File {
        path: "package.json",
        text: include_str!("../../../templates/typescript/package.json.in"),
    },
    File {
        path: "tsconfig.json",
        text: include_str!("../../../templates/typescript/tsconfig.json"),
    },
    File {
        path: ".gitignore",
        text: include_str!("../../../templates/typescript/gitignore"),
    },
    File {
        path: "README.md",
        text: include_str!("../../../templates/typescript/README.md.in"),
    },
];

/// What a TypeScript and a JavaScript project share: the scenario, the JavaScript SDK with
/// its types, and the world.
const JAVASCRIPT_SDK: &[File] = &[
    File {
        path: "scenarios/{name}.json",
        text: include_str!("../../../templates/rust/scenario.json.in"),
    },
    File {
        path: "sdk/tollgate-policy.js",
        text: include_str!("../../../../guest/javascript/tollgate-policy.js"),
    },
    File {
        path: "sdk/tollgate-policy.d.ts",
        text: include_str!("../../../../guest/javascript/tollgate-policy.d.ts"),
    },
    File {
        path: "wit/0.3.0/policy.wit",
        text: include_str!("../../../../wit/0.3.0/policy.wit"),
    },
];

/// The languages `policy new` knows, with their projects' files.
const LANGUAGES: &[(&str, &[&[File]])] = &[
    ("rust", &[RUST]),
    ("python", &[PYTHON]),
    ("typescript", &[TYPESCRIPT, JAVASCRIPT_SDK]),
    ("javascript", &[JAVASCRIPT, JAVASCRIPT_SDK]),
];

/// Writes a new project named after the last part of `dir` into `dir`, which must not exist
/// or be empty. Returns the files written.
pub fn new_project(dir: &Path, lang: &str) -> Result<Vec<String>, String> {
    let Some((_, files)) = LANGUAGES.iter().find(|(l, _)| *l == lang) else {
        let known: Vec<&str> = LANGUAGES.iter().map(|(l, _)| *l).collect();
        return Err(format!(
            "--lang {lang}: this build scaffolds {}",
            known.join(", ")
        ));
    };
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: not a folder name", dir.display()))?;
    let ok_name = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !ok_name {
        return Err(format!(
            "{name:?}: a policy name is 1 to 64 lowercase letters, digits, '-' or '_', starting with a letter"
        ));
    }
    if dir.exists()
        && fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .next()
            .is_some()
    {
        return Err(format!("{} exists and is not empty", dir.display()));
    }
    let mut written = Vec::new();
    for file in files.iter().flat_map(|f| f.iter()) {
        let path = dir.join(file.path.replace("{name}", name));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let text = if file.template() {
            file.text.replace("{name}", name)
        } else {
            file.text.to_string()
        };
        fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}
