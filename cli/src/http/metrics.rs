//! Prometheus metrics: decisions by outcome and reason, HTTP answers by status and open
//! connections, the policy version, bucket and slot gauges, the policy call latency, and
//! the writer's batches (the one writer is where the service saturates first) and the WAL
//! restarts that hold it.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The service's metrics, registered in a registry of their own.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub decisions: IntCounterVec,
    pub responses: IntCounterVec,
    /// Connections open now (at most `limits.max_connections`).
    pub connections: IntGauge,
    pub policy: GaugeVec,
    pub buckets: GaugeVec,
    /// Credits each period budget has spent in its current period.
    pub period_spent: GaugeVec,
    pub slots: GaugeVec,
    pub queues: GaugeVec,
    /// How long each tenant's oldest queued job has waited.
    pub queue_age: GaugeVec,
    /// Each deployment's state: 0 healthy, 1 paused, 2 ejected, 3 probing.
    pub deployment_state: GaugeVec,
    /// Each deployment's concurrency limit now (configured or learned), where it has one.
    pub deployment_limit: GaugeVec,
    pub policy_calls: Histogram,
    /// Jobs per writer transaction.
    pub batch_jobs: Histogram,
    /// Time per writer transaction, commit included.
    pub batch_seconds: Histogram,
    /// How long each WAL restart held the writer (SQLite).
    pub wal_restart_seconds: Histogram,
    /// Gateway calls by tenant, model and outcome.
    pub gateway_calls: IntCounterVec,
    /// Upstream time per attempt, to the whole answer (plain) or its last event (stream).
    pub gateway_upstream_seconds: HistogramVec,
    /// Upstream time to the first event of a stream.
    pub gateway_ttft_seconds: HistogramVec,
    /// Tokens the providers reported, by tenant, model and direction (`in`, `out`).
    pub gateway_tokens: IntCounterVec,
    /// Gateway completions the store could not take at once (`kept`), and how each kept
    /// one ended (`applied`, `not_applied`, `given_up`).
    pub gateway_completions_kept: IntCounterVec,
    /// Live admissions the shadow policy was asked about, by both answers.
    pub shadow: GaugeVec,
    /// Policy `log` lines dropped over the per-call bound.
    pub log_lines_dropped: IntGauge,
    /// Fresh policy instances made ahead and ready now, over every writer shard.
    pub instances_ready: IntGauge,
    /// Policy calls that found their instance made ahead, since the active policy was
    /// loaded, over every writer shard.
    pub calls_found_ready: IntGauge,
    /// Operations `unknown` now, awaiting reconciliation.
    pub unknown_operations: IntGauge,
    /// Budget alerts in the outbox not yet acknowledged by their webhook.
    pub alerts_pending: IntGauge,
    /// Calls found abandoned (`active` past `limits.max_call_ms`) and made `unknown`.
    pub abandoned: prometheus::IntCounter,
    /// Finished operations deleted for retention.
    pub retention_deleted: prometheus::IntCounter,
    /// Writer batches the store could not write, by why (`disk_full`, `unreachable`).
    pub store_write_failures: IntCounterVec,
    /// Calls in the waiting room now, by band.
    pub waiting_calls: GaugeVec,
    /// Calls in the waiting room now, by tenant (with the admin key only).
    pub waiting_tenant_calls: GaugeVec,
    /// How long calls waited in the waiting room, by how they left it.
    pub wait_seconds: HistogramVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions = counters(
            "tollgate_decisions_total",
            "Admission decisions by outcome and reason",
            &["outcome", "reason"],
        );
        let responses = counters(
            "tollgate_http_responses_total",
            "HTTP answers by status",
            &["status"],
        );
        let int_gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("a valid gauge");
        let connections = int_gauge(
            "tollgate_http_connections",
            "HTTP connections open (at most limits.max_connections)",
        );
        let policy = gauges(
            "tollgate_policy_info",
            "The active policy (value 1)",
            &["name", "version", "sha256"],
        );
        let buckets = gauges(
            "tollgate_bucket_credits",
            "Whole credits per bucket",
            &["bucket"],
        );
        let period_spent = gauges(
            "tollgate_period_spent_credits",
            "Credits each period budget has spent since its period began (micro-dollars for money)",
            &["bucket"],
        );
        let slots = gauges(
            "tollgate_slots_in_use",
            "Calls in flight per scope",
            &["scope"],
        );
        let queues = gauges(
            "tollgate_queue_depth",
            "Queued jobs per tenant",
            &["tenant"],
        );
        let queue_age = gauges(
            "tollgate_queue_oldest_age_seconds",
            "How long each tenant's oldest queued job has waited (0 when none waits)",
            &["tenant"],
        );
        let waiting_calls = gauges(
            "tollgate_waiting_calls",
            "Calls waiting in the waiting room, by band",
            &["band"],
        );
        let waiting_tenant_calls = gauges(
            "tollgate_waiting_tenant_calls",
            "Calls waiting in the waiting room, by tenant",
            &["tenant"],
        );
        let wait_seconds = histograms(
            "tollgate_wait_seconds",
            "How long calls waited in the waiting room, by how they left it (admitted, deadline, max_wait, gone, queue_full)",
            &["outcome"],
            &[0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        );
        let deployment_state = gauges(
            "tollgate_deployment_state",
            "Each deployment's state: 0 healthy, 1 paused, 2 ejected, 3 probing",
            &["model", "deployment"],
        );
        let deployment_limit = gauges(
            "tollgate_deployment_concurrency_limit",
            "Each deployment's concurrency limit (configured or learned)",
            &["model", "deployment"],
        );
        let policy_calls = histogram(
            "tollgate_policy_call_seconds",
            "Policy call latency (instantiate and call)",
            &[
                0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05,
            ],
        );
        let batch_jobs = histogram(
            "tollgate_writer_batch_jobs",
            "Jobs committed together in one writer transaction",
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
        );
        let batch_seconds = histogram(
            "tollgate_writer_batch_seconds",
            "Time per writer transaction, commit included",
            &[
                0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5,
            ],
        );
        let wal_restart_seconds = histogram(
            "tollgate_wal_restart_seconds",
            "How long each WAL restart held the writer (SQLite)",
            &[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
        );
        let gateway_calls = counters(
            "tollgate_gateway_calls_total",
            "Gateway calls by tenant, model and outcome",
            &["tenant", "model", "outcome"],
        );
        let latency = [
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let gateway_upstream_seconds = histograms(
            "tollgate_gateway_upstream_seconds",
            "Upstream time per attempt, to the end of the answer",
            &["model"],
            &latency,
        );
        let gateway_ttft_seconds = histograms(
            "tollgate_gateway_ttft_seconds",
            "Upstream time to the first event of a stream",
            &["model"],
            &latency,
        );
        let gateway_tokens = counters(
            "tollgate_gateway_tokens_total",
            "Tokens the providers reported, by tenant, model and direction",
            &["tenant", "model", "direction"],
        );
        let gateway_completions_kept = counters(
            "tollgate_gateway_completions_kept_total",
            "Gateway completions kept through a store outage, and how each ended",
            &["outcome"],
        );
        let shadow = gauges(
            "tollgate_shadow_decisions",
            "Live admissions the shadow policy was asked about, by the active and the shadow answer",
            &["active", "shadow"],
        );
        let log_lines_dropped = int_gauge(
            "tollgate_policy_log_lines_dropped",
            "Policy log lines dropped over the per-call bound",
        );
        let instances_ready = int_gauge(
            "tollgate_policy_instances_ready",
            "Fresh policy instances made ahead and ready now (serve --policy-instances-ahead)",
        );
        let calls_found_ready = int_gauge(
            "tollgate_policy_calls_found_ready",
            "Policy calls that found their instance made ahead, since the active policy was loaded",
        );
        let unknown_operations = int_gauge(
            "tollgate_operations_unknown",
            "Operations whose outcome is unknown, awaiting reconciliation (their slots held)",
        );
        let alerts_pending = int_gauge(
            "tollgate_alerts_pending",
            "Budget alerts written and not yet acknowledged by their webhook",
        );
        let abandoned = prometheus::IntCounter::new(
            "tollgate_abandoned_calls_total",
            "Calls active for longer than limits.max_call_ms, made unknown",
        )
        .expect("a valid counter");
        let retention_deleted = prometheus::IntCounter::new(
            "tollgate_operations_deleted_total",
            "Finished operations deleted after retention.operations_days",
        )
        .expect("a valid counter");
        let store_write_failures = counters(
            "tollgate_store_write_failures_total",
            "Writer batches the store could not write, by why (disk_full, unreachable)",
            &["kind"],
        );
        for c in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(store_write_failures.clone()),
            Box::new(unknown_operations.clone()),
            Box::new(alerts_pending.clone()),
            Box::new(abandoned.clone()),
            Box::new(retention_deleted.clone()),
            Box::new(shadow.clone()),
            Box::new(log_lines_dropped.clone()),
            Box::new(instances_ready.clone()),
            Box::new(calls_found_ready.clone()),
            Box::new(gateway_calls.clone()),
            Box::new(gateway_upstream_seconds.clone()),
            Box::new(gateway_ttft_seconds.clone()),
            Box::new(gateway_tokens.clone()),
            Box::new(gateway_completions_kept.clone()),
            Box::new(responses.clone()),
            Box::new(connections.clone()),
            Box::new(policy.clone()),
            Box::new(buckets.clone()),
            Box::new(period_spent.clone()),
            Box::new(slots.clone()),
            Box::new(queues.clone()),
            Box::new(queue_age.clone()),
            Box::new(waiting_calls.clone()),
            Box::new(waiting_tenant_calls.clone()),
            Box::new(wait_seconds.clone()),
            Box::new(deployment_state.clone()),
            Box::new(deployment_limit.clone()),
            Box::new(policy_calls.clone()),
            Box::new(batch_jobs.clone()),
            Box::new(batch_seconds.clone()),
            Box::new(wal_restart_seconds.clone()),
            Box::new(crate::telemetry::SPANS.clone()),
        ] {
            registry.register(c).unwrap();
        }
        Metrics {
            registry,
            decisions,
            responses,
            connections,
            policy,
            buckets,
            period_spent,
            slots,
            queues,
            queue_age,
            deployment_state,
            deployment_limit,
            policy_calls,
            batch_jobs,
            batch_seconds,
            wal_restart_seconds,
            gateway_calls,
            gateway_upstream_seconds,
            gateway_ttft_seconds,
            gateway_tokens,
            gateway_completions_kept,
            shadow,
            log_lines_dropped,
            instances_ready,
            calls_found_ready,
            unknown_operations,
            alerts_pending,
            abandoned,
            retention_deleted,
            store_write_failures,
            waiting_calls,
            waiting_tenant_calls,
            wait_seconds,
        }
    }

    /// The text exposition format: every series when `per_tenant`, else the totals only
    /// (no series names a tenant: tenants' names, levels and traffic are the operators').
    pub fn render(&self, per_tenant: bool) -> String {
        let mut families = self.registry.gather();
        if !per_tenant {
            for family in &mut families {
                family
                    .mut_metric()
                    .retain(|m| m.get_label().iter().all(names_no_tenant));
            }
            families.retain(|f| !f.get_metric().is_empty());
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .unwrap_or_default();
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Whether a label leaves tenants unnamed: no `tenant` label, and bucket and slot scope
/// names only of the global ones.
fn names_no_tenant(label: &prometheus::proto::LabelPair) -> bool {
    match label.name() {
        "tenant" => false,
        "bucket" | "scope" => {
            label.value().starts_with("global") || label.value().starts_with("model.")
        }
        _ => true,
    }
}

fn counters(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter")
}

fn gauges(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge")
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("a valid histogram")
}

fn histograms(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("a valid histogram")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The writer's batches and its housekeeping sweeps, counted.
impl tollgate::writer::WriterObserver for Metrics {
    fn batch(&self, jobs: usize, took: std::time::Duration) {
        self.batch_jobs.observe(jobs as f64);
        self.batch_seconds.observe(took.as_secs_f64());
    }

    fn swept(&self, s: &tollgate::engine::Sweep) {
        self.abandoned.inc_by(s.abandoned.len() as u64);
        self.retention_deleted.inc_by(s.deleted);
        self.unknown_operations.set(s.unknown as i64);
    }

    fn write_failed(&self, trouble: &tollgate::writer::Trouble) {
        self.store_write_failures
            .with_label_values(&[trouble.kind])
            .inc();
    }

    fn waited(&self, outcome: &'static str, waited: std::time::Duration) {
        self.wait_seconds
            .with_label_values(&[outcome])
            .observe(waited.as_secs_f64());
    }

    fn traced(&self, span: &tracing::Span, stamps: &tollgate::writer::Stamps) {
        crate::telemetry::writer_spans(span, stamps);
    }

    /// One log line per change of the store's state, never one per request.
    fn store_state(&self, trouble: Option<&tollgate::writer::Trouble>) {
        match trouble {
            Some(t) => {
                tracing::error!(kind = t.kind, error = %t.message, "the store cannot write: requests answer 503 store_unavailable until it can")
            }
            None => tracing::info!("the store writes again"),
        }
    }
}
