//! The directory: tenants, their groups and the keys that act for them, kept in the store so that every
//! replica on one store enforces the same ones and a restart keeps them. Tenants are kept as
//! written (laid over the configuration's `tenant_defaults` and checked like a file's); keys
//! only as their SHA-256, with a public id to list and revoke them by. A change through any
//! replica is written in one transaction that bumps a generation; each writer reads the
//! generation now and then ([`Engine::sync_directory`]) and rebuilds what changed. The
//! configuration file's tenants and keys are applied at every start and marked as the
//! file's ([`Engine::adopt_directory`]); entries made through the admin API live beside them.

use super::budgets::Budgets;
use super::Engine;
use crate::config::{ConfigError, Role, TenantConfig};
use crate::runtime::{hex, unhex32};
use crate::store::{KeyRole, Store, StoreError, StoredKey, Tx};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SEEDED: &str = "directory.seeded";
const FILE_OWNED: &str = "directory.file_owned";
pub(super) const GENERATION: &str = "directory.generation";
/// The groups as written, one JSON object by name.
const GROUPS: &str = "directory.groups";

/// The keys this engine knows, by SHA-256 of the key.
pub(super) type KeyTable = HashMap<[u8; 32], KeyInfo>;

/// A key as listed: never the key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The key's public id.
    pub id: String,
    /// `caller`, `worker` or `admin`.
    pub role: KeyRole,
    /// A caller key's tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// A worker key's worker name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl KeyInfo {
    /// The role the key gives: each kind with its own subject, never another kind.
    pub fn as_role(&self) -> Role {
        let subject = |s: &Option<String>| s.clone().unwrap_or_default();
        match self.role {
            KeyRole::Caller => Role::Caller {
                tenant: subject(&self.tenant),
            },
            KeyRole::Worker => Role::Worker {
                name: subject(&self.name),
            },
            KeyRole::Admin => Role::Admin,
        }
    }

    fn of(stored: &StoredKey) -> KeyInfo {
        let subject = Some(stored.subject.clone());
        let (tenant, name) = match stored.role {
            KeyRole::Caller => (subject, None),
            KeyRole::Worker => (None, subject),
            KeyRole::Admin => (None, None),
        };
        KeyInfo {
            id: stored.id.clone(),
            role: stored.role,
            tenant,
            name,
        }
    }
}

/// Why a directory change was refused.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The change is not valid (a bad tenant, an unknown role): nothing changed.
    #[error("{0}")]
    Invalid(String),
    /// No such tenant or key.
    #[error("{0} not found")]
    NotFound(String),
    /// The tenant still has work in flight.
    #[error("tenant {0} has queued, active, unknown or retrying operations")]
    Busy(String),
    /// The group is still named by a tenant or as another group's parent.
    #[error("group {0} is still named by {1}")]
    GroupInUse(String, String),
    /// Revoking the key would leave no admin key: nobody could change anything again.
    #[error("the last admin key cannot be revoked")]
    LastAdmin,
    /// The entry is the configuration file's: change it there (or allow API changes with
    /// `api_may_change_file_entries`).
    #[error("{0} is owned by the configuration file; change it there (or set api_may_change_file_entries)")]
    OwnedByConfiguration(String),
    /// The store failed: nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ConfigError> for DirectoryError {
    fn from(e: ConfigError) -> Self {
        DirectoryError::Invalid(e.0)
    }
}

