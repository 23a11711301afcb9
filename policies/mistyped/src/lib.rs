//! A fixture that names every export of `tollgate:policy/decide`, with `describe` and
//! `self-check` of the right types and `admit` and `on-failure` of other ones. The host
//! must refuse it when it loads it, not when a decision calls it.

wit_bindgen::generate!({
    inline: "
        package tollgate:policy@0.1.0;
        interface types {
            record policy-info {
                name: string,
                version: string,
            }
        }
        interface decide {
            use types.{policy-info};
            describe: func() -> policy-info;
            self-check: func() -> result<_, string>;
            admit: func(tokens: u64) -> u64;
            on-failure: func(attempt: u32) -> s64;
        }
        world policy {
            export decide;
        }
    ",
});

use exports::tollgate::policy::decide::{Guest, PolicyInfo};

struct Mistyped;

impl Guest for Mistyped {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "mistyped".into(),
            version: "0.1.0".into(),
        }
    }

    fn self_check() -> Result<(), String> {
        Ok(())
    }

    fn admit(tokens: u64) -> u64 {
        tokens
    }

    fn on_failure(attempt: u32) -> i64 {
        i64::from(attempt)
    }
}

export!(Mistyped);
