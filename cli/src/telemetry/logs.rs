//! `--log-format json`: one JSON object per line (`timestamp`, `level`, `target`,
//! `message` and the event's fields) with `trace_id` and `span_id` when the line was
//! written inside a traced request, so a log line leads to its trace and back.

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use std::fmt;
use tracing::field::{Field, Visit};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON line format.
pub struct JsonLines;

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let now = time::OffsetDateTime::now_utc();
        let stamp = now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        line.insert("timestamp".into(), Value::String(stamp));
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        line.append(&mut fields.0);
        // The trace of the request this line belongs to (the current span's, when traced).
        let current = tracing::Span::current();
        if !current.is_disabled() {
            let cx = current.context();
            let span = cx.span();
            let sc = span.span_context();
            if sc.is_valid() {
                line.insert("trace_id".into(), Value::String(sc.trace_id().to_string()));
                line.insert("span_id".into(), Value::String(sc.span_id().to_string()));
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}
