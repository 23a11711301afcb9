//! Token-bucket arithmetic: pure functions of a bucket's stored state, its limits and the time.
//! A bucket either refills continuously at its rate, or (a period budget) is full again at
//! each boundary of its calendar period and not before.
//!
//! Balances are kept in micro-credits and refill rates in milli-credits per second, so that a
//! refill over whole milliseconds is exact integer arithmetic (`rate_milli * elapsed_ms`
//! micro-credits) for any rate with up to three decimals, such as 0.5 requests per second.

use crate::calendar::Calendar;

/// Micro-credits in one credit.
pub const MICRO: i64 = 1_000_000;

/// A bucket's limits, from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most micro-credits the bucket can hold.
    pub capacity_micro: i64,
    /// Refill in milli-credits per second (one milli-credit per second is one micro-credit per ms).
    pub refill_milli_per_s: i64,
    /// For a period budget, its calendar (and its refill rate is 0).
    pub period: Option<Calendar>,
}

impl Limits {
    /// Limits from the configuration's numbers (capacity and refill in credits), which the
    /// configuration has already checked to be finite and non-negative.
    pub fn from_credits(capacity: f64, refill_per_s: f64) -> Self {
        Limits {
            capacity_micro: (capacity * MICRO as f64).round() as i64,
            refill_milli_per_s: (refill_per_s * 1000.0).round() as i64,
            period: None,
        }
    }

    /// A period budget of `limit` credits, full again at each boundary of `calendar`.
    pub fn per_period(limit: f64, calendar: Calendar) -> Self {
        Limits {
            capacity_micro: (limit * MICRO as f64).round() as i64,
            refill_milli_per_s: 0,
            period: Some(calendar),
        }
    }

    /// When a period budget last touched at `updated_ms` is full again (`None`: it refills
    /// continuously).
    pub fn resets_at(&self, updated_ms: i64) -> Option<i64> {
        Some(self.period?.next_reset(updated_ms))
    }
}

/// What the store keeps for a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Credits held, in micro-credits.
    pub balance_micro: i64,
    /// Logical time of the last refill. Never moves backwards.
    pub updated_ms: i64,
}

impl State {
    /// Every bucket starts full.
    pub fn full(limits: Limits, now_ms: i64) -> Self {
        State {
            balance_micro: limits.capacity_micro,
            updated_ms: now_ms,
        }
    }

    /// The state refilled up to `now_ms`. A clock that steps backwards adds nothing and
    /// leaves `updated_ms` where it was, so it can never mint credits.
    /// A period budget is full again once a boundary of its period lies after `updated_ms`
    /// and at or before `now_ms`; otherwise it keeps its balance.
    pub fn refilled(self, limits: Limits, now_ms: i64) -> Self {
        if now_ms <= self.updated_ms {
            return State {
                balance_micro: self.balance_micro.min(limits.capacity_micro),
                ..self
            };
        }
        if let Some(calendar) = limits.period {
            let balance = if now_ms >= calendar.next_reset(self.updated_ms) {
                limits.capacity_micro
            } else {
                self.balance_micro.min(limits.capacity_micro)
            };
            return State {
                balance_micro: balance,
                updated_ms: now_ms,
            };
        }
        let elapsed = i128::from(now_ms - self.updated_ms);
        let added = elapsed * i128::from(limits.refill_milli_per_s);
        let balance =
            (i128::from(self.balance_micro) + added).min(i128::from(limits.capacity_micro));
        State {
            balance_micro: balance as i64,
            updated_ms: now_ms,
        }
    }

    /// Whole credits available (what `inspect` reports).
    pub fn whole_credits(self) -> i64 {
        self.balance_micro.div_euclid(MICRO)
    }

    /// Takes `credits`, or says how long until they are there (for a period budget, until its
    /// next reset).
    pub fn spend(self, limits: Limits, credits: u64) -> Result<State, Shortage> {
        let need = need_micro(credits);
        if need > i128::from(limits.capacity_micro) {
            return Err(Shortage::NeverFits);
        }
        if i128::from(self.balance_micro) >= need {
            return Ok(State {
                balance_micro: (i128::from(self.balance_micro) - need) as i64,
                ..self
            });
        }
        if let Some(reset) = limits.resets_at(self.updated_ms) {
            return Err(Shortage::RetryAfterMs(
                reset.saturating_sub(self.updated_ms).max(0) as u64,
            ));
        }
        if limits.refill_milli_per_s <= 0 {
            return Err(Shortage::NoRefill);
        }
        let missing = need - i128::from(self.balance_micro);
        let rate = i128::from(limits.refill_milli_per_s);
        let wait_ms = (missing + rate - 1) / rate;
        Err(Shortage::RetryAfterMs(
            wait_ms.min(i128::from(i64::MAX)) as u64
        ))
    }

    /// Gives back `credits` (a usage refund), never above capacity.
    pub fn refund(self, limits: Limits, credits: u64) -> State {
        let balance = (i128::from(self.balance_micro) + need_micro(credits))
            .min(i128::from(limits.capacity_micro));
        State {
            balance_micro: balance as i64,
            ..self
        }
    }
}

/// Why a spend did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortage {
    /// Not yet: the credits are there after this many milliseconds of refill.
    RetryAfterMs(u64),
    /// The bucket does not refill, so waiting cannot cure it.
    NoRefill,
    /// More than the bucket can ever hold.
    NeverFits,
}

