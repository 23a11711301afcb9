//! Simulated callers that wait (`callers.max_wait_ms`): a refusal they may wait for puts
//! the call in the engine's waiting room, which is tried again after each batch that ended a
//! call and at its give-up and refill times, as a writer shard tries its room.

use super::{Event, Sim, Then};
use crate::engine::{frees_at, given_up, waiter_for, waiting_bounds, waits_for, Decision};
use crate::store::Store;

impl<S: Store> Sim<'_, S> {
    /// Lets refused call `op` wait, or refuses it as the room says (its deadline cannot
    /// fit, or the room is full).
    pub(super) fn wait(&mut self, op: u32, now: i64, last: Decision) {
        let config = self.engine.config();
        let request = self.request(op);
        let max_wait = self.callers[self.arrival(op).tenant]
            .max_wait_ms
            .unwrap_or(0);
        let deadline = request.deadline_ms;
        let refused = match waiter_for(&config, &request, last, (now, deadline), max_wait, op) {
            Ok(w) => {
                let (give_up, retry_at) = (w.give_up_ms, w.retry_at_ms);
                let (per_tenant, total) = waiting_bounds(&config, &request.tenant, 1);
                match self.room.enter(w, per_tenant, total) {
                    Ok(_) => {
                        self.push(give_up, Event::Wake);
                        if let Some(at) = retry_at {
                            self.push(at, Event::Wake);
                        }
                        return;
                    }
                    Err(_) => Decision::rejected(crate::reason::Reason::QueueFull, None),
                }
            }
            Err((_, d)) => d,
        };
        self.refused(op, now, &refused);
    }

    /// Tries the waiting calls: those whose time came are refused, the others tried in the
    /// room's order (every tenant's first when a call ended), rounds while some get in.
    pub(super) fn serve_waiting(&mut self, now: i64) -> Result<(), String> {
        for w in self.room.due(now) {
            let (d, _) = given_up(&w, now);
            self.refused(w.payload, now, &d);
        }
        loop {
            let ids = self.room.candidates(now, usize::MAX, self.freed);
            self.freed = false;
            if ids.is_empty() {
                return Ok(());
            }
            for id in ids {
                let Some(op) = self.room.get_mut(id).map(|w| w.payload) else {
                    continue;
                };
                let ticket = self.pending.admit(self.request(op), now);
                self.thens.push(Then::Retried(id, op, ticket));
            }
            self.let_in = 0;
            self.flush(now)?;
            if self.let_in == 0 {
                return Ok(());
            }
        }
    }

    /// A waiting call's answer: it waits on, or leaves the room with it.
    pub(super) fn retried(&mut self, id: u64, op: u32, now: i64, d: Decision) {
        if waits_for(&d) {
            if let Some(w) = self.room.get_mut(id) {
                w.retry_at_ms = frees_at(&d, now);
                w.last = d;
                if let Some(at) = w.retry_at_ms {
                    self.push(at, Event::Wake);
                }
            }
            return;
        }
        if let Some(w) = self.room.take(id) {
            if d.authorises_call() {
                self.room
                    .admitted(&w, d.reserved_tokens.unwrap_or(w.tokens));
                self.let_in += 1;
            }
        }
        self.admitted(op, now, d);
    }
}
