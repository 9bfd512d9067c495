//! How many snapshots one namespace may have made, per minute: whoever
//! gets reviews to the webhook (the API server for anyone who may write a
//! workload, or a forged review) cannot flood etcd with snapshots. A
//! creation past the budget is refused with [`Code::TooLarge`]; the policy
//! then follows `onSnapshotFailure` as for any failed snapshot.

use std::num::NonZeroU32;

use config_snapshot_policy::host_error::{Code, HostError};
use governor::{DefaultKeyedRateLimiter, Quota};

pub struct Budget {
    per_minute: NonZeroU32,
    limiter: DefaultKeyedRateLimiter<String>,
}

impl Budget {
    /// `per_minute` creations per namespace, all of which may come at
    /// once (a Deployment with many sources, a `kubectl apply` of many).
    pub fn per_minute(per_minute: NonZeroU32) -> Budget {
        Budget {
            per_minute,
            limiter: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
        }
    }

    /// Takes one creation from `namespace`'s budget, or says why not.
    pub fn take(&self, namespace: &str) -> Result<(), HostError> {
        self.limiter.check_key(&namespace.to_string()).map_err(|_| {
            HostError::new(
                Code::TooLarge,
                format!(
                    "refused: namespace {namespace} made {} snapshots in the last minute, its budget (--snapshot-rate)",
                    self.per_minute
                ),
            )
        })?;
        // Namespaces whose budget is full again are forgotten: the map
        // holds only the ones that spent recently.
        if self.limiter.len() > 4096 {
            self.limiter.retain_recent();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_past_its_budget_is_refused_and_others_are_not() {
        let budget = Budget::per_minute(NonZeroU32::new(5).unwrap());
        for _ in 0..5 {
            budget.take("shop").unwrap();
        }
        let refused = budget.take("shop").unwrap_err();
        assert_eq!(refused.code, Code::TooLarge);
        assert!(refused.message.contains("shop"), "{refused}");
        budget.take("bank").expect("another namespace has its own budget");
    }
}
