//! Instances made ahead: a thread beside the decisions instantiates a policy's next fresh
//! instances and drops the used ones, so that a decision finds its instance ready and
//! leaves the teardown (the reset of its memory) to another core.
//!
//! Every decision still runs in an instance no decision ran in before: a used instance is
//! only ever dropped, never handed out again. Nothing here can fail a decision: when no
//! instance is ready the caller instantiates one itself, and when the thread is behind
//! with its drops the caller drops its own. Used instances go back in bunches, so that the
//! thread is woken once per bunch rather than once per decision (a wake-up per decision
//! cost the writer a tenth of its time), and the pool slots they may hold all at once are
//! set aside first ([`AheadSlots`]), so that instances made ahead never take the slots
//! decisions made in place need.

use super::host::HostState;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use wasmtime::component::Instance;
use wasmtime::Store;

/// A fresh instance and the store it lives in, not yet called.
pub(super) struct Ready {
    pub(super) store: Store<HostState>,
    pub(super) instance: Instance,
}

/// The pool slots a runtime's policies may hold with instances made ahead, shared by all
/// of them.
#[derive(Clone, Debug)]
pub(super) struct AheadSlots(Arc<AtomicU32>);

/// Slots set aside for one policy's instances made ahead, given back when dropped.
pub(super) struct SlotsHeld {
    from: Arc<AtomicU32>,
    slots: u32,
}

impl Drop for SlotsHeld {
    fn drop(&mut self) {
        self.from.fetch_add(self.slots, Ordering::Relaxed);
    }
}

impl AheadSlots {
    /// `slots` pool slots to share.
    pub(super) fn new(slots: u32) -> Self {
        AheadSlots(Arc::new(AtomicU32::new(slots)))
    }

    /// The slots `depth` instances made ahead may hold at once: those ready, a bunch on
    /// its way back, a bunch waiting to be dropped, a bunch being dropped, and the one
    /// being made.
    pub(super) fn needed(depth: usize) -> u32 {
        u32::try_from(depth + 3 * bunch(depth) + 1).unwrap_or(u32::MAX)
    }

    /// Sets aside the slots for `depth` instances ahead, if that many are free.
    pub(super) fn hold(&self, depth: usize) -> Option<SlotsHeld> {
        let slots = Self::needed(depth);
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
                free.checked_sub(slots)
            })
            .ok()?;
        Some(SlotsHeld {
            from: self.0.clone(),
            slots,
        })
    }

    /// Slots not set aside now.
    #[cfg(test)]
    pub(super) fn free(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Used instances handed back at once: half the ready ones.
fn bunch(depth: usize) -> usize {
    (depth / 2).max(1)
}

/// The ready instances of one policy and the way back for used ones; the thread that
/// serves them stops when this is dropped.
pub(super) struct Ahead {
    ready: Mutex<Receiver<Ready>>,
    /// Used stores not yet handed back, up to a bunch.
    pile: Mutex<Vec<Store<HostState>>>,
    used: SyncSender<Vec<Store<HostState>>>,
    bunch: usize,
    /// Instances the thread has put in the queue, and instances taken from it.
    made: Arc<AtomicU64>,
    taken: AtomicU64,
    _slots: SlotsHeld,
}

impl Ahead {
    /// Starts a thread that keeps up to `depth` instances made by `make` ready, making one
    /// more for each used one it drops. `None` when no thread can be started.
    pub(super) fn start(
        depth: usize,
        slots: SlotsHeld,
        make: impl Fn() -> Option<Ready> + Send + 'static,
    ) -> Option<Ahead> {
        let (ready_tx, ready_rx) = sync_channel(depth);
        let (used_tx, used_rx) = sync_channel::<Vec<Store<HostState>>>(1);
        let made = Arc::new(AtomicU64::new(0));
        let counted = made.clone();
        // Makes `n` instances; false once the policy is gone. A full queue drops the
        // spare instance here.
        let make_more = move |n: usize| {
            for _ in 0..n {
                let Some(ready) = make() else { continue };
                match ready_tx.try_send(ready) {
                    Ok(()) => {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return false,
                }
            }
            true
        };
        std::thread::Builder::new()
            .name("tollgate-instances".into())
            .spawn(move || {
                if !make_more(depth) {
                    return;
                }
                for used in used_rx.iter() {
                    let n = used.len();
                    drop(used);
                    if !make_more(n) {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Ahead {
            ready: Mutex::new(ready_rx),
            pile: Mutex::new(Vec::with_capacity(bunch(depth))),
            used: used_tx,
            bunch: bunch(depth),
            made,
            taken: AtomicU64::new(0),
            _slots: slots,
        })
    }

    /// A ready instance, if one is.
    pub(super) fn take(&self) -> Option<Ready> {
        let ready = self.ready.lock().ok()?.try_recv().ok()?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(ready)
    }

    /// Piles a used store up, handing the pile to the thread to drop once it is a bunch;
    /// drops it here when the thread is behind.
    pub(super) fn give_back(&self, store: Store<HostState>) {
        let Ok(mut pile) = self.pile.lock() else {
            return;
        };
        pile.push(store);
        if pile.len() < self.bunch {
            return;
        }
        let bunch = std::mem::replace(&mut *pile, Vec::with_capacity(self.bunch));
        drop(pile);
        if let Err(TrySendError::Full(bunch) | TrySendError::Disconnected(bunch)) =
            self.used.try_send(bunch)
        {
            drop(bunch);
        }
    }

    /// Instances ready now, and instances taken ready so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        let taken = self.taken.load(Ordering::Relaxed);
        let made = self.made.load(Ordering::Relaxed);
        (made.saturating_sub(taken), taken)
    }
}
