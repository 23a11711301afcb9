//! What a simulation run measures as it goes: each tenant's counts, waits and latencies,
//! and the series sampled at fixed times. The event loop (`run`) says what happened; the
//! recorder keeps the books and turns them into the run's summary at the end.

use super::summary::{
    jain, max_service_difference, DeploymentSummary, Overall, Percentiles, Series, TenantSummary,
};
use std::collections::BTreeMap;

/// The books of one run, one entry per tenant (by the load's tenant index).
pub(super) struct Recorder {
    /// Per tenant: the counts of its summary, filled in as the run goes.
    tallies: Vec<TenantSummary>,
    /// Per tenant: arrival to the first provider call, per operation that reached one (ms).
    waits: Vec<Vec<u32>>,
    /// Per tenant: arrival to success (ms).
    latencies: Vec<Vec<u32>>,
    series: Series,
    /// Per tenant since the last sample: summed waits and calls started, refused at all.
    interval_waits: Vec<(f64, u32)>,
    interval_refused: Vec<bool>,
    /// Refusals since the last sample, by reason.
    interval_refusals: BTreeMap<String, u64>,
    /// Per simulated deployment (in name order): its name and counts.
    deployments: Vec<(String, DeploymentSummary)>,
    /// Per simulated deployment: calls sent to it since the last sample.
    interval_sent: Vec<u64>,
}

/// What the run ended with, for [`Recorder::finish`].
pub(super) struct Ending<'a> {
    /// Each tenant's dispatch weight.
    pub weights: &'a [u32],
    /// Engine calls the run made.
    pub engine_calls: u64,
}

impl Recorder {
    /// Empty books for `tenants` tenants and the provider's `deployments`.
    pub fn new(tenants: usize, deployments: Vec<String>) -> Self {
        let n = tenants;
        Recorder {
            tallies: vec![TenantSummary::default(); n],
            waits: vec![Vec::new(); n],
            latencies: vec![Vec::new(); n],
            series: Series {
                backlog: vec![Vec::new(); n],
                wait_ms: vec![Vec::new(); n],
                tokens: vec![Vec::new(); n],
                expired: vec![Vec::new(); n],
                backlogged: vec![Vec::new(); n],
                ..Series::default()
            },
            interval_waits: vec![(0.0, 0); n],
            interval_refused: vec![false; n],
            interval_refusals: BTreeMap::new(),
            interval_sent: vec![0; deployments.len()],
            deployments: deployments
                .into_iter()
                .map(|d| (d, DeploymentSummary::default()))
                .collect(),
        }
    }

    /// A call was sent to deployment `i`.
    pub fn deployment_sent(&mut self, i: usize) {
        self.deployments[i].1.sent += 1;
        self.interval_sent[i] += 1;
    }

    /// Deployment `i` took a call and now serves `in_flight`.
    pub fn deployment_in_flight(&mut self, i: usize, in_flight: u32) {
        let d = &mut self.deployments[i].1;
        d.peak_in_flight = d.peak_in_flight.max(in_flight);
    }

    /// A call sent to deployment `i` ended: `succeeded`, `unknown`, or the failure's kind.
    pub fn deployment_ended(&mut self, i: usize, kind: &str) {
        let d = &mut self.deployments[i].1;
        match kind {
            "succeeded" => d.succeeded += 1,
            "rate_limited" => d.rate_limited += 1,
            "unknown" => d.unknown += 1,
            _ => d.failed += 1,
        }
    }

    /// A request arrived.
    pub fn offered(&mut self, tenant: usize) {
        self.tallies[tenant].offered += 1;
    }

    /// An operation was admitted (accepted or queued) for the first time.
    pub fn admitted(&mut self, tenant: usize) {
        self.tallies[tenant].admitted += 1;
    }

    /// A request was refused for `reason`.
    pub fn refused(&mut self, tenant: usize, reason: &str) {
        *self.tallies[tenant]
            .refused
            .entry(reason.to_string())
            .or_default() += 1;
        *self
            .interval_refusals
            .entry(reason.to_string())
            .or_default() += 1;
        self.interval_refused[tenant] = true;
    }

    /// A caller stopped asking after a refusal.
    pub fn gave_up(&mut self, tenant: usize) {
        self.tallies[tenant].gave_up += 1;
    }

    /// An operation reached its first provider call `wait_ms` after it arrived.
    pub fn first_call(&mut self, tenant: usize, wait_ms: i64) {
        let wait = wait_ms.max(0);
        self.waits[tenant].push(wait.min(u32::MAX as i64) as u32);
        let w = &mut self.interval_waits[tenant];
        *w = (w.0 + wait as f64, w.1 + 1);
    }

