//! Whether the store can write now, as the writer last found it. A batch that fails for
//! the store's absence (its disk full, its connection lost) marks it unable to write; a
//! batch that commits marks it writing again. While it cannot write and no work comes,
//! the writer probes it (one small write, every [`PROBE_EVERY`]) so that the state
//! recovers by itself when space or the connection returns; `/healthz` reads the state.

use crate::store::StoreError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often an idle writer probes a store that cannot write.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Why the store cannot write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    /// `disk_full` or `unreachable`.
    pub kind: &'static str,
    /// The store's own words.
    pub message: String,
}

impl Trouble {
    /// The trouble `e` says, when it is the store's absence.
    pub fn of(e: &StoreError) -> Option<Trouble> {
        e.unavailable_kind().map(|kind| Trouble {
            kind,
            message: e.to_string(),
        })
    }
}

/// The store's state as the writer last found it.
#[derive(Default)]
pub struct StoreHealth {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    trouble: Option<Trouble>,
    last_probe: Option<Instant>,
}

impl StoreHealth {
    /// Why the store cannot write, if it cannot.
    pub fn trouble(&self) -> Option<Trouble> {
        self.lock().trouble.clone()
    }

    /// Records what a write found (`None`: it committed); whether that changed the state.
    pub(super) fn record(&self, found: Option<Trouble>) -> bool {
        let mut state = self.lock();
        let changed = state.trouble.is_some() != found.is_some();
        state.trouble = found;
        changed
    }

    /// Whether an idle writer should probe now (the store cannot write and the last probe
    /// is [`PROBE_EVERY`] old); if so the probe is counted as made.
    pub(super) fn probe_due(&self, now: Instant) -> bool {
        let mut state = self.lock();
        let due = state.trouble.is_some()
            && state
                .last_probe
                .is_none_or(|t| now.duration_since(t) >= PROBE_EVERY);
        if due {
            state.last_probe = Some(now);
        }
        due
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_reported_once_and_probes_are_spaced() {
        let h = StoreHealth::default();
        let full = Trouble::of(&StoreError::DiskFull("database or disk is full".into()));
        assert_eq!(full.as_ref().map(|t| t.kind), Some("disk_full"));
        assert!(
            !h.probe_due(Instant::now()),
            "nothing to probe while writing"
        );
        assert!(h.record(full.clone()));
        assert!(!h.record(full), "the same state again is no change");
        let t0 = Instant::now();
        assert!(h.probe_due(t0));
        assert!(!h.probe_due(t0 + Duration::from_millis(10)));
        assert!(h.probe_due(t0 + PROBE_EVERY));
        assert!(h.record(None));
        assert_eq!(h.trouble(), None);
        assert!(Trouble::of(&StoreError::Schema("x".into())).is_none());
    }
}
