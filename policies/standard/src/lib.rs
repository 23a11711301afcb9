//! The standard policy: the rules of docs/contract.md sections 3, 4, 6 and 7 with `policy_params`.

use tollgate_guest::{
    export_policy, standard, Admission, FailureReport, Policy, PolicyInfo, Request, RetryDecision,
};

struct Standard;

impl Policy for Standard {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "standard".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        standard::self_check()
    }

    fn admit(req: Request) -> Admission {
        standard::admit(&req)
    }

    fn on_failure(report: FailureReport) -> RetryDecision {
        standard::on_failure(&report)
    }
}

export_policy!(Standard);
