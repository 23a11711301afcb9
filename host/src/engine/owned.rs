//! Objects a tenant made through the gateway and fetches later (stored responses): each is
//! recorded with the tenant that made it and the deployment that holds it when it is made,
//! so that only its maker finds it, and only at that deployment. A record is keyed by its
//! tenant: another tenant's lookup of the same id finds nothing.

use super::Engine;
use crate::store::{OwnedObject, Store, StoreError};

/// The longest id recorded: a provider's ids are far shorter.
pub const MAX_OBJECT_ID_BYTES: usize = 256;

/// Whether `id` may name an owned object: 1 to [`MAX_OBJECT_ID_BYTES`] bytes of letters,
/// digits, `_` and `-` (what providers' ids are made of).
pub fn valid_object_id(id: &str) -> bool {
    (1..=MAX_OBJECT_ID_BYTES).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl<S: Store> Engine<S> {
    /// Records that `tenant` made `object`.
    pub fn own_object(&self, tenant: &str, object: &OwnedObject) -> Result<(), StoreError> {
        self.transaction(|tx| tx.put_owned_object(tenant, object))
    }

    /// `tenant`'s object `(kind, id)`, if `tenant` made it.
    pub fn owned_object(
        &self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<Option<OwnedObject>, StoreError> {
        self.transaction(|tx| tx.owned_object(tenant, kind, id))
    }

    /// Forgets `tenant`'s object `(kind, id)` (deleted at its deployment); whether there was
    /// one.
    pub fn forget_object(&self, tenant: &str, kind: &str, id: &str) -> Result<bool, StoreError> {
        self.transaction(|tx| tx.delete_owned_object(tenant, kind, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(id: &str) -> OwnedObject {
        OwnedObject {
            kind: "response".into(),
            id: id.into(),
            model: "m".into(),
            deployment: "d1".into(),
            created_ms: 5,
        }
    }

    #[test]
    fn only_the_maker_finds_its_object() {
        let e = crate::engine::test_engine(&serde_json::json!({"tenants": {"a": {}, "b": {}}}));
        e.own_object("a", &object("resp_1")).unwrap();
        assert_eq!(
            e.owned_object("a", "response", "resp_1").unwrap(),
            Some(object("resp_1"))
        );
        assert_eq!(e.owned_object("b", "response", "resp_1").unwrap(), None);
        assert_eq!(e.owned_object("a", "file", "resp_1").unwrap(), None);
        // Another tenant cannot forget it either.
        assert!(!e.forget_object("b", "response", "resp_1").unwrap());
        assert!(e.owned_object("a", "response", "resp_1").unwrap().is_some());
        assert!(e.forget_object("a", "response", "resp_1").unwrap());
        assert_eq!(e.owned_object("a", "response", "resp_1").unwrap(), None);
    }

    #[test]
    fn object_ids_are_plain_words() {
        assert!(valid_object_id(
            "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"
        ));
        for bad in ["", "a/b", "a b", "../x", "x?y", &"a".repeat(257)] {
            assert!(!valid_object_id(bad), "{bad}");
        }
    }
}
