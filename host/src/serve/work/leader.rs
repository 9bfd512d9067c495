//! One replica runs the periodic pass; all of them answer admissions.
//!
//! With `--leader-elect`, replicas compete for a `coordination.k8s.io`
//! Lease through `kube-leader-election`, and only the holder runs the
//! resync and the sweep. When it dies, another takes the Lease once it has
//! gone unrenewed for `--lease-duration`. Without the flag a replica
//! leads alone (one replica, or replay).
//!
//! The crate acquires an expired Lease with a merge patch that carries no
//! resourceVersion, so two replicas racing for it can both believe they
//! won for one renewal period. That costs a duplicated pass, never a wrong
//! one: every write the pass makes is guarded (uid and resourceVersion
//! preconditions, the storm guard on the workload), see docs/serve.md,
//! "Several replicas".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};

use crate::serve::tell::metrics::Metrics;

/// Whether this replica leads, as the rest of serve asks it.
pub struct Leadership {
    leading: AtomicBool,
    metrics: Arc<Metrics>,
    /// Told when this replica comes to lead: its first pass runs then, not
    /// an interval later (what the watch of sources told while another led,
    /// or none did, is found there).
    acquired: tokio::sync::Notify,
}

impl Leadership {
    /// A replica that leads alone (no election).
    pub fn alone(metrics: Arc<Metrics>) -> Leadership {
        metrics.leader.set(1);
        Leadership {
            leading: AtomicBool::new(true),
            metrics,
            acquired: tokio::sync::Notify::new(),
        }
    }

    /// A replica that must win the Lease first.
    pub(crate) fn contender(metrics: Arc<Metrics>) -> Leadership {
        metrics.leader.set(0);
        Leadership {
            leading: AtomicBool::new(false),
            metrics,
            acquired: tokio::sync::Notify::new(),
        }
    }

    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Waits until this replica comes to lead (again).
    pub(crate) async fn acquired(&self) {
        self.acquired.notified().await;
    }

    fn set(&self, leading: bool) {
        let was = self.leading.swap(leading, Ordering::SeqCst);
        self.metrics.leader.set(i64::from(leading));
        if was != leading {
            if leading {
                self.acquired.notify_one();
                tracing::info!("leading: this replica now runs the resync and the sweep");
            } else {
                tracing::info!("following: another replica runs the resync and the sweep");
            }
        }
    }
}

/// Where and as whom to compete.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub namespace: String,
    pub lease: String,
    pub holder: String,
    pub duration: Duration,
}

/// Renews or contends every third of the lease duration, forever. An error
/// reaching the API server makes this replica a follower until it can
/// renew again: a leader that cannot prove it leads must not act as one.
pub(crate) async fn compete(client: kube::Client, election: Election, leadership: Arc<Leadership>) {
    let lock = LeaseLock::new(
        client,
        &election.namespace,
        LeaseLockParams {
            lease_name: election.lease.clone(),
            holder_id: election.holder.clone(),
            lease_ttl: election.duration,
        },
    );
    let period = (election.duration / 3).max(Duration::from_millis(200));
    loop {
        match lock.try_acquire_or_renew().await {
            Ok(LeaseLockResult::Acquired(_)) => leadership.set(true),
            Ok(LeaseLockResult::NotAcquired(_)) => leadership.set(false),
            Err(e) => {
                tracing::warn!(error = %e, lease = %election.lease, "leader election: cannot reach the Lease");
                leadership.set(false);
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// This replica's name in the Lease: the pod's name, else host and pid.
pub(crate) fn default_holder() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "serve".into());
        format!("{}-{}", host.trim(), std::process::id())
    })
}
