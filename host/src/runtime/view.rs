//! What a policy may read during one decision ([`DecisionView`]), served the same way to
//! wasm components and to native deciders.

use super::{BucketKind, BucketLevel, SlotLevel, SlotScope};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A deterministic generator for jitter: SplitMix64 over a seed of the decision's identity.
#[derive(Clone, Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the configuration seed, the tenant, the key and the attempt.
    pub fn new(seed: u64, tenant: &str, key: &str, attempt: u32) -> Self {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update((tenant.len() as u64).to_le_bytes());
        h.update(tenant.as_bytes());
        h.update(key.as_bytes());
        h.update(attempt.to_le_bytes());
        let d = h.finalize();
        Jitter(u64::from_le_bytes(d[..8].try_into().unwrap()))
    }

    /// Another stream from the same seed, told apart by `label` (WASI's random sources
    /// read their own, so that they never repeat `host::random`'s draws).
    pub fn fork(&self, label: &[u8]) -> Jitter {
        let mut h = Sha256::new();
        h.update(self.0.to_le_bytes());
        h.update(label);
        let d = h.finalize();
        Jitter(u64::from_le_bytes(d[..8].try_into().unwrap()))
    }

    /// The next draw of the stream (SplitMix64).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, upper]`, without modulo bias.
    pub fn below_inclusive(&mut self, upper: u64) -> u64 {
        if upper == u64::MAX {
            return self.next_u64();
        }
        let span = upper + 1;
        let zone = u64::MAX - (u64::MAX % span);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % span;
            }
        }
    }
}

/// The configuration's `policy_params`, as a policy reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    /// Numbers (booleans as 0 and 1), read by `param`.
    pub numbers: BTreeMap<String, f64>,
    /// Strings, read by `param-string` (world 0.2.0).
    pub strings: BTreeMap<String, String>,
}

impl Params {
    /// Numeric parameters only.
    pub fn numbers(numbers: BTreeMap<String, f64>) -> Self {
        Params {
            numbers,
            strings: BTreeMap::new(),
        }
    }
}

/// What a policy may read during one decision: a snapshot taken inside the transaction.
#[derive(Clone, Debug)]
pub struct DecisionView {
    /// The decision's time.
    pub now_ms: i64,
    /// The configuration's `policy_params`.
    pub params: Arc<Params>,
    /// The tenant's dispatch weight.
    pub weight: u32,
    /// The global request bucket.
    pub global_requests: Option<BucketLevel>,
    /// The tenant's request bucket.
    pub tenant_requests: Option<BucketLevel>,
    /// The tenant's token bucket.
    pub tenant_tokens: Option<BucketLevel>,
    /// Global slots.
    pub global_slots: Option<SlotLevel>,
    /// The tenant's slots, when it has a limit.
    pub tenant_slots: Option<SlotLevel>,
    /// The request's model's shared request bucket.
    pub model_requests: Option<BucketLevel>,
    /// The request's model's shared token bucket.
    pub model_tokens: Option<BucketLevel>,
    /// The tenant's own token budget for the request's model.
    pub tenant_model_tokens: Option<BucketLevel>,
    /// The tenant's money budget.
    pub tenant_cost: Option<BucketLevel>,
    /// The decision's deterministic draw.
    pub jitter: Jitter,
}

impl DecisionView {
    /// A view with nothing in use and full buckets, for self-checks and smoke decisions.
    pub fn scratch(params: Arc<Params>) -> Self {
        let bucket = Some(BucketLevel {
            available: 1000,
            capacity: 1000,
            refill_per_s: 1.0,
        });
        DecisionView {
            now_ms: 0,
            params,
            weight: 1,
            global_requests: bucket,
            tenant_requests: bucket,
            tenant_tokens: Some(BucketLevel {
                available: 100_000,
                capacity: 100_000,
                refill_per_s: 1000.0,
            }),
            global_slots: Some(SlotLevel {
                in_use: 0,
                limit: 8,
            }),
            tenant_slots: None,
            model_requests: None,
            model_tokens: None,
            tenant_model_tokens: None,
            tenant_cost: None,
            jitter: Jitter(0),
        }
    }

    /// A bucket's level as the policy sees it (`None`: no such bucket is configured).
    pub fn bucket(&self, kind: BucketKind) -> Option<BucketLevel> {
        match kind {
            BucketKind::GlobalRequests => self.global_requests,
            BucketKind::TenantRequests => self.tenant_requests,
            BucketKind::TenantTokens => self.tenant_tokens,
            BucketKind::ModelRequests => self.model_requests,
            BucketKind::ModelTokens => self.model_tokens,
            BucketKind::TenantModelTokens => self.tenant_model_tokens,
            BucketKind::TenantCost => self.tenant_cost,
        }
    }

    /// A concurrency scope's slots as the policy sees them (`None`: no limit).
    pub fn slots(&self, scope: SlotScope) -> Option<SlotLevel> {
        match scope {
            SlotScope::Global => self.global_slots,
            SlotScope::Tenant => self.tenant_slots,
        }
    }
}
