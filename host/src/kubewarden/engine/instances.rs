//! The engine's one accounting of its instances. The pooling allocator
//! holds `limits.instances` slots and refuses an instantiation past them;
//! so every call takes one of these first, and waits for one rather than
//! asking the pool for more than it holds. No caller, serve's webhook or
//! serve's own work, the CLI or replay, can make the engine fail for want
//! of an instance: at worst it waits for one, and each instance it waits
//! for ends by its evaluation's deadline.
//!
//! The instances are in two lanes. The kept lane holds one of them (none
//! when the engine has only one): [`Lane::Kept`] calls take only that one
//! and [`Lane::Shared`] calls only the others, so the kept one is free
//! whenever no kept call holds it, however many shared calls wait. serve
//! keeps it for its periodic pass (docs/serve.md, "The wasm pool"). Within
//! a lane, waiting calls are served first come, first served.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Which of the engine's instances a call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// All but the kept one.
    Shared,
    /// The kept one, which shared calls never take.
    Kept,
}

/// How many instances the kept lane holds, of `instances`: one, unless
/// that would leave the shared lane none.
fn kept(instances: u32) -> u32 {
    u32::from(instances > 1)
}

/// The instances, who holds them and who waits, by lane.
pub(super) struct Instances {
    lanes: Mutex<[LaneState; 2]>,
    freed: Condvar,
}

#[derive(Default)]
struct LaneState {
    /// What the lane may hold at once.
    size: u32,
    held: u32,
    /// Tickets of the calls waiting, oldest first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

/// One instance taken, given back when dropped (after the call's store,
/// which frees the pool's slot, has gone).
pub(super) struct Instance<'a> {
    instances: &'a Instances,
    lane: Lane,
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        let mut lanes = self.instances.lanes();
        let lane = &mut lanes[index(self.lane)];
        lane.held = lane.held.saturating_sub(1);
        drop(lanes);
        self.instances.freed.notify_all();
    }
}

fn index(lane: Lane) -> usize {
    match lane {
        Lane::Shared => 0,
        Lane::Kept => 1,
    }
}

impl Instances {
    /// `instances` (at least one), one of them kept when there are two or
    /// more.
    pub(super) fn new(instances: u32) -> Instances {
        let instances = instances.max(1);
        let kept = kept(instances);
        let lane = |size| LaneState {
            size,
            ..LaneState::default()
        };
        Instances {
            lanes: Mutex::new([lane(instances - kept), lane(kept)]),
            freed: Condvar::new(),
        }
    }

    fn lanes(&self) -> MutexGuard<'_, [LaneState; 2]> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An instance of `lane`: at once when the lane has one free and no
    /// call of it waits before this one, else when one is given back.
    /// Blocking, as the engine's calls are. A kept call on an engine of one
    /// instance (whose kept lane holds none) takes a shared one.
    pub(super) fn take(&self, lane: Lane) -> Instance<'_> {
        let mut lanes = self.lanes();
        let lane = if lanes[index(lane)].size == 0 {
            Lane::Shared
        } else {
            lane
        };
        let at = index(lane);
        let ticket = lanes[at].next_ticket;
        lanes[at].next_ticket += 1;
        lanes[at].waiting.push_back(ticket);
        loop {
            let state = &mut lanes[at];
            if state.waiting.front() == Some(&ticket) && state.held < state.size {
                state.waiting.pop_front();
                state.held += 1;
                let more = state.held < state.size && !state.waiting.is_empty();
                drop(lanes);
                if more {
                    // The next in line may find a free one too.
                    self.freed.notify_all();
                }
                return Instance { instances: self, lane };
            }
            lanes = self.freed.wait(lanes).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// How many of `lane`'s instances are held now.
    #[cfg(test)]
    pub(super) fn held(&self, lane: Lane) -> u32 {
        self.lanes()[index(lane)].held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_instance_is_free_while_the_shared_ones_are_all_held() {
        let instances = Instances::new(3);
        let shared: Vec<_> = (0..2).map(|_| instances.take(Lane::Shared)).collect();
        let kept = instances.take(Lane::Kept);
        assert_eq!((instances.held(Lane::Shared), instances.held(Lane::Kept)), (2, 1));
        drop((shared, kept));
        assert_eq!((instances.held(Lane::Shared), instances.held(Lane::Kept)), (0, 0));
    }

    #[test]
    fn one_instance_is_shared_by_both_lanes() {
        let instances = Instances::new(1);
        let kept = instances.take(Lane::Kept);
        assert_eq!(instances.held(Lane::Shared), 1, "no lane is kept of one instance");
        drop(kept);
    }

    #[test]
    fn a_shared_call_past_its_lane_waits_for_a_shared_one_not_the_kept_one() {
        let instances = std::sync::Arc::new(Instances::new(2));
        let first = instances.take(Lane::Shared);
        let (sent, got) = std::sync::mpsc::channel();
        let waiter = {
            let instances = instances.clone();
            std::thread::spawn(move || {
                let taken = instances.take(Lane::Shared);
                sent.send(()).unwrap();
                drop(taken);
            })
        };
        // The kept instance is free, and a shared call does not take it.
        let kept = instances.take(Lane::Kept);
        assert!(got.try_recv().is_err(), "the second shared call waits");
        drop(kept);
        drop(first);
        got.recv().unwrap();
        waiter.join().unwrap();
    }
}
