//! Policies in Python, TypeScript and JavaScript, built by the real componentize-py, the
//! TypeScript compiler and componentize-js:
//! the author's loop from an empty folder, the standard rules ported to both passing every
//! scenario, the sealed WASI surface (nothing granted; clocks, random and output from the
//! decision), and a hostile Python policy failing closed under the configuration's limits.
//!
//! The toolchains are installed here when missing: componentize-py (PyPI) into
//! target/polyglot-venv, componentize-js and TypeScript (npm) into target/polyglot-node. `.ci/run`
//! installs them first, so that an install failure is reported as such.

mod common;

use common::output_text as text;

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tollgate::config::{Config, MIN_POLICY_FUEL};
use tollgate::reason::{Outcome, Reason};
use tollgate::runtime::{
    Admission, DecisionView, Jitter, LoadError, LoadedPolicy, PolicyLimits, Priority, Request,
    Route, Runtime,
};
use tollgate::store::SqliteStore;
use tollgate::Engine;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Installs `tests/polyglot/FILE` into `target/DIR` with `install` unless the same file is
/// already there with what it installs (`ready`).
fn installed(file: &str, dir: &str, ready: &str, install: impl FnOnce(&Path)) -> PathBuf {
    let dir = repo().join("target").join(dir);
    let wanted = std::fs::read(repo().join("tests/polyglot").join(file)).unwrap();
    let stamp = dir.join(file);
    let ok = std::fs::read(&stamp).ok().as_ref() == Some(&wanted) && dir.join(ready).exists();
    if !ok {
        std::fs::create_dir_all(&dir).unwrap();
        install(&dir);
        std::fs::write(&stamp, &wanted).unwrap();
    }
    dir
}

/// The environment `tollgate policy build` finds the toolchains through.
fn toolchains() -> &'static [(&'static str, PathBuf)] {
    static TOOLS: OnceLock<Vec<(&'static str, PathBuf)>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let venv = installed(
            "requirements.txt",
            "polyglot-venv",
            "bin/componentize-py",
            |dir| {
                let made = Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(dir)
                    .status()
                    .unwrap();
                assert!(made.success(), "python3 -m venv failed");
                let pip = Command::new(dir.join("bin/pip"))
                    .args(["install", "--quiet", "-r"])
                    .arg(repo().join("tests/polyglot/requirements.txt"))
                    .status()
                    .unwrap();
                assert!(pip.success(), "pip install componentize-py failed");
            },
        );
        let node = installed(
            "package.json",
            "polyglot-node",
            "node_modules/@bytecodealliance/componentize-js",
            |dir| {
                std::fs::copy(
                    repo().join("tests/polyglot/package.json"),
                    dir.join("package.json"),
                )
                .unwrap();
                let npm = Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund"])
                    .current_dir(dir)
                    .status()
                    .unwrap();
                assert!(npm.success(), "npm install componentize-js failed");
            },
        );
        vec![
            ("TOLLGATE_COMPONENTIZE_PY", venv.join("bin/componentize-py")),
            ("TOLLGATE_NODE_MODULES", node.join("node_modules")),
        ]
    })
}

fn tollgate(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir)
        .args(args)
        .envs(toolchains().iter().map(|(k, v)| (*k, v)))
        .output()
        .unwrap()
}

