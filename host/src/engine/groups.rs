//! Groups in the store's directory: made, changed and deleted through the admin API like
//! tenants, checked as the configuration file's `groups` section, and owned by the file
//! when it names them (see `directory`).

use super::directory::{Directory, Entry};
use super::{DirectoryError, Engine};
use crate::store::{Store, Tx};

impl<S: Store> Engine<S> {
    /// Creates (or replaces) a group from its settings as written (`parent`, `budgets`),
    /// checked like the configuration file's `groups` section. Its balances are kept (capped
    /// at new limits); a new group's budgets start full.
    pub fn put_group(
        &self,
        name: &str,
        written: &serde_json::Value,
        now_ms: i64,
    ) -> Result<(), DirectoryError> {
        // A name from before the rule (kept in an older store) may still be changed.
        if !self.config().groups.contains_key(name) {
            crate::model::names::check("group name", name).map_err(DirectoryError::Invalid)?;
        }
        let change = |d: &mut Directory, tx: &mut dyn Tx| {
            self.check_not_file_owned(tx, Entry::Group(name))?;
            d.groups.insert(name.to_string(), written.clone());
            Ok(())
        };
        self.change_directory(change, now_ms)
    }

    /// Deletes a group; refused while a tenant names it, or a group names it as its parent.
    pub fn delete_group(&self, name: &str) -> Result<(), DirectoryError> {
        let config = self.config();
        let change = |d: &mut Directory, tx: &mut dyn Tx| {
            if d.groups.remove(name).is_none() {
                return Err(DirectoryError::NotFound(format!("group {name}")));
            }
            self.check_not_file_owned(tx, Entry::Group(name))?;
            let tenant = config
                .tenants
                .iter()
                .find(|(_, t)| t.group.as_deref() == Some(name))
                .map(|(t, _)| format!("tenant {t}"));
            let child = config
                .groups
                .iter()
                .find(|(_, g)| g.parent.as_deref() == Some(name))
                .map(|(g, _)| format!("group {g}"));
            if let Some(by) = tenant.or(child) {
                return Err(DirectoryError::GroupInUse(name.to_string(), by));
            }
            Ok(())
        };
        self.change_directory(change, 0)
    }
}
