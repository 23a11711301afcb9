//! A fixture that misbehaves on purpose: as `standard`, except that a request whose key
//! starts with `trap` traps, `spin` loops forever and `hog` grows memory without bound.

use core::hint::black_box;
use tollgate_guest::{
    export_policy, standard, Admission, FailureReport, Policy, PolicyInfo, Request, RetryDecision,
};

struct Faulty;

impl Policy for Faulty {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "faulty".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn self_check() -> Result<(), String> {
        standard::self_check()
    }

    fn admit(req: Request) -> Admission {
        if req.key.starts_with("trap") {
            core::arch::wasm32::unreachable();
        }
        if req.key.starts_with("spin") {
            let mut n = 0u64;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        if req.key.starts_with("hog") {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(black_box(vec![1u8; 1 << 20]));
            }
        }
        standard::admit(&req)
    }

    fn on_failure(report: FailureReport) -> RetryDecision {
        standard::on_failure(&report)
    }
}

export_policy!(Faulty);
