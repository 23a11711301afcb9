//! A fixture that refuses every admission as `overloaded`.

use tollgate_guest::{
    export_policy, standard, Admission, FailureReport, Policy, PolicyInfo, Refusal, RefusalReason,
    Request, RetryDecision,
};

struct DenyAll;

impl Policy for DenyAll {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "deny-all".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        Ok(())
    }

    fn admit(_req: Request) -> Admission {
        Admission::Refuse(Refusal {
            reason: RefusalReason::Overloaded,
            retry_after_ms: None,
        })
    }

    fn on_failure(report: FailureReport) -> RetryDecision {
        standard::on_failure(&report)
    }
}

export_policy!(DenyAll);
