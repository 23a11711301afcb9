//! A property test of tenant isolation: two tenants, one of them named as an earlier
//! release allowed (dots, spaces, the other's name inside its own), calls and admin
//! changes in any order by the second; the first's balances and operations never move.

use super::Engine;
use crate::config::Config;
use crate::model::names;
use crate::store::{SqliteStore, Store, Tx};
use proptest::prelude::*;
use serde_json::json;

/// What the second tenant does.
#[derive(Clone, Debug)]
enum Step {
    /// A call for `model` (under a key the first tenant also uses), completed with `used`
    /// tokens of output when given.
    Call {
        key: u8,
        model: usize,
        input: u64,
        used: Option<u64>,
    },
    /// The admin sets its token budget, and its budget for `model`.
    Budgets {
        tokens: u64,
        model: usize,
        model_tokens: u64,
    },
}

const MODELS: [&str; 2] = ["mc", "gpt-4.1"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0u8..4,
            0..MODELS.len(),
            1u64..200,
            proptest::option::of(0u64..300)
        )
            .prop_map(|(key, model, input, used)| Step::Call {
                key,
                model,
                input,
                used
            }),
        (1u64..1_000_000, 0..MODELS.len(), 1u64..1_000_000).prop_map(
            |(tokens, model, model_tokens)| Step::Budgets {
                tokens,
                model,
                model_tokens
            }
        ),
    ]
}

/// The second tenant's name: the first's with a model's row name after it, or any odd name.
fn other_name(first: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        (0..MODELS.len()).prop_map(move |m| format!("{first}.model.{}", MODELS[m])),
        Just(format!("{first}.tokens")),
        Just(format!("{first} x")),
        Just(format!("{first}%2Emodel%2Emc")),
        "[a-z.%/: ]{1,12}".prop_filter("not the first", move |n| n != first),
    ]
}

/// Everything of `tenant` the store keeps: its own budget rows and its operations.
fn own_rows(tx: &mut dyn Tx, tenant: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rows = vec![
        names::tenant_requests(tenant),
        names::tenant_tokens(tenant),
        names::tenant_cost(tenant),
    ];
    rows.extend(MODELS.iter().map(|m| names::tenant_model_tokens(tenant, m)));
    for row in rows {
        out.push(format!("{row} {:?}", tx.bucket(&row).unwrap()));
    }
    let scope = names::tenant_slots(tenant);
    out.push(format!("{scope} {:?}", tx.slots_in_use(&scope).unwrap()));
    for key in 0..4 {
        let key = format!("k{key}");
        out.push(format!("{key} {:?}", tx.operation(tenant, &key).unwrap()));
    }
    out
}

/// An engine whose store holds both tenants, as an earlier release's store would.
fn engine(first: &str, second: &str) -> Engine<SqliteStore> {
    let config = Config::from_json(&json!({
        "tenant_defaults": {
            "requests": {"capacity": 1000, "refill_per_s": 0},
            "tokens": {"capacity": 100000, "refill_per_s": 0},
        },
        "models": {"mc": {}, "gpt-4.1": {}},
    }))
    .unwrap();
    let e = super::test_engine_on(&config, SqliteStore::in_memory().unwrap());
    let written = json!({"models": {
        "mc": {"tokens": {"capacity": 5000, "refill_per_s": 0}},
        "gpt-4.1": {"tokens": {"capacity": 5000, "refill_per_s": 0}},
    }})
    .to_string();
    e.transaction(|tx| {
        tx.put_written_tenant(first, &written)?;
        tx.put_written_tenant(second, &written)?;
        tx.set_meta(super::directory::GENERATION, "1")
    })
    .unwrap();
    e.sync_directory().unwrap();
    e
}

fn call(e: &Engine<impl Store>, tenant: &str, key: u8, model: &str, input: u64) -> bool {
    let request = json!({
        "tenant": tenant, "key": format!("k{key}"), "route": "interactive", "model": model,
        "input_tokens": input, "max_output_tokens": 100, "deadline_ms": 1_000_000,
    });
    e.admit(&request, 0).unwrap().authorises_call()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn nothing_one_tenant_does_moves_anothers_rows(
        second in other_name("acme"),
        steps in proptest::collection::vec(step(), 1..12),
    ) {
        let first = "acme";
        let e = engine(first, &second);
        prop_assert!(e.config().tenant(&second).is_some());
        // The first tenant has a call in flight and one finished, under keys the second
        // uses too.
        prop_assert!(call(&e, first, 0, "mc", 10));
        prop_assert!(call(&e, first, 1, "gpt-4.1", 10));
        e.complete(&super::Completion::succeeded(first, "k1"), 1).unwrap();
        let before = e.transaction(|tx| Ok(own_rows(tx, first))).unwrap();
        for s in &steps {
            match s {
                Step::Call { key, model, input, used } => {
                    if call(&e, &second, *key, MODELS[*model], *input) {
                        if let Some(used) = used {
                            let mut c = super::Completion::succeeded(&second, &format!("k{key}"));
                            c.usage = Some(crate::model::Usage::new(*input, *used));
                            e.complete(&c, 1).unwrap();
                        }
                    }
                }
                Step::Budgets { tokens, model, model_tokens } => {
                    let written = json!({
                        "tokens": {"capacity": tokens, "refill_per_s": 0},
                        "models": {MODELS[*model]: {"tokens": {"capacity": model_tokens, "refill_per_s": 0}}},
                    });
                    e.put_tenant(&second, &written, 1).unwrap();
                }
            }
            let after = e.transaction(|tx| Ok(own_rows(tx, first))).unwrap();
            prop_assert_eq!(&before, &after, "after {:?} by {:?}", s, second);
        }
    }
}

#[test]
fn the_reported_alias_no_longer_reaches_acmes_model_budget() {
    let e = engine("acme", "acme.model.mc");
    let row = names::tenant_model_tokens("acme", "mc");
    let before = e.transaction(|tx| tx.bucket(&row)).unwrap();
    e.put_tenant(
        "acme.model.mc",
        &json!({"tokens": {"capacity": 5, "refill_per_s": 0}}),
        1,
    )
    .unwrap();
    assert_eq!(e.transaction(|tx| tx.bucket(&row)).unwrap(), before);
    // A new name outside the rule is refused, the rule in the message.
    let refused = e.put_tenant("globex.model.mc", &json!({}), 1).unwrap_err();
    assert!(refused.to_string().contains("A-Z, a-z, 0-9"), "{refused}");
    assert!(e.config().tenant("globex.model.mc").is_none());
}
