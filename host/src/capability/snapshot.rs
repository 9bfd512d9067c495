//! `create_snapshot`: the host builds the snapshot itself from what the
//! guest proposes (its source, its content, nothing else), names it, signs
//! it, and makes a snapshot that exists already outlive the new reference
//! to it (docs/design.md, "Garbage collection", Reuse and Anchors).
//! `snapshot_name`: the name a Secret's snapshot gets, keyed.

use config_snapshot_policy::host::contract::{
    CreateSnapshot, CreateSnapshots, Created, CreatedEach, ItemAnswer, Names, Owner, SnapshotName,
};
use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::host::operation::{Operation, SNAPSHOTS_PER_CALL};
use config_snapshot_policy::model::content::{snapshot_object, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::selection::is_dns_subdomain;
use config_snapshot_policy::model::source::{SourceId, SourceKind, TOKEN_TYPES};
use config_snapshot_policy::snapshot::{only_owners_collect, reusable_as_cached};
use serde_json::{json, Value};

use super::{failed, refused, Capability};
use crate::cluster::{patch_judged, ApiError, Cluster, Judged};
use crate::lifecycle::driver::SWEEP_EVERY_SECS;
use crate::lifecycle::verdict::{adopt_ops, anchor_ops, mark_ops, own_history};
use crate::lifecycle::{written_size, Effect};

/// The most current snapshots one `snapshot_name` call asks about.
const CURRENT_NAMES: usize = 16;

/// A source's name, if it is one.
fn source_name(name: &str) -> Result<&str, HostError> {
    if is_dns_subdomain(name) {
        Ok(name)
    } else {
        Err(refused(format!("refused: {name:?} is not a source's name")))
    }
}

impl Capability {
    pub(super) fn snapshot_name(&self, request: SnapshotName) -> Result<Names, HostError> {
        let kind = request.source.kind;
        let source = source_name(&request.source.name)?;
        let hash = request.content_hash;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(refused("refused: a content hash is 64 lowercase hex digits"));
        }
        let ns = &self.caller.namespace;
        let mut names = self.prover().names_for(kind, ns, source, &hash).into_iter();
        let name = names.next().unwrap_or_default();
        // The names this content had under earlier schemes (or keys) that
        // a proven snapshot of this very source carries here: what a
        // workload running one of them runs is this content, so a watch
        // need not roll it. Only those that exist: a name is no oracle.
        let mut aliases: Vec<String> = names
            .filter(|alias| {
                self.cluster
                    .get(kind.kind(), ns, alias)
                    .ok()
                    .flatten()
                    .is_some_and(|o| keys::is_snapshot(&o) && keys::snapshot_source(&o) == Some(source))
            })
            .collect();
        // What a workload runs now may be a snapshot signed by a key the
        // ring no longer has (the key was lost): not the host's to sweep,
        // adopt or reuse, but if it holds this very content, rolling the
        // workload off it would change nothing its pods read.
        for running in request.current.iter().take(CURRENT_NAMES) {
            if *running == name || aliases.contains(running) || !is_dns_subdomain(running) {
                continue;
            }
            let Ok(Some(object)) = self.cluster.raw().get(kind.kind(), ns, running) else {
                continue;
            };
            let holds = keys::is_snapshot(&object)
                && keys::snapshot_source(&object) == Some(source)
                && object["immutable"] == true
                && self.prover().holds_hash(&object, kind, &hash);
            if holds {
                aliases.push(running.clone());
            }
        }
        let revoked = self.revoked(&SourceId::new(kind, source), &hash)?;
        Ok(Names { name, aliases, revoked })
    }

    /// The snapshot object the host makes for what the guest proposes: of
    /// the proposal it takes the kind, name, namespace, content, source and
    /// the source's version, and nothing else (no owners, finalizers, other
    /// labels or annotations); the name must be the one the content gets,
    /// and a Secret's type Opaque or its source's own, never a token's.
    fn build(&self, proposed: &Value) -> Result<(SourceId, String, Content, Value), HostError> {
        let kind = proposed["kind"]
            .as_str()
            .and_then(SourceKind::from_kind)
            .ok_or_else(|| refused("refused: a snapshot is a ConfigMap or a Secret"))?;
        let name = proposed
            .meta_str("name")
            .ok_or_else(|| refused("refused: a snapshot needs a name"))?
            .to_string();
        match proposed.namespace() {
            None => {}
            Some(ns) if ns == self.caller.namespace => {}
            Some(ns) => {
                return Err(refused(format!(
                    "refused: snapshot {name} is in namespace {ns}, the request is in {}",
                    self.caller.namespace
                )))
            }
        }
        if proposed["immutable"] != true {
            return Err(refused(format!("refused: snapshot {name} must be immutable")));
        }
        let content =
            Content::from_object(kind, proposed).map_err(|e| refused(format!("refused: snapshot {name}: {e}")))?;
        let source = proposed.annotation(keys::SOURCE_NAME).unwrap_or_default();
        let source = source_name(source)?.to_string();
        let ns = &self.caller.namespace;
        let hash_said = proposed.annotation(keys::CONTENT_HASH);
        if name != self.prover().snapshot_name(ns, &source, &content)
            || (kind == SourceKind::ConfigMap && hash_said != Some(content.hash().as_str()))
        {
            return Err(refused(format!(
                "refused: snapshot {name} does not match its content hash"
            )));
        }
        self.check_stored(&source, &name, &content)?;
        let id = SourceId::new(kind, &source);
        // Whatever the guest asks: revoked content is never made, nor a
        // snapshot of it reused, again.
        if let Some(revoked) = self.revoked(&id, &content.hash())? {
            return Err(refused(format!(
                "refused: snapshot {name}: {id}'s content was {revoked} (snapshot {})",
                revoked.snapshot
            )));
        }
        let version = proposed.annotation(keys::SOURCE_RESOURCE_VERSION).unwrap_or_default();
        let version: String = version.chars().filter(char::is_ascii_digit).take(20).collect();
        let mut object = snapshot_object(&id, ns, &name, &version, &content);
        self.prover().sign(&mut object);
        Ok((id, name, content, object))
    }

    /// What serve writes comes only from what the API server stored: a
    /// snapshot holds keys of its source as stored, with their values, and
    /// (a Secret's) its type or Opaque; never one that makes the API server
    /// mint a credential into it. A source write's review carries content not
    /// stored yet (and a forged or later refused one, never): its watchers'
    /// snapshots are made once it is, by the rollout (docs/design.md,
    /// "Deferred effects").
    fn check_stored(&self, source: &str, name: &str, content: &Content) -> Result<(), HostError> {
        if self.caller.subject.is_source() {
            let kind = &self.caller.subject.kind;
            return Err(refused(format!(
                "refused: snapshot {name}: a {kind} write's content is not stored while it is reviewed; its watchers' snapshots are made once it is"
            )));
        }
        if TOKEN_TYPES.contains(&content.type_.as_str()) {
            return Err(refused(format!(
                "refused: a snapshot is never a {} Secret",
                content.type_
            )));
        }
        let stored = self
            .stored_source(content.kind, source)?
            .ok_or_else(|| refused(format!("refused: snapshot {name} of {source}, which does not exist")))?;
        let holds = Content::from_object(content.kind, &stored).is_ok_and(|whole| {
            (whole.type_ == content.type_ || content.type_ == "Opaque")
                && content.data.iter().all(|(k, v)| whole.data.get(k) == Some(v))
                && content
                    .binary_data
                    .iter()
                    .all(|(k, v)| whole.binary_data.get(k) == Some(v))
        });
        if holds {
            Ok(())
        } else {
            Err(refused(format!(
                "refused: snapshot {name} holds content {source} does not: a snapshot is made only of what the API server stores"
            )))
        }
    }

    pub(super) fn create_snapshot(&self, request: &CreateSnapshot) -> Result<Created, HostError> {
        let (source, name, content, object) = self.build(&request.object)?;
        let kind = source.kind;
        let owner = self.owner(request.owner.as_ref())?;
        let ns = self.caller.namespace.clone();
        // A new snapshot: its source's older versions are swept after the
        // admission, by the host, so that the admission does not wait for
        // the lists a sweep makes; the policy is told it need not. At most
        // once a minute per source (half the grace period, if shorter).
        let created = || {
            self.observer.note(format!("snapshot {}/{name} created", kind.kind()));
            let grace = self.rules.settings.orphan_grace_period_secs as i64;
            let every = SWEEP_EVERY_SECS.min(grace / 2);
            if self.in_flight.sweep_due(&ns, &source, self.cluster.now(), every) {
                self.stage(Effect::Sweep {
                    namespace: ns.clone(),
                    source: source.clone(),
                    keep: name.clone(),
                });
            }
            Ok(Created {
                created: true,
                sweeps: true,
            })
        };
        // A cached read first: most snapshots made are new, and most reused
        // ones are owned, and neither needs more.
        // `proven`: the copy `patch_judged` is first given was proved to be
        // this snapshot already, so its first judgement need not prove it
        // again (a digest and an HMAC, on the hot path of a shared reuse).
        // Asked before the cached read: a copy read while the watch was
        // heard, not one that was in the cache when it started to fail.
        let following = self.cluster.following(kind.kind(), &ns);
        let (existing, mut proven) = match self.cluster.get(kind.kind(), &ns, &name).map_err(failed)? {
            // Whether an unowned snapshot must be marked is decided on a
            // read as fresh as the request: a cache could show one since
            // deleted (which only the write would catch), or one since
            // marked. serve has read it ahead, beside the policy.
            // An anchored one is the sweep's to judge as well, unless the
            // cache shows it used recently enough that no sweep may have
            // judged it (`reusable_as_cached`, the rule the read-ahead
            // follows too): a snapshot shared by many workloads is then
            // reused with no request at all. Not while the cache's watch is
            // failing or listing again (`Cluster::following`): defence in
            // depth, as only a deletion by hand could escape the cached
            // word, and then only within the cache's lag, which a failing
            // watch leaves unbounded. A cached copy that does not prove to
            // be this snapshot is judged again on a fresh read: a keyring
            // rotated since the cache digested it is not a different
            // snapshot.
            Some(found)
                if following
                    && reusable_as_cached(&found, self.cluster.now(), self.rules.settings.orphan_grace_period_secs)
                    && self.same_snapshot(kind, &found, &content, &name).is_ok() =>
            {
                (Some(found), true)
            }
            Some(_) => (self.cluster.get_fresh(kind.kind(), &ns, &name).map_err(failed)?, false),
            None => match self.make(&object)? {
                Ok(()) => return created(),
                // Another replica (or a concurrent admission) created it
                // first: content addressing makes that the same snapshot,
                // if it is ours.
                Err(ApiError::AlreadyExists(_)) => {
                    (self.cluster.get_fresh(kind.kind(), &ns, &name).map_err(failed)?, false)
                }
                Err(e) => return Err(failed(e)),
            },
        };
        // A reused snapshot must outlive this admission's reference to it:
        // - unowned or anchored, it is marked used, so a sweep that judged
        //   it unused a moment ago cannot delete it (its delete carries the
        //   version it judged, which this write changes). Unless it was used
        //   recently enough that no sweep may judge it before this request
        //   is stored (`sweep::must_mark_reuse`);
        // - owned by others (revisions, maybe of another workload), it is
        //   anchored in its namespace, so the garbage collector cannot take
        //   it when those revisions go, whoever names it then.
        // Whether the write the last judgement chose anchors: said once it
        // has landed.
        let anchoring = std::cell::Cell::new(false);
        let reused = patch_judged(
            &self.cluster,
            (kind.kind(), &ns, &name),
            existing,
            |found| {
                anchoring.set(false);
                let Some(found) = found else {
                    // Gone since it was read: made anew.
                    return match self.make(&object)? {
                        Ok(()) => created().map(Judged::Done),
                        Err(e) => Err(failed(e)),
                    };
                };
                if !std::mem::take(&mut proven) {
                    self.same_snapshot(kind, &found, &content, &name)?;
                }
                let reused = Created {
                    created: false,
                    sweeps: false,
                };
                let Some((ops, anchors)) = self.keep_alive(owner.as_ref(), &found)? else {
                    return Ok(Judged::Done(reused));
                };
                anchoring.set(anchors);
                Ok(Judged::Patch {
                    ops,
                    version: found.resource_version().to_string(),
                    then: reused,
                })
            },
            failed,
        )?;
        if reused.is_some() && anchoring.get() {
            self.observer
                .note(format!("snapshot {}/{name} anchored in namespace {ns}", kind.kind()));
        }
        reused.ok_or_else(|| {
            HostError::new(
                Code::Conflict,
                format!("refused: snapshot {name} kept changing while it was reused; try again"),
            )
        })
    }

    /// The write that makes a reused snapshot (`found`) outlive this
    /// admission's reference to it, if one is needed (see
    /// [`Self::create_snapshot`]), and whether it anchors. One write at
    /// most in a shared snapshot's life, its anchor, and a mark about once
    /// a grace period: never one per workload that names it (docs/design.md,
    /// "Garbage collection", Anchors).
    fn keep_alive(&self, owner: Option<&Value>, found: &Value) -> Result<Option<(Vec<Value>, bool)>, HostError> {
        let now = self.cluster.now();
        if !only_owners_collect(found) {
            let grace = self.rules.settings.orphan_grace_period_secs;
            return Ok(mark_ops(found, now, grace).map(|ops| (ops, false)));
        }
        // Owned by others: anchored, unless the workload owns it already
        // (its own revisions' snapshot, on an update). A bare Job or Pod,
        // which owns its snapshots only once its deferred adoption runs,
        // anchors it too.
        if let Some((owner, uid)) = owner.and_then(|o| Some((o, o.uid()?))) {
            if found.owner_references().iter().any(|r| r["uid"].as_str() == Some(uid)) {
                return Ok(None);
            }
            let ns = &self.caller.namespace;
            let revision = |kind: &str, name: &str| self.cluster.get(kind, ns, name).ok().flatten();
            if own_history(found, uid, &revision) {
                return Ok(adopt_ops(owner, found).map(|ops| (ops, false)));
            }
        }
        let uid = self.namespace_uid()?;
        Ok(anchor_ops(found, &uid, now).map(|ops| (ops, true)))
    }

    /// The uid of the request's namespace, read once per request (the
    /// items of `create_snapshots` share it).
    fn namespace_uid(&self) -> Result<String, HostError> {
        let mut known = self.namespace_uid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(uid) = known.as_ref() {
            return Ok(uid.clone());
        }
        let ns = &self.caller.namespace;
        let uid = self
            .cluster
            .namespace_uid(ns)
            .map_err(failed)?
            .ok_or_else(|| HostError::new(Code::NotFound, format!("namespace {ns} not found")))?;
        *known = Some(uid.clone());
        Ok(uid)
    }

    /// `create_snapshots`: each item as `create_snapshot` (its injected
    /// faults included), one answer per item in order. Where the cluster
    /// gains by it, a few at a time on threads of their own: a workload's
    /// new snapshots cost about one API round trip, not one each.
    pub(super) fn create_snapshots(&self, request: CreateSnapshots) -> Result<CreatedEach, HostError> {
        /// Creations in flight at once, per call.
        const AT_ONCE: usize = 8;
        let items = request.items;
        if items.len() > SNAPSHOTS_PER_CALL {
            return Err(refused(format!(
                "refused: at most {SNAPSHOTS_PER_CALL} snapshots per call, not {}",
                items.len()
            )));
        }
        let one = |item: &CreateSnapshot| -> ItemAnswer {
            let fault = self
                .faults
                .as_ref()
                .and_then(|f| f.fault(Operation::CreateSnapshot.name()));
            match fault.map_or_else(|| self.create_snapshot(item), Err) {
                Ok(answer) => ItemAnswer::done(answer),
                Err(error) => ItemAnswer::failed(error),
            }
        };
        let results: Vec<ItemAnswer> = if self.cluster.concurrent_writes() {
            let mut results = Vec::with_capacity(items.len());
            for wave in items.chunks(AT_ONCE) {
                std::thread::scope(|scope| {
                    let running: Vec<_> = wave.iter().map(|item| scope.spawn(|| one(item))).collect();
                    results.extend(running.into_iter().map(|r| {
                        r.join().unwrap_or_else(|_| {
                            ItemAnswer::failed(HostError::new(Code::Unavailable, "creating the snapshot failed"))
                        })
                    }));
                });
            }
            results
        } else {
            items.iter().map(one).collect()
        };
        Ok(CreatedEach { results })
    }

    /// The workload an admission makes name the snapshot, as an owner
    /// object: a workload in the request's namespace, and if it names a
    /// uid, the live object with that uid.
    fn owner(&self, owner: Option<&Owner>) -> Result<Option<Value>, HostError> {
        let Some(owner) = owner else {
            return Ok(None);
        };
        let (kind, name) = (owner.kind.as_str(), owner.name.as_str());
        let Some(workload) = WorkloadKind::from_kind(kind).filter(|_| !name.is_empty()) else {
            return Err(refused(format!(
                "refused: a snapshot's owner must be a workload, not {kind:?}"
            )));
        };
        let uid = owner.uid.as_deref().filter(|u| !u.is_empty());
        if let Some(uid) = uid {
            let live = self.cluster.get(kind, &self.caller.namespace, name).map_err(failed)?;
            if live.as_ref().and_then(|l| l.uid()) != Some(uid) {
                return Err(refused(format!(
                    "refused: owner {kind}/{name} with uid {uid} does not exist"
                )));
            }
        }
        Ok(Some(json!({
            "apiVersion": workload.api_version(), "kind": kind,
            "metadata": {"name": name, "uid": uid},
        })))
    }
}

impl Capability {
    /// Creates `object`, if the namespace's budget allows one more.
    fn make(&self, object: &Value) -> Result<Result<(), ApiError>, HostError> {
        if let Some(budget) = &self.budget {
            budget.take(&self.caller.namespace, written_size(object))?;
        }
        Ok(self.cluster.create(object.clone()))
    }

    /// `Ok` if `existing` is this very snapshot, and ours; refused
    /// otherwise.
    fn same_snapshot(
        &self,
        kind: SourceKind,
        existing: &Value,
        content: &Content,
        name: &str,
    ) -> Result<(), HostError> {
        if self.prover().holds(existing, content) && self.prover().ours(existing) {
            return Ok(());
        }
        Err(refused(format!(
            "refused: a different {} named {name} already exists",
            kind.kind()
        )))
    }
}
