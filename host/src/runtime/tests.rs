//! The runtime's tests: isolation, limits, faults, worlds and the compiled cache.

use super::error::bounded;
use super::*;

/// A test fixture this build made (`policies/fixtures/`).
fn fixture(name: &str) -> Vec<u8> {
    let dir = crate::scenario::default_fixtures();
    crate::scenario::resolve_policy(name, None, &dir).unwrap()
}

#[test]
fn jitter_is_deterministic_and_bounded() {
    let mut a = Jitter::new(7, "acme", "k1", 1);
    let mut b = Jitter::new(7, "acme", "k1", 1);
    let mut c = Jitter::new(7, "acme", "k1", 2);
    let xs: Vec<u64> = (0..50).map(|_| a.below_inclusive(100)).collect();
    let ys: Vec<u64> = (0..50).map(|_| b.below_inclusive(100)).collect();
    let zs: Vec<u64> = (0..50).map(|_| c.below_inclusive(100)).collect();
    assert_eq!(xs, ys);
    assert_ne!(xs, zs);
    assert!(xs.iter().all(|&x| x <= 100));
    assert_eq!(Jitter::new(1, "t", "k", 1).below_inclusive(0), 0);
}

#[test]
fn a_compiled_component_is_kept_on_disk_checked_and_recompiled_when_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = builtin::get("standard").unwrap();
    let runtime = || {
        Runtime::new()
            .unwrap()
            .with_compiled_cache(CompiledCache::new(dir.path()))
    };
    let entries = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect::<Vec<_>>()
    };
    // A first process compiles and keeps the result.
    let first = runtime();
    assert_eq!(
        first
            .load(bytes, PolicyLimits::DEFAULT)
            .unwrap()
            .info()
            .name,
        "standard"
    );
    assert_eq!(first.compilations(), 1);
    let kept = entries();
    assert_eq!(kept.len(), 1, "{kept:?}");
    // A second process (a fresh engine) compiles nothing and decides the same way.
    let second = runtime();
    let loaded = second.load(bytes, PolicyLimits::DEFAULT).unwrap();
    assert_eq!(second.compilations(), 0);
    assert_eq!(loaded.digest(), &PolicyDigest::of(bytes));
    // One byte changed, or the entry cut short: never loaded, compiled again, rewritten.
    for damage in [
        |b: &mut Vec<u8>| {
            let i = b.len() / 2;
            b[i] ^= 0x40;
        },
        |b: &mut Vec<u8>| b.truncate(b.len() / 3),
    ] {
        let mut b = std::fs::read(&kept[0]).unwrap();
        damage(&mut b);
        std::fs::write(&kept[0], &b).unwrap();
        let third = runtime();
        assert_eq!(
            third
                .load(bytes, PolicyLimits::DEFAULT)
                .unwrap()
                .info()
                .name,
            "standard"
        );
        assert_eq!(third.compilations(), 1, "a damaged entry is compiled again");
        let fourth = runtime();
        fourth.load(bytes, PolicyLimits::DEFAULT).unwrap();
        assert_eq!(fourth.compilations(), 0, "and the sound entry is back");
    }
    // Another component has an entry of its own.
    runtime()
        .load(builtin::get("deny-all").unwrap(), PolicyLimits::DEFAULT)
        .unwrap();
    assert_eq!(entries().len(), 2);
}

/// Why loading a built-in fixture fails, and the error's text.
fn load_error(name: &str) -> (LoadError, String) {
    let err = Runtime::new()
        .unwrap()
        .load(&fixture(name), PolicyLimits::DEFAULT)
        .unwrap_err();
    let text = err.to_string();
    (err, text)
}

#[test]
fn broken_policy_is_refused_with_what_is_missing() {
    let (err, text) = load_error("broken");
    assert!(matches!(err, LoadError::World(_)), "{text}");
    assert!(text.contains("tollgate:policy/decide"), "{text}");
}

#[test]
fn a_policy_whose_decision_exports_have_other_types_is_refused_at_load() {
    let (_, text) = load_error("mistyped");
    assert!(text.contains("type mismatch"), "{text}");
}

