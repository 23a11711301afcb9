//! Instances made ahead: a thread beside the decisions instantiates a policy's next fresh
//! instances and drops the used ones, so that a decision finds its instance ready and
//! leaves the teardown (the reset of its memory) to another core.
//!
//! Every decision still runs in an instance no decision ran in before: a used instance is
//! only ever dropped, never handed out again. Nothing here can fail a decision: when no
//! instance is ready the caller instantiates one itself, and when the thread is behind
//! with its drops the caller drops its own.

use super::host::HostState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use wasmtime::component::Instance;
use wasmtime::Store;

/// A fresh instance and the store it lives in, not yet called.
pub(super) struct Ready {
    pub(super) store: Store<HostState>,
    pub(super) instance: Instance,
}

/// The ready instances of one policy and the way back for used ones; the thread that
/// serves them stops when this is dropped.
pub(super) struct Ahead {
    ready: Mutex<Receiver<Ready>>,
    used: SyncSender<Store<HostState>>,
    /// Instances the thread has put in the queue, and instances taken from it.
    made: Arc<AtomicU64>,
    taken: AtomicU64,
}

impl Ahead {
    /// Starts a thread that keeps up to `depth` instances made by `make` ready, making one
    /// more for each used one it drops. `None` when no thread can be started.
    pub(super) fn start(
        depth: usize,
        make: impl Fn() -> Option<Ready> + Send + 'static,
    ) -> Option<Ahead> {
        let (ready_tx, ready_rx) = sync_channel(depth);
        let (used_tx, used_rx) = sync_channel::<Store<HostState>>(depth);
        let made = Arc::new(AtomicU64::new(0));
        let counted = made.clone();
        // False once the policy is gone; a full queue drops the spare instance here.
        let offer = move |ready: Ready| match ready_tx.try_send(ready) {
            Ok(()) => {
                counted.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Full(_)) => true,
            Err(TrySendError::Disconnected(_)) => false,
        };
        std::thread::Builder::new()
            .name("tollgate-instances".into())
            .spawn(move || {
                for _ in 0..depth {
                    if let Some(ready) = make() {
                        if !offer(ready) {
                            return;
                        }
                    }
                }
                for used in used_rx.iter() {
                    drop(used);
                    if let Some(ready) = make() {
                        if !offer(ready) {
                            return;
                        }
                    }
                }
            })
            .ok()?;
        Some(Ahead {
            ready: Mutex::new(ready_rx),
            used: used_tx,
            made,
            taken: AtomicU64::new(0),
        })
    }

    /// A ready instance, if one is.
    pub(super) fn take(&self) -> Option<Ready> {
        let ready = self.ready.lock().ok()?.try_recv().ok()?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(ready)
    }

    /// Instances ready now, and instances taken ready so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        let taken = self.taken.load(Ordering::Relaxed);
        let made = self.made.load(Ordering::Relaxed);
        (made.saturating_sub(taken), taken)
    }

    /// Hands a used store to the thread to drop; drops it here when the thread is behind.
    pub(super) fn give_back(&self, store: Store<HostState>) {
        if let Err(TrySendError::Full(store) | TrySendError::Disconnected(store)) =
            self.used.try_send(store)
        {
            drop(store);
        }
    }
}