/// A project of `policies/` built once per test process into target/polyglot-built.
fn built(project: &'static str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(&'static str, PathBuf)>>> = OnceLock::new();
    let cell = BUILT.get_or_init(Default::default);
    let mut built = cell.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(p, _)| *p == project) {
        return path.clone();
    }
    let out = repo()
        .join("target/polyglot-built")
        .join(format!("{}.wasm", project.replace('/', "-")));
    let dir = repo().join("policies").join(project);
    let o = tollgate(
        &repo(),
        &[
            "policy",
            "build",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{project}: {}", text(&o));
    built.push((project, out.clone()));
    out
}

fn runtime() -> Runtime {
    let cache = tollgate::runtime::CompiledCache::new(repo().join("target/polyglot-compiled"));
    Runtime::new().unwrap().with_compiled_cache(cache)
}

/// The author's loop for one language: `policy new`, `policy build`, `policy test` (the
/// checks and the project's own scenario, which the example rule must pass).
fn new_build_test(lang: &str, source: &str) {
    let dir = tempfile::tempdir().unwrap();
    let new = tollgate(dir.path(), &["policy", "new", "quiet", "--lang", lang]);
    assert!(new.status.success(), "{}", text(&new));
    for file in [
        source,
        "scenarios/quiet.json",
        "README.md",
        "wit/0.3.0/policy.wit",
    ] {
        assert!(dir.path().join("quiet").join(file).is_file(), "{file}");
    }
    let build = tollgate(dir.path(), &["policy", "build", "quiet"]);
    assert!(build.status.success(), "{}", text(&build));
    let out = String::from_utf8_lossy(&build.stdout).to_string();
    let wasm = dir.path().join("quiet/target/quiet.wasm");
    let bytes = std::fs::read(&wasm).unwrap();
    assert!(
        out.contains(&format!("size\t{} bytes", bytes.len())),
        "{out}"
    );
    assert!(out.contains("world\ttollgate:policy@0.3.0"), "{out}");
    assert!(out.contains("policy\tquiet 0.1.0"), "{out}");
    let test = tollgate(dir.path(), &["policy", "test", "quiet"]);
    assert!(test.status.success(), "{}", text(&test));
    assert!(
        String::from_utf8_lossy(&test.stdout).contains("2 passed, 0 failed"),
        "{}",
        text(&test)
    );
    // The example rule decides: a scenario expecting the opposite fails.
    let scenario = dir.path().join("quiet/scenarios/quiet.json");
    let flipped = std::fs::read_to_string(&scenario).unwrap().replacen(
        "\"outcome\": \"rejected\"",
        "\"outcome\": \"accepted\"",
        1,
    );
    std::fs::write(&scenario, flipped).unwrap();
    let wrong = tollgate(
        dir.path(),
        &[
            "policy",
            "test",
            "quiet/target/quiet.wasm",
            "quiet/scenarios",
        ],
    );
    let wrong_text = text(&wrong);
    assert!(!wrong.status.success(), "{wrong_text}");
    assert!(wrong_text.contains("1 passed, 1 failed"), "{wrong_text}");
}

/// The value of a `policy build` line (`sha256`, `source_sha256`).
fn line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}\t")))
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

/// An unchanged project is not built again (by `policy build` or `policy test`), and the
/// same sources always have the same source digest, even where the toolchain's bytes vary;
/// a changed source is built again.
fn reused_and_stable(lang: &str, source: &str) {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        tollgate(dir.path(), &["policy", "new", "p", "--lang", lang])
            .status
            .success()
    );
    let first = tollgate(dir.path(), &["policy", "build", "p"]);
    assert!(first.status.success(), "{}", text(&first));
    let first = String::from_utf8_lossy(&first.stdout).to_string();
    let again = tollgate(dir.path(), &["policy", "build", "p"]);
    let again_out = String::from_utf8_lossy(&again.stdout).to_string();
    assert!(
        text(&again).contains("unchanged since the last build: reused"),
        "{}",
        text(&again)
    );
    assert_eq!(line(&again_out, "sha256"), line(&first, "sha256"));
    let test = tollgate(dir.path(), &["policy", "test", "p"]);
    assert!(test.status.success(), "{}", text(&test));
    assert!(text(&test).contains("reused"), "{}", text(&test));
    // Built again from the same sources: the same source digest.
    let forced = tollgate(dir.path(), &["policy", "build", "p", "--force"]);
    assert!(forced.status.success(), "{}", text(&forced));
    assert!(!text(&forced).contains("reused"));
    let forced = String::from_utf8_lossy(&forced.stdout).to_string();
    assert_eq!(
        line(&forced, "source_sha256"),
        line(&first, "source_sha256")
    );
    // A changed source is built again, with another source digest.
    let path = dir.path().join("p").join(source);
    let changed = std::fs::read_to_string(&path).unwrap() + "\n// changed\n";
    let changed = if lang == "python" {
        changed.replace("// changed", "# changed")
    } else {
        changed
    };
    std::fs::write(&path, changed).unwrap();
    let rebuilt = tollgate(dir.path(), &["policy", "build", "p"]);
    assert!(rebuilt.status.success(), "{}", text(&rebuilt));
    assert!(!text(&rebuilt).contains("reused"));
    let rebuilt = String::from_utf8_lossy(&rebuilt.stdout).to_string();
    assert_ne!(
        line(&rebuilt, "source_sha256"),
        line(&first, "source_sha256")
    );
}

