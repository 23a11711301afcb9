//! The engine's invariants under random sequences: admissions (interactive and durable),
//! completions (with and without their attempt), reconciliations, dispatch and expiry,
//! policy swaps, housekeeping sweeps (abandoned calls) and time steps, driven through the real engine and store. After every step:
//!
//! - slots in use equal the operations holding slots, globally and per tenant, and only
//!   operations whose termination is not known (`active`, `unknown`) hold one;
//! - every tenant's token spend equals what the answers reserved (nothing refunded: no usage
//!   is reported), and no bucket is below zero or above its capacity;
//! - no (key, attempt) is accepted twice;
//! - no tenant sees another's operation (each tenant sends token counts of its own parity);
//! - queue depths equal the durable operations waiting.
//!
//! proptest shrinks a failure to a shortest sequence and keeps it in
//! `tests/invariants.regressions`, replayed first on every run. On SQLite always; on
//! PostgreSQL too when `TOLLGATE_TEST_POSTGRES` is set (`.ci/run`, with `--ignored`).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, FileFailurePersistence};
use serde_json::json;
use std::collections::HashSet;
use tollgate::engine::{
    Batch, Completion, CompletionAnswer, Decision, DispatchAnswer, Reconciliation, Ticket,
};
use tollgate::model::{names, CallResult, OpState, Route};
use tollgate::reason::Outcome;
use tollgate::store::Store;
use tollgate::Engine;

const TENANTS: [&str; 2] = ["t0", "t1"];
const TOKENS: f64 = 20_000.0;
const REQUESTS: f64 = 60.0;

#[derive(Clone, Debug)]
enum Step {
    Admit {
        tenant: usize,
        key: u8,
        durable: bool,
        tokens: u16,
        deadline_in: u16,
    },
    Complete {
        tenant: usize,
        key: u8,
        result: u8,
        attempt: Option<u8>,
    },
    Reconcile {
        tenant: usize,
        key: u8,
        succeeded: bool,
    },
    Dispatch {
        count: u8,
    },
    Advance {
        ms: u16,
    },
    Swap {
        deny_all: bool,
    },
    /// Housekeeping: calls active past `limits.max_call_ms` become `unknown`.
    Sweep,
    /// Admissions, completions and dispatches run together as the service's writer runs
    /// them: one transaction, each job all or nothing.
    Batch(Vec<Step>),
}

