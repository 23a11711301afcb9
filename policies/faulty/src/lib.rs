//! A fixture that misbehaves on purpose: as `standard`, except that a request whose key
//! starts with `trap` traps, `spin` loops forever, `hog` grows memory without bound, `deep`
//! recurses until the stack runs out, `loud` asks the host for a parameter with a 16 MiB
//! name again and again, and `chatty` calls the host without end; `big` allocates
//! most of a MiB (beyond the initial memory) and checks that no block overlaps another.

use core::hint::black_box;
use tollgate_guest::{
    export_policy, host, standard, Admission, FailureReport, Policy, PolicyInfo, Request, RetryDecision,
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
        if req.key.starts_with("loud") {
            // Little fuel per call, and a 16 MiB string for the host to copy each time.
            let name = "p".repeat(16 << 20);
            loop {
                black_box(host::param(black_box(&name)));
            }
        }
        if req.key.starts_with("chatty") {
            // Host calls as fast as the guest can make them.
            loop {
                black_box(host::now_ms());
            }
        }
        if req.key.starts_with("deep") {
            return Admission::Refuse(deeper(black_box(0)));
        }
        if req.key.starts_with("big") && !big_allocations_hold() {
            core::arch::wasm32::unreachable();
        }
        standard::admit(&req)
    }

    fn on_failure(report: FailureReport) -> RetryDecision {
        standard::on_failure(&report)
    }
}

/// Recurses until the stack runs out (the host traps it with a long backtrace).
#[allow(unconditional_recursion)]
fn deeper(depth: u64) -> tollgate_guest::Refusal {
    let r = deeper(black_box(depth + 1));
    black_box(r)
}

/// Interleaves growing, shrinking and freeing blocks past the initial memory, then checks
/// every byte: an allocator that hands out overlapping memory fails here.
fn big_allocations_hold() -> bool {
    let mut blocks: Vec<Vec<u32>> = Vec::new();
    for b in 0..6u32 {
        let mut v = Vec::new();
        for i in 0..(1u32 << 15) {
            v.push(black_box(b ^ i));
        }
        if b % 3 == 0 {
            v.truncate(1000);
            v.shrink_to_fit();
        }
        blocks.push(v);
        let scratch = black_box(vec![0xffu8; 4096]);
        drop(scratch);
    }
    blocks
        .iter()
        .enumerate()
        .all(|(b, v)| v.iter().enumerate().all(|(i, x)| *x == b as u32 ^ i as u32))
}

export_policy!(Faulty);