/// A directory entry the configuration file may own (a key by its SHA-256).
#[derive(Clone, Copy)]
pub(super) enum Entry<'a> {
    Tenant(&'a str),
    Group(&'a str),
    Key(&'a str),
}

/// The tenants and groups as written, as a change sees them.
pub(super) struct Directory {
    pub(super) tenants: Written,
    pub(super) groups: Written,
}

/// Longest worker name a key may carry.
const MAX_WORKER_NAME_BYTES: usize = 255;

fn sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// `n` bytes from the operating system's random source.
fn random(n: usize) -> Result<Vec<u8>, StoreError> {
    let mut bytes = vec![0u8; n];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| StoreError::Schema(format!("no random source: {e}")))?;
    Ok(bytes)
}

/// How a role is kept: its kind and its subject.
fn stored_role(role: &Role) -> (KeyRole, String) {
    match role {
        Role::Caller { tenant } => (KeyRole::Caller, tenant.clone()),
        Role::Worker { name } => (KeyRole::Worker, name.clone()),
        Role::Admin => (KeyRole::Admin, String::new()),
    }
}

fn new_key_record(key: &str, role: &Role) -> Result<StoredKey, StoreError> {
    let (role, subject) = stored_role(role);
    Ok(StoredKey {
        id: format!("key_{}", hex(&random(8)?)),
        sha256: hex(&sha256(key)),
        role,
        subject,
    })
}

fn bump(tx: &mut dyn Tx) -> Result<i64, StoreError> {
    let next = tx
        .meta(GENERATION)?
        .and_then(|g| g.parse::<i64>().ok())
        .unwrap_or(0)
        + 1;
    tx.set_meta(GENERATION, &next.to_string())?;
    Ok(next)
}

/// Entries as written (JSON), by name.
pub(super) type Written = BTreeMap<String, serde_json::Value>;

/// What the store's directory holds, read in one transaction.
struct Snapshot {
    generation: i64,
    tenants: Written,
    groups: Written,
    keys: Vec<StoredKey>,
}

fn write_groups(tx: &mut dyn Tx, groups: &Written) -> Result<(), StoreError> {
    let text =
        serde_json::to_string(groups).map_err(|e| StoreError::Schema(format!("groups: {e}")))?;
    tx.set_meta(GROUPS, &text)
}

fn read(tx: &mut dyn Tx) -> Result<Snapshot, StoreError> {
    let generation = tx
        .meta(GENERATION)?
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let mut tenants = BTreeMap::new();
    for (name, written) in tx.written_tenants()? {
        let value = serde_json::from_str(&written)
            .map_err(|e| StoreError::Schema(format!("tenant {name}: {e}")))?;
        tenants.insert(name, value);
    }
    let groups = match tx.meta(GROUPS)? {
        Some(text) => {
            serde_json::from_str(&text).map_err(|e| StoreError::Schema(format!("groups: {e}")))?
        }
        None => Written::new(),
    };
    Ok(Snapshot {
        generation,
        tenants,
        groups,
        keys: tx.api_keys()?,
    })
}

/// Brings `tenant`'s balances to `now_ms` under its `old` limits, then caps them by its
/// `new` ones: a change keeps what the tenant has, never more than the new capacity.
fn carry_balances(
    tx: &mut dyn Tx,
    tenant: &str,
    old: &TenantConfig,
    new: &TenantConfig,
    now_ms: i64,
) -> Result<(), StoreError> {
    let old = Budgets::of_tenant(tenant, old);
    for bucket in Budgets::of_tenant(tenant, new) {
        let Some(state) = tx.bucket(&bucket.name)? else {
            continue;
        };
        let state = match old.iter().find(|b| b.name == bucket.name) {
            Some(before) => state.refilled(before.limits, now_ms),
            None => state,
        };
        tx.set_bucket(&bucket.name, state.refilled(bucket.limits, now_ms))?;
    }
    Ok(())
}

/// What [`Engine::adopt_directory`] applied from the configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DirectoryApplied {
    /// Whether the store had no directory before (its first start).
    pub seeded: bool,
    /// The file's tenants the store did not have.
    pub tenants_created: Vec<String>,
    /// The file's tenants whose settings the store had otherwise.
    pub tenants_updated: Vec<String>,
    /// The file's tenants the store already had as written.
    pub tenants_unchanged: usize,
    /// Tenants the file named at an earlier start and no longer does, removed.
    pub tenants_removed: Vec<String>,
    /// Tenants the file no longer names but that still have work in flight: kept until a
    /// later start finds them idle.
    pub tenants_kept_busy: Vec<String>,
    /// Tenants made through the admin API, kept beside the file's.
    pub api_tenants: usize,
    /// The file's groups that the store did not have as written, and groups the file no
    /// longer names, removed.
    pub groups_changed: Vec<String>,
    /// The file's keys the store did not have.
    pub keys_added: usize,
    /// The file's keys whose role changed.
    pub keys_updated: usize,
    /// Keys the file named at an earlier start and no longer does, revoked.
    pub keys_revoked: usize,
    /// Keys made through the admin API, kept beside the file's.
    pub api_keys: usize,
}