    /// An operation succeeded with `tokens` used, `latency_ms` after it arrived.
    pub fn succeeded(&mut self, tenant: usize, tokens: u64, latency_ms: i64, late: bool) {
        let tally = &mut self.tallies[tenant];
        tally.completed += 1;
        tally.tokens += tokens;
        if late {
            tally.past_deadline += 1;
        }
        self.latencies[tenant].push(latency_ms.clamp(0, u32::MAX as i64) as u32);
    }

    /// An operation failed for good.
    pub fn failed_final(&mut self, tenant: usize) {
        self.tallies[tenant].failed_final += 1;
    }

    /// A call ended with an unknown outcome.
    pub fn unknown(&mut self, tenant: usize) {
        self.tallies[tenant].unknown += 1;
    }

    /// An unknown outcome was reconciled as `tokens` used.
    pub fn reconciled(&mut self, tenant: usize, tokens: u64) {
        self.tallies[tenant].tokens += tokens;
    }

    /// A queued job expired before dispatch.
    pub fn expired(&mut self, tenant: usize) {
        self.tallies[tenant].expired += 1;
        self.tallies[tenant].past_deadline += 1;
    }

    /// An operation was still pending when the run ended (`late`: its deadline had passed).
    pub fn pending_at_end(&mut self, tenant: usize, late: bool) {
        self.tallies[tenant].pending_at_end += 1;
        if late {
            self.tallies[tenant].past_deadline += 1;
        }
    }

    /// Samples the series at `now`: calls in flight, and each tenant's queue depth.
    pub fn sample(&mut self, now: i64, in_flight: u32, depth: impl Fn(usize) -> u32) {
        let series = &mut self.series;
        series.t_ms.push(now);
        series.occupancy.push(in_flight);
        for i in 0..self.tallies.len() {
            let depth = depth(i);
            series.backlog[i].push(depth);
            let (sum, count) = std::mem::take(&mut self.interval_waits[i]);
            series.wait_ms[i].push((count > 0).then(|| sum / count as f64));
            series.tokens[i].push(self.tallies[i].tokens);
            series.expired[i].push(self.tallies[i].expired);
            let refused = std::mem::take(&mut self.interval_refused[i]);
            series.backlogged[i].push(depth > 0 || refused);
        }
        let k = series.t_ms.len();
        for (reason, n) in std::mem::take(&mut self.interval_refusals) {
            let line = series.refusals.entry(reason).or_default();
            line.resize(k - 1, 0);
            line.push(n);
        }
        for line in series.refusals.values_mut() {
            line.resize(k, 0);
        }
        for (i, (name, _)) in self.deployments.iter().enumerate() {
            let sent = std::mem::take(&mut self.interval_sent[i]);
            series
                .deployment_sent
                .entry(name.clone())
                .or_default()
                .push(sent);
        }
    }

    /// Closes the books: each tenant's summary (shares, percentiles), the run's overall
    /// figures, and the series.
    pub fn finish(
        mut self,
        ending: Ending,
    ) -> (
        Vec<TenantSummary>,
        Overall,
        BTreeMap<String, DeploymentSummary>,
        Series,
    ) {
        let all_tokens: u64 = self.tallies.iter().map(|t| t.tokens).sum();
        let all_completed: u64 = self.tallies.iter().map(|t| t.completed).sum();
        let share = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
        let mut weighted = Vec::new();
        for (i, t) in self.tallies.iter_mut().enumerate() {
            t.weight = ending.weights[i];
            weighted.push(t.tokens as f64 / t.weight.max(1) as f64);
            t.refused_total = t.refused.values().sum();
            t.wait_ms = Percentiles::of(&mut self.waits[i]);
            t.latency_ms = Percentiles::of(&mut self.latencies[i]);
            t.token_share = share(t.tokens, all_tokens);
            t.request_share = share(t.completed, all_completed);
        }
        let tallies = &self.tallies;
        let occupancy = &self.series.occupancy;
        let overall = Overall {
            offered: tallies.iter().map(|t| t.offered).sum(),
            completed: all_completed,
            refused: tallies.iter().map(|t| t.refused_total).sum(),
            expired: tallies.iter().map(|t| t.expired).sum(),
            past_deadline: tallies.iter().map(|t| t.past_deadline).sum(),
            jain_fairness_tokens: jain(&weighted),
            max_service_difference_tokens: max_service_difference(&self.series, ending.weights),
            provider_occupancy_mean: occupancy.iter().map(|&x| x as f64).sum::<f64>()
                / occupancy.len().max(1) as f64,
            engine_calls: ending.engine_calls,
        };
        let deployments = self.deployments.into_iter().collect();
        (self.tallies, overall, deployments, self.series)
    }
}
