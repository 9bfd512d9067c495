//! What the orchestration tells the outside: lines for replay's timeline
//! or serve's log, and what a user of a workload should learn (serve
//! publishes those as Kubernetes Events). One vocabulary, so a scenario
//! shows what serve reports.

use serde_json::Value;

/// Why a user is told: an Event's reason, type and action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A source changed and the workload now runs its new snapshot.
    ConfigRolledOut,
    /// renew-duration passed: the workload was re-admitted.
    ConfigRenewed,
    /// A watch rollout was not applied: a rollback (or the snapshot's
    /// loss) came first.
    RolloutDropped,
    /// A watch rollout waits for the workload's rollout window.
    RolloutHeld,
    /// A watched change waits for a person: announced in notify mode, or
    /// awaiting approval.
    RolloutPending,
    /// A deferred effect failed past its retries.
    EffectFailed,
    /// An object carries config-snapshot's label without being a snapshot
    /// it made: left alone (docs/security.md).
    Unproven,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::ConfigRolledOut => "ConfigRolledOut",
            Reason::ConfigRenewed => "ConfigRenewed",
            Reason::RolloutDropped => "RolloutDropped",
            Reason::RolloutHeld => "RolloutHeld",
            Reason::RolloutPending => "RolloutPending",
            Reason::EffectFailed => "EffectFailed",
            Reason::Unproven => "UnprovenSnapshot",
        }
    }

    pub fn warning(self) -> bool {
        matches!(self, Reason::EffectFailed | Reason::Unproven)
    }

    pub fn action(self) -> &'static str {
        match self {
            Reason::ConfigRolledOut => "Rollout",
            Reason::ConfigRenewed => "Renew",
            Reason::RolloutDropped => "Drop",
            Reason::RolloutHeld => "Hold",
            Reason::RolloutPending => "Pend",
            Reason::EffectFailed => "GiveUp",
            Reason::Unproven => "Ignore",
        }
    }
}

pub trait Observer: Send + Sync {
    /// A line about what the host did.
    fn note(&self, line: String);
    /// Something a user of `object` should be told.
    fn tell(&self, object: &Value, reason: Reason, message: String);
    /// A revision became an owner of a snapshot (counted by serve).
    fn adopted(&self, line: String) {
        self.note(line)
    }
}

/// An observer that keeps nothing: for benchmarks and tests that look at
/// the cluster, not the report.
pub struct Silent;

impl Observer for Silent {
    fn note(&self, _: String) {}
    fn tell(&self, _: &Value, _: Reason, _: String) {}
}