fn need_micro(credits: u64) -> i128 {
    i128::from(credits) * i128::from(MICRO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(capacity: f64, refill: f64) -> Limits {
        Limits::from_credits(capacity, refill)
    }

    #[test]
    fn fractional_refill_is_exact() {
        let l = limits(1.0, 0.5);
        let s = State {
            balance_micro: 0,
            updated_ms: 0,
        };
        assert_eq!(s.refilled(l, 1999).whole_credits(), 0);
        assert_eq!(s.refilled(l, 2000).whole_credits(), 1);
        assert_eq!(s.spend(l, 1), Err(Shortage::RetryAfterMs(2000)));
    }

    #[test]
    fn retry_after_rounds_up_to_the_millisecond() {
        let l = limits(10.0, 3.0);
        let s = State {
            balance_micro: 0,
            updated_ms: 0,
        };
        // One credit at 3 per second takes 333.33 ms: answer 334.
        assert_eq!(s.spend(l, 1), Err(Shortage::RetryAfterMs(334)));
        assert!(s.refilled(l, 334).spend(l, 1).is_ok());
        assert!(s.refilled(l, 333).spend(l, 1).is_err());
    }

    #[test]
    fn backwards_clock_mints_nothing() {
        let l = limits(100.0, 10.0);
        let s = State {
            balance_micro: 5 * MICRO,
            updated_ms: 1000,
        };
        let back = s.refilled(l, 0);
        assert_eq!(back, s);
        // Returning to the old time must not count the backwards step as elapsed time.
        assert_eq!(back.refilled(l, 1000), s);
    }

    #[test]
    fn never_fits_and_no_refill_are_distinct() {
        let l = limits(10.0, 0.0);
        let s = State {
            balance_micro: 0,
            updated_ms: 0,
        };
        assert_eq!(s.spend(l, 11), Err(Shortage::NeverFits));
        assert_eq!(s.spend(l, 1), Err(Shortage::NoRefill));
    }

    #[test]
    fn a_period_budget_is_full_again_at_its_boundary_and_not_before() {
        let day = Calendar::new(crate::calendar::Period::Day, "UTC").unwrap();
        let l = Limits::per_period(10.0, day);
        let noon = 12 * 3_600_000;
        let s = State::full(l, noon).spend(l, 10).unwrap();
        // Short until midnight: the retry-after is the reset.
        assert_eq!(s.spend(l, 1), Err(Shortage::RetryAfterMs(12 * 3_600_000)));
        assert_eq!(s.refilled(l, 86_400_000 - 1).whole_credits(), 0);
        assert_eq!(s.refilled(l, 86_400_000).whole_credits(), 10);
        assert_eq!(s.spend(l, 11), Err(Shortage::NeverFits));
        // Back in time: nothing.
        assert_eq!(s.refilled(l, 0), s);
    }

    proptest! {
        #[test]
        fn a_period_budget_never_grants_more_than_its_limit_in_one_period(
            limit in 0u32..1000,
            ops in proptest::collection::vec((0i64..7_200_000, 0u64..300, any::<bool>()), 1..80),
        ) {
            let hour = Calendar::new(crate::calendar::Period::Hour, "UTC").unwrap();
            let l = Limits::per_period(f64::from(limit), hour);
            let mut s = State::full(l, 0);
            let mut now = 0i64;
            let mut spent: std::collections::BTreeMap<i64, u64> = Default::default();
            let mut refunded: std::collections::BTreeMap<i64, u64> = Default::default();
            for (step, credits, refund) in ops {
                now += step;
                s = s.refilled(l, now);
                let period = now.div_euclid(3_600_000);
                if refund {
                    // Refunds return at most what was spent in the period.
                    let back = credits.min(spent.get(&period).copied().unwrap_or(0)
                        - refunded.get(&period).copied().unwrap_or(0));
                    s = s.refund(l, back);
                    *refunded.entry(period).or_default() += back;
                } else if let Ok(next) = s.spend(l, credits) {
                    s = next;
                    *spent.entry(period).or_default() += credits;
                }
                let net = spent.get(&period).copied().unwrap_or(0) - refunded.get(&period).copied().unwrap_or(0);
                prop_assert!(net <= u64::from(limit));
                prop_assert!(s.balance_micro >= 0 && s.balance_micro <= l.capacity_micro);
            }
        }

        #[test]
        fn balance_stays_within_zero_and_capacity(
            capacity in 0u32..1_000_000,
            refill_milli in 0i64..10_000_000,
            ops in proptest::collection::vec((0i64..5_000, 0u64..2_000_000, any::<bool>()), 1..60),
        ) {
            let l = Limits { capacity_micro: i64::from(capacity) * MICRO, refill_milli_per_s: refill_milli, period: None };
            let mut s = State::full(l, 0);
            let mut now = 0i64;
            for (step, credits, refund) in ops {
                now += step;
                s = s.refilled(l, now);
                let before = s;
                if refund {
                    s = s.refund(l, credits);
                    prop_assert!(s.balance_micro >= before.balance_micro);
                } else {
                    match s.spend(l, credits) {
                        Ok(next) => {
                            prop_assert_eq!(next.balance_micro, before.balance_micro - credits as i64 * MICRO);
                            s = next;
                        }
                        Err(Shortage::RetryAfterMs(ms)) => {
                            // Waiting exactly that long is enough, one millisecond less is not.
                            prop_assert!(s.refilled(l, now + ms as i64).spend(l, credits).is_ok());
                            if ms > 0 {
                                prop_assert!(s.refilled(l, now + ms as i64 - 1).spend(l, credits).is_err());
                            }
                        }
                        Err(_) => prop_assert_eq!(s, before),
                    }
                }
                prop_assert!(s.balance_micro >= 0);
                prop_assert!(s.balance_micro <= l.capacity_micro);
            }
        }
    }
}
