//! Fairness measured, not assumed: continuously backlogged tenants with weights 2:1:1 and
//! random job sizes.
//! - `wrr`: job-count shares are exact at every full round.
//! - `drr_tokens`: each tenant's tokens stay within `quantum × weight + largest job` of its
//!   weighted share, after every claim.

mod common;

use serde_json::json;
use std::collections::BTreeMap;
use tollgate::engine::Completion;
use tollgate::store::SqliteStore;
use tollgate::Engine;

const WEIGHTS: [(&str, u64); 3] = [("a", 2), ("b", 1), ("c", 1)];
const LARGEST_JOB: u64 = 3000;

/// A small deterministic generator (the test must replay exactly).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

fn engine(discipline: &str) -> Engine<SqliteStore> {
    common::engine(
        json!({
            "global": {"requests": {"capacity": 1e9, "refill_per_s": 1e9}, "concurrency": 1000},
            "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 1e9},
                                "tokens": {"capacity": 1e9, "refill_per_s": 1e9}, "queue_limit": 100},
            "tenants": {"a": {"weight": 2}, "b": {}, "c": {}},
            "scheduler": {"discipline": discipline, "quantum_tokens": 1000, "max_claims_per_worker": 1000}
        }),
        "standard",
    )
}

/// Keeps every queue at least `depth` deep with jobs of random size; returns each job's tokens.
fn top_up(
    e: &Engine<SqliteStore>,
    rng: &mut Lcg,
    next_key: &mut u64,
    sizes: &mut BTreeMap<String, u64>,
    depth: u32,
) {
    let depths = e.queue_depths().unwrap();
    for (tenant, _) in WEIGHTS {
        for _ in depths[tenant]..depth {
            *next_key += 1;
            let half = 1 + rng.next(LARGEST_JOB / 2);
            let key = format!("j{next_key}");
            let req = json!({"tenant": tenant, "key": key, "route": "durable",
                             "input_tokens": half, "max_output_tokens": half, "deadline_ms": 1_000_000_000});
            let d = e.admit(&req, 0).unwrap();
            assert_eq!(d.http, 202, "{d:?}");
            sizes.insert(format!("{tenant}/{key}"), 2 * half);
        }
    }
}

fn run(discipline: &str, claims: usize, mut check: impl FnMut(usize, &BTreeMap<&str, (u64, u64)>)) {
    let e = engine(discipline);
    let mut rng = Lcg(42);
    let mut next_key = 0;
    let mut sizes = BTreeMap::new();
    // tenant -> (jobs, tokens) served
    let mut served: BTreeMap<&str, (u64, u64)> =
        WEIGHTS.iter().map(|(t, _)| (*t, (0, 0))).collect();
    for n in 1..=claims {
        top_up(&e, &mut rng, &mut next_key, &mut sizes, 4);
        let answer = e.dispatch("w", 1, 0).unwrap();
        assert_eq!(answer.claimed.len(), 1, "{answer:?}");
        let c = &answer.claimed[0];
        assert_eq!(c.reserved_tokens, sizes[&format!("{}/{}", c.tenant, c.key)]);
        let entry = served.get_mut(c.tenant.as_str()).unwrap();
        entry.0 += 1;
        entry.1 += c.reserved_tokens;
        let done = Completion::succeeded(&c.tenant, &c.key);
        assert!(e.complete(&done, 0).unwrap().ok);
        check(n, &served);
    }
}

#[test]
fn wrr_job_shares_are_exact_at_full_rounds() {
    let total_weight: u64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut rounds_checked = 0;
    run("wrr", 400, |n, served| {
        if (n as u64).is_multiple_of(total_weight) {
            let rounds = n as u64 / total_weight;
            for (tenant, weight) in WEIGHTS {
                assert_eq!(
                    served[tenant].0,
                    weight * rounds,
                    "{tenant} after {n} claims: {served:?}"
                );
            }
            rounds_checked += 1;
        }
    });
    assert_eq!(rounds_checked, 100);
}

#[test]
fn drr_token_shares_stay_within_the_bound() {
    let total_weight: u64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut worst = 0f64;
    run("drr_tokens", 600, |n, served| {
        let total: u64 = served.values().map(|s| s.1).sum();
        for (tenant, weight) in WEIGHTS {
            let fair = total as f64 * weight as f64 / total_weight as f64;
            let deviation = (served[tenant].1 as f64 - fair).abs();
            let bound = (1000 * weight + LARGEST_JOB) as f64;
            worst = worst.max(deviation / bound);
            assert!(
                deviation <= bound,
                "{tenant} after {n} claims: {served:?} deviates {deviation} > {bound}"
            );
        }
    });
    eprintln!("worst deviation: {:.0}% of the bound", worst * 100.0);
}