impl DirectoryApplied {
    /// Whether the start changed anything in the store's directory.
    pub fn changed(&self) -> bool {
        self.seeded
            || !self.tenants_created.is_empty()
            || !self.tenants_updated.is_empty()
            || !self.tenants_removed.is_empty()
            || !self.groups_changed.is_empty()
            || self.keys_added + self.keys_updated + self.keys_revoked > 0
    }
}

/// What the configuration file owns in the store's directory (kept in `meta`): its tenants
/// by name and its keys by SHA-256.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(super) struct FileOwned {
    tenants: std::collections::BTreeSet<String>,
    keys: std::collections::BTreeSet<String>,
    /// Absent in stores from before groups.
    #[serde(default)]
    groups: std::collections::BTreeSet<String>,
}

fn file_owned(tx: &mut dyn Tx) -> Result<FileOwned, StoreError> {
    Ok(tx
        .meta(FILE_OWNED)?
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default())
}

impl<S: Store> Engine<S> {
    /// Applies the configuration file's directory to the store, at every start before
    /// serving: the file's tenants (as written in the engine's configuration) and `keys` are
    /// created or updated to match it and marked as the file's; entries the file named at an
    /// earlier start and no longer names are removed (a tenant only once it has no work in
    /// flight); entries made through the admin API are kept. All of it in one transaction,
    /// checked as a whole; then the store's directory is taken up here.
    pub fn adopt_directory(
        &self,
        keys: &HashMap<String, Role>,
        worker_renames: &[(String, String)],
        now_ms: i64,
    ) -> Result<DirectoryApplied, DirectoryError> {
        let config = self.config();
        let configured = config.written_tenants();
        let configured_groups = config.written_groups();
        let mut applied = DirectoryApplied::default();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store.transaction(|tx| -> Result<(), DirectoryError> {
            let mut report = DirectoryApplied {
                seeded: tx.meta(SEEDED)?.is_none(),
                ..DirectoryApplied::default()
            };
            let owned_before = file_owned(tx)?;
            let snapshot = read(tx)?;
            let before = snapshot.tenants;
            let mut after = before.clone();
            let mut owned = FileOwned::default();
            let groups_before = snapshot.groups;
            let mut groups_after = groups_before.clone();
            for (name, written) in &configured_groups {
                if groups_before.get(name) != Some(written) {
                    report.groups_changed.push(name.clone());
                }
                groups_after.insert(name.clone(), written.clone());
                owned.groups.insert(name.clone());
            }
            for name in owned_before.groups.difference(&owned.groups) {
                if groups_after.remove(name).is_some() {
                    report.groups_changed.push(name.clone());
                }
            }
            for (name, written) in &configured {
                match before.get(name) {
                    None => report.tenants_created.push(name.clone()),
                    Some(w) if w != written => report.tenants_updated.push(name.clone()),
                    Some(_) => report.tenants_unchanged += 1,
                }
                after.insert(name.clone(), written.clone());
                owned.tenants.insert(name.clone());
            }
            let dropped: Vec<String> = owned_before
                .tenants
                .difference(&owned.tenants)
                .cloned()
                .collect();
            for name in &dropped {
                if !after.contains_key(name) {
                    continue;
                }
                if tx.tenant_has_work(name)? {
                    report.tenants_kept_busy.push(name.clone());
                    owned.tenants.insert(name.clone());
                } else {
                    after.remove(name);
                    report.tenants_removed.push(name.clone());
                }
            }
            report.api_tenants = after.keys().filter(|n| !owned.tenants.contains(*n)).count();
            // The whole directory is checked as a configuration before anything is written.
            let next = config.with_written(&after, &groups_after)?;
            // Balances are carried from the store's limits (when they still read) to the file's.
            let was = config.with_written(&before, &groups_before).ok();
            if groups_after != groups_before || tx.meta(GROUPS)?.is_none() {
                write_groups(tx, &groups_after)?;
            }
            for (name, written) in &after {
                if before.get(name) != Some(written) {
                    tx.put_written_tenant(name, &written.to_string())?;
                    let old = was.as_ref().and_then(|c| c.tenant(name));
                    if let (Some(old), Some(new)) = (old, next.tenant(name)) {
                        carry_balances(tx, name, old, new, now_ms)?;
                    }
                }
            }
            for name in &report.tenants_removed {
                tx.delete_written_tenant(name)?;
            }

            let stored = tx.api_keys()?;
            for (key, role) in keys {
                let record = new_key_record(key, role)?;
                owned.keys.insert(record.sha256.clone());
                match stored.iter().find(|k| k.sha256 == record.sha256) {
                    None => {
                        tx.put_api_key(&record)?;
                        report.keys_added += 1;
                    }
                    Some(k) if k.role != record.role || k.subject != record.subject => {
                        tx.delete_api_key(&k.id)?;
                        tx.put_api_key(&StoredKey {
                            id: k.id.clone(),
                            ..record
                        })?;
                        report.keys_updated += 1;
                    }
                    Some(_) => {}
                }
            }
            for k in &stored {
                let dropped =
                    owned_before.keys.contains(&k.sha256) && !owned.keys.contains(&k.sha256);
                // A removed tenant's caller keys go with it, whoever made them.
                let orphan =
                    k.role == KeyRole::Caller && report.tenants_removed.contains(&k.subject);
                if dropped || orphan {
                    tx.delete_api_key(&k.id)?;
                    report.keys_revoked += 1;
                }
            }
            report.api_keys = tx
                .api_keys()?
                .iter()
                .filter(|k| !owned.keys.contains(&k.sha256))
                .count();
            // The file may leave admin keys out (then nobody administers over HTTP), but it
            // may not take away the last one the store had.
            let had_admin = stored.iter().any(|k| k.role == KeyRole::Admin);
            if had_admin && !tx.api_keys()?.iter().any(|k| k.role == KeyRole::Admin) {
                return Err(DirectoryError::LastAdmin);
            }
            if report.seeded {
                // Claims an earlier release recorded under a bare key take the worker's name.
                for (key, name) in worker_renames {
                    tx.rename_worker(key, name)?;
                }
                tx.set_meta(SEEDED, "1")?;
            }
            if owned != owned_before {
                let text = serde_json::to_string(&owned)
                    .map_err(|e| StoreError::Schema(format!("file-owned entries: {e}")))?;
                tx.set_meta(FILE_OWNED, &text)?;
            }
            if report.changed() {
                bump(tx)?;
            }
            applied = report;
            Ok(())
        })?;
        drop(store);
        self.directory_generation.store(-1, Ordering::SeqCst);
        self.sync_directory()?;
        Ok(applied)
    }

