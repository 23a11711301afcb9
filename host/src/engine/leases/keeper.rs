//! Keeping leases: a holder's registration renewed, expired leases (its own, and a dead
//! holder's) given back, the live holders counted, the list of holders rewritten when one
//! joins or is forgotten, and a stopping holder's leases returned; with the engine's calls
//! that run each in its transaction.

use super::holder::Holder;
use super::rows::{
    granted_row, lease_row, lease_writes, leased_row, listed_holders, read_lease, registration_row,
    SharedRow,
};
use super::{FORGET_AFTER_MS, HOLDERS_META, HOLDER_LIFE_MS};
use crate::bucket::State;
use crate::engine::budgets::{BucketRef, SlotRef};
use crate::lease::Shared;
use crate::store::{Prefetch, StoreError, Tx};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// What one renewal of a holder did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseKeep {
    /// Holders whose registration is live, this one included.
    pub live_holders: u32,
    /// Expired leases given back to their shared rows (any holder's).
    pub returned: u32,
}

impl Holder {
    /// The rows [`Holder::keep`] names, so that it runs beside other holders' batches: the
    /// holders' registrations and this holder's own leases.
    pub fn keep_hint(&self, listed: &[String], budgets: &[SharedRow]) -> Prefetch {
        let mut hint = Prefetch {
            meta: vec![HOLDERS_META.to_string()],
            complete: true,
            ..Prefetch::default()
        };
        hint.buckets
            .extend(listed.iter().chain([&self.id]).map(|h| registration_row(h)));
        for row in budgets {
            let budget = row.budget();
            hint.buckets.push(lease_row(&self.id, &budget));
            hint.buckets.push(granted_row(&self.id, &budget));
        }
        hint.buckets.sort();
        hint.buckets.dedup();
        hint
    }

    /// Renews this holder's registration, gives back its own expired leases and those of
    /// holders whose registration lapsed (a dead holder's), and counts the live holders.
    /// Reaches a shared row only to give a lease back to it. Says whether the list of
    /// holders must change (this holder is not on it, or one lapsed long ago), which
    /// [`Holder::relist`] does with the store to itself.
    pub fn keep(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        now_ms: i64,
    ) -> Result<(LeaseKeep, bool), StoreError> {
        let listed = listed_holders(tx)?;
        let lapses = now_ms.saturating_add(HOLDER_LIFE_MS);
        tx.set_bucket(
            &registration_row(&self.id),
            State {
                balance_micro: 0,
                updated_ms: lapses,
            },
        )?;
        let mut live = 1;
        let mut relist = !listed.contains(&self.id);
        let mut sweep = vec![self.id.clone()];
        for holder in listed.iter().filter(|h| **h != self.id) {
            let until = tx
                .bucket(&registration_row(holder))?
                .map_or(0, |r| r.updated_ms);
            if until > now_ms {
                live += 1;
            } else {
                sweep.push(holder.clone());
                relist |= now_ms >= until.saturating_add(FORGET_AFTER_MS);
            }
        }
        let mut returned = 0;
        for row in budgets {
            let budget = row.budget();
            let mut shared: Option<(Shared, Shared)> = None;
            let mut writes = Vec::new();
            for holder in &sweep {
                let Some(l) = read_lease(tx, holder, &budget)? else {
                    continue;
                };
                if !l.expired(now_ms) {
                    continue;
                }
                let (was, current) = match shared {
                    Some(s) => s,
                    None => {
                        let was = row.read(tx, now_ms)?;
                        (was, was)
                    }
                };
                shared = Some((was, current.give_back(row.limits(), l, now_ms)));
                lease_writes(holder, &budget, None, &mut writes);
                returned += 1;
            }
            if let Some((was, s)) = shared {
                self.saw(
                    &budget,
                    s.refilled(row.limits(), now_ms).bucket.balance_micro,
                );
                row.writes(was, s, &mut writes);
            }
            writes.iter().try_for_each(|w| w.apply(tx))?;
        }
        self.live.store(live, Ordering::Relaxed);
        Ok((
            LeaseKeep {
                live_holders: live,
                returned,
            },
            relist,
        ))
    }

    /// Refreshes what this holder's policy is shown of each shared row while it leases, and
    /// what it reads as last seen of deployments' pauses (`pauses`, bucket rows: when each
    /// ends) and failure counts (`counts`, slot rows).
    pub fn look(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        pauses: &[String],
        counts: &[String],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for row in budgets {
            let level = row.read(tx, now_ms)?.refilled(row.limits(), now_ms);
            self.saw(&row.budget(), level.bucket.balance_micro);
        }
        for pause in pauses {
            self.saw(pause, tx.bucket(pause)?.map_or(0, |s| s.updated_ms));
        }
        for count in counts {
            self.saw(count, i64::from(tx.slots_in_use(count)?));
        }
        Ok(())
    }