#[test]
fn a_python_build_is_reused_when_unchanged_and_its_source_digest_is_stable() {
    reused_and_stable("python", "app.py");
}

#[test]
fn a_typescript_build_is_reused_when_unchanged_and_its_source_digest_is_stable() {
    reused_and_stable("typescript", "policy.ts");
}

#[test]
fn a_python_policy_from_an_empty_folder() {
    new_build_test("python", "app.py");
}

#[test]
fn a_javascript_policy_from_an_empty_folder() {
    new_build_test("javascript", "policy.js");
}

#[test]
fn a_typescript_policy_from_an_empty_folder() {
    new_build_test("typescript", "policy.ts");
    for file in ["tsconfig.json", "sdk/tollgate-policy.d.ts"] {
        let dir = tempfile::tempdir().unwrap();
        tollgate(dir.path(), &["policy", "new", "t", "--lang", "typescript"]);
        assert!(dir.path().join("t").join(file).is_file(), "{file}");
    }
}

#[test]
fn a_typescript_policy_with_a_type_error_is_not_built() {
    let dir = tempfile::tempdir().unwrap();
    let new = tollgate(
        dir.path(),
        &["policy", "new", "typo", "--lang", "typescript"],
    );
    assert!(new.status.success(), "{}", text(&new));
    // A number where the SDK takes a BigInt: JavaScript would build it and fail at run time.
    let source = dir.path().join("typo/policy.ts");
    let wrong = std::fs::read_to_string(&source).unwrap().replace(
        "refuse(\"overloaded\", 1000n)",
        "refuse(\"overloaded\", 1000)",
    );
    std::fs::write(&source, wrong).unwrap();
    let build = tollgate(dir.path(), &["policy", "build", "typo"]);
    let out = text(&build);
    assert!(!build.status.success(), "{out}");
    assert!(
        out.contains("policy.ts(") && out.contains("error TS2345"),
        "{out}"
    );
    assert!(!dir.path().join("typo/target/typo.wasm").exists());
    assert!(
        !dir.path().join("typo/policy.js").exists(),
        "the project holds no generated code"
    );

    // Without tsconfig.json the build says what is missing.
    std::fs::remove_file(dir.path().join("typo/tsconfig.json")).unwrap();
    let build = tollgate(dir.path(), &["policy", "build", "typo"]);
    let out = text(&build);
    assert!(!build.status.success(), "{out}");
    assert!(out.contains("no tsconfig.json"), "{out}");
}

#[test]
fn the_standard_rules_in_python_and_javascript_pass_every_scenario() {
    let mut folders = vec![repo().join("tests/scenarios")];
    if repo().join("../shared/scenarios").is_dir() {
        folders.push(repo().join("../shared/scenarios"));
    }
    for project in ["python/standard", "javascript/standard"] {
        let wasm = built(project);
        let mut args = vec!["conformance", "run", "--policy", wasm.to_str().unwrap()];
        args.extend(folders.iter().map(|f| f.to_str().unwrap()));
        let run = tollgate(&repo(), &args);
        let out = text(&run);
        assert!(run.status.success(), "{project}: {out}");
        assert!(out.contains(" passed, 0 failed"), "{project}: {out}");
    }
}

