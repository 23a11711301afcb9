//! One store taken in turns by several engines of one process: the writer shards of a SQLite
//! file (`serve --writers N`), which share the file's one connection, and with it its row
//! cache and bucket log. Each engine keeps its own batch loop, policy instance and tenants;
//! their transactions run one at a time, so every engine reads every row as the last
//! transaction left it, and reserves from the budgets tenants share directly (no leases:
//! those are for engines on different connections, docs/design.md).

use super::{Prefetch, Store, StoreError, Tx};
use std::sync::{Arc, Mutex};

/// A handle on a store shared by the engines of one process; clones are handles on the
/// same store.
pub struct SharedStore<S> {
    inner: Arc<Mutex<S>>,
}

impl<S> Clone for SharedStore<S> {
    fn clone(&self) -> Self {
        SharedStore {
            inner: self.inner.clone(),
        }
    }
}

impl<S> SharedStore<S> {
    /// `n` handles (at least one) on `store`.
    pub fn split(store: S, n: usize) -> Vec<Self> {
        let first = SharedStore {
            inner: Arc::new(Mutex::new(store)),
        };
        let mut handles = vec![first.clone(); n.max(1) - 1];
        handles.insert(0, first);
        handles
    }

    /// Runs `f` on the store, between two engines' transactions.
    pub fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        let mut store = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut store)
    }
}

impl<S: Store> Store for SharedStore<S> {
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.with(|s| s.transaction(f))
    }

    fn transaction_many<T>(
        &mut self,
        n: usize,
        f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.with(|s| s.transaction_many(n, f))
    }

    fn transaction_batch<T>(
        &mut self,
        n: usize,
        hint: &Prefetch,
        f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.with(|s| s.transaction_batch(n, hint, f))
    }

    fn clock_ms(&mut self) -> Result<Option<i64>, StoreError> {
        self.with(|s| s.clock_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::State;
    use crate::store::SqliteStore;

    #[test]
    fn every_handle_reads_what_another_wrote() {
        let mut handles = SharedStore::split(SqliteStore::in_memory().unwrap(), 3);
        assert_eq!(handles.len(), 3);
        let state = State {
            balance_micro: 42,
            updated_ms: 7,
        };
        handles[2]
            .transaction(|tx| tx.set_bucket("b", state))
            .unwrap();
        for h in &mut handles {
            let read = h.transaction(|tx| tx.bucket("b")).unwrap();
            assert_eq!(read, Some(state));
        }
        assert_eq!(
            SharedStore::split(SqliteStore::in_memory().unwrap(), 0).len(),
            1
        );
    }
}
