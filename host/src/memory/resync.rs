//! Replay's driver of the periodic pass (`advanceTime` ends with one), over
//! the shared decisions of [`crate::lifecycle::resync`], as serve's resync
//! runs them against the API server.

use anyhow::Result;
use serde_json::Value;

use super::{Simulator, HOST_USER};
use crate::backend::Backend;
use crate::lifecycle::resync::{bridges, missing_adoptions, orphans, renewals, watched_sources};

impl Simulator {
    pub fn resync(&mut self) -> Result<()> {
        let objects = self.objects();
        let all: Vec<&Value> = objects.iter().collect();
        for effect in missing_adoptions(&all) {
            self.note(format!("resync: {} was missing", effect.describe()));
            self.run_effect_now(&effect)?;
        }
        let objects = self.objects();
        let all: Vec<&Value> = objects.iter().collect();
        for ((kind, ns, name), ops) in bridges(&all) {
            if Backend::patch(self.shared.as_ref(), &kind, &ns, &name, ops).is_ok() {
                self.note(format!("resync: {kind}/{name}'s owners brought up to date"));
            }
        }
        for workload in renewals(&all) {
            let (kind, ns, name) = super::store::key_of(workload);
            let Some(live) = self.get(&kind, &ns, &name) else {
                continue;
            };
            let a = self.write(live.clone(), Some(live.clone()), false, HOST_USER)?;
            if a.allowed
                && self
                    .get(&kind, &ns, &name)
                    .is_some_and(|now| now["spec"]["template"] != live["spec"]["template"])
            {
                self.note(format!("renew: {kind}/{name} renewed its snapshots"));
            }
        }
        let settings = self.effect_rules.settings.clone();
        for source in watched_sources(&all, &settings) {
            let (kind, ns, name) = super::store::key_of(source);
            let Some(live) = self.get(&kind, &ns, &name) else {
                continue;
            };
            let request = self.admission_request("CREATE", &live, None, false, HOST_USER);
            let (a, _) = self.review(&request)?;
            for w in &a.warnings {
                self.note(format!("warning: {w}"));
            }
            // The source is persisted already: its effects may run.
            if let Some(uid) = request["uid"].as_str() {
                self.release(uid);
            }
        }
        self.settle()?;
        let objects = self.objects();
        let all: Vec<&Value> = objects.iter().collect();
        let awaited = self.awaited_snapshots();
        let grace = settings.orphan_grace_period_secs;
        for doomed in orphans(&all, &awaited, self.now(), grace) {
            let Some(snapshot) = self.get(&doomed.kind, &doomed.namespace, &doomed.name) else {
                continue;
            };
            if self.delete_snapshot(&snapshot, &doomed.uid, &doomed.resource_version) {
                self.note(format!(
                    "{}/{} swept: unowned, unused for {grace}s",
                    doomed.kind, doomed.name
                ));
            }
        }
        Ok(())
    }
}