fn request(key: &str) -> Request {
    Request {
        tenant: "acme".into(),
        key: key.into(),
        route: Route::Interactive,
        input_tokens: 10,
        optional_context_tokens: 0,
        max_output_tokens: 10,
        deadline_ms: 10_000_000,
        size_bytes: 0,
        attempt: 1,
        model: None,
        priority: Priority::Standard,
        labels: Vec::new(),
    }
}

fn view(now_ms: i64, key: &str) -> DecisionView {
    let mut view = DecisionView::scratch(Arc::default());
    view.now_ms = now_ms;
    view.jitter = Jitter::new(7, "acme", key, 1);
    view
}

fn faulty() -> &'static LoadedPolicy {
    static FAULTY: OnceLock<LoadedPolicy> = OnceLock::new();
    FAULTY.get_or_init(|| {
        let bytes = std::fs::read(built("python/faulty")).unwrap();
        runtime().load(&bytes, PolicyLimits::DEFAULT).unwrap()
    })
}

/// The plan's (estimated_exec_ms, optional_context_tokens).
fn plan(admission: Admission) -> (u64, u64) {
    match admission {
        Admission::Admit(p) => (p.estimated_exec_ms, p.optional_context_tokens),
        Admission::Refuse(r) => panic!("refused: {r:?}"),
    }
}

#[test]
fn a_python_policy_sees_the_decisions_time_and_draw_and_nothing_of_the_machine() {
    let p = faulty();
    // Both clocks read the decision's logical time.
    assert_eq!(
        plan(
            p.admit(view(1_234_567, "clock-1"), &request("clock-1"))
                .unwrap()
        ),
        (1_234_567, 1_234_567)
    );
    assert_eq!(
        plan(p.admit(view(42, "clock-1"), &request("clock-1")).unwrap()),
        (42, 42)
    );
    // WASI's random source is the decision's seeded draw: the same key draws the same, another
    // key draws otherwise.
    let draw = |key: &str| plan(p.admit(view(0, key), &request(key)).unwrap()).0;
    assert_eq!(draw("urandom-a"), draw("urandom-a"));
    let draws: std::collections::BTreeSet<u64> =
        ["urandom-a", "urandom-b", "urandom-c", "urandom-d"]
            .iter()
            .map(|k| draw(k))
            .collect();
    assert!(draws.len() >= 3, "{draws:?}");
    // The sealed WASI context was made for these calls (and only for components that use it:
    // see the runtime's unit test for a Rust policy).
    assert!(tollgate::runtime::wasi_contexts_made() > 0);
    // No file, folder, environment variable, argument or socket: the policy admits (it
    // refuses `too-large` when it finds anything).
    let peek = p.admit(view(0, "peek-1"), &request("peek-1")).unwrap();
    assert!(matches!(peek, Admission::Admit(_)), "{peek:?}");
    // A sleep is ready at once: logical time does not pass inside a decision.
    let started = Instant::now();
    let slept = p.admit(view(0, "sleep-1"), &request("sleep-1")).unwrap();
    assert!(matches!(slept, Admission::Admit(_)), "{slept:?}");
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    // A hundred printed lines: the decision stands, the log keeps its bound.
    let before = tollgate::runtime::log_lines_dropped();
    let printed = p.admit(view(0, "print-1"), &request("print-1")).unwrap();
    assert!(matches!(printed, Admission::Admit(_)), "{printed:?}");
    let dropped = tollgate::runtime::log_lines_dropped() - before;
    assert!(dropped >= 100 - 8, "{dropped}");
}

