//! The deferred effects on their way, in one place per host: queued,
//! running, retrying or held. Both hosts keep one, and decide from it the
//! same things: an effect doing the same work as one on its way is not
//! queued again, a watch rollout of a workload to a source's newer content
//! takes the place of the one still waiting for an older content, and a
//! snapshot an effect on its way will make a workload reference may not be
//! deleted meanwhile.
//!
//! Everything here is keyed (docs/security.md, "A tenant's work stays
//! theirs"): each effect has a [`Slot`], what it works on, and a slot holds
//! at most the effect being run and the newest one waiting. A tenant who
//! edits a ConfigMap with a thousand watchers in a loop therefore keeps at
//! most two rollouts per watcher on their way, however fast they edit, and
//! no question asked of the ledger (at every admission, every effect's end,
//! every sweep) scans what other namespaces queued.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use config_snapshot_policy::host::contract::SnapshotRef;
use config_snapshot_policy::model::source::SourceId;

use super::effect::{Effect, StoredAs};
use crate::cluster::Key;

/// What an effect works on: two effects of one slot are never both waiting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Slot {
    /// A watch rollout of a workload (kind, namespace, name) for a source:
    /// only the newest content of the source can still apply.
    Patch(Key, SourceId),
    /// A sweep of a source's snapshots: one judges every version.
    Sweep(String, SourceId),
    /// An adoption, as asked: two differ in what they adopt or for which
    /// stored object.
    Adopt {
        namespace: String,
        owner_kind: String,
        owner_name: String,
        snapshots: Vec<SnapshotRef>,
        stored_as: Option<StoredAs>,
    },
}

impl Slot {
    pub fn of(effect: &Effect) -> Slot {
        match effect {
            Effect::Patch(intent) => Slot::Patch(
                (
                    intent.kind.kind().to_string(),
                    intent.namespace.clone(),
                    intent.name.clone(),
                ),
                intent.source.clone(),
            ),
            Effect::Sweep { namespace, source, .. } => Slot::Sweep(namespace.clone(), source.clone()),
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
                stored_as,
            } => Slot::Adopt {
                namespace: namespace.clone(),
                owner_kind: owner_kind.clone(),
                owner_name: owner_name.clone(),
                snapshots: snapshots.clone(),
                stored_as: stored_as.clone(),
            },
        }
    }

    pub fn namespace(&self) -> &str {
        match self {
            Slot::Patch((_, ns, _), _) | Slot::Sweep(ns, _) | Slot::Adopt { namespace: ns, .. } => ns,
        }
    }

    /// Whether it takes a place of the queue's (adoptions and sweeps):
    /// watch rollouts are bounded by their slots instead.
    fn placed(&self) -> bool {
        !matches!(self, Slot::Patch(..))
    }
}

/// What [`InFlight::begin`] made of an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begun {
    /// Nothing of its slot was on its way: the host schedules it.
    New,
    /// The same work is on its way already ([`Effect::same_work`]).
    Same,
    /// It took the place of the effect of its slot that was waiting (a
    /// watch rollout for an older content): the job already scheduled for
    /// the slot runs it, and a held one should be judged again now.
    Replaced,
}

/// One slot's effects: the one a host is running, and the newest waiting.
#[derive(Debug)]
struct Entry {
    running: Option<Effect>,
    waiting: Option<Effect>,
}

impl Entry {
    fn effects(&self) -> impl Iterator<Item = &Effect> {
        self.running.iter().chain(self.waiting.iter())
    }
}

#[derive(Debug, Default)]
struct Ledger {
    entries: HashMap<Slot, Entry>,
    /// Adoptions and sweeps on their way, per namespace, and in all.
    placed: HashMap<String, usize>,
    placed_all: usize,
    /// The snapshots effects on their way will make a workload reference,
    /// each with how many do.
    awaited: HashMap<Key, usize>,
}

