//! Traces: an OpenTelemetry span for each request and its steps (admission, the writer's
//! queue, the policy call, the store's commit, the upstream call, dispatch, completion),
//! exported over OTLP/HTTP when an endpoint is configured (the `telemetry` section or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! Spans are written with `tracing` under the target [`TARGET`], which only the
//! OpenTelemetry layer listens to: with no endpoint that layer is absent, those spans are
//! disabled at their call sites, and a request costs what it cost before. The writer's
//! steps are timed by the writer itself and turned into spans on the requester's side
//! (see [`writer_spans`]), so the writer's thread never builds or exports one.

mod export;
pub mod logs;
mod spans;

pub use export::SPANS;
pub use spans::{
    admission, completion, decided, dispatched, durable_context, inject, number, server_span,
    upstream, upstream_answered, waited, writer_spans,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tollgate::config::TelemetryConfig;

/// The `tracing` target of every span meant for OpenTelemetry.
pub const TARGET: &str = "tollgate::trace";

/// Spans exported while this lives; dropping it sends what is queued (briefly) and stops.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// Where spans go.
    pub endpoint: String,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Starts exporting when an endpoint is configured; the `tracing` layer that feeds it comes
/// back with it. `None`: nothing is exported and no span is built.
///
/// # Errors
/// The exporter could not be built from the configuration (the endpoint named).
pub fn start<S>(
    config: &TelemetryConfig,
) -> Result<Option<(Telemetry, impl tracing_subscriber::Layer<S>)>, String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let Some(endpoint) = config.traces_endpoint(|k| std::env::var(k).ok()) else {
        return Ok(None);
    };
    let processor = export::Bounded::start(&endpoint, &config.service_name)?;
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("tollgate");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_target(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == TARGET
        }));
    Ok(Some((Telemetry { provider, endpoint }, layer)))
}
