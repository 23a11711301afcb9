//! The `groups` section: teams and organisations above tenants. A group has budgets
//! (`requests`, `tokens`, `cost_microusd`, each a bucket or a period budget) and at most one
//! parent; a tenant names its group, and each of its calls reserves in its group's budgets
//! and in every ancestor's, all or nothing, with its own.

use super::{BucketConfig, ConfigError};
use crate::model::names;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most levels of groups above a tenant (a group, its parent, and so on).
pub const MAX_GROUP_DEPTH: usize = 4;

/// A group as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupInput {
    /// The group above this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The group's budgets.
    #[serde(default)]
    pub budgets: GroupBudgets,
}

/// A group's budgets, each optional.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupBudgets {
    /// One credit per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<BucketConfig>,
    /// The call's reserved tokens (refunded to what it used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<BucketConfig>,
    /// The call's price in micro-dollars (refunded to what its usage cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_microusd: Option<BucketConfig>,
}

/// A checked group: its parent and its budgets.
pub type GroupConfig = GroupInput;

impl GroupInput {
    /// The group's budgets by bucket name (`group.<g>.<budget>`).
    pub fn buckets<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (String, &'a BucketConfig)> + 'a {
        [
            ("requests", &self.budgets.requests),
            ("tokens", &self.budgets.tokens),
            ("cost_microusd", &self.budgets.cost_microusd),
        ]
        .into_iter()
        .filter_map(move |(budget, b)| Some((names::group_budget(name, budget), b.as_ref()?)))
    }
}

/// The groups, checked: names of 1 to 255 bytes, parents that exist, no cycle, and at most
/// [`MAX_GROUP_DEPTH`] levels.
pub(crate) fn effective(
    groups: &BTreeMap<String, GroupInput>,
) -> Result<BTreeMap<String, GroupConfig>, ConfigError> {
    for (name, g) in groups {
        if name.is_empty() || name.len() > 255 {
            return Err(ConfigError(format!(
                "group name {name:?} must be 1 to 255 bytes"
            )));
        }
        if let Some(p) = &g.parent {
            if !groups.contains_key(p) {
                return Err(ConfigError(format!(
                    "groups.{name}.parent: {p:?} is not a group of the `groups` section"
                )));
            }
        }
        let chain = chain_of(groups, name);
        if chain.len() > MAX_GROUP_DEPTH {
            let cycle = chain[1..].contains(&name.as_str());
            return Err(ConfigError(if cycle {
                format!(
                    "groups.{name}.parent: the parents make a cycle ({})",
                    chain.join(" -> ")
                )
            } else {
                format!(
                    "groups.{name}.parent: groups nest at most {MAX_GROUP_DEPTH} levels ({})",
                    chain.join(" -> ")
                )
            }));
        }
    }
    Ok(groups.clone())
}

/// A group and its ancestors, nearest first; stops one past [`MAX_GROUP_DEPTH`] so that a
/// cycle or a chain too deep shows as a chain too long.
pub(crate) fn chain_of<'a>(
    groups: &'a BTreeMap<String, GroupInput>,
    group: &'a str,
) -> Vec<&'a str> {
    let mut chain = vec![group];
    let mut at = group;
    while let Some(parent) = groups.get(at).and_then(|g| g.parent.as_deref()) {
        chain.push(parent);
        if chain.len() > MAX_GROUP_DEPTH {
            break;
        }
        at = parent;
    }
    chain
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use serde_json::json;

    fn err(v: serde_json::Value) -> String {
        Config::from_json(&v).unwrap_err().to_string()
    }

    #[test]
    fn groups_nest_and_tenants_name_them() {
        let c = Config::from_json(&json!({
            "groups": {
                "org": {"budgets": {"cost_microusd": {"limit": 500000000, "period": "month"}}},
                "team": {"parent": "org", "budgets": {"requests": {"capacity": 10, "refill_per_s": 1}}}
            },
            "tenants": {"a": {"group": "team"}, "b": {}}
        }))
        .unwrap();
        assert_eq!(c.tenant("a").unwrap().group.as_deref(), Some("team"));
        assert_eq!(c.group_chain("a"), vec!["team", "org"]);
        assert!(c.group_chain("b").is_empty());
    }

    #[test]
    fn bad_groups_name_the_field() {
        let e = err(json!({"groups": {"a": {"parent": "b"}, "b": {"parent": "a"}}}));
        assert!(e.contains("groups.a.parent") && e.contains("cycle"), "{e}");
        let e = err(json!({"groups": {
            "g1": {"parent": "g2"}, "g2": {"parent": "g3"}, "g3": {"parent": "g4"},
            "g4": {"parent": "g5"}, "g5": {}
        }}));
        assert!(
            e.contains("groups.g1.parent") && e.contains("at most 4"),
            "{e}"
        );
        let e = err(json!({"groups": {"a": {"parent": "nope"}}}));
        assert!(e.contains("groups.a.parent"), "{e}");
        let e = err(json!({"tenants": {"t": {"group": "nope"}}}));
        assert!(e.contains("tenants.t.group"), "{e}");
        let e = err(
            json!({"groups": {"a": {"budgets": {"tokens": {"limit": 1, "period": "day", "timezone": "Nowhere/Land"}}}}}),
        );
        assert!(e.contains("timezone") && e.contains("Nowhere/Land"), "{e}");
        let e = err(json!({"groups": {"a": {"budgets": {"money": {}}}}}));
        assert!(e.contains("money"), "{e}");
        // Four levels are allowed.
        assert!(Config::from_json(&json!({"groups": {
            "g1": {"parent": "g2"}, "g2": {"parent": "g3"}, "g3": {"parent": "g4"}, "g4": {}
        }, "tenants": {"t": {"group": "g1"}}}))
        .is_ok());
    }
}