impl Ledger {
    fn await_target(&mut self, effect: &Effect) {
        if let Some(target) = effect.target() {
            *self.awaited.entry(target).or_default() += 1;
        }
    }

    fn forget_target(&mut self, effect: &Effect) {
        if let Some(target) = effect.target() {
            if let Some(n) = self.awaited.get_mut(&target) {
                *n -= 1;
                if *n == 0 {
                    self.awaited.remove(&target);
                }
            }
        }
    }

    fn insert(&mut self, slot: Slot, effect: Effect) {
        if slot.placed() {
            *self.placed.entry(slot.namespace().to_string()).or_default() += 1;
            self.placed_all += 1;
        }
        self.await_target(&effect);
        self.entries.insert(
            slot,
            Entry {
                running: None,
                waiting: Some(effect),
            },
        );
    }

    fn remove(&mut self, slot: &Slot) {
        let Some(entry) = self.entries.remove(slot) else { return };
        for effect in entry.effects() {
            let effect = effect.clone();
            self.forget_target(&effect);
        }
        if slot.placed() {
            self.placed_all -= 1;
            if let Some(n) = self.placed.get_mut(slot.namespace()) {
                *n -= 1;
                if *n == 0 {
                    self.placed.remove(slot.namespace());
                }
            }
        }
    }

    /// Sets what waits in `slot`, forgetting what waited before.
    fn set_waiting(&mut self, slot: &Slot, effect: Option<Effect>) {
        let before = self.entries.get_mut(slot).and_then(|e| e.waiting.take());
        if let Some(before) = before {
            self.forget_target(&before);
        }
        if let Some(effect) = &effect {
            self.await_target(effect);
        }
        if let Some(entry) = self.entries.get_mut(slot) {
            entry.waiting = effect;
        }
    }
}

/// How many adoptions and sweeps may be on their way at once: in all, and
/// in one namespace (a quarter of all), so that one namespace's revisions
/// cannot crowd out another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Places {
    pub all: usize,
    pub per_namespace: usize,
}

impl Places {
    pub fn of(capacity: usize) -> Places {
        let all = capacity.max(1);
        Places {
            all,
            per_namespace: (all / 4).max(1),
        }
    }
}

/// Whether one more adoption or sweep of a namespace has a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    Free,
    /// Every place is taken.
    Full,
    /// The namespace holds its share.
    FullForNamespace,
}

#[derive(Debug, Default)]
pub struct InFlight {
    /// `None`: unbounded (replay, whose scheduler runs everything it is
    /// given).
    places: Option<Places>,
    ledger: Mutex<Ledger>,
    /// (namespace, source) → when its last sweep was asked for (unix
    /// seconds).
    swept: Mutex<HashMap<(String, SourceId), i64>>,
}

/// Entries of [`InFlight::swept`] past which old ones are forgotten.
const SWEPT_REMEMBERED: usize = 10_000;

impl InFlight {
    /// A ledger that holds at most `places` adoptions and sweeps.
    pub fn bounded(places: Places) -> InFlight {
        InFlight {
            places: Some(places),
            ..InFlight::default()
        }
    }

