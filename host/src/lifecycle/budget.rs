//! How much the host may write as snapshots, per minute: a count per
//! namespace, bytes per namespace, and bytes for the whole cluster.
//! Whoever gets its reviews to the webhook (the API server for anyone who
//! may write a workload, or a forged review) cannot flood etcd with copies.
//!
//! Sizing (docs/security.md, "Sizing the budget"): etcd refuses every write
//! once its database passes its quota (`--quota-backend-bytes`, 2 GiB by
//! default), and what is written and deleted stays in its history until
//! kube-apiserver compacts it (every 5 minutes by default). The default
//! cluster budget, 32 MiB a minute, lets at most 160 MiB into one
//! compaction window, 8% of the default quota; one namespace gets a
//! quarter of it.
//!
//! A creation past the budget is refused with [`Code::TooLarge`]: an
//! admission then follows `onSnapshotFailure`, a watch rollout retries
//! with backoff and the periodic pass derives it again later.

use std::num::NonZeroU32;

use config_snapshot_policy::host::host_error::{Code, HostError};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use serde_json::Value;

/// The budget's limits, each per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Snapshots one namespace may have made (`--snapshot-rate`).
    pub count: NonZeroU32,
    /// Bytes of snapshots one namespace may have made
    /// (`--snapshot-bytes-rate`).
    pub namespace_bytes: NonZeroU32,
    /// Bytes of snapshots the whole cluster may have made
    /// (`--snapshot-bytes-rate-total`).
    pub total_bytes: NonZeroU32,
}

impl Default for Limits {
    fn default() -> Limits {
        const MIB: u32 = 1 << 20;
        Limits {
            count: NonZeroU32::new(600).expect("not zero"),
            namespace_bytes: NonZeroU32::new(8 * MIB).expect("not zero"),
            total_bytes: NonZeroU32::new(32 * MIB).expect("not zero"),
        }
    }
}

pub struct Budget {
    limits: Limits,
    count: DefaultKeyedRateLimiter<String>,
    bytes: DefaultKeyedRateLimiter<String>,
    total: DefaultDirectRateLimiter,
}

impl Budget {
    /// A budget of `limits`, all of which may be spent at once (a
    /// Deployment with many sources, a `kubectl apply` of many).
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            count: DefaultKeyedRateLimiter::keyed(Quota::per_minute(limits.count)),
            bytes: DefaultKeyedRateLimiter::keyed(Quota::per_minute(limits.namespace_bytes)),
            total: DefaultDirectRateLimiter::direct(Quota::per_minute(limits.total_bytes)),
        }
    }

    /// `per_minute` creations per namespace, and the default byte limits.
    #[cfg(test)]
    pub(crate) fn per_minute(per_minute: NonZeroU32) -> Budget {
        Budget::new(Limits {
            count: per_minute,
            ..Limits::default()
        })
    }

    /// Takes one creation of `bytes` from `namespace`'s budget and the
    /// cluster's, or says why not. A refusal by a later limit leaves what
    /// an earlier one took spent: it errs on the side of writing less.
    pub fn take(&self, namespace: &str, bytes: usize) -> Result<(), HostError> {
        // Each refusal says which limit, and that it protects etcd.
        let key = namespace.to_string();
        if self.count.check_key(&key).is_err() {
            return Err(HostError::new(
                Code::TooLarge,
                format!(
                    "refused: namespace {namespace} made {} snapshots in the last minute, its budget (--snapshot-rate)",
                    self.limits.count
                ),
            ));
        }
        let n = NonZeroU32::new(u32::try_from(bytes).unwrap_or(u32::MAX).max(1)).expect("at least one");
        if !matches!(self.bytes.check_key_n(&key, n), Ok(Ok(()))) {
            return Err(HostError::new(
                Code::TooLarge,
                format!(
                    "refused: namespace {namespace} may make {} bytes of snapshots a minute (--snapshot-bytes-rate), and this one is {bytes}",
                    self.limits.namespace_bytes
                ),
            ));
        }
        if !matches!(self.total.check_n(n), Ok(Ok(()))) {
            return Err(HostError::new(
                Code::TooLarge,
                format!(
                    "refused: the cluster may make {} bytes of snapshots a minute (--snapshot-bytes-rate-total), and this one is {bytes}",
                    self.limits.total_bytes
                ),
            ));
        }
        // Namespaces whose budget is full again are forgotten: the maps
        // hold only the ones that spent recently.
        if self.count.len() > 4096 {
            self.count.retain_recent();
            self.bytes.retain_recent();
        }
        Ok(())
    }
}

/// The bytes a byte quantity means: a plain number, or one with a binary
/// suffix (`Ki`, `Mi`, `Gi`), as Kubernetes quantities write them. For
/// `--snapshot-bytes-rate` and `--snapshot-bytes-rate-total`.
pub(crate) fn parse_bytes(text: &str) -> Result<NonZeroU32, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let multiplier: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(format!("{text:?}: a number of bytes, with Ki, Mi or Gi if you like")),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: a number of bytes, with Ki, Mi or Gi if you like"))?;
    number
        .checked_mul(multiplier)
        .and_then(|b| u32::try_from(b).ok())
        .and_then(NonZeroU32::new)
        .ok_or_else(|| format!("{text:?}: between 1 byte and 4Gi"))
}

/// The bytes a snapshot takes as written: what the budget counts.
pub(crate) fn written_size(object: &Value) -> usize {
    serde_json::to_vec(object).map_or(usize::MAX, |b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(count: u32, namespace_bytes: u32, total_bytes: u32) -> Limits {
        Limits {
            count: NonZeroU32::new(count).unwrap(),
            namespace_bytes: NonZeroU32::new(namespace_bytes).unwrap(),
            total_bytes: NonZeroU32::new(total_bytes).unwrap(),
        }
    }

    #[test]
    fn a_namespace_past_its_count_is_refused_and_others_are_not() {
        let budget = Budget::per_minute(NonZeroU32::new(5).unwrap());
        for _ in 0..5 {
            budget.take("shop", 10).unwrap();
        }
        let refused = budget.take("shop", 10).unwrap_err();
        assert_eq!(refused.code, Code::TooLarge);
        assert!(refused.message.contains("shop"), "{refused}");
        budget.take("bank", 10).expect("another namespace has its own budget");
    }

    #[test]
    fn bytes_are_bounded_per_namespace_and_for_the_cluster() {
        let budget = Budget::new(limits(100, 1000, 2500));
        budget.take("a", 600).unwrap();
        let refused = budget.take("a", 600).unwrap_err();
        assert!(refused.message.contains("--snapshot-bytes-rate"), "{refused}");
        budget.take("b", 900).unwrap();
        budget.take("c", 900).unwrap();
        let refused = budget.take("d", 900).unwrap_err();
        assert!(refused.message.contains("--snapshot-bytes-rate-total"), "{refused}");
        let refused = budget.take("e", 5000).unwrap_err();
        assert_eq!(refused.code, Code::TooLarge, "one snapshot past any budget");
    }

    #[test]
    fn byte_quantities() {
        assert_eq!(parse_bytes("512").unwrap().get(), 512);
        assert_eq!(parse_bytes("8Mi").unwrap().get(), 8 << 20);
        assert_eq!(parse_bytes("1Gi").unwrap().get(), 1 << 30);
        for bad in ["", "0", "8M", "-1", "5Ti", "8 Mi", "4Gi"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