#[test]
fn not_a_component_is_refused() {
    let rt = Runtime::new().unwrap();
    assert!(matches!(
        rt.load(b"\0asm garbage", PolicyLimits::DEFAULT),
        Err(LoadError::Compile(_))
    ));
    assert!(matches!(
        rt.load(
            &[0u8; 100],
            PolicyLimits {
                max_bytes: 10,
                ..PolicyLimits::DEFAULT
            }
        ),
        Err(LoadError::TooBig { .. })
    ));
}

#[test]
fn a_core_module_is_refused_with_how_to_make_a_component() {
    // The smallest core module: the header alone.
    let err = Runtime::new()
        .unwrap()
        .load(b"\0asm\x01\0\0\0", PolicyLimits::DEFAULT)
        .unwrap_err()
        .to_string();
    assert!(err.contains("core wasm module"), "{err}");
    assert!(err.contains("wasm-tools component new"), "{err}");
}

#[test]
fn long_messages_are_cut_at_a_character_boundary_and_say_how_long_they_were() {
    assert_eq!(bounded("short".into()), "short");
    let exact = "x".repeat(MAX_MESSAGE_BYTES);
    assert_eq!(bounded(exact.clone()), exact);
    // Two-byte characters from the first byte: the cut falls inside one at 1024 + 1.
    let long = format!("x{}", "é".repeat(MAX_MESSAGE_BYTES));
    let cut = bounded(long.clone());
    let (kept, note) = cut.split_once(" … ").unwrap();
    assert!(
        long.starts_with(kept) && kept.len() == MAX_MESSAGE_BYTES - 1,
        "{}",
        kept.len()
    );
    assert_eq!(note, format!("({} bytes in all)", long.len()));
}

#[test]
fn what_a_hostile_module_says_about_itself_is_bounded() {
    let rt = Runtime::new().unwrap();
    let load = |name| rt.load(&fixture(name), PolicyLimits::DEFAULT).unwrap();
    let scratch = || DecisionView::scratch(Arc::default());
    // A self-check failing with 4 MiB of text.
    let message = load("verbose").self_check(scratch()).unwrap().unwrap_err();
    assert!(message.len() < MAX_MESSAGE_BYTES + 64, "{}", message.len());
    assert!(
        message.ends_with(&format!("({} bytes in all)", 4 << 20)),
        "{message}"
    );
    // A trap whose backtrace has a line for every frame of a runaway recursion.
    let fault = faulty_admit("deep-1");
    assert!(fault.0.len() < MAX_MESSAGE_BYTES + 64, "{}", fault.0.len());
    // The cause comes first, so the cut keeps it (the guest's shadow stack runs below
    // address 0 before wasmtime's own stack limit is reached).
    assert!(fault.0.starts_with("wasm trap: "), "{}", fault.0);
    assert!(fault.0.contains("bytes in all"), "{}", fault.0);
}

/// The fault of `faulty` deciding on a request with `key`.
fn faulty_admit(key: &str) -> PolicyFault {
    let faulty = Runtime::new()
        .unwrap()
        .load(&fixture("faulty"), PolicyLimits::DEFAULT)
        .unwrap();
    let request = Request {
        tenant: "acme".into(),
        key: key.into(),
        route: Route::Interactive,
        input_tokens: 1,
        optional_context_tokens: 0,
        max_output_tokens: 1,
        deadline_ms: 1,
        size_bytes: 0,
        attempt: 1,
        model: None,
        priority: Priority::Standard,
        labels: Vec::new(),
    };
    let view = DecisionView::scratch(Arc::default());
    faulty.admit(view, &request).unwrap_err()
}

#[test]
fn host_calls_are_budgeted_and_parameter_names_bounded() {
    // Fuel alone let these run for 140 ms and for minutes: the traps are the host's.
    let chatty = faulty_admit("chatty-1");
    assert!(
        chatty.0.contains("more than 1000 host calls"),
        "{}",
        chatty.0
    );
    let loud = faulty_admit("loud-1");
    assert!(
        loud.0
            .contains(&format!("a parameter name of {} bytes", 16 << 20)),
        "{}",
        loud.0
    );
}

