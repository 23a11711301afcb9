//! The host imports of the world, served from one decision's [`DecisionView`] under a
//! budget of host calls.

use super::bindings;
use super::sealed_wasi::SealedWasi;
use super::{
    BucketKind, BucketLevel, DecisionView, LogLevel, SlotLevel, SlotScope, HOST_CALLS_PER_CALL,
    MAX_PARAM_NAME_BYTES,
};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::StoreLimits;
use wasmtime_wasi::{WasiCtxView, WasiView};

/// `log` lines one call of an export may write; later ones are dropped and counted.
pub const LOG_LINES_PER_CALL: u32 = 8;
/// Longest `log` line, in bytes; a longer one is cut.
pub const MAX_LOG_LINE_BYTES: usize = 1024;

static LOG_LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// `log` lines dropped since the process started, over [`LOG_LINES_PER_CALL`].
pub fn log_lines_dropped() -> u64 {
    LOG_LINES_DROPPED.load(Ordering::Relaxed)
}

/// Who is deciding on what, for the policy's log lines.
#[derive(Clone, Debug, Default)]
pub(super) struct LogContext {
    /// The policy's SHA-256 in hex, made once at load (not per decision).
    pub digest: std::sync::Arc<str>,
    pub key: String,
}

/// The per-decision store data.
pub(super) struct HostState {
    view: DecisionView,
    /// The sealed WASI context, made on the guest's first WASI call (`None` for a policy that
    /// imports no WASI).
    wasi: Option<SealedWasi>,
    pub(super) limits: StoreLimits,
    /// Host calls this guest call may still make (see [`HOST_CALLS_PER_CALL`]).
    host_calls_left: u32,
    log_lines_left: u32,
    log: LogContext,
    /// What the policy `explain`ed in this call (world 0.3.0), bounded.
    explanation: Option<String>,
}

impl HostState {
    pub(super) fn new(view: DecisionView, limits: StoreLimits, log: LogContext) -> Self {
        HostState {
            view,
            wasi: None,
            limits,
            host_calls_left: HOST_CALLS_PER_CALL,
            log_lines_left: LOG_LINES_PER_CALL,
            log,
            explanation: None,
        }
    }

    /// Points a store made ahead at the decision it serves: the view it reads and the
    /// operation its log lines name.
    pub(super) fn begin(&mut self, view: DecisionView, key: String) {
        self.view = view;
        self.log.key = key;
    }

    /// `explain`: keeps the words (the last call wins), bounded; never fails the guest
    /// beyond counting as a host call.
    pub(super) fn explain(&mut self, message: &str) -> wasmtime::Result<()> {
        self.host_call()?;
        self.explanation = crate::explain::bounded_policy_message(message);
        Ok(())
    }

    /// What the policy explained in this call, taken.
    pub(super) fn take_explanation(&mut self) -> Option<String> {
        self.explanation.take()
    }

    /// Counts one host call, trapping the guest once its budget is spent.
    fn host_call(&mut self) -> wasmtime::Result<()> {
        match self.host_calls_left.checked_sub(1) {
            Some(left) => {
                self.host_calls_left = left;
                Ok(())
            }
            None => Err(wasmtime::Error::msg(format!(
                "the policy made more than {HOST_CALLS_PER_CALL} host calls in one call"
            ))),
        }
    }

    /// What the guest wrote to stdout (info) and stderr (warn) in this call, as log lines
    /// under the same bounds as `log`.
    pub(super) fn flush_output(&mut self) {
        let Some(wasi) = self.wasi.as_mut() else {
            return;
        };
        let (stdout, stderr) = wasi.take_output();
        for (level, text) in [(LogLevel::Info, stdout), (LogLevel::Warn, stderr)] {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                self.write_log(level, line.to_string());
            }
        }
    }

    /// One line into the host's log, counted against the call's bound.
    fn write_log(&mut self, level: LogLevel, message: String) {
        let Some(left) = self.log_lines_left.checked_sub(1) else {
            LOG_LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.log_lines_left = left;
        let message = super::bounded_to(message, MAX_LOG_LINE_BYTES);
        let (digest, key) = (&self.log.digest, &self.log.key);
        match level {
            LogLevel::Debug => {
                tracing::debug!(target: "tollgate::policy", policy = %digest, key = %key, "{message}")
            }
            LogLevel::Info => {
                tracing::info!(target: "tollgate::policy", policy = %digest, key = %key, "{message}")
            }
            LogLevel::Warn => {
                tracing::warn!(target: "tollgate::policy", policy = %digest, key = %key, "{message}")
            }
            LogLevel::Error => {
                tracing::error!(target: "tollgate::policy", policy = %digest, key = %key, "{message}")
            }
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let view = &self.view;
        let wasi = self.wasi.get_or_insert_with(|| SealedWasi::new(view));
        WasiCtxView {
            ctx: &mut wasi.ctx,
            table: &mut wasi.table,
        }
    }
}

impl bindings::tollgate::policy::types::Host for HostState {}

impl bindings::tollgate::policy::host::Host for HostState {
    fn now_ms(&mut self) -> wasmtime::Result<i64> {
        self.host_call()?;
        Ok(self.view.now_ms)
    }

    fn param(&mut self, name: String) -> wasmtime::Result<Option<f64>> {
        self.host_call()?;
        if name.len() > MAX_PARAM_NAME_BYTES {
            return Err(wasmtime::Error::msg(format!(
                "the policy asked for a parameter name of {} bytes (at most {MAX_PARAM_NAME_BYTES})",
                name.len()
            )));
        }
        Ok(self.view.params.numbers.get(&name).copied())
    }

    fn param_string(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        self.host_call()?;
        if name.len() > MAX_PARAM_NAME_BYTES {
            return Err(wasmtime::Error::msg(format!(
                "the policy asked for a parameter name of {} bytes (at most {MAX_PARAM_NAME_BYTES})",
                name.len()
            )));
        }
        Ok(self.view.params.strings.get(&name).cloned())
    }

    fn log(&mut self, level: LogLevel, message: String) -> wasmtime::Result<()> {
        self.host_call()?;
        self.write_log(level, message);
        Ok(())
    }

    fn tenant_weight(&mut self) -> wasmtime::Result<u32> {
        self.host_call()?;
        Ok(self.view.weight)
    }

    fn bucket(&mut self, kind: BucketKind) -> wasmtime::Result<Option<BucketLevel>> {
        self.host_call()?;
        Ok(self.view.bucket(kind))
    }

    fn slots(&mut self, scope: SlotScope) -> wasmtime::Result<Option<SlotLevel>> {
        self.host_call()?;
        Ok(self.view.slots(scope))
    }

    fn random(&mut self, upper: u64) -> wasmtime::Result<u64> {
        self.host_call()?;
        Ok(self.view.jitter.below_inclusive(upper))
    }
}
