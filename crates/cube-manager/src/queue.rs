//! The controller's work queue: task IDs to reconcile, each at most once in the queue and
//! never reconciled twice at the same time (kube-runtime's scheduler and runner, in small).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;
use uuid::Uuid;

/// Keys waiting, keys being worked on, and keys asked for again while being worked on.
#[derive(Debug, Default)]
pub struct WorkQueue {
    /// A `std` mutex: every operation is a few set operations and never awaits.
    inner: Mutex<Inner>,
    /// Wakes the runner when a key is pushed. `notify_one` stores a permit when nobody
    /// waits, so a push between the runner's check and its wait is not lost.
    ready: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    order: VecDeque<Uuid>,
    queued: HashSet<Uuid>,
    active: HashSet<Uuid>,
    again: HashSet<Uuid>,
}

impl WorkQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every operation leaves the sets consistent before it could panic.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Asks for `id` to be reconciled. A key already queued is not queued twice; a key being
    /// reconciled now is queued again when that reconcile ends (it may have read old state).
    pub fn push(&self, id: Uuid) {
        let mut inner = self.lock();
        if inner.active.contains(&id) {
            inner.again.insert(id);
            return;
        }
        if inner.queued.insert(id) {
            inner.order.push_back(id);
            drop(inner);
            self.ready.notify_one();
        }
    }

    /// The next key to work on, waiting for one. The caller must call [`WorkQueue::done`].
    pub async fn pop(&self) -> Uuid {
        loop {
            {
                let mut inner = self.lock();
                if let Some(id) = inner.order.pop_front() {
                    inner.queued.remove(&id);
                    inner.active.insert(id);
                    // Others may be waiting too; let the next one look.
                    if !inner.order.is_empty() {
                        self.ready.notify_one();
                    }
                    return id;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Ends the work on `id`; queues it again if it was pushed meanwhile.
    pub fn done(&self, id: Uuid) {
        let again = {
            let mut inner = self.lock();
            inner.active.remove(&id);
            inner.again.remove(&id)
        };
        if again {
            self.push(id);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_queued_once_and_never_worked_on_twice_at_once() {
        let queue = WorkQueue::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        queue.push(a);
        queue.push(b);
        queue.push(a);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.pop().await, a);
        queue.push(a); // while a is being worked on
        assert_eq!(queue.len(), 1, "a waits for its reconcile to end");
        assert_eq!(queue.pop().await, b);
        queue.done(a);
        assert_eq!(queue.pop().await, a, "queued again after done");
        queue.done(a);
        queue.done(b);
        assert_eq!(queue.len(), 0);
    }
}
