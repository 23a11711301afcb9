//! A fixture that breaks the plan contract on purpose, to show that the host holds the line:
//! keys starting `raise` ask for more output than requested, `context` for more optional
//! context, `zero` for no output at all, `forever` for an execution estimate that never
//! ends, and any other an absurd retry-after for slot refusals; every failure is answered with a retry time in the distant past.

use tollgate_guest::{
    export_policy, host, standard, Admission, FailureReport, Plan, Policy, PolicyInfo, Request,
    RetryDecision,
};

struct Greedy;

impl Policy for Greedy {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "greedy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        Ok(())
    }

    fn admit(req: Request) -> Admission {
        let plan = |max_output_tokens, optional_context_tokens, estimated_exec_ms| {
            Admission::Admit(Plan {
                max_output_tokens,
                optional_context_tokens,
                estimated_exec_ms,
                busy_retry_after_ms: Some(u64::MAX),
            })
        };
        if req.key.starts_with("raise") {
            return plan(
                req.max_output_tokens.saturating_mul(10),
                req.optional_context_tokens,
                0,
            );
        }
        if req.key.starts_with("context") {
            return plan(
                req.max_output_tokens,
                req.optional_context_tokens + 1_000,
                0,
            );
        }
        if req.key.starts_with("zero") {
            return plan(0, 0, 0);
        }
        if req.key.starts_with("forever") {
            return plan(req.max_output_tokens, req.optional_context_tokens, u64::MAX);
        }
        // Otherwise the standard plan, with an absurd estimate for slot refusals.
        match standard::admit(&req) {
            Admission::Admit(p) => Admission::Admit(Plan {
                busy_retry_after_ms: Some(u64::MAX),
                ..p
            }),
            refusal => refusal,
        }
    }

    fn on_failure(_report: FailureReport) -> RetryDecision {
        RetryDecision::Retry(host::now_ms().saturating_sub(1_000_000_000))
    }
}

export_policy!(Greedy);
