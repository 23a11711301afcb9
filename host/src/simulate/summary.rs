//! What one run measured: counts per tenant, the time series the plots draw, and the
//! summary written to `summary.json` (percentiles, shares and the two fairness measures).

use serde::Serialize;
use std::collections::BTreeMap;

/// The time series of one run, one point per sample.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Series {
    /// Sample times.
    pub t_ms: Vec<i64>,
    /// Queued durable jobs per tenant, at each sample.
    pub backlog: Vec<Vec<u32>>,
    /// Mean wait of the calls started since the previous sample, per tenant (ms).
    pub wait_ms: Vec<Vec<Option<f64>>>,
    /// Refusals since the previous sample, by reason.
    pub refusals: BTreeMap<String, Vec<u64>>,
    /// Tokens served so far, per tenant.
    pub tokens: Vec<Vec<u64>>,
    /// Durable jobs expired (their deadline could no longer be met) so far, per tenant.
    pub expired: Vec<Vec<u64>>,
    /// Provider calls in flight at each sample.
    pub occupancy: Vec<u32>,
    /// Calls sent to each simulated deployment since the previous sample, by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub deployment_sent: BTreeMap<String, Vec<u64>>,
    /// Whether each tenant had unserved demand (queued, or refused since the last sample).
    #[serde(skip)]
    pub backlogged: Vec<Vec<bool>>,
}

/// p50, p95 and p99 of a sample (`None` with no values).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// The median.
    pub p50: Option<u32>,
    /// The 95th percentile.
    pub p95: Option<u32>,
    /// The 99th percentile.
    pub p99: Option<u32>,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (sorted in place).
    pub fn of(values: &mut [u32]) -> Self {
        values.sort_unstable();
        let at = |q: f64| {
            (!values.is_empty()).then(|| {
                let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
                values[rank - 1]
            })
        };
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        }
    }
}

/// One tenant in `summary.json`. The run counts into it as it goes; the weight, the
/// total of refusals, the percentiles and the shares are filled in at the end.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantSummary {
    /// Its dispatch weight.
    pub weight: u32,
    /// Requests that arrived.
    pub offered: u64,
    /// Operations admitted at least once (accepted or queued).
    pub admitted: u64,
    /// Refusals by reason (a caller asking again is refused again).
    pub refused: BTreeMap<String, u64>,
    /// All refusals.
    pub refused_total: u64,
    /// Callers that stopped asking after a refusal.
    pub gave_up: u64,
    /// Durable jobs whose deadline passed in the queue.
    pub expired: u64,
    /// Calls that succeeded.
    pub completed: u64,
    /// Operations failed for good.
    pub failed_final: u64,
    /// Calls whose outcome was unknown (reconciled later).
    pub unknown: u64,
    /// Callers whose deadline passed before their answer: expired, late, or still waiting.
    pub past_deadline: u64,
    /// Operations unfinished at the end.
    pub pending_at_end: u64,
    /// Arrival to first provider call.
    pub wait_ms: Percentiles,
    /// Arrival to success.
    pub latency_ms: Percentiles,
    /// Tokens the provider reported for finished calls.
    pub tokens: u64,
    /// This tenant's part of all tokens served.
    pub token_share: f64,
    /// This tenant's part of all calls completed.
    pub request_share: f64,
}

/// The whole run in `summary.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The run's name (variant and policy).
    pub name: String,
    /// The policy that decided.
    pub policy: crate::engine::PolicyIdentity,
    /// Simulated time.
    pub duration_ms: u64,
    /// Per tenant.
    pub tenants: BTreeMap<String, TenantSummary>,
    /// Across tenants.
    pub overall: Overall,
    /// Per simulated deployment (the provider's `deployments`), by name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub deployments: BTreeMap<String, DeploymentSummary>,
}

/// One simulated deployment in `summary.json`: what was sent to it and how it answered.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DeploymentSummary {
    /// Calls sent to it.
    pub sent: u64,
    /// Calls it served.
    pub succeeded: u64,
    /// Calls it refused with 429: past its own limits, or by its failure draw.
    pub rate_limited: u64,
    /// Calls that failed otherwise (5xx).
    pub failed: u64,
    /// Calls whose outcome was lost.
    pub unknown: u64,
    /// The most calls it served at once.
    pub peak_in_flight: u32,
}

/// Totals and fairness across tenants.
#[derive(Clone, Debug, Serialize)]
pub struct Overall {
    /// Requests that arrived.
    pub offered: u64,
    /// Calls that succeeded.
    pub completed: u64,
    /// Refusals.
    pub refused: u64,
    /// Jobs expired in the queue.
    pub expired: u64,
    /// Callers whose deadline passed before their answer.
    pub past_deadline: u64,
    /// Jain's index over the tenants' token shares divided by their weights (1: each
    /// tenant served in proportion to its weight; 1/n: one tenant served alone).
    pub jain_fairness_tokens: Option<f64>,
    /// The largest difference of weighted tokens served to two tenants over any stretch
    /// in which both were backlogged (VTC's measure; 0 is perfectly fair).
    pub max_service_difference_tokens: u64,
    /// Mean provider calls in flight, at the samples.
    pub provider_occupancy_mean: f64,
    /// Admissions, completions and dispatches the engine decided.
    pub engine_calls: u64,
}

/// Jain's fairness index of `xs`: (Σx)² / (n · Σx²).
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    (!xs.is_empty() && squares > 0.0).then(|| sum * sum / (xs.len() as f64 * squares))
}

/// VTC's service difference: over every stretch of samples in which tenants `i` and `j`
/// are both backlogged, the largest |Δ service_i − Δ service_j| (service = tokens / weight).
pub fn max_service_difference(series: &Series, weights: &[u32]) -> u64 {
    let n = weights.len();
    let samples = series.t_ms.len();
    let service = |i: usize, k: usize| series.tokens[i][k] as f64 / weights[i].max(1) as f64;
    let mut most = 0.0f64;
    for i in 0..n {
        for j in i + 1..n {
            let mut start: Option<usize> = None;
            for k in 0..samples {
                if series.backlogged[i][k] && series.backlogged[j][k] {
                    let s = *start.get_or_insert(k.saturating_sub(1));
                    let d = (service(i, k) - service(i, s)) - (service(j, k) - service(j, s));
                    most = most.max(d.abs());
                } else {
                    start = None;
                }
            }
        }
    }
    most.round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<u32> = (1..=100).rev().collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p95, p.p99), (Some(50), Some(95), Some(99)));
        assert_eq!(Percentiles::of(&mut []).p50, None);
    }

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert_eq!(jain(&[2.0, 2.0, 2.0]), Some(1.0));
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]).unwrap() - 0.25).abs() < 1e-12);
    }

    #[test]
    fn service_difference_counts_only_stretches_where_both_wait() {
        let series = Series {
            t_ms: vec![0, 1, 2, 3],
            tokens: vec![vec![0, 100, 200, 900], vec![0, 50, 100, 100]],
            backlogged: vec![vec![true, true, true, false], vec![true, true, true, true]],
            ..Series::default()
        };
        // Both backlogged over samples 0..=2: a gained 200, b 100 (weights 1, 1).
        assert_eq!(max_service_difference(&series, &[1, 1]), 100);
        // With weight 2, a's 200 tokens are 100 of weighted service: even with b.
        assert_eq!(max_service_difference(&series, &[2, 1]), 0);
    }
}
