//! The `waiting` section: the waiting room's bounds and its longest wait (contract §4a).

use super::input::WaitingInput;
use super::{ConfigError, TenantConfig};

/// The waiting room (`waiting`): interactive calls refused only by shared capacity that
/// frees by itself wait for it, within their deadline, in a fair order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingConfig {
    /// Whether gateway calls wait (a `POST /v1/admit` waits only when it asks).
    pub enabled: bool,
    /// The longest a call waits, whatever its deadline.
    pub max_wait_ms: u64,
    /// Most calls of one tenant waiting at once (a tenant's `waiting.per_tenant` overrides).
    pub per_tenant: u32,
    /// Most calls waiting at once in all.
    pub total: u32,
}

impl Default for WaitingConfig {
    fn default() -> Self {
        WaitingConfig {
            enabled: true,
            max_wait_ms: 30_000,
            per_tenant: 64,
            total: 4096,
        }
    }
}

impl WaitingConfig {
    /// Most calls of `tenant` waiting at once.
    pub fn per_tenant_of(&self, tenant: Option<&TenantConfig>) -> u32 {
        tenant
            .and_then(|t| t.waiting_per_tenant)
            .unwrap_or(self.per_tenant)
    }
}

/// The longest `waiting.max_wait_ms`: ten minutes.
pub const MAX_WAIT_MS: u64 = 600_000;
/// The largest `waiting.total` (and `per_tenant`): each waiter holds a connection.
pub const MAX_WAITERS: u32 = 1_000_000;

/// The `waiting` section, checked: every field named when out of its bounds.
pub(super) fn of(w: &WaitingInput) -> Result<WaitingConfig, ConfigError> {
    let d = WaitingConfig::default();
    let max_wait_ms = w.max_wait_ms.unwrap_or(d.max_wait_ms);
    if max_wait_ms > MAX_WAIT_MS {
        return Err(ConfigError(format!(
            "waiting.max_wait_ms must be at most {MAX_WAIT_MS} (ten minutes)"
        )));
    }
    let bound = |v: Option<u32>, default: u32, field: &str| match v.unwrap_or(default) {
        n if n > MAX_WAITERS => Err(ConfigError(format!(
            "waiting.{field} must be at most {MAX_WAITERS}"
        ))),
        n => Ok(n),
    };
    Ok(WaitingConfig {
        enabled: w.enabled.unwrap_or(d.enabled),
        max_wait_ms,
        per_tenant: bound(w.per_tenant, d.per_tenant, "per_tenant")?,
        total: bound(w.total, d.total, "total")?,
    })
}
