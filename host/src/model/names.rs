//! The names of buckets and slot scopes, as the store keeps them and `inspect` shows them,
//! and the names tenants, groups, models and deployments may have.
//!
//! A row's name joins its owners' names with `.`. Tenant, group and deployment names are
//! written through [`part`], which escapes `.` and `%`, so that none of them contains a dot
//! in a row's name; a model's name (`gpt-4.1`) is written as it is, and is always the one
//! part between a fixed word before it and dot-free parts and a fixed word after it, so it
//! is read back from both ends. No name, however written, makes another's row:
//! `tenant.acme%2Emodel%2Emc.tokens` is tenant `acme.model.mc`'s, never acme's budget for
//! model `mc`. Names of the documented character sets contain neither `.` nor `%` where it
//! is escaped, so their rows are named as they always were.

use std::borrow::Cow;

/// One name as a part of a row's name: `%` written `%25` and `.` written `%2E`.
pub fn part(name: &str) -> Cow<'_, str> {
    if !name.contains(['.', '%']) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(name.replace('%', "%25").replace('.', "%2E"))
}

/// The longest tenant or group name.
pub const MAX_NAME_BYTES: usize = 64;
/// The rule tenant and group names follow, as refusals state it.
pub const NAME_RULE: &str = "1 to 64 characters of A-Z, a-z, 0-9, `_` and `-`";

/// Whether `name` may name a tenant or a group: [`NAME_RULE`].
pub fn valid(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `Err` naming `field` and the rule when `name` is not [`valid`].
pub fn check(field: &str, name: &str) -> Result<(), String> {
    if valid(name) {
        Ok(())
    } else {
        Err(format!("{field}: the name {name:?} is not {NAME_RULE}"))
    }
}

/// The global request bucket.
pub const GLOBAL_REQUESTS: &str = "global.requests";
/// The global concurrency scope.
pub const GLOBAL_SLOTS: &str = "global";

/// A tenant's request bucket.
pub fn tenant_requests(tenant: &str) -> String {
    format!("tenant.{tenant}.requests", tenant = part(tenant))
}

/// A tenant's token bucket.
pub fn tenant_tokens(tenant: &str) -> String {
    format!("tenant.{tenant}.tokens", tenant = part(tenant))
}

/// A model's shared request bucket.
pub fn model_requests(model: &str) -> String {
    format!("model.{model}.requests")
}

/// A model's shared token bucket.
pub fn model_tokens(model: &str) -> String {
    format!("model.{model}.tokens")
}

/// A tenant's own token budget for one model.
pub fn tenant_model_tokens(tenant: &str, model: &str) -> String {
    format!(
        "tenant.{tenant}.model.{model}.tokens",
        tenant = part(tenant)
    )
}

/// A tenant's money budget, in micro-dollars.
pub fn tenant_cost(tenant: &str) -> String {
    format!("tenant.{tenant}.cost_microusd", tenant = part(tenant))
}

/// A group's budget: `requests`, `tokens` or `cost_microusd`.
pub fn group_budget(group: &str, budget: &str) -> String {
    format!("group.{group}.{budget}", group = part(group))
}

/// A tenant's concurrency scope.
pub fn tenant_slots(tenant: &str) -> String {
    format!("tenant.{tenant}", tenant = part(tenant))
}

/// The prefix of every row of one deployment of a gateway model.
pub fn deployment(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}", name = part(name))
}

/// When a deployment's pause (a 429's retry-after) or ejection ends: a bucket row whose
/// `updated_ms` is that time.
pub fn deployment_pause(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.pause", name = part(name))
}

/// A deployment's request bucket.
pub fn deployment_requests(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.requests", name = part(name))
}

/// A deployment's token bucket.
pub fn deployment_tokens(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.tokens", name = part(name))
}

/// A deployment's concurrency scope (its calls in flight).
pub fn deployment_slots(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.slots", name = part(name))
}

/// A deployment's consecutive failures (a count kept as a slot row).
pub fn deployment_failures(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.failures", name = part(name))
}

/// How many times in a row a deployment was ejected (its cool-down doubles with it).
pub fn deployment_ejections(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.ejections", name = part(name))
}

