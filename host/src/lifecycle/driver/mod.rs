//! Carrying out deferred effects, once for both hosts: read what an effect
//! is judged against, ask [`super::verdict`], write, and say what comes
//! next. `replay` and `serve` differ only in how they schedule (replay's
//! clock stands still between steps, serve's queue has workers and
//! backoff); what an attempt means, when an effect is over, what is then
//! collected and what users are told is decided here.

use config_snapshot_policy::host::host_error::HostError;
use config_snapshot_policy::model::keys;

use serde_json::Value;

use super::budget::Budget;
use super::effect::Effect;
use super::in_flight::InFlight;
use super::observe::{Observer, Reason};
use super::verdict::{Hold, PatchError, Rules};
use crate::cluster::proof::proven::Proven;
use crate::cluster::{self, ApiError, Cluster, Key, Selector};

mod collect;
mod owners;
mod retarget;

/// The most often a source is swept after its new snapshots (seconds).
pub(crate) const SWEEP_EVERY_SECS: i64 = 60;

/// What one run of an effect came to.
#[derive(Debug)]
pub enum Attempt {
    Done,
    /// Nothing to do any more (superseded, a rollback came first, target
    /// gone): not retried. `collect`: the snapshot made for it, deleted if
    /// nothing else uses it.
    Dropped {
        why: String,
        collect: Option<Key>,
    },
    /// A precondition does not hold yet (owner not created, source change
    /// not persisted): look again; past the host's patience it was
    /// superseded or never persisted, and is dropped.
    Wait(String),
    /// A read or write failed: try again; past the host's patience it has
    /// failed.
    Retry(Retry),
    /// Held back until this time (the cluster's clock), by `Hold`.
    Later(i64, Hold),
}

/// Why an attempt is tried again: a failure the next attempt may not meet.
/// Past the host's patience it is what the `EffectFailed` Event says.
#[derive(Debug, thiserror::Error)]
pub enum Retry {
    /// A read or a write of the cluster failed.
    #[error("{0}")]
    Cluster(#[from] ApiError),
    /// One of a watch rollout's preparatory writes did not land.
    #[error("{0}")]
    Write(#[from] WriteFailed),
    /// The workload moved on between its read and its patch.
    #[error("conflict: {0}")]
    Conflict(ApiError),
    /// The workload's patch was refused.
    #[error("patching {who}: {source}")]
    Patch { who: String, source: ApiError },
    /// The snapshot could not be made.
    #[error("creating {snapshot}: {source}")]
    Create { snapshot: String, source: ApiError },
    /// The snapshot was there when the create was refused, and gone when
    /// it was read.
    #[error("{0} came and went")]
    CameAndWent(String),
    /// The workload or its source went between the read and the verdict.
    #[error("the workload or its source went while it was judged")]
    WentWhileJudged,
    /// The write budget has no room for the snapshot now.
    #[error("{}", .0.message)]
    Budget(HostError),
    /// The patch does not apply to the workload as read.
    #[error("{0}")]
    Ops(#[from] PatchError),
}

impl Retry {
    /// The same failure with every API server's message left out, its
    /// status in its place: what the `EffectFailed` Event says of it. A
    /// write is denied by admission as well as by the API server, and
    /// another webhook or policy may quote in its message the object it
    /// denied (docs/security.md). serve's log keeps the whole failure.
    pub(crate) fn told(self) -> Retry {
        match self {
            Retry::Cluster(e) => Retry::Cluster(e.without_message()),
            Retry::Write(w) => Retry::Write(w.told()),
            Retry::Conflict(e) => Retry::Conflict(e.without_message()),
            Retry::Patch { who, source } => Retry::Patch {
                who,
                source: source.without_message(),
            },
            Retry::Create { snapshot, source } => Retry::Create {
                snapshot,
                source: source.without_message(),
            },
            Retry::CameAndWent(_) | Retry::WentWhileJudged | Retry::Budget(_) | Retry::Ops(_) => self,
        }
    }
}

/// Why one of a watch rollout's preparatory writes did not land: it is
/// retried ([`Retry::Write`]).
#[derive(Debug, thiserror::Error)]
pub enum WriteFailed {
    /// The held change could not be recorded on its workload.
    #[error("recording the pending change on {who}: {source}")]
    Pending { who: String, source: ApiError },
    /// The snapshot could not be anchored in its namespace.
    #[error("anchoring {snapshot}: {source}")]
    Anchor { snapshot: String, source: ApiError },
    /// The snapshot (or its namespace) went before it could be anchored.
    #[error("{0} is gone")]
    Gone(String),
    /// Every write was refused for a version that had moved on.
    #[error("{0} kept changing while it was anchored")]
    KeptChanging(String),
}

impl WriteFailed {
    /// The same failure without the API server's message ([`Retry::told`]).
    fn told(self) -> WriteFailed {
        match self {
            WriteFailed::Pending { who, source } => WriteFailed::Pending {
                who,
                source: source.without_message(),
            },
            WriteFailed::Anchor { snapshot, source } => WriteFailed::Anchor {
                snapshot,
                source: source.without_message(),
            },
            WriteFailed::Gone(_) | WriteFailed::KeptChanging(_) => self,
        }
    }
}

/// What the host's scheduler does with the effect next.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Over: how it ended, for metrics.
    Over(Ending),
    /// Held until this time (unix seconds), by `Hold`.
    Park(i64, Hold),
    /// Look again later (with backoff).
    Again,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Done,
    Dropped,
    Failed,
}

impl Ending {
    pub fn label(self) -> &'static str {
        match self {
            Ending::Done => "done",
            Ending::Dropped => "dropped",
            Ending::Failed => "failed",
        }
    }
}

/// Everything carrying out an effect needs.
pub struct Driver<'a> {
    /// The cluster as the host acts on it: an object carrying our label
    /// without proof is seen without it ([`Proven`]).
    pub cluster: Proven<&'a dyn Cluster>,
    pub rules: &'a Rules,
    pub in_flight: &'a InFlight,
    pub observer: &'a dyn Observer,
    /// What a watch rollout's snapshot is taken from (serve's; replay has
    /// none).
    pub budget: Option<&'a Budget>,
}

