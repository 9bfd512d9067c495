//! Admissions evaluating at once, and who goes next (docs/security.md,
//! "serve's port").
//!
//! The wasm pool has a fixed number of instances, which the engine counts
//! itself: past them a call waits for one (kubewarden/engine/instances.rs),
//! whoever makes it, so no evaluation fails for want of one. The API
//! server's reviews may hold all the engine's shared ones (every instance
//! but the one kept for the pass) less the ones the judges of changed
//! sources hold; these slots share that between namespaces, and a review
//! waits for its slot here before it waits for an instance there, which a
//! judge holds for at most one evaluation. The API server is one caller
//! carrying every namespace's reviews, so a first-come queue would let one
//! namespace's burst (a tenant's dry runs in a loop) hold every slot and
//! keep every other namespace's reviews waiting behind it until the API
//! server gives up on them (and lets them through unchanged). So:
//!
//! - one namespace never holds every slot: at most all but one
//!   ([`Evaluations::new`]), so while one namespace is busy another's
//!   review finds a slot free;
//! - when slots are short, a slot that frees goes first to the oldest
//!   waiting review of a namespace holding less than a quarter of them,
//!   then to the oldest waiting review whose namespace may hold one more.
//!
//! Alone, a namespace uses all slots but one: a cluster whose load is one
//! namespace (a namespaced install) loses one of its seven slots (by
//! default), not three in four.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::shares::ChargedTo;

/// The slots, and who holds and waits for them.
pub(crate) struct Evaluations {
    slots: Mutex<Slots>,
    /// What a namespace may hold and still go before others: a quarter.
    fair: usize,
    /// What a namespace may hold at most: all but one.
    most: usize,
}

struct Slots {
    free: usize,
    held: HashMap<ChargedTo, usize>,
    /// Reviews waiting, oldest first, each with where to send its slot.
    waiting: VecDeque<(ChargedTo, oneshot::Sender<Slot>)>,
}

/// A slot, given back when dropped.
pub(crate) struct Slot {
    evaluations: Arc<Evaluations>,
    to: ChargedTo,
    /// Whether dropping it gives it back: a slot that never reached its
    /// waiter is given back by the hand that made it.
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            let mut slots = self.evaluations.slots();
            Evaluations::give_back(&mut slots, &self.to);
            self.evaluations.hand_out(&mut slots);
        }
    }
}

