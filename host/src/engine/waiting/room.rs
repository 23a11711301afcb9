//! The waiting room's bookkeeping: each band's waiting calls by tenant in arrival order,
//! the fair-share counters, the calls in flight per tenant, and the give-up times. Pure:
//! it holds no lock, runs no thread and reads no clock; time is an argument.
//!
//! **Order.** Bands first (`critical`, `standard`, `sheddable`); within a band, the tenant
//! with the fewest calls in flight for its weight goes first (what waiting calls contend
//! for is most often slots: a tenant below its share of them is served before one above
//! it, so a light tenant beside a heavy one keeps its max-min share); among tenants with as
//! many, the one with the smallest virtual token counter (VTC): serving a call adds its
//! reserved tokens over the tenant's weight to the tenant's counter. A tenant that starts
//! waiting with no call in flight (idle) has its counter lifted to the smallest counter of
//! those already waiting (or to the band's virtual time, the counter of the last call
//! served, when none is), so being idle banks no credit. Within a tenant, arrival order.
//! Every tenant's first waiter is a candidate, so a head that does not fit does not hold
//! the others back (work-conserving), and is not charged for being passed.

use super::{Full, Waiter};
use crate::engine::Decision;
use crate::model::Priority;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// A band's place in [`Priority::BANDS`], the order bands are served in.
fn band_index(p: Priority) -> usize {
    match p {
        Priority::Critical => 0,
        Priority::Standard => 1,
        Priority::Sheddable => 2,
    }
}

/// One band's waiting calls and fair-share counters.
#[derive(Debug)]
struct Band<T> {
    /// Each tenant's waiting calls, in arrival order.
    queues: BTreeMap<String, VecDeque<Waiter<T>>>,
    /// Each tenant's virtual token counter.
    counters: HashMap<String, f64>,
    /// The counter of the last call served: where a tenant with no waiting company starts.
    virtual_time: f64,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Band {
            queues: BTreeMap::new(),
            counters: HashMap::new(),
            virtual_time: 0.0,
        }
    }
}

/// The waiting calls of one owner, in fair order.
#[derive(Debug)]
pub struct WaitingRoom<T> {
    bands: [Band<T>; 3],
    /// Where each waiter is: its band and tenant.
    index: HashMap<u64, (usize, String)>,
    /// Give-up times, soonest first.
    give_ups: BTreeSet<(i64, u64)>,
    /// Waiters by model, for the no-passing rule.
    models: HashMap<Option<String>, [usize; 3]>,
    /// Calls in flight per tenant, as its owner saw them start and end.
    in_flight: HashMap<String, u32>,
    next_id: u64,
}

impl<T> Default for WaitingRoom<T> {
    fn default() -> Self {
        WaitingRoom {
            bands: Default::default(),
            index: HashMap::new(),
            give_ups: BTreeSet::new(),
            models: HashMap::new(),
            in_flight: HashMap::new(),
            next_id: 1,
        }
    }
}

impl<T> WaitingRoom<T> {
    /// An empty room.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many calls wait.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// How many calls wait in each band, in [`Priority::BANDS`] order.
    pub fn by_band(&self) -> [usize; 3] {
        let mut out = [0; 3];
        for (i, b) in self.bands.iter().enumerate() {
            out[i] = b.queues.values().map(VecDeque::len).sum();
        }
        out
    }

    /// How many calls of each tenant wait.
    pub fn by_tenant(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for b in &self.bands {
            for (t, q) in &b.queues {
                *out.entry(t.clone()).or_default() += q.len();
            }
        }
        out
    }

    /// How many calls of `tenant` wait.
    pub fn of_tenant(&self, tenant: &str) -> usize {
        self.bands
            .iter()
            .filter_map(|b| b.queues.get(tenant))
            .map(VecDeque::len)
            .sum()
    }

    /// Whether a call for `model` in `band` would pass a waiting one: one of the same model
    /// waits in its band or a higher one. Such a call waits behind them instead of trying.
    pub fn would_pass(&self, model: Option<&str>, band: Priority) -> bool {
        let key = model.map(str::to_string);
        self.models
            .get(&key)
            .is_some_and(|n| n[..=band_index(band)].iter().any(|&c| c > 0))
    }

    /// The latest refusal of a call waiting for `model`: what a call held back behind it
    /// (see [`WaitingRoom::would_pass`]) is taken to wait for.
    pub fn refusal_for(&self, model: Option<&str>) -> Option<&Decision> {
        self.bands
            .iter()
            .flat_map(|b| b.queues.values())
            .flatten()
            .find(|w| w.model.as_deref() == model)
            .map(|w| &w.last)
    }