/// A deployment's learned concurrency limit (`max_concurrency: "adaptive"`).
pub fn deployment_limit(model: &str, name: &str) -> String {
    format!("deployment.{model}.{name}.limit", name = part(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Every row name the owners `(tenant, group, model, deployment)` have (`deployment`,
    /// a prefix that names no row, is not one).
    fn rows(t: &str, g: &str, m: &str, d: &str) -> Vec<(String, String)> {
        let mut out = vec![
            (tenant_requests(t), format!("tenant_requests {t}")),
            (tenant_tokens(t), format!("tenant_tokens {t}")),
            (tenant_cost(t), format!("tenant_cost {t}")),
            (tenant_slots(t), format!("tenant_slots {t}")),
            (model_requests(m), format!("model_requests {m}")),
            (model_tokens(m), format!("model_tokens {m}")),
            (
                tenant_model_tokens(t, m),
                format!("tenant_model_tokens {t} {m}"),
            ),
            (deployment_pause(m, d), format!("deployment_pause {m} {d}")),
            (
                deployment_requests(m, d),
                format!("deployment_requests {m} {d}"),
            ),
            (
                deployment_tokens(m, d),
                format!("deployment_tokens {m} {d}"),
            ),
            (deployment_slots(m, d), format!("deployment_slots {m} {d}")),
            (
                deployment_failures(m, d),
                format!("deployment_failures {m} {d}"),
            ),
            (
                deployment_ejections(m, d),
                format!("deployment_ejections {m} {d}"),
            ),
            (deployment_limit(m, d), format!("deployment_limit {m} {d}")),
        ];
        for budget in ["requests", "tokens", "cost_microusd"] {
            out.push((
                group_budget(g, budget),
                format!("group_budget {g} {budget}"),
            ));
        }
        out
    }

    /// Names of any shape: dots, percent signs, the words rows are made of.
    fn name() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just(".".to_string()),
                Just("%".to_string()),
                Just("%2E".to_string()),
                Just("model".to_string()),
                Just("tokens".to_string()),
                Just("requests".to_string()),
                Just("a".to_string()),
                Just("b".to_string()),
                Just(" ".to_string()),
                Just("/".to_string()),
            ],
            1..6,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// No two owners, however named, share a row: each row name has one meaning.
        #[test]
        fn no_name_makes_another_owners_row(
            owners in proptest::collection::vec((name(), name(), name(), name()), 2..5)
        ) {
            let mut seen: HashMap<String, String> = HashMap::new();
            for (t, g, m, d) in &owners {
                for (row, meaning) in rows(t, g, m, d) {
                    if let Some(before) = seen.insert(row.clone(), meaning.clone()) {
                        prop_assert_eq!(&before, &meaning, "row {} has two meanings", row);
                    }
                }
            }
        }
    }

    #[test]
    fn the_reported_alias_is_two_rows() {
        assert_ne!(
            tenant_tokens("acme.model.mc"),
            tenant_model_tokens("acme", "mc")
        );
        assert_eq!(
            tenant_tokens("acme.model.mc"),
            "tenant.acme%2Emodel%2Emc.tokens"
        );
        assert_ne!(deployment_slots("a.b", "c"), deployment_slots("a", "b.c"));
        // Names of the rule keep the rows they always had.
        assert_eq!(
            tenant_model_tokens("acme", "gpt-4.1"),
            "tenant.acme.model.gpt-4.1.tokens"
        );
        assert_eq!(
            deployment_pause("gpt-4.1", "east-1"),
            "deployment.gpt-4.1.east-1.pause"
        );
    }

    #[test]
    fn names_follow_the_rule() {
        for good in ["acme", "a", "team_alpha-2", &"x".repeat(64)] {
            assert!(valid(good), "{good}");
        }
        for bad in [
            "",
            "acme.model.mc",
            "a:b",
            "a/b",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            let e = check("tenants.x", bad).unwrap_err();
            assert!(e.contains("A-Z, a-z, 0-9"), "{e}");
            assert!(e.starts_with("tenants.x:"), "{e}");
        }
    }
}