/// Steps that can be jobs of a batch.
fn batch_step() -> impl Strategy<Value = Step> {
    let tenant = 0..TENANTS.len();
    let key = 0u8..5;
    prop_oneof![
        3 => (tenant.clone(), key.clone(), any::<bool>(), 1u16..400, 0u16..4000).prop_map(
            |(tenant, key, durable, tokens, deadline_in)| Step::Admit { tenant, key, durable, tokens, deadline_in }
        ),
        2 => (tenant, key, 0u8..3, proptest::option::of(1u8..4)).prop_map(
            |(tenant, key, result, attempt)| Step::Complete { tenant, key, result, attempt }
        ),
        1 => (1u8..4).prop_map(|count| Step::Dispatch { count }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let tenant = 0..TENANTS.len();
    let key = 0u8..5;
    prop_oneof![
        4 => (tenant.clone(), key.clone(), any::<bool>(), 1u16..400, 0u16..4000).prop_map(
            |(tenant, key, durable, tokens, deadline_in)| Step::Admit { tenant, key, durable, tokens, deadline_in }
        ),
        3 => (tenant.clone(), key.clone(), 0u8..3, proptest::option::of(1u8..4)).prop_map(
            |(tenant, key, result, attempt)| Step::Complete { tenant, key, result, attempt }
        ),
        1 => (tenant, key, any::<bool>()).prop_map(|(tenant, key, succeeded)| Step::Reconcile { tenant, key, succeeded }),
        2 => (1u8..4).prop_map(|count| Step::Dispatch { count }),
        2 => (0u16..3000).prop_map(|ms| Step::Advance { ms }),
        1 => any::<bool>().prop_map(|deny_all| Step::Swap { deny_all }),
        1 => Just(Step::Sweep),
        2 => proptest::collection::vec(batch_step(), 1..8).prop_map(Step::Batch),
    ]
}

fn config() -> serde_json::Value {
    json!({
        "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 3},
        "tenant_defaults": {"requests": {"capacity": REQUESTS, "refill_per_s": 0},
                            "tokens": {"capacity": TOKENS, "refill_per_s": 0}, "queue_limit": 3},
        "tenants": {"t0": {"concurrency": 2}, "t1": {}},
        "limits": {"max_call_ms": 4000},
        "policy_params": {"max_attempts": 3, "backoff_base_ms": 50, "backoff_cap_ms": 400}
    })
}

/// What the answers said, against which the store is checked.
#[derive(Default)]
struct Model {
    now_ms: i64,
    spent_tokens: [u64; 2],
    accepted: HashSet<(usize, String, u32)>,
}

fn tenant_index(name: &str) -> usize {
    TENANTS.iter().position(|t| *t == name).unwrap()
}

fn run<S: Store>(engine: &Engine<S>, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut model = Model {
        now_ms: 1_000_000,
        ..Model::default()
    };
    for (n, step) in steps.iter().enumerate() {
        apply(engine, &mut model, step)?;
        check(engine, &model)
            .map_err(|e| TestCaseError::fail(format!("after step {n} {step:?}: {e}")))?;
    }
    Ok(())
}

/// The admission request of an `Admit` step. Each tenant's token counts have its own
/// parity: a view of another tenant's operation would show the wrong one.
fn admission(
    tenant: usize,
    key: u8,
    durable: bool,
    tokens: u16,
    deadline_ms: i64,
) -> serde_json::Value {
    json!({
        "tenant": TENANTS[tenant], "key": format!("k{key}"),
        "route": if durable { "durable" } else { "interactive" },
        "input_tokens": u64::from(tokens) * 2 + tenant as u64, "max_output_tokens": 50,
        "deadline_ms": deadline_ms,
    })
}

fn completion(tenant: usize, key: u8, result: u8, attempt: Option<u8>) -> Completion {
    let result = [
        CallResult::Succeeded,
        CallResult::Failed,
        CallResult::Unknown,
    ][result as usize];
    Completion {
        result,
        failure: (result == CallResult::Failed).then(|| "unavailable".to_string()),
        attempt: attempt.map(u32::from),
        ..Completion::succeeded(TENANTS[tenant], &format!("k{key}"))
    }
}

/// Counts an acceptance in the model; fails on a second acceptance of one attempt.
fn accepted(
    model: &mut Model,
    tenant: usize,
    key: &str,
    attempt: u32,
    reserved: u64,
) -> Result<(), TestCaseError> {
    let fresh = model.accepted.insert((tenant, key.to_string(), attempt));
    prop_assert!(fresh, "{key} attempt {attempt} of t{tenant} accepted twice");
    model.spent_tokens[tenant] += reserved;
    Ok(())
}

/// Runs a batch's steps as pieces of one transaction and counts their answers, in order.
fn run_batch<S: Store>(
    engine: &Engine<S>,
    model: &mut Model,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    /// What each piece of the batch answers.
    enum Piece {
        Admit(Ticket<Decision>, String, String),
        Complete(Ticket<CompletionAnswer>),
        Dispatch(Ticket<DispatchAnswer>),
    }
    let now = model.now_ms;
    let config = engine.config();
    let mut batch = Batch::new();
    let mut pieces = Vec::new();
    for step in steps {
        match step {
            Step::Admit {
                tenant,
                key,
                durable,
                tokens,
                deadline_in,
            } => {
                let raw = admission(
                    *tenant,
                    *key,
                    *durable,
                    *tokens,
                    now + i64::from(*deadline_in),
                );
                if let Ok(request) = tollgate::validate::request(&raw, &config) {
                    let (t, k) = (request.tenant.clone(), request.key.clone());
                    pieces.push(Piece::Admit(batch.admit(request, now), t, k));
                }
            }
            Step::Complete {
                tenant,
                key,
                result,
                attempt,
            } => {
                let c = completion(*tenant, *key, *result, *attempt);
                pieces.push(Piece::Complete(batch.complete(c, now)));
            }
            Step::Dispatch { count } => {
                let claims = batch.dispatch("w1".into(), u32::from(*count), now);
                pieces.push(Piece::Dispatch(claims));
            }
            _ => {}
        }
    }
    let failed = |e: tollgate::store::StoreError| TestCaseError::fail(e.to_string());
    let mut answers = engine.run(batch).map_err(failed)?;
    for piece in pieces {
        match piece {
            Piece::Admit(ticket, tenant, key) => {
                let d = answers.take(ticket).map_err(failed)?;
                if d.outcome == Outcome::Accepted {
                    accepted(
                        model,
                        tenant_index(&tenant),
                        &key,
                        d.attempt.unwrap(),
                        d.reserved_tokens.unwrap_or(0),
                    )?;
                }
            }
            Piece::Complete(ticket) => {
                answers.take(ticket).map_err(failed)?;
            }
            Piece::Dispatch(ticket) => {
                for c in answers.take(ticket).map_err(failed)?.claimed {
                    accepted(
                        model,
                        tenant_index(&c.tenant),
                        &c.key,
                        c.attempt,
                        c.reserved_tokens,
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn apply<S: Store>(
    engine: &Engine<S>,
    model: &mut Model,
    step: &Step,
) -> Result<(), TestCaseError> {
    let now = model.now_ms;
    match step {
        Step::Admit {
            tenant,
            key,
            durable,
            tokens,
            deadline_in,
        } => {
            let request = admission(
                *tenant,
                *key,
                *durable,
                *tokens,
                now + i64::from(*deadline_in),
            );
            let d = engine
                .admit(&request, now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            if d.outcome == Outcome::Accepted {
                let attempt = d.attempt.expect("an acceptance names its attempt");
                accepted(
                    model,
                    *tenant,
                    &format!("k{key}"),
                    attempt,
                    d.reserved_tokens.unwrap_or(0),
                )?;
            }
        }
        Step::Complete {
            tenant,
            key,
            result,
            attempt,
        } => {
            engine
                .complete(&completion(*tenant, *key, *result, *attempt), now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Step::Reconcile {
            tenant,
            key,
            succeeded,
        } => {
            let r = Reconciliation {
                tenant: TENANTS[*tenant].to_string(),
                key: format!("k{key}"),
                resolution: if *succeeded {
                    CallResult::Succeeded
                } else {
                    CallResult::Failed
                },
                usage: None,
                result_ref: None,
                worker: None,
                attempt: None,
            };
            engine
                .reconcile(&r, now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Step::Dispatch { count } => {
            let answer = engine
                .dispatch("w1", u32::from(*count), now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for c in answer.claimed {
                accepted(
                    model,
                    tenant_index(&c.tenant),
                    &c.key,
                    c.attempt,
                    c.reserved_tokens,
                )?;
            }
        }
        Step::Advance { ms } => model.now_ms += i64::from(*ms),
        Step::Batch(steps) => run_batch(engine, model, steps)?,
        Step::Sweep => {
            engine
                .sweep(now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Step::Swap { deny_all } => {
            let name = if *deny_all { "deny-all" } else { "standard" };
            engine
                .swap_policy(&common::policy_bytes(name))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
    Ok(())
}

fn check<S: Store>(engine: &Engine<S>, model: &Model) -> Result<(), String> {
    let view = engine.inspect(model.now_ms).map_err(|e| e.to_string())?;
    let ops = engine.operation_records().map_err(|e| e.to_string())?;

    let holding = ops.iter().filter(|o| o.holds_slot).count() as u32;
    let in_use = view.slots.get(names::GLOBAL_SLOTS).copied().unwrap_or(0);
    if in_use != holding {
        return Err(format!(
            "global slots in use {in_use}, operations holding one {holding}"
        ));
    }
    let t0_holding = ops
        .iter()
        .filter(|o| o.tenant == "t0" && o.holds_tenant_slot)
        .count() as u32;
    let t0_in_use = view
        .slots
        .get(&names::tenant_slots("t0"))
        .copied()
        .unwrap_or(0);
    if t0_in_use != t0_holding {
        return Err(format!(
            "t0 slots in use {t0_in_use}, operations holding one {t0_holding}"
        ));
    }
    if t0_in_use > 2 || in_use > 3 {
        return Err(format!(
            "over a concurrency limit: t0 {t0_in_use}, global {in_use}"
        ));
    }
    for op in &ops {
        let unfinished = matches!(op.state, OpState::Active | OpState::Unknown);
        if op.holds_slot != unfinished {
            return Err(format!(
                "{}/{} is {:?} and holds_slot is {}",
                op.tenant, op.key, op.state, op.holds_slot
            ));
        }
        if op.input_tokens % 2 != tenant_index(&op.tenant) as u64 {
            return Err(format!(
                "{}/{} carries another tenant's request",
                op.tenant, op.key
            ));
        }
    }
    for (i, tenant) in TENANTS.iter().enumerate() {
        let tokens = view.buckets[&names::tenant_tokens(tenant)];
        let expected = TOKENS as i64 - model.spent_tokens[i] as i64;
        if tokens != expected {
            return Err(format!(
                "{tenant} tokens {tokens}, the answers reserved {} of {TOKENS}",
                model.spent_tokens[i]
            ));
        }
        let requests = view.buckets[&names::tenant_requests(tenant)];
        if !(0..=REQUESTS as i64).contains(&requests) {
            return Err(format!("{tenant} requests {requests}"));
        }
        let waiting = ops
            .iter()
            .filter(|o| o.tenant == *tenant && o.route == Route::Durable)
            .filter(|o| matches!(o.state, OpState::Queued | OpState::RetryPending))
            .count() as u32;
        let depth = view.queues.get(*tenant).copied().unwrap_or(0);
        if depth != waiting {
            return Err(format!(
                "{tenant} queue depth {depth}, durable operations waiting {waiting}"
            ));
        }
    }
    Ok(())
}

fn runner(cases: u32) -> RunnerConfig {
    RunnerConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..RunnerConfig::default()
    }
}

proptest! {
    #![proptest_config(runner(256))]

    #[test]
    fn invariants_hold_on_sqlite(steps in proptest::collection::vec(step(), 1..60)) {
        let engine = common::engine(config(), "standard");
        run(&engine, &steps)?;
    }
}

proptest! {
    #![proptest_config(runner(48))]

    #[test]
    #[ignore = "needs PostgreSQL: .ci/run runs this with --ignored"]
    fn invariants_hold_on_postgres(steps in proptest::collection::vec(step(), 1..60)) {
        let url = std::env::var("TOLLGATE_TEST_POSTGRES").expect("TOLLGATE_TEST_POSTGRES");
        let store = tollgate::store::PgStore::open_scratch(&url, &format!("invariants_{}", std::process::id())).unwrap();
        let engine = common::engine_on(config(), store, "standard");
        run(&engine, &steps)?;
    }
}
