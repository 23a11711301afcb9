//! Sending finished spans: a bounded queue between the requests that end spans and one
//! thread that posts them in batches with OpenTelemetry's OTLP/HTTP exporter. A full
//! queue drops the span rather than wait, and an export that fails drops its batch; both
//! are counted (`tollgate_trace_spans_total{result}`), so a receiver that is down or slow
//! never holds a request.

use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Spans waiting to be sent, at most (about 1 KiB each).
const QUEUE: usize = 8192;
/// Spans per export, at most.
const BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const LINGER: Duration = Duration::from_millis(500);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans by what became of them: `exported`, `dropped_queue_full`, `dropped_export_failed`.
pub static SPANS: LazyLock<prometheus::IntCounterVec> = LazyLock::new(|| {
    let counter = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "tollgate_trace_spans_total",
            "Trace spans by what became of them (exported, dropped_queue_full, dropped_export_failed)",
        ),
        &["result"],
    )
    .expect("a valid metric");
    for result in ["exported", "dropped_queue_full", "dropped_export_failed"] {
        counter.with_label_values(&[result]);
    }
    counter
});

/// What the queue carries to the sending thread.
#[derive(Debug)]
enum Message {
    /// An ended, sampled span.
    Span(Box<SpanData>),
    /// Send what is queued and stop (the thread may be waiting with nothing to send).
    Close,
}

/// The span processor: ended, sampled spans into the queue; the thread does the rest.
#[derive(Debug)]
pub struct Bounded {
    queue: SyncSender<Message>,
    closing: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Bounded {
    /// Builds the exporter for `endpoint` (a full `/v1/traces` address) and starts its
    /// thread.
    pub fn start(endpoint: &str, service_name: &str) -> Result<Bounded, String> {
        // The exporter's hyper client needs a runtime to run on: the thread's own.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("telemetry: {e}"))?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let client = opentelemetry_http::hyper::HyperClient::new(connector, EXPORT_TIMEOUT, None);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("telemetry.otlp_endpoint {endpoint}: {e}"))?;
        exporter.set_resource(
            &Resource::builder()
                .with_service_name(service_name.to_string())
                .build(),
        );
        let (queue, taken) = sync_channel(QUEUE);
        let closing = Arc::new(AtomicBool::new(false));
        let stop = closing.clone();
        let thread = std::thread::Builder::new()
            .name("tollgate-traces".into())
            .spawn(move || runtime.block_on(send(exporter, taken, stop)))
            .map_err(|e| format!("telemetry: {e}"))?;
        Ok(Bounded {
            queue,
            closing,
            thread: Mutex::new(Some(thread)),
        })
    }
}

/// The sending thread: a batch goes when it is full or its first span has waited
/// [`LINGER`]; what is queued when asked to close goes too. With nothing to send it waits
/// for the next message and does not wake before.
async fn send(
    exporter: opentelemetry_otlp::SpanExporter,
    taken: Receiver<Message>,
    closing: Arc<AtomicBool>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut since: Option<Instant> = None;
    loop {
        let message = match since {
            None if !closing.load(Ordering::Relaxed) => taken
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
            None => taken.recv_timeout(Duration::ZERO),
            Some(t) => taken.recv_timeout(LINGER.saturating_sub(t.elapsed())),
        };
        match message {
            Ok(Message::Span(span)) => {
                since.get_or_insert_with(Instant::now);
                batch.push(*span);
            }
            Ok(Message::Close) => closing.store(true, Ordering::Relaxed),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let closed = closing.load(Ordering::Relaxed);
        let due = since.is_some_and(|t| t.elapsed() >= LINGER);
        if batch.len() >= BATCH || (due || closed) && !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
            let n = spans.len() as u64;
            let result = match exporter.export(spans).await {
                Ok(()) => "exported",
                Err(e) => {
                    tracing::debug!(error = %e, "a batch of spans was not exported");
                    "dropped_export_failed"
                }
            };
            SPANS.with_label_values(&[result]).inc_by(n);
            since = None;
        }
        if closed && batch.is_empty() {
            return;
        }
    }
}

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send(Message::Span(Box::new(span)))
        {
            SPANS.with_label_values(&["dropped_queue_full"]).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.closing.store(true, Ordering::Relaxed);
        // Wakes a thread waiting with nothing to send; a full queue means it is not waiting.
        let _ = self.queue.try_send(Message::Close);
        let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let until = Instant::now() + timeout;
        while !thread.is_finished() {
            if Instant::now() >= until {
                return Err(OTelSdkError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = thread.join();
        Ok(())
    }
}