    /// Lets `w` wait (its `id` is set here), unless its tenant has `per_tenant` calls
    /// waiting or the room `total`: then it is handed back with the bound reached.
    pub fn enter(
        &mut self,
        mut w: Waiter<T>,
        per_tenant: u32,
        total: u32,
    ) -> Result<u64, (Box<Waiter<T>>, Full)> {
        if self.of_tenant(&w.tenant) >= per_tenant as usize {
            return Err((Box::new(w), Full::Tenant { bound: per_tenant }));
        }
        if self.len() >= total as usize {
            return Err((Box::new(w), Full::Total { bound: total }));
        }
        let id = self.next_id;
        self.next_id += 1;
        w.id = id;
        let b = band_index(w.band);
        let idle = !self.in_flight.contains_key(&w.tenant);
        let band = &mut self.bands[b];
        if idle && !band.queues.contains_key(&w.tenant) {
            // Idle time banks no credit: start level with those waiting, or with the last
            // one served when nobody waits.
            let floor = band
                .queues
                .keys()
                .filter_map(|t| band.counters.get(t))
                .copied()
                .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))))
                .unwrap_or(band.virtual_time);
            let c = band.counters.entry(w.tenant.clone()).or_insert(0.0);
            *c = c.max(floor);
        }
        self.index.insert(id, (b, w.tenant.clone()));
        self.give_ups.insert((w.give_up_ms, id));
        self.models.entry(w.model.clone()).or_default()[b] += 1;
        band.queues
            .entry(w.tenant.clone())
            .or_default()
            .push_back(w);
        Ok(id)
    }

    /// The calls to try now, at most `most`, in the order to try them: bands in order, and
    /// in each the first waiting call of every tenant, by counter (then name). Unless
    /// `freed` (something was released: every call may fit now), a call not to be tried
    /// before a later time is left out.
    pub fn candidates(&self, now_ms: i64, most: usize, freed: bool) -> Vec<u64> {
        let mut out = Vec::new();
        for band in &self.bands {
            let mut heads: Vec<(f64, f64, &str, u64)> = band
                .queues
                .iter()
                .filter_map(|(t, q)| {
                    let head = q.front()?;
                    let ready = freed || head.retry_at_ms.is_none_or(|at| at <= now_ms);
                    let share = f64::from(self.in_flight.get(t).copied().unwrap_or(0))
                        / f64::from(head.weight.max(1));
                    let counter = band.counters.get(t).copied().unwrap_or(0.0);
                    ready.then_some((share, counter, t.as_str(), head.id))
                })
                .collect();
            heads.sort_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(a.1.total_cmp(&b.1))
                    .then(a.2.cmp(b.2))
            });
            out.extend(heads.into_iter().map(|(_, _, _, id)| id));
            if out.len() >= most {
                out.truncate(most);
                break;
            }
        }
        out
    }

    /// The waiter `id`, to read or update in place.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Waiter<T>> {
        let (b, tenant) = self.index.get(&id)?;
        self.bands[*b]
            .queues
            .get_mut(tenant)?
            .iter_mut()
            .find(|w| w.id == id)
    }

    /// Takes waiter `id` out (served, refused, or its caller gone); `None` if it is not
    /// here. Only [`WaitingRoom::admitted`] charges its tenant.
    pub fn take(&mut self, id: u64) -> Option<Waiter<T>> {
        let (b, tenant) = self.index.remove(&id)?;
        let band = &mut self.bands[b];
        let queue = band.queues.get_mut(&tenant)?;
        let at = queue.iter().position(|w| w.id == id)?;
        let w = queue.remove(at)?;
        if queue.is_empty() {
            band.queues.remove(&tenant);
        }
        self.give_ups.remove(&(w.give_up_ms, id));
        if let Some(n) = self.models.get_mut(&w.model) {
            n[b] = n[b].saturating_sub(1);
            if n.iter().all(|&c| c == 0) {
                self.models.remove(&w.model);
            }
        }
        Some(w)
    }

    /// Charges a served call to its tenant's counter: `tokens` over its weight.
    pub fn admitted(&mut self, w: &Waiter<T>, tokens: u64) {
        let band = &mut self.bands[band_index(w.band)];
        let c = band.counters.entry(w.tenant.clone()).or_insert(0.0);
        band.virtual_time = band.virtual_time.max(*c);
        *c += tokens as f64 / f64::from(w.weight.max(1));
    }

    /// A call of `tenant` started (admitted, from the room or not).
    pub fn started(&mut self, tenant: &str) {
        match self.in_flight.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.in_flight.insert(tenant.to_string(), 1);
            }
        }
    }

    /// A call of `tenant` ended and released what it held.
    pub fn ended(&mut self, tenant: &str) {
        if let Some(n) = self.in_flight.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(tenant);
            }
        }
    }

    /// Calls of `tenant` in flight, as seen.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        self.in_flight.get(tenant).copied().unwrap_or(0)
    }

    /// Takes out every waiter.
    pub fn drain(&mut self) -> Vec<Waiter<T>> {
        let ids: Vec<u64> = self.index.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.take(id)).collect()
    }

    /// Takes out every waiter whose give-up time has come by `now_ms`.
    pub fn due(&mut self, now_ms: i64) -> Vec<Waiter<T>> {
        let ids: Vec<u64> = self
            .give_ups
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .map(|(_, id)| *id)
            .collect();
        ids.into_iter().filter_map(|id| self.take(id)).collect()
    }

    /// The next time something is due: a give-up, or a first waiting call's retry time
    /// after `now_ms`.
    pub fn next_due(&self, now_ms: i64) -> Option<i64> {
        let give_up = self.give_ups.iter().next().map(|(at, _)| *at);
        let retry = self
            .bands
            .iter()
            .flat_map(|b| b.queues.values())
            .filter_map(|q| q.front()?.retry_at_ms)
            .filter(|at| *at > now_ms)
            .min();
        match (give_up, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A tenant's counter in `band` (for tests and `inspect`).
    pub fn counter(&self, band: Priority, tenant: &str) -> f64 {
        self.bands[band_index(band)]
            .counters
            .get(tenant)
            .copied()
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::waiting::{give_up_at, waits_for};
    use crate::reason::Reason;

    fn waiter(tenant: &str, band: Priority, tokens: u64, give_up_ms: i64) -> Waiter<()> {
        Waiter {
            id: 0,
            tenant: tenant.into(),
            band,
            model: Some("m".into()),
            tokens,
            weight: 1,
            entered_ms: 0,
            give_up_ms,
            by_deadline: true,
            exec_ms: 0,
            retry_at_ms: None,
            last: Decision::rejected(Reason::DeploymentCapacity, None),
            payload: (),
        }
    }

    /// Serves one call at a time, `n` times: the tenants served, in order.
    fn serve(room: &mut WaitingRoom<()>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let Some(&id) = room.candidates(0, 64, false).first() else {
                break;
            };
            let w = room.take(id).unwrap();
            room.admitted(&w, w.tokens);
            out.push(w.tenant);
        }
        out
    }

    #[test]
    fn bands_first_then_the_smallest_counter_then_arrival() {
        let mut room = WaitingRoom::new();
        for _ in 0..4 {
            room.enter(waiter("heavy", Priority::Standard, 100, 9), 64, 64)
                .unwrap();
        }
        room.enter(waiter("light", Priority::Standard, 100, 9), 64, 64)
            .unwrap();
        room.enter(waiter("light", Priority::Critical, 100, 9), 64, 64)
            .unwrap();
        // Critical first; then the two tenants alternate while both wait.
        let order = serve(&mut room, 6);
        assert_eq!(
            order,
            ["light", "heavy", "light", "heavy", "heavy", "heavy"]
        );
        assert!(room.is_empty());
    }

    #[test]
    fn weights_share_tokens_and_idleness_banks_nothing() {
        let mut room = WaitingRoom::new();
        let mut w = |t: &str, weight: u32| {
            let mut x = waiter(t, Priority::Standard, 100, 9);
            x.weight = weight;
            room.enter(x, 64, 64).unwrap();
        };
        for _ in 0..6 {
            w("a", 2);
            w("b", 1);
        }
        let order = serve(&mut room, 9);
        let a = order.iter().filter(|t| *t == "a").count();
        assert_eq!((a, order.len() - a), (6, 3), "{order:?}");
        // b, alone a long time now, starts a new wait level with a, not behind or ahead.
        serve(&mut room, 3);
        assert!(room.is_empty());
        let mut room2: WaitingRoom<()> = WaitingRoom::new();
        for _ in 0..10 {
            room2
                .enter(waiter("a", Priority::Standard, 100, 9), 64, 64)
                .unwrap();
        }
        serve(&mut room2, 10);
        // A newcomer starts at the band's virtual time, not at zero.
        room2
            .enter(waiter("b", Priority::Standard, 100, 9), 64, 64)
            .unwrap();
        assert!(room2.counter(Priority::Standard, "b") >= 900.0);
    }

    #[test]
    fn a_tenant_with_fewer_calls_in_flight_goes_first_and_is_not_lifted_while_busy() {
        let mut room = WaitingRoom::new();
        for _ in 0..3 {
            room.started("heavy");
        }
        room.started("light");
        room.enter(waiter("heavy", Priority::Standard, 100, 9), 64, 64)
            .unwrap();
        room.enter(waiter("light", Priority::Standard, 100, 9), 64, 64)
            .unwrap();
        assert_eq!(serve(&mut room, 1), ["light"]);
        // Light, with a call in flight, is not lifted to heavy's counter when it waits again.
        let mut room2: WaitingRoom<()> = WaitingRoom::new();
        room2.started("light");
        for _ in 0..3 {
            room2
                .enter(waiter("heavy", Priority::Standard, 100, 9), 64, 64)
                .unwrap();
        }
        serve(&mut room2, 2);
        room2
            .enter(waiter("light", Priority::Standard, 100, 9), 64, 64)
            .unwrap();
        assert_eq!(room2.counter(Priority::Standard, "light"), 0.0);
        room2.ended("light");
        assert_eq!(room2.in_flight("light"), 0);
        room2.ended("light");
        assert_eq!(room2.in_flight("light"), 0);
    }

    #[test]
    fn a_head_that_is_not_ready_does_not_hold_the_others_back() {
        let mut room = WaitingRoom::new();
        let mut later = waiter("a", Priority::Standard, 10, 100);
        later.retry_at_ms = Some(50);
        room.enter(later, 64, 64).unwrap();
        let b = room
            .enter(waiter("b", Priority::Standard, 10, 100), 64, 64)
            .unwrap();
        assert_eq!(room.candidates(0, 64, false), vec![b]);
        assert_eq!(
            room.candidates(0, 64, true).len(),
            2,
            "a release tries every head"
        );
        assert_eq!(room.next_due(0), Some(50));
        assert_eq!(room.candidates(50, 64, false).len(), 2);
    }

    #[test]
    fn bounds_give_ups_and_the_no_passing_rule() {
        let mut room = WaitingRoom::new();
        room.enter(waiter("a", Priority::Standard, 1, 10), 2, 3)
            .unwrap();
        room.enter(waiter("a", Priority::Standard, 1, 20), 2, 3)
            .unwrap();
        let (_, full) = room
            .enter(waiter("a", Priority::Standard, 1, 30), 2, 3)
            .unwrap_err();
        assert_eq!(full, Full::Tenant { bound: 2 });
        assert!(full.message("a").contains("waiting.per_tenant 2"));
        room.enter(waiter("b", Priority::Standard, 1, 30), 2, 3)
            .unwrap();
        let (_, full) = room
            .enter(waiter("c", Priority::Standard, 1, 30), 2, 3)
            .unwrap_err();
        assert_eq!(full, Full::Total { bound: 3 });
        assert!(room.would_pass(Some("m"), Priority::Standard));
        assert!(room.would_pass(Some("m"), Priority::Sheddable));
        assert!(!room.would_pass(Some("m"), Priority::Critical));
        assert!(!room.would_pass(Some("other"), Priority::Standard));
        assert_eq!(room.next_due(0), Some(10));
        let due = room.due(20);
        assert_eq!(due.len(), 2);
        assert_eq!(room.len(), 1);
        assert_eq!(room.by_tenant().get("b"), Some(&1));
        let id = room.candidates(0, 8, false)[0];
        room.take(id).unwrap();
        assert!(!room.would_pass(Some("m"), Priority::Sheddable));
        assert!(room.is_empty());
    }

    #[test]
    fn only_shared_capacity_that_frees_itself_is_waited_for() {
        use crate::explain::Shortfall;
        let with = |reason, limit: &str| {
            Decision::rejected(reason, None).with_shortfall(Some(Shortfall {
                limit: limit.into(),
                requested: 1,
                available: 0,
                unit: crate::explain::Unit::Tokens,
                capacity: None,
                output_tokens: None,
            }))
        };
        assert!(waits_for(&Decision::rejected(
            Reason::DeploymentCapacity,
            None
        )));
        assert!(waits_for(&Decision::rejected(
            Reason::GlobalConcurrency,
            None
        )));
        assert!(waits_for(&with(Reason::ModelTokenBudget, "model.m.tokens")));
        assert!(!waits_for(&with(
            Reason::ModelTokenBudget,
            "tenant.a.model.m.tokens"
        )));
        assert!(waits_for(&with(Reason::GroupBudget, "group.g.tokens")));
        assert!(!waits_for(&with(
            Reason::GroupBudget,
            "group.g.cost_microusd"
        )));
        for own in [
            Reason::TenantRate,
            Reason::TokenBudget,
            Reason::TenantConcurrency,
            Reason::CostBudget,
            Reason::Overloaded,
        ] {
            assert!(!waits_for(&Decision::rejected(own, None)), "{own:?}");
        }
        assert_eq!(give_up_at(0, 1_000, 200, 30_000), (800, true));
        assert_eq!(give_up_at(0, 100_000, 200, 30_000), (30_000, false));
    }
}