    /// Refuses a change through the admin API to an entry the configuration file owns,
    /// unless `api_may_change_file_entries` allows it (then the next start applies the
    /// file again).
    pub(super) fn check_not_file_owned(
        &self,
        tx: &mut dyn Tx,
        entry: Entry,
    ) -> Result<(), DirectoryError> {
        if self.config().api_may_change_file_entries {
            return Ok(());
        }
        let owned = file_owned(tx)?;
        let (set, what) = match entry {
            Entry::Tenant(t) => (&owned.tenants, format!("tenant {t}")),
            Entry::Group(g) => (&owned.groups, format!("group {g}")),
            Entry::Key(_) => (&owned.keys, "this key".to_string()),
        };
        let name = match entry {
            Entry::Tenant(n) | Entry::Group(n) | Entry::Key(n) => n,
        };
        if set.contains(name) {
            return Err(DirectoryError::OwnedByConfiguration(what));
        }
        Ok(())
    }

    /// Takes up a directory change another replica made: when the store's generation moved,
    /// its tenants and keys become this engine's. Whether anything changed.
    pub fn sync_directory(&self) -> Result<bool, DirectoryError> {
        let seen = self.directory_generation.load(Ordering::SeqCst);
        let generation = self.read(|tx| {
            Ok(tx
                .meta(GENERATION)?
                .and_then(|g| g.parse::<i64>().ok())
                .unwrap_or(0))
        })?;
        // Generation 0: the store has no directory yet; the configuration's stays.
        if generation == seen || generation == 0 {
            return Ok(false);
        }
        // Read and applied under the store's lock: no decision sees half of it.
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = store.transaction(read)?;
        let config = self
            .config()
            .with_written(&snapshot.tenants, &snapshot.groups)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        let table: KeyTable = snapshot
            .keys
            .iter()
            .filter_map(|k| Some((unhex32(&k.sha256)?, KeyInfo::of(k))))
            .collect();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.directory_generation
            .store(snapshot.generation, Ordering::SeqCst);
        Ok(true)
    }