/// An engine deciding with the component `bytes`, under the default limits.
fn engine(bytes: &[u8]) -> Engine<SqliteStore> {
    let config = Config::from_json(&json!({"tenants": {"acme": {}}})).unwrap();
    let loaded = runtime()
        .load(bytes, config.policy_limits())
        .unwrap_or_else(|e| panic!("{e}"));
    Engine::new(
        config,
        SqliteStore::in_memory().unwrap(),
        runtime(),
        Arc::new(loaded),
    )
}

#[test]
fn a_python_policy_that_loops_hogs_or_raises_fails_closed_and_the_engine_goes_on() {
    let bytes = std::fs::read(built("python/faulty")).unwrap();
    let engine = engine(&bytes);
    for kind in ["loop", "hog", "raise"] {
        let started = Instant::now();
        let d = engine
            .admit(
                &common::request("acme", &format!("{kind}-1"), "interactive", 10, 60_000),
                0,
            )
            .unwrap();
        eprintln!("{kind}: stopped after {:?}", started.elapsed());
        assert_eq!(d.reason, Some(Reason::PolicyError), "{kind}: {d:?}");
        assert_eq!(d.http, 503);
    }
    // Nothing was spent, and ordinary keys decide by the standard rules.
    let after = engine.inspect(0).unwrap();
    assert_eq!(after.buckets["tenant.acme.requests"], 10);
    assert_eq!(after.slots["global"], 0);
    assert!(after.operations.is_empty());
    let d = engine
        .admit(
            &common::request("acme", "ok-1", "interactive", 10, 60_000),
            0,
        )
        .unwrap();
    assert!(matches!(d.outcome, Outcome::Accepted), "{d:?}");
}

#[test]
fn the_configurations_limits_bound_a_python_policy() {
    let bytes = std::fs::read(built("python/standard")).unwrap();
    let limits = |v: serde_json::Value| {
        Config::from_json(&json!({"limits": v}))
            .unwrap()
            .policy_limits()
    };
    // The interpreter's component is over 16 MiB: a smaller `max_policy_bytes` refuses it.
    let small = runtime().load(&bytes, limits(json!({"max_policy_bytes": 16 << 20})));
    assert!(matches!(small, Err(LoadError::TooBig { .. })), "{small:?}");
    // Too little memory for the interpreter's heap: it cannot even describe itself.
    let starved = runtime().load(&bytes, limits(json!({"policy_memory_bytes": 4 << 20})));
    let err = starved.unwrap_err().to_string();
    assert!(err.contains("faulted"), "{err}");
    // Too little fuel for the interpreter: refused at load, before any decision.
    let config = |fuel: u64| {
        Config::from_json(&json!({"tenants": {"acme": {}}, "limits": {"policy_fuel": fuel}}))
            .unwrap()
    };
    let err = runtime()
        .load(&bytes, config(MIN_POLICY_FUEL).policy_limits())
        .unwrap_err()
        .to_string();
    assert!(err.contains("fuel"), "{err}");
    // With the defaults it decides by the standard rules.
    let defaults = config(PolicyLimits::DEFAULT.fuel);
    let p = runtime().load(&bytes, defaults.policy_limits()).unwrap();
    assert_eq!(p.info.name, "standard");
    let engine = Engine::new(
        defaults,
        SqliteStore::in_memory().unwrap(),
        runtime(),
        Arc::new(p),
    );
    let fed = engine
        .admit(&common::request("acme", "k", "interactive", 10, 60_000), 0)
        .unwrap();
    assert!(matches!(fed.outcome, Outcome::Accepted), "{fed:?}");
    // Out-of-range limits are refused at start.
    for bad in [
        json!({"policy_memory_bytes": 0}),
        json!({"policy_memory_bytes": 4u64 << 30}),
        json!({"policy_fuel": 10}),
    ] {
        assert!(Config::from_json(&json!({"limits": bad})).is_err(), "{bad}");
    }
}