    /// Rewrites the list of holders (with the store to itself): this one on it, and those
    /// lapsed for long, whose leases the sweep has returned, off it.
    pub fn relist(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<(), StoreError> {
        let mut listed = listed_holders(tx)?;
        let mut kept = Vec::with_capacity(listed.len() + 1);
        for holder in listed.drain(..) {
            let until = tx
                .bucket(&registration_row(&holder))?
                .map_or(0, |r| r.updated_ms);
            if holder == self.id || now_ms < until.saturating_add(FORGET_AFTER_MS) {
                kept.push(holder);
            }
        }
        if !kept.contains(&self.id) {
            kept.push(self.id.clone());
        }
        kept.sort();
        tx.set_meta(
            HOLDERS_META,
            &serde_json::to_string(&kept).unwrap_or_default(),
        )
    }

    /// Gives back every lease of this holder and lets its registration lapse now (a holder
    /// that stops): its credits are at once the others'.
    pub fn stop(
        &self,
        tx: &mut dyn Tx,
        budgets: &[SharedRow],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for row in budgets {
            let budget = row.budget();
            if let Some(l) = self.lease(tx, &budget)? {
                let mut writes = Vec::new();
                let was = row.read(tx, now_ms)?;
                row.writes(was, was.give_back(row.limits(), l, now_ms), &mut writes);
                self.lease_writes(&budget, None, &mut writes);
                writes.iter().try_for_each(|w| w.apply(tx))?;
            }
        }
        tx.set_bucket(
            &registration_row(&self.id),
            State {
                balance_micro: 0,
                updated_ms: now_ms,
            },
        )?;
        self.live.store(1, Ordering::Relaxed);
        Ok(())
    }
}

impl<S: crate::store::Store> crate::engine::Engine<S> {
    /// This engine as a holder of leases, once [`Engine::hold_leases`] made it one.
    ///
    /// [`Engine::hold_leases`]: crate::engine::Engine::hold_leases
    pub(crate) fn holder(&self) -> Option<&std::sync::Arc<Holder>> {
        self.holder.get()
    }

    /// [`Engine::holder`], borrowed.
    ///
    /// [`Engine::holder`]: crate::engine::Engine::holder
    pub(crate) fn holding(&self) -> Option<&Holder> {
        self.holder.get().map(|h| &**h)
    }

    /// Makes this engine a holder of leases under `id` (unique among the engines sharing
    /// its store): from the next [`Engine::keep_leases`] that finds another holder live, it
    /// reserves the budgets tenants share through leases (docs/design.md, "Leases for
    /// shared budgets"). For an engine whose store other engines share (replicas on
    /// PostgreSQL); the service does it at start. A second call changes nothing.
    ///
    /// [`Engine::keep_leases`]: crate::engine::Engine::keep_leases
    /// [`Engine::hold_leases`]: crate::engine::Engine::hold_leases
    pub fn hold_leases(&self, id: &str) {
        let _ = self
            .holder
            .set(std::sync::Arc::new(Holder::new(id.to_string())));
    }

    /// Makes this engine a holder of leases under a random id when its store has a clock of
    /// its own, which is a store other engines may share on connections of their own
    /// (PostgreSQL). The service's engines do it at start.
    ///
    /// # Errors
    /// When the store's clock cannot be read, or the system has no random source.
    pub fn hold_leases_if_shared(&self) -> Result<(), StoreError> {
        if self.store_clock_ms()?.is_some() {
            let mut bytes = [0u8; 8];
            getrandom::getrandom(&mut bytes)
                .map_err(|e| StoreError::Schema(format!("no random source: {e}")))?;
            self.hold_leases(&crate::runtime::hex(&bytes));
        }
        Ok(())
    }

    /// Holders of leases live at this engine's last renewal, itself included (1 for an
    /// engine that holds none).
    pub fn live_lease_holders(&self) -> u32 {
        self.holder()
            .map_or(1, |h| h.live.load(Ordering::Relaxed).max(1))
    }

    /// The id this engine holds leases under, if it holds them.
    pub fn lease_holder(&self) -> Option<&str> {
        self.holder().map(|h| h.id())
    }

    /// Every budget tenants share in the configuration: the global request bucket, the
    /// models' and the groups' budgets, the global slots, and each deployment's configured
    /// buckets and concurrency; with the deployments' rows a holder reads as last seen.
    fn shared_budgets(&self) -> SharedBudgets {
        use crate::engine::budgets::Budgets;
        use crate::engine::deployments::{DeploymentBudgets, UNLIMITED_SLOTS};
        let config = self.config();
        let mut shared = SharedBudgets {
            buckets: vec![Budgets::global_requests(&config)],
            slots: vec![Budgets::global_slots(&config)],
            ..SharedBudgets::default()
        };
        shared.buckets.extend(Budgets::of_models(&config));
        shared.buckets.extend(Budgets::of_groups(&config));
        for model in config.routing.keys() {
            for d in DeploymentBudgets::of(&config, model) {
                shared.buckets.extend(d.leased_buckets().cloned());
                match d.leased_slots() {
                    Some(s) => shared.slots.push(s),
                    // An adaptive count is not leased; a lease left from when it was not
                    // adaptive is still given back.
                    None => shared.unseen.push(SlotRef {
                        scope: d.slots.clone(),
                        limit: UNLIMITED_SLOTS,
                    }),
                }
                let (pause, counts) = d.seen_rows();
                shared.pauses.push(pause.to_string());
                shared.counts.extend(counts.iter().map(|c| c.to_string()));
            }
        }
        shared
    }