    /// The role `key` gives, if the directory knows it.
    pub fn role_of(&self, key: &str) -> Option<Role> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.get(&sha256(key)).map(KeyInfo::as_role)
    }

    /// Every key, by id (never the keys themselves).
    pub fn keys(&self) -> Vec<KeyInfo> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out: Vec<KeyInfo> = keys.values().cloned().collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Creates (or replaces) a tenant from its settings as written, checked like the
    /// configuration file's. Its balances are kept (capped at new capacities when refilled);
    /// a new tenant's buckets start full.
    pub fn put_tenant(
        &self,
        name: &str,
        written: &serde_json::Value,
        now_ms: i64,
    ) -> Result<(), DirectoryError> {
        // A name from before the rule (kept in an older store) may still be changed.
        if self.config().tenant(name).is_none() {
            crate::model::names::check("tenant name", name).map_err(DirectoryError::Invalid)?;
        }
        let change = |d: &mut Directory, tx: &mut dyn Tx| {
            self.check_not_file_owned(tx, Entry::Tenant(name))?;
            d.tenants.insert(name.to_string(), written.clone());
            Ok(())
        };
        self.change_directory(change, now_ms)
    }

    /// Deletes a tenant and revokes its caller keys (their ids returned); refused while it
    /// has queued, active, unknown or retrying operations.
    pub fn delete_tenant(&self, name: &str) -> Result<Vec<String>, DirectoryError> {
        let mut revoked = Vec::new();
        let change = |d: &mut Directory, tx: &mut dyn Tx| {
            if d.tenants.remove(name).is_none() {
                return Err(DirectoryError::NotFound(format!("tenant {name}")));
            }
            self.check_not_file_owned(tx, Entry::Tenant(name))?;
            if tx.tenant_has_work(name)? {
                return Err(DirectoryError::Busy(name.to_string()));
            }
            for key in tx.api_keys()? {
                if key.role == KeyRole::Caller && key.subject == name {
                    tx.delete_api_key(&key.id)?;
                    revoked.push(key.id);
                }
            }
            Ok(())
        };
        // Nothing is kept of a deleted tenant's balances: the time does not matter.
        self.change_directory(change, 0)?;
        Ok(revoked)
    }

    /// Applies `change` to the store's directory, checks the result as a configuration,
    /// writes it and takes it up here; on any error nothing changed. A changed tenant's
    /// balances are brought to `now_ms` under its old limits and capped by its new ones.
    pub(super) fn change_directory(
        &self,
        change: impl FnOnce(&mut Directory, &mut dyn Tx) -> Result<(), DirectoryError>,
        now_ms: i64,
    ) -> Result<(), DirectoryError> {
        let config = self.config();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        // An error from `change` or the check rolls the transaction back.
        store.transaction(|tx| -> Result<(), DirectoryError> {
            let snapshot = read(tx)?;
            let before = snapshot.tenants;
            let mut d = Directory {
                tenants: before.clone(),
                groups: snapshot.groups.clone(),
            };
            change(&mut d, tx)?;
            let after = d.tenants;
            let next = config.with_written(&after, &d.groups)?;
            if d.groups != snapshot.groups {
                write_groups(tx, &d.groups)?;
            }
            for (name, written) in &after {
                if before.get(name) != Some(written) {
                    tx.put_written_tenant(name, &written.to_string())?;
                    if let (Some(old), Some(new)) = (config.tenant(name), next.tenant(name)) {
                        carry_balances(tx, name, old, new, now_ms)?;
                    }
                }
            }
            for name in before.keys().filter(|n| !after.contains_key(*n)) {
                tx.delete_written_tenant(name)?;
            }
            bump(tx)?;
            Ok(())
        })?;
        drop(store);
        self.sync_directory()?;
        Ok(())
    }

    /// Creates a key for `role`: its id and the key, which is shown this once.
    pub fn create_key(&self, role: &Role) -> Result<(String, String), DirectoryError> {
        match role {
            Role::Caller { tenant } if self.config().tenant(tenant).is_none() => {
                return Err(DirectoryError::NotFound(format!("tenant {tenant}")))
            }
            Role::Worker { name } if name.is_empty() || name.len() > MAX_WORKER_NAME_BYTES => {
                return Err(DirectoryError::Invalid(format!(
                    "a worker name is 1 to {MAX_WORKER_NAME_BYTES} bytes"
                )))
            }
            _ => {}
        }
        let key = format!("tg_{}", hex(&random(32)?));
        let record = new_key_record(&key, role)?;
        let id = record.id.clone();
        self.transaction(|tx| {
            tx.put_api_key(&record)?;
            bump(tx).map(drop)
        })?;
        self.sync_directory()?;
        Ok((id, key))
    }

    /// Revokes a key by id, on every replica once they have synced.
    pub fn revoke_key(&self, id: &str) -> Result<(), DirectoryError> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store.transaction(|tx| -> Result<(), DirectoryError> {
            let keys = tx.api_keys()?;
            let Some(key) = keys.iter().find(|k| k.id == id) else {
                return Err(DirectoryError::NotFound(format!("key {id}")));
            };
            self.check_not_file_owned(tx, Entry::Key(&key.sha256))?;
            if key.role == KeyRole::Admin
                && keys.iter().filter(|k| k.role == KeyRole::Admin).count() == 1
            {
                return Err(DirectoryError::LastAdmin);
            }
            tx.delete_api_key(id)?;
            bump(tx)?;
            Ok(())
        })?;
        drop(store);
        self.sync_directory()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::test_engine as engine;

    #[test]
    fn a_file_without_admin_keys_applies_again_but_cannot_take_the_last_one_away() {
        let e = engine(&serde_json::json!({"tenants": {"a": {}}}));
        let caller = |key: &str| (key.to_string(), Role::Caller { tenant: "a".into() });
        let callers: HashMap<String, Role> = [caller("a-key")].into();
        // Applied at a start and again (a restart, or a second replica of the same file).
        e.adopt_directory(&callers, &[], 0).unwrap();
        e.adopt_directory(&callers, &[], 1).unwrap();
        let with_admin: HashMap<String, Role> =
            [caller("a-key"), ("admin-key".to_string(), Role::Admin)].into();
        e.adopt_directory(&with_admin, &[], 2).unwrap();
        assert!(matches!(
            e.adopt_directory(&callers, &[], 3),
            Err(DirectoryError::LastAdmin)
        ));
    }

    #[test]
    fn hashes_round_trip_through_hex() {
        let h = sha256("acme-key");
        assert_eq!(unhex32(&hex(&h)), Some(h));
        assert_eq!(unhex32("zz"), None);
        assert_eq!(unhex32(&"g".repeat(64)), None);
    }
}
