//! When each job of a batch began and was decided, and when its policy was called: the
//! times a trace shows for one request inside the writer. Read only for a batch that asks
//! (the writer asks when one of its jobs is traced), so other batches read no clocks.

use std::cell::Cell;
use std::time::Instant;

/// One job's times within its batch.
#[derive(Clone, Copy, Debug)]
pub struct JobTimes {
    /// When the job's turn in the transaction began.
    pub started: Instant,
    /// When its answer was known (the batch commits after).
    pub decided: Instant,
    /// The policy call, when the job made one.
    pub policy: Option<(Instant, Instant)>,
}

thread_local! {
    /// Whether the batch on this thread takes times.
    static TAKING: Cell<bool> = const { Cell::new(false) };
    /// The last policy call's start and end on this thread, while taking.
    static POLICY: Cell<Option<(Instant, Instant)>> = const { Cell::new(None) };
}

/// Runs the policy call `call`, noting its times when this thread's batch takes them.
pub(super) fn policy_call<T>(call: impl FnOnce() -> T) -> T {
    if !TAKING.get() {
        return call();
    }
    let started = Instant::now();
    let answer = call();
    POLICY.set(Some((started, Instant::now())));
    answer
}

/// Takes times for the jobs of one batch while it lives (on this thread).
pub(super) struct Taking {
    times: Vec<Option<JobTimes>>,
}

impl Taking {
    pub(super) fn new(jobs: usize) -> Self {
        TAKING.set(true);
        Taking {
            times: vec![None; jobs],
        }
    }

    /// Runs job `i`, noting its times (a job run again after a retry keeps its last).
    pub(super) fn job<T>(&mut self, i: usize, run: impl FnOnce() -> T) -> T {
        POLICY.set(None);
        let started = Instant::now();
        let answer = run();
        if let Some(slot) = self.times.get_mut(i) {
            *slot = Some(JobTimes {
                started,
                decided: Instant::now(),
                policy: POLICY.take(),
            });
        }
        answer
    }

    pub(super) fn into_times(mut self) -> Vec<Option<JobTimes>> {
        std::mem::take(&mut self.times)
    }
}

impl Drop for Taking {
    fn drop(&mut self) {
        TAKING.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_calls_are_timed_only_while_taking() {
        policy_call(|| ());
        assert_eq!(POLICY.get(), None);
        let mut taking = Taking::new(2);
        taking.job(1, || policy_call(|| ()));
        taking.job(0, || ());
        let times = taking.into_times();
        assert!(times[0].unwrap().policy.is_none());
        let (from, to) = times[1].unwrap().policy.unwrap();
        assert!(from <= to && times[1].unwrap().started <= from);
        assert!(!TAKING.get());
    }
}
