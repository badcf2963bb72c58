//! The fair gate in front of each model: at most `width` requests (the
//! model's slots) pass to its backend at once; the others wait here, and a
//! slot that frees goes to
//!
//! 1. an `interactive` request if any waits (`batch` work only fills slots
//!    nobody else waits for),
//! 2. of the user with the least service (weighted fair queueing: a
//!    user's service grows by a request's tokens, prompt and generated,
//!    divided by its weight, charged when the request ends, and by 1/weight
//!    on admission so that unfinished requests count too),
//! 3. that user's oldest waiting request (a user's own requests keep their
//!    order).
//!
//! A user who had nothing waiting or running starts at the service of the
//! last request admitted (the virtual time), so idling earns no credit.
//!
//! Why here and not in the engine's queue: the gate sees who sent a
//! request (the key), which the engine and a runner process never do, and
//! it works the same for the in-process engine, runner processes and
//! upstream servers. Past the gate the engine's own FIFO queue stays empty
//! but for requests that bypass the gate (embeddings, token counts).
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::keys::Priority;

/// The gates of the models, made on first use.
pub struct FairGates {
    width: usize,
    queue_limit: usize,
    gates: Mutex<HashMap<String, Arc<FairGate>>>,
}

impl FairGates {
    /// Gates of `width` slots each (the server's `--parallel`), at most
    /// `queue_limit` requests waiting at each (its `--queue-limit`).
    pub fn new(width: usize, queue_limit: usize) -> FairGates {
        FairGates {
            width: width.max(1),
            queue_limit,
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// The gate of `model` (a name the pool knows: the map stays bounded).
    pub fn gate(&self, model: &str) -> Arc<FairGate> {
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            gates
                .entry(model.to_string())
                .or_insert_with(|| Arc::new(FairGate::new(model, self.width, self.queue_limit))),
        )
    }

    /// Requests holding a slot and waiting, per model and user.
    pub fn snapshot(&self) -> Vec<(String, Vec<UserSlots>)> {
        let gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = gates
            .iter()
            .map(|(model, gate)| (model.clone(), gate.users()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One user's requests at one model now.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UserSlots {
    pub user: String,
    pub running: usize,
    pub waiting: usize,
}

/// One model's gate.
pub struct FairGate {
    model: String,
    inner: Mutex<Inner>,
}

struct Inner {
    width: usize,
    queue_limit: usize,
    waiting: usize,
    running: usize,
    /// Arrival numbers.
    next_seq: u64,
    /// Requests admitted so far, and those of them that were batch work.
    admitted: u64,
    batch_admitted: u64,
    /// The service of the user last admitted.
    virtual_time: f64,
    users: HashMap<Arc<str>, User>,
}

struct User {
    service: f64,
    weight: f64,
    running: usize,
    /// Waiting requests by priority (interactive, batch), oldest first.
    queues: [VecDeque<Waiter>; 2],
}

struct Waiter {
    seq: u64,
    arrived: Instant,
    /// What had been admitted when it arrived.
    admitted_before: u64,
    batch_admitted_before: u64,
    tx: oneshot::Sender<Permit>,
}

/// The slots are busy and the queue holds `--queue-limit` requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// How a request got its slot, for its response headers and the usage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    /// Time waiting at the gate.
    pub waited: Duration,
    /// Requests that got a slot of this model while it waited, and how many
    /// of them were batch work.
    pub started_while_waiting: u64,
    pub batch_started_while_waiting: u64,
}

/// A slot of a model, held until the response is over; dropping it gives
/// the slot to the next request.
pub struct Permit {
    gate: Arc<FairGate>,
    user: Arc<str>,
    /// Tokens the request used (prompt and generated), charged at the end.
    pub tokens: Arc<AtomicU64>,
    pub admission: Admission,
    armed: bool,
}

fn class(priority: Priority) -> usize {
    match priority {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

impl FairGate {
    pub fn new(model: &str, width: usize, queue_limit: usize) -> FairGate {
        FairGate {
            model: model.to_string(),
            inner: Mutex::new(Inner {
                width: width.max(1),
                queue_limit,
                waiting: 0,
                running: 0,
                next_seq: 0,
                admitted: 0,
                batch_admitted: 0,
                virtual_time: 0.0,
                users: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a slot for `user`'s request; [`QueueFull`] at once when
    /// the slots are busy and `queue_limit` requests wait already. Dropping
    /// the future before then leaves the queue.
    pub async fn admit(
        self: &Arc<Self>,
        user: &Arc<str>,
        weight: f64,
        priority: Priority,
    ) -> Result<Permit, QueueFull> {
        let arrived = Instant::now();
        let (seq, rx) = {
            let mut inner = self.lock();
            if inner.running >= inner.width && inner.waiting >= inner.queue_limit {
                return Err(QueueFull);
            }
            let vt = inner.virtual_time;
            let entry = inner.users.entry(Arc::clone(user)).or_insert_with(|| User {
                service: vt,
                weight,
                running: 0,
                queues: [VecDeque::new(), VecDeque::new()],
            });
            entry.weight = weight;
            if inner.running < inner.width {
                let admission = Admission {
                    waited: Duration::ZERO,
                    started_while_waiting: 0,
                    batch_started_while_waiting: 0,
                };
                inner.start(user, priority);
                self.publish(&inner);
                return Ok(self.permit(user, admission));
            }
            let (tx, rx) = oneshot::channel();
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let waiter = Waiter {
                seq,
                arrived,
                admitted_before: inner.admitted,
                batch_admitted_before: inner.batch_admitted,
                tx,
            };
            inner.users.get_mut(user).expect("entered above").queues[class(priority)]
                .push_back(waiter);
            inner.waiting += 1;
            self.publish(&inner);
            (seq, rx)
        };
        let mut leave = LeaveOnDrop {
            gate: self,
            user,
            priority,
            seq,
            admitted: false,
        };
        let permit = rx
            .await
            .expect("a waiter leaves the queue only admitted or dropped");
        leave.admitted = true;
        Ok(permit)
    }

    fn permit(self: &Arc<Self>, user: &Arc<str>, admission: Admission) -> Permit {
        Permit {
            gate: Arc::clone(self),
            user: Arc::clone(user),
            tokens: Arc::new(AtomicU64::new(0)),
            admission,
            armed: true,
        }
    }

    /// Gives freed slots to the next requests (see the module's order).
    fn dispatch(self: &Arc<Self>, inner: &mut Inner) {
        while inner.running < inner.width {
            let Some((user, priority)) = inner.next_user() else {
                break;
            };
            let waiter = inner
                .users
                .get_mut(&user)
                .and_then(|u| u.queues[class(priority)].pop_front())
                .expect("next_user names a user with a waiter");
            inner.waiting -= 1;
            let admission = Admission {
                waited: waiter.arrived.elapsed(),
                started_while_waiting: inner.admitted - waiter.admitted_before,
                batch_started_while_waiting: inner.batch_admitted - waiter.batch_admitted_before,
            };
            inner.start(&user, priority);
            if let Err(mut permit) = waiter.tx.send(self.permit(&user, admission)) {
                // Its client left as it was admitted: the slot is free again.
                permit.armed = false;
                inner.finish(&user, 0);
            }
        }
        self.publish(inner);
    }

    /// The gauges of requests waiting here.
    fn publish(&self, inner: &Inner) {
        for priority in [Priority::Interactive, Priority::Batch] {
            let waiting: usize = inner
                .users
                .values()
                .map(|u| u.queues[class(priority)].len())
                .sum();
            crate::metrics::users::fair_waiting(&self.model, priority, waiting);
        }
    }

    fn users(&self) -> Vec<UserSlots> {
        let inner = self.lock();
        let mut out: Vec<UserSlots> = inner
            .users
            .iter()
            .map(|(name, u)| UserSlots {
                user: name.to_string(),
                running: u.running,
                waiting: u.queues.iter().map(VecDeque::len).sum(),
            })
            .collect();
        out.sort_by(|a, b| a.user.cmp(&b.user));
        out
    }
}

impl Inner {
    /// The user whose oldest request of the first class with waiters goes next.
    fn next_user(&self) -> Option<(Arc<str>, Priority)> {
        for priority in [Priority::Interactive, Priority::Batch] {
            let c = class(priority);
            let best = self
                .users
                .iter()
                .filter_map(|(name, u)| u.queues[c].front().map(|w| (name, u.service, w.seq)))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)));
            if let Some((name, _, _)) = best {
                return Some((Arc::clone(name), priority));
            }
        }
        None
    }

    fn start(&mut self, user: &Arc<str>, priority: Priority) {
        self.running += 1;
        self.admitted += 1;
        if priority == Priority::Batch {
            self.batch_admitted += 1;
        }
        let u = self.users.get_mut(user).expect("a user admitted is known");
        self.virtual_time = self.virtual_time.max(u.service);
        u.service += 1.0 / u.weight;
        u.running += 1;
    }

    /// A request of `user` ended having used `tokens`.
    fn finish(&mut self, user: &Arc<str>, tokens: u64) {
        self.running -= 1;
        if let Some(u) = self.users.get_mut(user) {
            u.running -= 1;
            u.service += tokens as f64 / u.weight;
            if u.running == 0 && u.queues.iter().all(VecDeque::is_empty) {
                self.users.remove(user);
            }
        }
    }
}

/// Takes a waiter whose future was dropped out of its queue.
struct LeaveOnDrop<'a> {
    gate: &'a Arc<FairGate>,
    user: &'a Arc<str>,
    priority: Priority,
    seq: u64,
    admitted: bool,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        let mut inner = self.gate.lock();
        if let Some(u) = inner.users.get_mut(self.user) {
            let queue = &mut u.queues[class(self.priority)];
            let before = queue.len();
            queue.retain(|w| w.seq != self.seq);
            let left = before - queue.len();
            let idle = u.running == 0 && u.queues.iter().all(VecDeque::is_empty);
            inner.waiting -= left;
            if idle {
                inner.users.remove(self.user);
            }
        }
        // Admitted meanwhile: the permit in the channel frees its slot
        // when the channel goes, after this.
        self.gate.publish(&inner);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let gate = Arc::clone(&self.gate);
        let mut inner = gate.lock();
        inner.finish(&self.user, self.tokens.load(Ordering::Relaxed));
        gate.dispatch(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt as _;

    fn user(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[tokio::test]
    async fn interactive_work_goes_before_queued_batch_work() {
        let gate = Arc::new(FairGate::new("m", 2, 64));
        let batch = user("batch");
        let first = gate.admit(&batch, 1.0, Priority::Batch).await.unwrap();
        let second = gate.admit(&batch, 1.0, Priority::Batch).await.unwrap();
        let mut queued: Vec<_> = (0..5)
            .map(|_| Box::pin(gate.admit(&batch, 1.0, Priority::Batch)))
            .collect();
        for q in &mut queued {
            assert!(q.as_mut().now_or_never().is_none());
        }
        let alice = user("alice");
        let mut interactive = Box::pin(gate.admit(&alice, 1.0, Priority::Interactive));
        assert!(interactive.as_mut().now_or_never().is_none());
        drop(first);
        let permit = interactive.await.unwrap();
        assert_eq!(permit.admission.started_while_waiting, 0);
        assert_eq!(permit.admission.batch_started_while_waiting, 0);
        // The batch queue keeps its order and runs when nobody else waits.
        drop(second);
        let next = queued.remove(0).await.unwrap();
        assert_eq!(next.admission.batch_started_while_waiting, 0);
        assert_eq!(next.admission.started_while_waiting, 1);
    }

    #[tokio::test]
    async fn the_user_with_least_service_goes_first_and_weights_count() {
        let gate = Arc::new(FairGate::new("m", 1, 64));
        let (a, b) = (user("a"), user("b"));
        let running = gate.admit(&a, 1.0, Priority::Interactive).await.unwrap();
        running.tokens.store(100, Ordering::Relaxed);
        let mut a_next = Box::pin(gate.admit(&a, 1.0, Priority::Interactive));
        assert!(a_next.as_mut().now_or_never().is_none());
        let mut b_next = Box::pin(gate.admit(&b, 1.0, Priority::Interactive));
        assert!(b_next.as_mut().now_or_never().is_none());
        drop(running);
        // a has used 101, b 0 since it started waiting: b goes first.
        let b_permit = b_next.as_mut().now_or_never().expect("b admitted").unwrap();
        assert!(a_next.as_mut().now_or_never().is_none());
        drop(b_permit);
        assert!(a_next.now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_frees_its_place() {
        let gate = Arc::new(FairGate::new("m", 1, 64));
        let a = user("a");
        let running = gate.admit(&a, 1.0, Priority::Interactive).await.unwrap();
        let mut gone = Box::pin(gate.admit(&a, 1.0, Priority::Interactive));
        assert!(gone.as_mut().now_or_never().is_none());
        drop(gone);
        drop(running);
        // The slot is free: the next request passes at once.
        let again = gate.admit(&a, 1.0, Priority::Interactive).now_or_never();
        assert!(again.is_some());
        assert_eq!(gate.users().len(), 1);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let gate = Arc::new(FairGate::new("m", 1, 1));
        let a = user("a");
        let running = gate.admit(&a, 1.0, Priority::Interactive).await.unwrap();
        let mut waiting = Box::pin(gate.admit(&a, 1.0, Priority::Interactive));
        assert!(waiting.as_mut().now_or_never().is_none());
        let refused = gate.admit(&a, 1.0, Priority::Batch).now_or_never();
        assert_eq!(refused.map(|r| r.err()), Some(Some(QueueFull)));
        drop(running);
        assert!(waiting.now_or_never().is_some());
        let none_waiting = Arc::new(FairGate::new("m", 1, 0));
        let _held = none_waiting
            .admit(&a, 1.0, Priority::Interactive)
            .await
            .unwrap();
        assert!(none_waiting
            .admit(&a, 1.0, Priority::Interactive)
            .now_or_never()
            .is_some_and(|r| r.is_err()));
    }
}
