//! The deferred effects on their way, in one place per host: queued,
//! running, retrying or held by the storm guard. Both hosts keep one, and
//! decide from it the same things: an effect doing the same work as one on
//! its way is not queued again, and a snapshot an effect on its way will
//! make a workload reference may not be deleted meanwhile.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use config_snapshot_policy::model::source::SourceId;

use super::effect::Effect;
use crate::cluster::Key;

#[derive(Debug, Default)]
pub struct InFlight {
    effects: Mutex<Vec<Effect>>,
    /// (namespace, source) → when its last sweep was asked for (unix
    /// seconds).
    swept: Mutex<HashMap<(String, SourceId), i64>>,
}

/// Entries of [`InFlight::swept`] past which old ones are forgotten.
const SWEPT_REMEMBERED: usize = 10_000;

impl InFlight {
    fn effects(&self) -> MutexGuard<'_, Vec<Effect>> {
        // Every write is one push or one removal: a poisoned lock still
        // holds a consistent list.
        self.effects.lock().unwrap_or_else(|e| e.into_inner())
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
        self.effects().clear();
        self.swept.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Records `effect` as on its way; `false` when one doing the same work
    /// ([`Effect::same_work`]) already is, and this one need not run.
    pub fn begin(&self, effect: &Effect) -> bool {
        let mut effects = self.effects();
        if effects.iter().any(|e| e.same_work(effect)) {
            return false;
        }
        effects.push(effect.clone());
        true
    }

    /// `effect` is over, whatever came of it: its target is no longer
    /// awaited by it, and the same work may be queued again.
    pub fn end(&self, effect: &Effect) {
        let mut effects = self.effects();
        if let Some(i) = effects.iter().position(|e| e == effect) {
            effects.swap_remove(i);
        }
    }

    /// Adoptions and sweeps on their way (watch rollouts are not counted:
    /// they never wait for a place): all of them, and those of `namespace`.
    pub(crate) fn places_taken(&self, namespace: &str) -> (usize, usize) {
        let effects = self.effects();
        let placed = effects.iter().filter(|e| !matches!(e, Effect::Patch { .. }));
        let (mut all, mut mine) = (0, 0);
        for effect in placed {
            all += 1;
            mine += usize::from(effect.namespace() == namespace);
        }
        (all, mine)
    }

    /// How many effects are on their way.
    pub fn len(&self) -> usize {
        self.effects().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an effect on its way will make something reference this
    /// snapshot.
    pub fn awaits(&self, key: &Key) -> bool {
        self.effects().iter().any(|e| e.target().as_ref() == Some(key))
    }

    /// Every snapshot an effect on its way awaits.
    pub fn targets(&self) -> HashSet<Key> {
        self.effects().iter().filter_map(Effect::target).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_source_is_swept_at_most_once_an_interval_and_sweeps_of_it_coalesce() {
        use config_snapshot_policy::model::source::SourceKind;
        let (app, other) = (
            SourceId::new(SourceKind::ConfigMap, "app"),
            SourceId::new(SourceKind::ConfigMap, "other"),
        );
        let in_flight = InFlight::default();
        assert!(in_flight.sweep_due("ns", &app, 1000, 60));
        assert!(!in_flight.sweep_due("ns", &app, 1059, 60), "within the interval");
        assert!(in_flight.sweep_due("ns", &other, 1059, 60), "per source");
        assert!(in_flight.sweep_due("other-ns", &app, 1059, 60), "per namespace");
        assert!(in_flight.sweep_due("ns", &app, 1060, 60), "the interval passed");
        let sweep = |keep: &str| Effect::Sweep {
            namespace: "ns".into(),
            source: app.clone(),
            keep: keep.into(),
        };
        assert!(in_flight.begin(&sweep("app-1")));
        assert!(!in_flight.begin(&sweep("app-2")), "one sweep of a source at a time");
        in_flight.end(&sweep("app-1"));
        assert!(in_flight.is_empty());
    }

    #[test]
    fn the_same_work_is_registered_once_and_its_target_is_awaited_until_it_ends() {
        let patch = |source_version: &str| {
            let request = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                "snapshot": "app-1", "patch": [],
                "source": {"kind": "ConfigMap", "name": "app", "contentHash": "ab", "resourceVersion": source_version}});
            Effect::Patch(super::super::PatchIntent::new(
                "ns",
                serde_json::from_value(request).unwrap(),
            ))
        };
        let in_flight = InFlight::default();
        assert!(in_flight.begin(&patch("7")));
        assert!(!in_flight.begin(&patch("8")), "the same work is on its way");
        let target = ("ConfigMap".to_string(), "ns".to_string(), "app-1".to_string());
        assert!(in_flight.awaits(&target));
        in_flight.end(&patch("7"));
        assert!(!in_flight.awaits(&target) && in_flight.is_empty());
        assert!(in_flight.begin(&patch("8")), "over: may be queued again");
    }
}
