//! The ownerReference garbage collector.

use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Value};

use crate::replay::simulator::store::key_of;
use crate::replay::simulator::Simulator;

impl Simulator {
    /// The ownerReference garbage collector, as Kubernetes runs it: an
    /// object whose owners are all gone is deleted; an object that keeps a
    /// live owner loses its references to the owners that are gone.
    /// Repeats until nothing changes (deletions cascade).
    pub(crate) fn collect_garbage(&self) {
        loop {
            let mut store = self.shared.store();
            let mut doomed = Vec::new();
            let mut pruned = Vec::new();
            for o in store.all() {
                let refs = o.owner_references();
                if refs.is_empty() {
                    continue;
                }
                let live: Vec<&Value> = refs.iter().filter(|r| store.owner_exists(r)).collect();
                if live.is_empty() {
                    doomed.push(key_of(o));
                } else if live.len() < refs.len() {
                    let mut kept = o.clone();
                    kept.set_meta("ownerReferences", json!(live));
                    pruned.push(kept);
                }
            }
            if doomed.is_empty() && pruned.is_empty() {
                return;
            }
            for o in pruned {
                store.persist(o);
            }
            drop(store);
            for (kind, ns, name) in doomed {
                self.shared.store().remove(&kind, &ns, &name);
                self.note(format!("{kind}/{name} garbage-collected"));
            }
        }
    }
}