    /// What is in leases of each shared budget now, for `inspect` (none listed when no
    /// lease is out; a slot scope as `slots:<scope>`, a slot being one credit).
    pub(in crate::engine) fn in_leases(
        &self,
        tx: &mut dyn Tx,
    ) -> Result<BTreeMap<String, InLeases>, StoreError> {
        let mut out = BTreeMap::new();
        if self.holder().is_none() {
            return Ok(out);
        }
        let holders = listed_holders(tx)?;
        for row in self.shared_budgets().rows() {
            let budget = row.budget();
            let leased_micro = tx
                .bucket(&leased_row(&budget))?
                .map_or(0, |s| s.balance_micro.max(0));
            let mut unspent_micro = 0i64;
            for holder in &holders {
                if let Some(l) = read_lease(tx, holder, &budget)? {
                    unspent_micro = unspent_micro.saturating_add(l.remaining_micro.max(0));
                }
            }
            if leased_micro > 0 || unspent_micro > 0 {
                let held = InLeases {
                    leased_micro,
                    unspent_micro,
                };
                out.insert(budget, held);
            }
        }
        Ok(out)
    }

    /// Renews this holder's registration, gives back expired leases (its own, and a dead
    /// holder's) and counts the live holders, at `now_ms` (the store's clock): one
    /// transaction beside other holders' batches (and, when a holder joins or is forgotten,
    /// one with the store to itself), run by housekeeping about twice a second. `None` for
    /// an engine that holds no leases.
    ///
    /// # Errors
    /// The store's failure (nothing of it was written).
    pub fn keep_leases(&self, now_ms: i64) -> Result<Option<LeaseKeep>, StoreError> {
        let Some(holder) = self.holder().cloned() else {
            return Ok(None);
        };
        let shared = self.shared_budgets();
        let rows = shared.rows();
        let listed = self.read(listed_holders)?;
        let hint = holder.keep_hint(&listed, &rows);
        let (kept, relist) = self.named(&hint, |tx| holder.keep(tx, &rows, now_ms))?;
        if relist {
            self.transaction(|tx| holder.relist(tx, now_ms))?;
        }
        if holder.leasing() {
            // What the policy is shown of the shared rows, and the deployments' rows read as
            // last seen, read without their locks' wait: a batch of its own that names
            // them, at most twice a second.
            let seen = shared.seen_rows();
            let look = Prefetch {
                buckets: shared
                    .buckets
                    .iter()
                    .map(|b| b.name.clone())
                    .chain(seen.iter().map(|r| leased_row(&r.budget())))
                    .chain(shared.pauses.iter().cloned())
                    .collect(),
                slots: (shared.slots.iter().map(|s| s.scope.clone()))
                    .chain(shared.counts.iter().cloned())
                    .collect(),
                complete: true,
                ..Prefetch::default()
            };
            self.named(&look, |tx| {
                holder.look(tx, &seen, &shared.pauses, &shared.counts, now_ms)
            })?;
        }
        Ok(Some(kept))
    }

    /// Gives back every lease this engine holds and takes it off the holders' list (a
    /// replica that stops), at `now_ms` (the store's clock).
    ///
    /// # Errors
    /// The store's failure (nothing of it was written; the leases expire on their own).
    pub fn stop_leases(&self, now_ms: i64) -> Result<(), StoreError> {
        let Some(holder) = self.holder().cloned() else {
            return Ok(());
        };
        let shared = self.shared_budgets();
        self.transaction(|tx| holder.stop(tx, &shared.rows(), now_ms))
    }
}

/// What one shared budget has in leases.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::engine) struct InLeases {
    /// Granted to leases, spent or not.
    pub leased_micro: i64,
    /// Of that, what is not spent yet: available, though another holder's.
    pub unspent_micro: i64,
}

/// The budgets tenants share, as configured now.
#[derive(Default)]
struct SharedBudgets {
    buckets: Vec<BucketRef>,
    slots: Vec<SlotRef>,
    /// Slot counts no holder leases now, whose old leases still go back.
    unseen: Vec<SlotRef>,
    /// Deployments' pause rows and failure counts, read as last seen while leasing.
    pauses: Vec<String>,
    counts: Vec<String>,
}

impl SharedBudgets {
    /// Each budget leased now, as leases see it.
    fn seen_rows(&self) -> Vec<SharedRow<'_>> {
        (self.buckets.iter().map(SharedRow::Bucket))
            .chain(self.slots.iter().map(SharedRow::Slots))
            .collect()
    }

    /// Each budget with leases to keep: those leased now, and those whose old leases go back.
    fn rows(&self) -> Vec<SharedRow<'_>> {
        let mut rows = self.seen_rows();
        rows.extend(self.unseen.iter().map(SharedRow::Slots));
        rows
    }
}