fn request(key: &str) -> Request {
    Request {
        tenant: "acme".into(),
        key: key.into(),
        route: Route::Interactive,
        input_tokens: 10,
        optional_context_tokens: 5,
        max_output_tokens: 500,
        deadline_ms: 60_000,
        size_bytes: 0,
        attempt: 1,
        model: Some("gpt-4o".into()),
        priority: Priority::Sheddable,
        labels: vec![("tier".into(), "free".into())],
    }
}

/// A component this repository keeps as built for an earlier world (`0.1.0`, `0.2.0`).
fn kept(world: &str, name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../policies/fixtures/world-{world}/{name}.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap()
}

fn world_v1(name: &str) -> Vec<u8> {
    kept("0.1.0", name)
}

#[test]
fn components_of_every_world_load_and_decide_alike() {
    let rt = Runtime::new().unwrap();
    let old = rt
        .load(&world_v1("standard"), PolicyLimits::DEFAULT)
        .unwrap();
    let v2 = rt
        .load(&kept("0.2.0", "standard"), PolicyLimits::DEFAULT)
        .unwrap();
    let new = rt
        .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
        .unwrap();
    assert_eq!(
        (old.world, v2.world, new.world),
        (WorldVersion::V0_1, WorldVersion::V0_2, WorldVersion::V0_3)
    );
    assert_eq!(old.info.name, "standard");
    let mut view = DecisionView::scratch(Arc::default());
    view.global_slots = Some(SlotLevel {
        in_use: 7,
        limit: 8,
    });
    let params = Params {
        numbers: [("degrade_at_slot_fraction".to_string(), 0.5)].into(),
        strings: Default::default(),
    };
    view.params = Arc::new(params);
    let mut req = request("k");
    req.priority = Priority::Standard;
    let a = old.admit(view.clone(), &req).unwrap();
    let b = new.admit(view.clone(), &req).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert_eq!(
        format!("{:?}", v2.admit(view.clone(), &req).unwrap()),
        format!("{b:?}")
    );
    assert!(matches!(a, Admission::Admit(p) if p.max_output_tokens == 256));
    let report = FailureReport {
        tenant: "acme".into(),
        key: "k".into(),
        route: Route::Interactive,
        attempt: 1,
        failure: Some(Failure::RateLimited),
        provider_retry_after_ms: Some(700),
        deadline_ms: 60_000,
        max_output_tokens: 10,
        optional_context_tokens: 0,
        input_tokens: 10,
        model: None,
        priority: Priority::Standard,
    };
    let a = old.on_failure(view.clone(), &report).unwrap();
    let b = new.on_failure(view.clone(), &report).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    let c = v2.on_failure(view.clone(), &report).unwrap();
    assert_eq!(format!("{c:?}"), format!("{b:?}"));
    // An old module's traps still fail closed.
    let faulty = rt.load(&world_v1("faulty"), PolicyLimits::DEFAULT).unwrap();
    assert!(faulty.admit(view, &request("trap-1")).is_err());
}

#[test]
fn a_policy_reads_model_priority_labels_and_string_params_and_its_log_is_bounded() {
    let rt = Runtime::new().unwrap();
    let p = rt
        .load(&fixture("shed-model"), PolicyLimits::DEFAULT)
        .unwrap();
    let mut view = DecisionView::scratch(Arc::default());
    view.params = Arc::new(Params {
        numbers: Default::default(),
        strings: [("shed_model".to_string(), "gpt-4o".to_string())].into(),
    });
    let shed = p.admit(view.clone(), &request("a")).unwrap();
    assert!(matches!(shed, Admission::Refuse(r) if r.reason == RefusalReason::Overloaded));
    let mut other = request("b");
    other.model = Some("small".into());
    let capped = p.admit(view.clone(), &other).unwrap();
    assert!(matches!(capped, Admission::Admit(p) if p.max_output_tokens == 100));
    let before = log_lines_dropped();
    let mut flood = request("log-flood-1");
    flood.priority = Priority::Standard;
    assert!(
        p.admit(view, &flood).is_ok(),
        "a flood of log lines never traps"
    );
    let dropped = log_lines_dropped() - before;
    assert!(dropped >= u64::from(20 - LOG_LINES_PER_CALL), "{dropped}");
}

