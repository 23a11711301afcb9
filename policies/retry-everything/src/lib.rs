//! A fixture that answers "retry now" for every failure, to show that the host alone
//! refuses to retry an unknown outcome.

use tollgate_guest::{
    export_policy, host, standard, Admission, FailureReport, Policy, PolicyInfo, Request,
    RetryDecision,
};

struct RetryEverything;

impl Policy for RetryEverything {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "retry-everything".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        Ok(())
    }

    fn admit(req: Request) -> Admission {
        standard::admit(&req)
    }

    fn on_failure(_report: FailureReport) -> RetryDecision {
        RetryDecision::Retry(host::now_ms())
    }
}

export_policy!(RetryEverything);
