//! A budget as the configuration writes it: a bucket that refills continuously
//! (`{"capacity", "refill_per_s"}`) or a period budget that is full again at each boundary of
//! a calendar period (`{"limit", "period", "timezone"?}`), and the overlay that gives one
//! field by field over another (`tenant_defaults` under a tenant).

use super::ConfigError;
use crate::bucket::Limits;
use crate::calendar::{Calendar, Period};
use serde::{Deserialize, Serialize};

/// The timezone of a period budget that names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// A budget: a bucket's capacity and refill rate in credits, or a period budget's limit
/// (as `capacity`, with no refill) and calendar.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(try_from = "BudgetInput", into = "BudgetInput")]
pub struct BucketConfig {
    /// Most credits the bucket holds; it starts full. A period budget's `limit`.
    pub capacity: f64,
    /// Credits added per second (0: a hard budget, or a period budget).
    pub refill_per_s: f64,
    /// A period budget's calendar: full again at each of its boundaries.
    pub period: Option<Calendar>,
}

impl BucketConfig {
    /// A bucket that refills continuously.
    pub const fn refilling(capacity: f64, refill_per_s: f64) -> Self {
        BucketConfig {
            capacity,
            refill_per_s,
            period: None,
        }
    }

    /// The exact integer limits the bucket arithmetic runs on.
    pub fn limits(&self) -> Limits {
        match self.period {
            Some(calendar) => Limits::per_period(self.capacity, calendar),
            None => Limits::from_credits(self.capacity, self.refill_per_s),
        }
    }

    /// Capacity and refill are finite numbers from 0 to 1e12; `name` says whose in the error.
    pub(crate) fn check(&self, name: &str) -> Result<(), ConfigError> {
        let ok = |x: f64| x.is_finite() && (0.0..=1e12).contains(&x);
        if self.period.is_some() && !ok(self.capacity) {
            return Err(ConfigError(format!(
                "{name}: limit must be a number from 0 to 1e12"
            )));
        }
        if !ok(self.capacity) || !ok(self.refill_per_s) {
            return Err(ConfigError(format!(
                "{name}: capacity and refill_per_s must be numbers from 0 to 1e12"
            )));
        }
        Ok(())
    }
}

/// Either form as written; which fields are present says which it is.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refill_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    period: Option<Period>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timezone: Option<String>,
}

impl BudgetInput {
    fn is_period(&self) -> bool {
        self.limit.is_some() || self.period.is_some() || self.timezone.is_some()
    }

    fn is_bucket(&self) -> bool {
        self.capacity.is_some() || self.refill_per_s.is_some()
    }
}

fn calendar(period: Period, timezone: Option<&str>) -> Result<Calendar, String> {
    let name = timezone.unwrap_or(DEFAULT_TIMEZONE);
    Calendar::new(period, name).ok_or_else(|| {
        format!("timezone: {name:?} is not an IANA timezone name (such as \"Europe/Paris\")")
    })
}

const MIXED: &str = "a budget is either {\"capacity\", \"refill_per_s\"} or {\"limit\", \"period\", \"timezone\"}, not both";

impl TryFrom<BudgetInput> for BucketConfig {
    type Error = String;

    fn try_from(b: BudgetInput) -> Result<Self, String> {
        if b.is_period() && b.is_bucket() {
            return Err(MIXED.into());
        }
        if b.is_period() {
            let (Some(limit), Some(period)) = (b.limit, b.period) else {
                return Err(
                    "a period budget needs both `limit` and `period` (hour, day, week or month)"
                        .into(),
                );
            };
            return Ok(BucketConfig {
                capacity: limit,
                refill_per_s: 0.0,
                period: Some(calendar(period, b.timezone.as_deref())?),
            });
        }
        match (b.capacity, b.refill_per_s) {
            (Some(capacity), Some(refill_per_s)) => {
                Ok(BucketConfig::refilling(capacity, refill_per_s))
            }
            _ => {
                Err("a budget needs `capacity` and `refill_per_s`, or `limit` and `period`".into())
            }
        }
    }
}

impl From<BucketConfig> for BudgetInput {
    fn from(b: BucketConfig) -> Self {
        match b.period {
            Some(c) => BudgetInput {
                limit: Some(b.capacity),
                period: Some(c.period),
                timezone: Some(c.timezone_name().to_string()),
                ..Default::default()
            },
            None => BudgetInput {
                capacity: Some(b.capacity),
                refill_per_s: Some(b.refill_per_s),
                ..Default::default()
            },
        }
    }
}