impl<'a> Driver<'a> {
    pub fn new(
        cluster: &'a dyn Cluster,
        rules: &'a Rules,
        in_flight: &'a InFlight,
        observer: &'a dyn Observer,
    ) -> Self {
        Driver {
            cluster: Proven::new(cluster, rules.prover.clone()),
            rules,
            in_flight,
            observer,
            budget: None,
        }
    }

    /// The same driver, its snapshots counted against `budget`.
    pub(crate) fn with_budget(self, budget: &'a Budget) -> Self {
        Driver {
            budget: Some(budget),
            ..self
        }
    }
}

impl Driver<'_> {
    /// Runs `effect` once and decides what comes next. `patient`: whether
    /// the host still lets it wait or retry; `attempts`: how many runs came
    /// before this one.
    pub fn step(&self, effect: &Effect, patient: bool, attempts: u32) -> Next {
        let attempt = self.run(effect);
        let label = effect.label();
        match attempt {
            Attempt::Done => self.over(effect, Ending::Done),
            Attempt::Dropped { why, collect } => {
                self.observer.note(why);
                let ending = self.over(effect, Ending::Dropped);
                if let Some(key) = collect {
                    self.collect_unused(&key);
                }
                ending
            }
            Attempt::Later(at, hold) => {
                let said = match &hold {
                    Hold::StormGuard => Some(format!("held by the storm guard until {at} (unix seconds)")),
                    // Told once, when it is recorded as pending: its looks
                    // every few seconds say nothing new.
                    Hold::Window(_) | Hold::Notify | Hold::Approval { .. } | Hold::Settle { .. } => None,
                };
                if let Some(said) = said {
                    self.observer.note(format!("{} {said}", effect.describe()));
                }
                Next::Park(at, hold)
            }
            Attempt::Wait(_) | Attempt::Retry(_) if patient => Next::Again,
            Attempt::Wait(why) => {
                self.observer
                    .note(format!("{} dropped after waiting: {why}", effect.describe()));
                self.give_up(effect, Ending::Dropped)
            }
            Attempt::Retry(why) => {
                let gave_up = format!("gave up on {label} after {} attempts", attempts + 1);
                // The whole failure for the log; for the Event, what it is
                // without the API server's words ([`Retry::told`]).
                self.observer.note(format!("{} {gave_up}: {why}", effect.describe()));
                let (kind, ns, name) = effect.subject();
                if let Ok(Some(subject)) = self.cluster.get_fresh(&kind, &ns, &name) {
                    self.observer
                        .tell(&subject, Reason::EffectFailed, format!("{gave_up}: {}", why.told()));
                }
                self.give_up(effect, Ending::Failed)
            }
        }
    }

    fn over(&self, effect: &Effect, ending: Ending) -> Next {
        self.in_flight.end(effect);
        Next::Over(ending)
    }

    /// Its source change never landed (or landed and went): the snapshot
    /// made for it is garbage, unless something uses it.
    fn give_up(&self, effect: &Effect, ending: Ending) -> Next {
        let next = self.over(effect, ending);
        if let Some(key) = effect.target() {
            self.collect_unused(&key);
        }
        next
    }

    pub fn run(&self, effect: &Effect) -> Attempt {
        match effect {
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
                stored_as,
            } => self.adopt(namespace, owner_kind, owner_name, snapshots, stored_as.as_ref()),
            Effect::Patch(intent) => self.patch(intent),
            Effect::Sweep {
                namespace,
                source,
                keep,
            } => self.sweep_source(namespace, source, keep),
        }
    }

    /// A read from the cache, or the API server when the cache does not
    /// have it yet (an object made a moment ago).
    fn read(&self, kind: &str, ns: &str, name: &str) -> cluster::Result<Option<Value>> {
        match self.cluster.get(kind, ns, name)? {
            Some(found) => Ok(Some(found)),
            None => self.cluster.get_fresh(kind, ns, name),
        }
    }

    /// The snapshots of a namespace, recognised the one way both hosts
    /// recognise them.
    pub fn snapshots(&self, ns: &str) -> cluster::Result<Vec<Value>> {
        let mut out = Vec::new();
        for kind in ["ConfigMap", "Secret"] {
            self.cluster.list(kind, Some(ns), &Selector::managed(), &mut |o| {
                if keys::is_snapshot(o) {
                    out.push(o.clone())
                }
            })?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 9 of eff3694's review: the `EffectFailed` Event relayed the
    /// API server's message, which another admission policy fills as it
    /// likes, with the object it denied among it. What the Event says of a
    /// failure names what failed and the status, no word of the server's.
    #[test]
    fn an_event_says_a_failure_without_the_api_servers_words() {
        let quoted = "admission webhook \"audit\" denied the request: password=hunter2".to_string();
        let failures = [
            Retry::Cluster(ApiError::Unavailable(quoted.clone())),
            Retry::Conflict(ApiError::Conflict(quoted.clone())),
            Retry::Patch {
                who: "deployment/web".into(),
                source: ApiError::Forbidden(quoted.clone()),
            },
            Retry::Create {
                snapshot: "db-k-1".into(),
                source: ApiError::Invalid(quoted.clone()),
            },
            Retry::Write(WriteFailed::Pending {
                who: "deployment/web".into(),
                source: ApiError::Forbidden(quoted.clone()),
            }),
            Retry::Write(WriteFailed::Anchor {
                snapshot: "db-k-1".into(),
                source: ApiError::Timeout(quoted.clone()),
            }),
        ];
        for failure in failures {
            let whole = failure.to_string();
            assert!(whole.contains("hunter2"), "the log keeps it: {whole}");
            let told = failure.told().to_string();
            assert!(!told.contains("hunter2") && !told.contains("denied"), "{told}");
            assert!(told.chars().any(|c| c.is_ascii_digit()), "its status: {told}");
        }
        let told = Retry::Patch {
            who: "deployment/web".into(),
            source: ApiError::Forbidden(quoted),
        }
        .told()
        .to_string();
        assert_eq!(told, "patching deployment/web: 403 Forbidden");
    }
}
