//! The writer's intake: jobs wait in one lane per tenant (jobs for no tenant share a lane),
//! and the writer takes them round robin across lanes, one job per lane per turn. A tenant
//! with many requests in flight then delays another tenant's request by at most one of its
//! own per batch, instead of by all of them: the writer is shared, its order need not be
//! first come, first served between tenants. Within a lane, jobs keep their order.
//!
//! At most `bound` jobs wait in all; past that, senders wait (asynchronously) for room.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Which lane a job waits in: its tenant, or `None` for jobs that act for no tenant.
pub type Lane = Option<String>;

/// The queue between the connections (senders) and the one writer (receiver).
pub struct Intake<T> {
    lanes: Mutex<Lanes<T>>,
    /// Signalled when a job arrives while the writer waits, or when the last sender leaves.
    arrived: Condvar,
    /// Free places; a sender takes one per job and the writer gives them back.
    room: Semaphore,
}

struct Lanes<T> {
    waiting: HashMap<Lane, VecDeque<T>>,
    /// The lanes with jobs, in turn order.
    turns: VecDeque<Lane>,
    senders: usize,
    writer_waits: bool,
    /// Set by [`Intake::wake`]: the receiver's next wait ends at once.
    woken: bool,
}

/// Sending was refused: the receiver is gone.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

impl<T> Intake<T> {
    /// An intake with one sender registered (see [`Intake::add_sender`]).
    pub fn new(bound: usize) -> Self {
        Intake {
            lanes: Mutex::new(Lanes {
                waiting: HashMap::new(),
                turns: VecDeque::new(),
                senders: 1,
                writer_waits: false,
                woken: false,
            }),
            arrived: Condvar::new(),
            room: Semaphore::new(bound.max(1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lanes<T>> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a job in its lane once there is room.
    pub async fn send(&self, lane: Lane, job: T) -> Result<(), Closed> {
        self.room.acquire().await.map_err(|_| Closed)?.forget();
        let mut lanes = self.lock();
        match lanes.waiting.get_mut(&lane) {
            Some(queue) => queue.push_back(job),
            None => {
                lanes.waiting.insert(lane.clone(), VecDeque::from([job]));
                lanes.turns.push_back(lane);
            }
        }
        // Waking costs a system call: only when the writer sleeps.
        if lanes.writer_waits {
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Waits (at most `idle`) for jobs and takes up to `most`, one per lane per turn: none
    /// when `idle` passed first, `None` once every sender is gone and nothing waits.
    pub fn take(&self, most: usize, idle: Duration) -> Option<Vec<T>> {
        let mut lanes = self.lock();
        let until = Instant::now() + idle;
        while lanes.turns.is_empty() {
            if lanes.senders == 0 {
                return None;
            }
            if std::mem::take(&mut lanes.woken) {
                return Some(Vec::new());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Some(Vec::new());
            }
            lanes.writer_waits = true;
            lanes = self
                .arrived
                .wait_timeout(lanes, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            lanes.writer_waits = false;
        }
        let mut taken = Vec::with_capacity(most.min(64));
        while taken.len() < most {
            let Some(lane) = lanes.turns.pop_front() else {
                break;
            };
            let queue = lanes
                .waiting
                .get_mut(&lane)
                .expect("a lane in turn has jobs");
            taken.extend(queue.pop_front());
            if queue.is_empty() {
                lanes.waiting.remove(&lane);
            } else {
                lanes.turns.push_back(lane);
            }
        }
        drop(lanes);
        self.room.add_permits(taken.len());
        Some(taken)
    }

    /// Ends the receiver's wait at once (with no jobs), or its next one: something it
    /// keeps besides the intake needs a look (a waiting call's caller left).
    pub fn wake(&self) {
        self.lock().woken = true;
        self.arrived.notify_one();
    }

    /// One more sender: the receiver keeps waiting until every sender has left.
    pub fn add_sender(&self) {
        self.lock().senders += 1;
    }

    /// A sender is gone; the last one wakes the writer so that it can finish.
    pub fn remove_sender(&self) {
        let mut lanes = self.lock();
        lanes.senders -= 1;
        if lanes.senders == 0 {
            self.arrived.notify_one();
        }
    }

    /// Refuses every sender from now on and drops the jobs still waiting (the receiver
    /// stopped): whoever waits for their answers learns that none will come.
    pub fn close(&self) {
        self.room.close();
        let mut lanes = self.lock();
        lanes.turns.clear();
        let dropped = std::mem::take(&mut lanes.waiting);
        drop(lanes);
        drop(dropped);
    }

    /// Whether [`Intake::close`] was called (the receiver stopped).
    pub fn is_closed(&self) -> bool {
        self.room.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const LONG: Duration = Duration::from_secs(600);

    fn lane(t: &str) -> Lane {
        Some(t.to_string())
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_busy_tenant_delays_another_by_one_job_per_turn() {
        let intake = Intake::new(1000);
        block_on(async {
            for i in 0..100 {
                intake.send(lane("busy"), ("busy", i)).await.unwrap();
            }
            intake.send(lane("quiet"), ("quiet", 0)).await.unwrap();
            intake.send(None, ("none", 0)).await.unwrap();
            intake.send(lane("quiet"), ("quiet", 1)).await.unwrap();
        });
        let first = intake.take(4, LONG).unwrap();
        assert_eq!(
            first,
            [("busy", 0), ("quiet", 0), ("none", 0), ("busy", 1)],
            "one job per lane per turn, lanes in the order they got work"
        );
        let second = intake.take(3, LONG).unwrap();
        assert_eq!(second, [("quiet", 1), ("busy", 2), ("busy", 3)]);
        // The rest of the busy lane, in its own order.
        let rest = intake.take(1000, LONG).unwrap();
        assert_eq!(rest, (4..100).map(|i| ("busy", i)).collect::<Vec<_>>());
    }

    #[test]
    fn senders_wait_for_room_and_the_receiver_for_senders() {
        let intake = Arc::new(Intake::new(2));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            intake.send(lane("a"), 1).await.unwrap();
            intake.send(lane("a"), 2).await.unwrap();
            let third = intake.send(lane("a"), 3);
            let waited = tokio::time::timeout(std::time::Duration::from_millis(50), third).await;
            assert!(
                waited.is_err(),
                "a third job found room in an intake of two"
            );
        });
        assert_eq!(intake.take(10, LONG).unwrap(), [1, 2]);
        rt.block_on(intake.send(lane("a"), 3)).unwrap();
        // The receiver blocks while a sender remains; the last sender leaving ends it.
        let receiver = {
            let intake = intake.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(jobs) = intake.take(10, LONG) {
                    got.extend(jobs);
                }
                got
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        rt.block_on(intake.send(None, 4)).unwrap();
        intake.remove_sender();
        assert_eq!(receiver.join().unwrap(), [3, 4]);
        rt.block_on(intake.send(None, 5)).unwrap();
        intake.close();
        assert_eq!(rt.block_on(intake.send(None, 6)), Err(Closed));
        assert_eq!(
            intake.take(10, LONG),
            None,
            "closing dropped the job left waiting"
        );
    }

    #[test]
    fn an_idle_wait_ends_with_nothing_taken() {
        let intake: Intake<u32> = Intake::new(4);
        assert_eq!(intake.take(10, Duration::from_millis(20)), Some(Vec::new()));
        intake.remove_sender();
        assert_eq!(intake.take(10, Duration::from_millis(20)), None);
    }
}