/// A budget given field by field over another: either form's fields, never both.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub(crate) struct BucketOverlay(BudgetInput);

impl BucketOverlay {
    /// This overlay laid over `base`: a period budget's fields make a period budget (the
    /// limit, period and timezone not given are the base's), a bucket's fields a bucket.
    pub(crate) fn over(&self, base: BucketConfig, name: &str) -> Result<BucketConfig, ConfigError> {
        let o = &self.0;
        let named = |e: &str| ConfigError(format!("{name}: {e}"));
        if o.is_period() && o.is_bucket() {
            return Err(named(MIXED));
        }
        if o.is_period() {
            let base_period = base.period;
            let limit = o
                .limit
                .or(base_period.map(|_| base.capacity))
                .ok_or_else(|| named("a period budget needs `limit`"))?;
            let period = o.period.or(base_period.map(|c| c.period)).ok_or_else(|| {
                named("a period budget needs `period` (hour, day, week or month)")
            })?;
            let timezone = o
                .timezone
                .clone()
                .or(base_period.map(|c| c.timezone_name().to_string()));
            return Ok(BucketConfig {
                capacity: limit,
                refill_per_s: 0.0,
                period: Some(calendar(period, timezone.as_deref()).map_err(|e| named(&e))?),
            });
        }
        if o.is_bucket() {
            return Ok(BucketConfig::refilling(
                o.capacity.unwrap_or(base.capacity),
                o.refill_per_s.unwrap_or(base.refill_per_s),
            ));
        }
        Ok(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget(v: serde_json::Value) -> Result<BucketConfig, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn both_forms_read_and_write_back() {
        let b =
            budget(json!({"limit": 500, "period": "month", "timezone": "Europe/Paris"})).unwrap();
        assert_eq!(b.capacity, 500.0);
        assert_eq!(b.period.unwrap().timezone_name(), "Europe/Paris");
        assert_eq!(
            serde_json::to_value(b).unwrap(),
            json!({"limit": 500.0, "period": "month", "timezone": "Europe/Paris"})
        );
        let b = budget(json!({"limit": 5, "period": "day"})).unwrap();
        assert_eq!(b.period.unwrap().timezone_name(), "UTC");
        let b = budget(json!({"capacity": 5, "refill_per_s": 1})).unwrap();
        assert_eq!(b, BucketConfig::refilling(5.0, 1.0));
    }

    #[test]
    fn bad_budgets_name_the_field() {
        let e = budget(json!({"limit": 5, "period": "day", "timezone": "Mars/Base"})).unwrap_err();
        assert!(e.contains("timezone") && e.contains("Mars/Base"), "{e}");
        let e = budget(json!({"limit": 5, "period": "fortnight"})).unwrap_err();
        assert!(e.contains("fortnight"), "{e}");
        let e = budget(json!({"limit": 5})).unwrap_err();
        assert!(e.contains("period"), "{e}");
        let e = budget(json!({"limit": 5, "period": "day", "capacity": 3})).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        assert!(budget(json!({"capacity": 5})).is_err());
        assert!(budget(json!({"limit": 5, "period": "day", "every": 2})).is_err());
    }

    #[test]
    fn overlays_keep_the_form_they_name() {
        let month =
            budget(json!({"limit": 100, "period": "month", "timezone": "Asia/Tokyo"})).unwrap();
        let o: BucketOverlay = serde_json::from_value(json!({"limit": 40})).unwrap();
        let b = o.over(month, "t").unwrap();
        assert_eq!(b.capacity, 40.0);
        assert_eq!(b.period, month.period);
        let o: BucketOverlay = serde_json::from_value(json!({"period": "week"})).unwrap();
        let refill = BucketConfig::refilling(10.0, 1.0);
        let e = o.over(refill, "tenants.a.requests").unwrap_err();
        assert!(e.0.starts_with("tenants.a.requests:"), "{e}");
        let o: BucketOverlay = serde_json::from_value(json!({"refill_per_s": 2})).unwrap();
        assert_eq!(
            o.over(refill, "t").unwrap(),
            BucketConfig::refilling(10.0, 2.0)
        );
    }
}