impl Evaluations {
    /// `slots` at once (at least one); one namespace holds at most all but
    /// one of them, and goes first while it holds less than a quarter.
    pub(crate) fn new(slots: usize) -> Arc<Evaluations> {
        let slots = slots.max(1);
        Arc::new(Evaluations {
            slots: Mutex::new(Slots {
                free: slots,
                held: HashMap::new(),
                waiting: VecDeque::new(),
            }),
            fair: (slots / 4).max(1),
            most: (slots - 1).max(1),
        })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a review charged to `to`: at once when one is free and
    /// `to` may hold one more, else when one is handed to it. `None` only
    /// if serve is dropping its slots (never while it runs).
    pub(crate) async fn take(self: &Arc<Self>, to: ChargedTo) -> Option<Slot> {
        let waiting = {
            let mut slots = self.slots();
            if slots.free > 0 && slots.held.get(&to).copied().unwrap_or(0) < self.most {
                return Some(self.hold(&mut slots, to));
            }
            let (send, receive) = oneshot::channel();
            slots.waiting.push_back((to, send));
            receive
        };
        waiting.await.ok()
    }

    fn hold(self: &Arc<Self>, slots: &mut Slots, to: ChargedTo) -> Slot {
        slots.free -= 1;
        *slots.held.entry(to.clone()).or_default() += 1;
        Slot {
            evaluations: self.clone(),
            to,
            armed: true,
        }
    }

    fn give_back(slots: &mut Slots, to: &ChargedTo) {
        slots.free += 1;
        if let Some(n) = slots.held.get_mut(to) {
            *n -= 1;
            if *n == 0 {
                slots.held.remove(to);
            }
        }
    }

    /// Hands the free slots to waiting reviews: first the oldest of a
    /// namespace under its quarter, then the oldest of one under its most.
    fn hand_out(self: &Arc<Self>, slots: &mut Slots) {
        while slots.free > 0 {
            let holds = |slots: &Slots, to: &ChargedTo| slots.held.get(to).copied().unwrap_or(0);
            let next = slots
                .waiting
                .iter()
                .position(|(to, _)| holds(slots, to) < self.fair)
                .or_else(|| slots.waiting.iter().position(|(to, _)| holds(slots, to) < self.most));
            let Some((to, send)) = next.and_then(|at| slots.waiting.remove(at)) else {
                return;
            };
            let slot = self.hold(slots, to);
            if let Err(mut unsent) = send.send(slot) {
                // Its waiter is gone: the slot is free again, given back
                // here, under the lock, not by its drop.
                unsent.armed = false;
                Evaluations::give_back(slots, &unsent.to);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    fn ns(name: &str) -> ChargedTo {
        ChargedTo::Namespace(name.to_string())
    }

    /// Finding 3, the evaluations: one namespace's burst holds all slots
    /// but one, so another namespace's review is evaluated at once; on
    /// eff3694 (one first-come semaphore) it waited behind the burst.
    #[tokio::test]
    async fn one_namespace_never_holds_every_slot() {
        let evaluations = Evaluations::new(4);
        let mut tenant = Vec::new();
        for _ in 0..3 {
            tenant.push(
                evaluations
                    .take(ns("tenant"))
                    .now_or_never()
                    .flatten()
                    .expect("a free slot"),
            );
        }
        let waiting = evaluations.take(ns("tenant"));
        tokio::pin!(waiting);
        assert!(
            waiting.as_mut().now_or_never().is_none(),
            "the last slot is not the tenant's"
        );
        let other = evaluations.take(ns("shop")).now_or_never().flatten();
        assert!(other.is_some(), "another namespace finds a slot at once");
        drop(other);
        assert!(waiting.as_mut().now_or_never().is_none(), "still all but one");
        drop(tenant.pop());
        let handed = waiting.await.expect("handed a slot once the tenant holds fewer");
        drop((tenant, handed));
        let slots = evaluations.slots();
        assert_eq!(slots.free, 4);
        assert!(slots.held.is_empty() && slots.waiting.is_empty());
    }

    /// When slots are short, a slot that frees goes to a namespace under
    /// its quarter before the namespaces holding more, whatever their
    /// place in the line.
    #[tokio::test]
    async fn a_namespace_under_its_quarter_goes_first() {
        let evaluations = Evaluations::new(8);
        let mut held = Vec::new();
        for to in ["a", "a", "a", "a", "a", "a", "b", "b"] {
            held.push(evaluations.take(ns(to)).now_or_never().flatten().unwrap());
        }
        let mut line: Vec<_> = ["a", "b", "b", "c"]
            .into_iter()
            .map(|to| Box::pin(evaluations.take(ns(to))))
            .collect();
        for waiting in &mut line {
            assert!(waiting.as_mut().now_or_never().is_none());
        }
        // A slot of a's frees: c, last in line but holding none, gets it.
        drop(held.remove(0));
        let c = line.pop().unwrap().now_or_never().flatten();
        assert!(c.is_some(), "c went first");
        // The next: a (5 of 8) and b (2 of 8) are both past their quarter;
        // the oldest waiting review whose namespace may hold one more.
        drop(held.remove(0));
        assert!(line.remove(0).now_or_never().flatten().is_some(), "a, first in line");
        drop(held);
    }

    /// A waiter that went away before its slot came does not keep it.
    #[tokio::test]
    async fn a_slot_handed_to_no_one_is_free_again() {
        let evaluations = Evaluations::new(2);
        let first = evaluations.take(ns("a")).now_or_never().flatten().unwrap();
        let second = evaluations.take(ns("b")).now_or_never().flatten().unwrap();
        let mut gone = Box::pin(evaluations.take(ns("c")));
        assert!(gone.as_mut().now_or_never().is_none());
        drop(gone);
        drop(first);
        assert_eq!(evaluations.slots().free, 1);
        assert!(evaluations.slots().waiting.is_empty());
        drop(second);
        assert_eq!(evaluations.slots().free, 2);
    }
}