    /// Whether one more adoption or sweep of `namespace` has a place now.
    /// An admission asks before it promises its revision an adoption
    /// ([`Room::Free`] or the revision is refused, and its controller
    /// retries), and the queue asks of the adoptions and sweeps the pass
    /// derives (dropped when full: the next pass derives them again).
    pub fn room(&self, namespace: &str) -> Room {
        let Some(places) = self.places else { return Room::Free };
        let (all, mine) = self.places_taken(namespace);
        if mine >= places.per_namespace {
            Room::FullForNamespace
        } else if all >= places.all {
            Room::Full
        } else {
            Room::Free
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Every change leaves the ledger whole before it can panic: a
        // poisoned lock still holds a consistent ledger.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a new snapshot of `source` should be followed by a sweep:
    /// none was asked for in the last `every` seconds. A sweep judges
    /// versions by an age of minutes (the grace period), so sweeping a busy
    /// source at every new snapshot finds nothing sooner; it only adds work
    /// beside the admissions. Records this one.
    pub(crate) fn sweep_due(&self, namespace: &str, source: &SourceId, now: i64, every: i64) -> bool {
        let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
        if swept.len() >= SWEPT_REMEMBERED {
            swept.retain(|_, at| now - *at < every);
        }
        let slot = (namespace.to_string(), source.clone());
        if swept.get(&slot).is_some_and(|at| now - at < every) {
            return false;
        }
        swept.insert(slot, now);
        true
    }

    /// Forgets everything, as a host that restarts does: what its queue
    /// held is lost, and the periodic pass must make up for it.
    pub fn forget_all(&self) {
        *self.ledger() = Ledger::default();
        self.swept.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Records `effect` as on its way. A watch rollout of a workload for a
    /// source it has one waiting for takes that one's place: the older
    /// content can no longer apply (the source holds this one now, or will
    /// once the write that asked for it is stored), and would only be
    /// judged superseded at its next look.
    pub fn begin(&self, effect: &Effect) -> Begun {
        let slot = Slot::of(effect);
        let mut ledger = self.ledger();
        let Some(entry) = ledger.entries.get(&slot) else {
            ledger.insert(slot, effect.clone());
            return Begun::New;
        };
        let latest = entry.waiting.as_ref().or(entry.running.as_ref());
        if latest.is_some_and(|e| e.same_work(effect)) {
            return Begun::Same;
        }
        ledger.set_waiting(&slot, Some(effect.clone()));
        Begun::Replaced
    }

    /// The host starts running what waits in `slot`: the effect to run, if
    /// any still waits (it is then the slot's running one).
    pub fn take(&self, slot: &Slot) -> Option<Effect> {
        let mut ledger = self.ledger();
        let entry = ledger.entries.get_mut(slot)?;
        let effect = entry.waiting.take()?;
        // Its target stays awaited: it moves, it is not forgotten.
        if let Some(earlier) = entry.running.replace(effect.clone()) {
            ledger.forget_target(&earlier);
        }
        Some(effect)
    }

    /// The run of `effect` stopped short of its end (held, or to be tried
    /// again): it waits in its slot again, unless a newer one came while it
    /// ran. `true` when a newer one waits: run that, now.
    pub fn put_back(&self, effect: &Effect) -> bool {
        let slot = Slot::of(effect);
        let mut ledger = self.ledger();
        let Some(entry) = ledger.entries.get_mut(&slot) else {
            return false;
        };
        let ran = entry.running.take();
        if entry.waiting.is_some() {
            if let Some(ran) = ran {
                ledger.forget_target(&ran);
            }
            return true;
        }
        entry.waiting = ran;
        false
    }

    /// `effect` is over, whatever came of it: its target is no longer
    /// awaited by it, and the same work may be queued again. `true` when a
    /// newer effect of its slot came meanwhile and waits: run that.
    pub fn end(&self, effect: &Effect) -> bool {
        let slot = Slot::of(effect);
        let mut ledger = self.ledger();
        let Some(entry) = ledger.entries.get_mut(&slot) else {
            return false;
        };
        if entry.running.as_ref() == Some(effect) {
            entry.running = None;
            ledger.forget_target(effect);
        } else if entry.waiting.as_ref() == Some(effect) {
            // Ended without being taken (its host is stopping).
            ledger.set_waiting(&slot, None);
        }
        let entry = &ledger.entries[&slot];
        if entry.waiting.is_some() {
            return true;
        }
        if entry.running.is_none() {
            ledger.remove(&slot);
        }
        false
    }

    /// Whether an effect waits in `slot` to be run.
    pub fn waiting(&self, slot: &Slot) -> bool {
        self.ledger().entries.get(slot).is_some_and(|e| e.waiting.is_some())
    }

    /// Adoptions and sweeps on their way (watch rollouts are bounded by
    /// their slots, not by places): all of them, and those of `namespace`.
    pub(crate) fn places_taken(&self, namespace: &str) -> (usize, usize) {
        let ledger = self.ledger();
        (ledger.placed_all, ledger.placed.get(namespace).copied().unwrap_or(0))
    }

    /// How many slots have effects on their way.
    pub fn len(&self) -> usize {
        self.ledger().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an effect on its way will make something reference this
    /// snapshot.
    pub fn awaits(&self, key: &Key) -> bool {
        self.ledger().awaited.contains_key(key)
    }

    /// Every snapshot an effect on its way awaits.
    pub fn targets(&self) -> HashSet<Key> {
        self.ledger().awaited.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::source::SourceKind;
    use serde_json::json;

    fn app() -> SourceId {
        SourceId::new(SourceKind::ConfigMap, "app")
    }

    fn patch(workload: &str, snapshot: &str, content: &str) -> Effect {
        let request = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": workload,
            "snapshot": snapshot, "patch": [],
            "source": {"kind": "ConfigMap", "name": "app", "contentHash": content, "resourceVersion": "7"}});
        Effect::Patch(super::super::PatchIntent::new(
            "ns",
            serde_json::from_value(request).unwrap(),
        ))
    }

    fn target(snapshot: &str) -> Key {
        ("ConfigMap".to_string(), "ns".to_string(), snapshot.to_string())
    }

    #[test]
    fn a_source_is_swept_at_most_once_an_interval_and_sweeps_of_it_coalesce() {
        let other = SourceId::new(SourceKind::ConfigMap, "other");
        let in_flight = InFlight::default();
        assert!(in_flight.sweep_due("ns", &app(), 1000, 60));
        assert!(!in_flight.sweep_due("ns", &app(), 1059, 60), "within the interval");
        assert!(in_flight.sweep_due("ns", &other, 1059, 60), "per source");
        assert!(in_flight.sweep_due("other-ns", &app(), 1059, 60), "per namespace");
        assert!(in_flight.sweep_due("ns", &app(), 1060, 60), "the interval passed");
        let sweep = |keep: &str| Effect::Sweep {
            namespace: "ns".into(),
            source: app(),
            keep: keep.into(),
        };
        assert_eq!(in_flight.begin(&sweep("app-1")), Begun::New);
        assert_eq!(
            in_flight.begin(&sweep("app-2")),
            Begun::Same,
            "one sweep of a source at a time"
        );
        let taken = in_flight.take(&Slot::of(&sweep("app-1"))).unwrap();
        assert!(!in_flight.end(&taken));
        assert!(in_flight.is_empty());
        assert_eq!(in_flight.places_taken("ns"), (0, 0));
    }

    #[test]
    fn the_same_work_is_registered_once_and_its_target_is_awaited_until_it_ends() {
        let in_flight = InFlight::default();
        assert_eq!(in_flight.begin(&patch("web", "app-1", "ab")), Begun::New);
        assert_eq!(in_flight.begin(&patch("web", "app-1", "ab")), Begun::Same);
        assert!(in_flight.awaits(&target("app-1")));
        let running = in_flight.take(&Slot::of(&patch("web", "app-1", "ab"))).unwrap();
        assert!(in_flight.awaits(&target("app-1")), "running, it is still awaited");
        assert!(!in_flight.end(&running));
        assert!(!in_flight.awaits(&target("app-1")) && in_flight.is_empty());
        assert_eq!(
            in_flight.begin(&patch("web", "app-1", "ab")),
            Begun::New,
            "over: may be queued again"
        );
    }

    /// A storm of edits of one source keeps one rollout per watcher
    /// waiting, the newest, and never lets go of what the one running
    /// will make its workload reference.
    #[test]
    fn a_watch_rollout_for_newer_content_takes_the_place_of_the_one_waiting() {
        let in_flight = InFlight::default();
        assert_eq!(in_flight.begin(&patch("web", "app-1", "c1")), Begun::New);
        for i in 2..=100 {
            let newer = patch("web", &format!("app-{i}"), &format!("c{i}"));
            assert_eq!(in_flight.begin(&newer), Begun::Replaced);
        }
        assert_eq!(in_flight.len(), 1, "one slot for the workload and the source");
        assert_eq!(in_flight.targets(), HashSet::from([target("app-100")]));
        assert_eq!(
            in_flight.begin(&patch("api", "app-api", "c100")),
            Begun::New,
            "per workload"
        );
        // The newest runs; a newer one comes meanwhile: both are awaited.
        let slot = Slot::of(&patch("web", "app-1", "c1"));
        let running = in_flight.take(&slot).unwrap();
        assert_eq!(running, patch("web", "app-100", "c100"));
        assert_eq!(in_flight.begin(&patch("web", "app-101", "c101")), Begun::Replaced);
        assert!(in_flight.awaits(&target("app-100")) && in_flight.awaits(&target("app-101")));
        assert!(in_flight.end(&running), "a newer one waits: run it");
        assert!(!in_flight.awaits(&target("app-100")));
        let next = in_flight.take(&slot).unwrap();
        assert_eq!(next, patch("web", "app-101", "c101"));
        // Held: it waits again, and the next newer one replaces it.
        assert!(!in_flight.put_back(&next));
        assert_eq!(in_flight.begin(&patch("web", "app-102", "c102")), Begun::Replaced);
        assert_eq!(in_flight.targets().len(), 2, "web's newest and api's");
        assert!(!in_flight.awaits(&target("app-101")));
        let newest = in_flight.take(&slot).unwrap();
        assert!(!in_flight.end(&newest));
        let api = in_flight.take(&Slot::of(&patch("api", "x", "y"))).unwrap();
        assert!(!in_flight.end(&api));
        assert!(in_flight.is_empty() && in_flight.targets().is_empty());
    }

    #[test]
    fn a_run_held_while_a_newer_one_came_gives_way_to_it() {
        let in_flight = InFlight::default();
        in_flight.begin(&patch("web", "app-1", "c1"));
        let slot = Slot::of(&patch("web", "app-1", "c1"));
        let running = in_flight.take(&slot).unwrap();
        in_flight.begin(&patch("web", "app-2", "c2"));
        assert!(in_flight.put_back(&running), "the newer one runs instead");
        assert_eq!(in_flight.targets(), HashSet::from([target("app-2")]));
        assert_eq!(in_flight.take(&slot), Some(patch("web", "app-2", "c2")));
    }

    #[test]
    fn places_are_counted_per_namespace_without_a_scan() {
        let in_flight = InFlight::default();
        let adopt = |ns: &str, owner: &str| Effect::Adopt {
            namespace: ns.into(),
            owner_kind: "ReplicaSet".into(),
            owner_name: owner.into(),
            snapshots: vec![],
            stored_as: None,
        };
        for i in 0..3 {
            assert_eq!(in_flight.begin(&adopt("a", &format!("rs-{i}"))), Begun::New);
        }
        assert_eq!(in_flight.begin(&adopt("b", "rs-0")), Begun::New);
        assert_eq!(in_flight.begin(&adopt("b", "rs-0")), Begun::Same);
        in_flight.begin(&patch("web", "app-1", "c1"));
        assert_eq!(in_flight.places_taken("a"), (4, 3));
        assert_eq!(in_flight.places_taken("b"), (4, 1));
        let taken = in_flight.take(&Slot::of(&adopt("a", "rs-1"))).unwrap();
        in_flight.end(&taken);
        assert_eq!(in_flight.places_taken("a"), (3, 2));
    }
}