#[test]
fn a_policy_that_imports_no_wasi_never_makes_a_wasi_context() {
    let rt = Runtime::new().unwrap();
    let before = wasi_contexts_made();
    let p = rt
        .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
        .unwrap();
    let view = DecisionView::scratch(Arc::default());
    assert!(p.self_check(view.clone()).unwrap().is_ok());
    assert!(matches!(
        p.admit(view, &request("k")).unwrap(),
        Admission::Admit(_)
    ));
    assert_eq!(wasi_contexts_made(), before);
}

#[test]
fn standard_policy_describes_itself() {
    let rt = Runtime::new().unwrap();
    let p = rt
        .load(builtin::get("standard").unwrap(), PolicyLimits::DEFAULT)
        .unwrap();
    assert_eq!(p.info.name, "standard");
    assert_eq!(
        p.digest,
        PolicyDigest::of(builtin::get("standard").unwrap())
    );
}

#[test]
fn a_smaller_pool_decides_and_bounds_what_a_call_may_grow_to() {
    let pool = PoolConfig {
        slots: 4,
        max_memory_bytes: 16 << 20,
    };
    let runtime = Runtime::with_pool(pool).unwrap();
    assert_eq!(runtime.pool(), pool);
    // The configuration allows 64 MiB; the pool's slots hold 16.
    let limits = PolicyLimits {
        memory_bytes: 64 << 20,
        ..PolicyLimits::DEFAULT
    };
    let faulty = runtime.load(&fixture("faulty"), limits).unwrap();
    assert_eq!(faulty.limits.memory_bytes, 16 << 20);
    let view = || DecisionView::scratch(Arc::default());
    // `big` grows its memory to most of a MiB: inside a slot, it decides.
    assert!(faulty.admit(view(), &request("big-1")).is_ok());
    // `hog` grows until refused: the slot's bound stops it, and the call fails closed.
    let hog = faulty.admit(view(), &request("hog-1")).unwrap_err();
    assert!(!hog.0.is_empty());
    assert!(faulty.admit(view(), &request("big-2")).is_ok());

    // A pool out of its bounds is refused, and says why.
    for (slots, max_memory_bytes, says) in [
        (0, 16 << 20, "at least 1 slot"),
        (4, 1 << 10, "one wasm page"),
        (4, MAX_POLICY_MEMORY + 1, "one wasm page"),
    ] {
        let refused = Runtime::with_pool(PoolConfig {
            slots,
            max_memory_bytes,
        });
        let message = refused.err().expect("refused").to_string();
        assert!(message.contains(says), "{message}");
    }
}

