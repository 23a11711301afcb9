//! The engine's side of leases (docs/design.md, "Leases for shared budgets"): which budgets
//! are leased, the rows a holder keeps, reserving, refunding and releasing through its
//! leases, and the keeper that renews a holder's registration and returns expired leases.
//! The arithmetic is [`crate::lease`]'s; this module reads and writes its rows.
//!
//! A *holder* is one engine serving from a store other engines share (a replica on
//! PostgreSQL). Its leases are kept in bucket rows no other holder writes, so the store's
//! row locks keep replicas apart as they do for tenants' rows:
//!
//! - `lease:<holder>:<budget>`: what is left of the lease (`balance_micro`) and when it
//!   expires (`updated_ms`);
//! - `lease.granted:<holder>:<budget>`: what was moved into it;
//! - `lease.leased:<budget>`: the credits granted to every lease not given back, beside the
//!   shared row (only a holder that holds the shared row's lock writes it).
//!
//! A slot count is leased as a budget that never refills, of its limit (`<budget>` is
//! `slots:<scope>`). While one holder is live, or while it reserves seldom (under
//! [`crate::lease::LEASE_FROM_RESERVATIONS`] a second), it reserves from the shared rows
//! directly, as an engine of its own store always does.

mod holder;
mod keeper;
mod rows;

pub(crate) use holder::{Holder, Taken};
pub use keeper::LeaseKeep;
pub(crate) use rows::{slots_budget, RowWrite, SharedRow};

use crate::model::names;

/// The meta row that lists the holders, live or lapsed (a JSON array of their ids).
pub const HOLDERS_META: &str = "lease.holders";
/// How long a holder's registration lives past its last renewal.
pub const HOLDER_LIFE_MS: i64 = 3_000;
/// How long a lapsed holder stays listed, so that the sweep returns its leases.
const FORGET_AFTER_MS: i64 = 30_000;

/// Whether bucket `name` is shared by tenants, and so leased: the global request bucket, a
/// model's budgets and a group's.
pub(crate) fn is_shared_bucket(name: &str) -> bool {
    name == names::GLOBAL_REQUESTS || name.starts_with("model.") || name.starts_with("group.")
}

/// Whether slot scope `scope` is shared, and so leased: the global one.
pub(crate) fn is_shared_scope(scope: &str) -> bool {
    scope == names::GLOBAL_SLOTS
}
