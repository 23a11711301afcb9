//! A fixture that talks too much: its self-check fails with a message of 4 MiB, which
//! the host must cut to a bounded length before it reaches a log line or an HTTP answer.
//! Otherwise the standard policy.

use tollgate_guest::{
    export_policy, standard, Admission, FailureReport, Policy, PolicyInfo, Request, RetryDecision,
};

struct Verbose;

impl Policy for Verbose {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "verbose".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        Err("é".repeat(2 << 20))
    }

    fn admit(req: Request) -> Admission {
        standard::admit(&req)
    }

    fn on_failure(report: FailureReport) -> RetryDecision {
        standard::on_failure(&report)
    }
}

export_policy!(Verbose);