/// Waits until `policy` has an instance made ahead ready (the thread beside it is free to
/// take its time on a busy machine).
fn until_one_is_ready(policy: &LoadedPolicy) {
    let started = std::time::Instant::now();
    while policy.instances_ahead().0 == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no instance made ahead in 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn instances_made_ahead_are_fresh_and_decide_as_those_made_inline() {
    let mut ahead_runtime = Runtime::new().unwrap();
    ahead_runtime.set_instances_ahead(4);
    assert_eq!(ahead_runtime.instances_ahead(), 4);
    let ahead = ahead_runtime
        .load(&fixture("faulty"), PolicyLimits::DEFAULT)
        .unwrap();
    let inline = Runtime::new()
        .unwrap()
        .load(&fixture("faulty"), PolicyLimits::DEFAULT)
        .unwrap();
    assert_eq!(inline.instances_ahead(), (0, 0));
    let view = DecisionView::scratch(Arc::default());
    // `remember` traps in an instance that decided before: each of these must be fresh,
    // whether it was ready or made by the call.
    for i in 0..24 {
        if i % 2 == 0 {
            until_one_is_ready(&ahead);
        }
        let key = format!("remember-{i}");
        let made_ahead = ahead.admit(view.clone(), &request(&key));
        let made_inline = inline.admit(view.clone(), &request(&key));
        assert!(made_ahead.is_ok(), "{key}: {made_ahead:?}");
        assert_eq!(
            format!("{made_ahead:?}"),
            format!("{made_inline:?}"),
            "{key}"
        );
    }
    let (_, taken) = ahead.instances_ahead();
    assert!(
        taken >= 12,
        "only {taken} of 24 calls found an instance ready"
    );
    // A trap in an instance made ahead costs only that call.
    until_one_is_ready(&ahead);
    let trapped = ahead.admit(view.clone(), &request("trap-1")).unwrap_err();
    assert!(trapped.0.contains("unreachable"), "{}", trapped.0);
    until_one_is_ready(&ahead);
    assert!(ahead.admit(view, &request("remember-after-trap")).is_ok());
}

#[test]
fn instances_made_ahead_hold_no_more_than_the_slots_set_aside() {
    let pool = PoolConfig {
        slots: 64,
        max_memory_bytes: 64 << 20,
    };
    let mut runtime = Runtime::with_pool(pool).unwrap();
    runtime.set_instances_ahead(8);
    // Half of 64 slots set aside; 8 ahead may hold 8 + 3 bunches of 4 + 1 of them.
    assert_eq!(runtime.ahead_slots.free(), 32);
    let load = |runtime: &Runtime| {
        runtime
            .load(&fixture("faulty"), PolicyLimits::DEFAULT)
            .unwrap()
    };
    let first = load(&runtime);
    assert_eq!(runtime.ahead_slots.free(), 11);
    let second = load(&runtime);
    assert_eq!(runtime.ahead_slots.free(), 11, "no room for a second");
    let view = DecisionView::scratch(Arc::default());
    until_one_is_ready(&first);
    for policy in [&first, &second] {
        assert!(policy.admit(view.clone(), &request("remember-1")).is_ok());
    }
    assert_eq!(first.instances_ahead().1, 1);
    assert_eq!(second.instances_ahead(), (0, 0));
    drop(first);
    assert_eq!(runtime.ahead_slots.free(), 32);
    let third = load(&runtime);
    until_one_is_ready(&third);
    assert!(third.admit(view, &request("remember-1")).is_ok());
    assert_eq!(third.instances_ahead().1, 1);
    // A pool too small to set 21 slots aside (40 keeps 20 for decisions made in place)
    // makes none ahead.
    let mut small = Runtime::with_pool(PoolConfig { slots: 40, ..pool }).unwrap();
    small.set_instances_ahead(8);
    assert!(load(&small).ahead.is_none());
    assert_eq!(small.ahead_slots.free(), 20);
    let mut enough = Runtime::with_pool(PoolConfig { slots: 42, ..pool }).unwrap();
    enough.set_instances_ahead(8);
    assert!(load(&enough).ahead.is_some());
}

#[test]
fn a_large_component_makes_two_instances_ahead() {
    let mut runtime = Runtime::new().unwrap();
    runtime.set_instances_ahead(8);
    let aside = runtime.ahead_slots.free();
    // `faulty` with a custom section that takes it past LARGE_COMPONENT_BYTES.
    let mut large = fixture("faulty");
    let name = b"padding";
    let size = 1 + name.len() + LARGE_COMPONENT_BYTES;
    large.push(0);
    let mut n = size;
    while n >= 0x80 {
        large.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    large.push(n as u8);
    large.push(name.len() as u8);
    large.extend_from_slice(name);
    large.resize(large.len() + LARGE_COMPONENT_BYTES, 0);
    let policy = runtime.load(&large, PolicyLimits::DEFAULT).unwrap();
    // 2 ready, 3 bunches of 1, and the one being made.
    assert_eq!(aside - runtime.ahead_slots.free(), 6);
    until_one_is_ready(&policy);
    let view = DecisionView::scratch(Arc::default());
    assert!(policy.admit(view, &request("remember-1")).is_ok());
    drop(policy);
    let small = runtime
        .load(&fixture("faulty"), PolicyLimits::DEFAULT)
        .unwrap();
    assert_eq!(aside - runtime.ahead_slots.free(), 21);
    drop(small);
    assert_eq!(runtime.ahead_slots.free(), aside);
}
