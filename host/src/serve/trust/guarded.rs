//! The one rule for a guarded Secret's later versions: the signing key's
//! (serve/trust/signing.rs) and the webhook CA's (serve/trust/own_certificate.rs), both
//! guarded by deploy/serve/keyguard.yaml (docs/security.md, "The signing
//! key", "Certificates").
//!
//! serve judges the Secret when it starts ([`KeySecret::trusted`]): only a
//! Secret made after its guard was in force, so that every version of it
//! was written by serve or a key administrator. While serve runs it sees
//! new versions, and judges each the same way: a version is taken only if
//! the guard is in force now and was in force when that version was
//! written. serve cannot read when a version was written, so it asks what
//! makes it so:
//!
//! - the guard in force now is the very one serve started under (the same
//!   binding and policy, by uid): it has been in force since, so every
//!   write since was guarded; or
//! - it is a guard made since (a reinstall made it anew), and the Secret
//!   was made after it: every version of the Secret was written under it.
//!
//! Otherwise the version may be anyone's who could write Secrets in serve's
//! namespace while the guard was away: serve keeps what it holds and says
//! why. Without the guard (`--trust-unguarded-signing-key`) every version
//! is taken, as at start.
//!
//! Not covered: a guard edited to let someone else write and edited back.
//! Whoever may edit a ValidatingAdmissionPolicy may as well make themselves
//! a key administrator, whom the guard lets write the key anyway.

use k8s_openapi::api::core::v1::Secret;

use super::signing::{made_under, Guard, KeySecret};

/// Why a later version of a guarded Secret is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untaken {
    /// The guard is not in force now (why, in the guard's own words): the
    /// version may have been written by anyone.
    #[error("{0}")]
    Unguarded(String),
    /// The guard was deleted and made anew since serve started, and the
    /// Secret is older than the new one: this version may have been written
    /// in between.
    #[error(
        "its guard was made anew since serve started, after the Secret, so this version may have been written while \
         no guard was in force"
    )]
    GuardMadeAnew,
}

/// Whether a later version of a guarded Secret is taken, under the guard
/// serve started under (`started_under`) and the guard as it is now
/// (`now`: the guard, or why it is not in force). The module's rule.
pub(crate) fn judged(
    version: &Secret,
    started_under: Option<&Guard>,
    now: Result<Guard, String>,
) -> Result<(), Untaken> {
    let now = now.map_err(Untaken::Unguarded)?;
    if started_under.is_some_and(|started| started.uids == now.uids) || made_under(version, &now) {
        Ok(())
    } else {
        Err(Untaken::GuardMadeAnew)
    }
}

impl KeySecret {
    /// Whether `version`, a later version of this Secret seen while serve
    /// runs, may be taken, under the guard serve started under: the guard
    /// read now, judged by [`judged`]. Without the guard
    /// (`--trust-unguarded-signing-key`), always.
    pub(crate) async fn may_take(&self, version: &Secret, started_under: Option<&Guard>) -> Result<(), Untaken> {
        if self.trust_unguarded {
            return Ok(());
        }
        let now = self.guard().await.map_err(|e| format!("{e:#}"));
        judged(version, started_under, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const STARTED: i64 = 1_800_000_000;

    fn guard(since: i64, uid: &str) -> Guard {
        Guard {
            since,
            uids: (format!("binding-{uid}"), format!("policy-{uid}")),
        }
    }

    /// A version of a Secret made at `created`.
    fn version(created: i64) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(created).unwrap()));
        secret
    }

    /// Finding 7 of eff3694's review: with the key's guard deleted, a patch
    /// of the key Secret was taken at once, and the webhook's path moved to
    /// one its writer could derive. A version is taken only under the guard
    /// serve started under, still in force, or under a guard made anew
    /// before the Secret was; never while none is in force, nor under a
    /// guard made anew after the Secret (the binding deleted and made again
    /// around the write).
    #[test]
    fn a_version_is_taken_only_if_its_guard_was_in_force_when_it_was_written() {
        let started = guard(STARTED, "first");
        let made_before = version(STARTED + 60);
        let unguarded = || Err("the signing key's guard is not in force: no ValidatingAdmissionPolicyBinding".into());
        assert_eq!(
            judged(&made_before, Some(&started), Ok(started.clone())),
            Ok(()),
            "a rotation under the guard serve started under"
        );
        assert!(
            matches!(
                judged(&made_before, Some(&started), unguarded()),
                Err(Untaken::Unguarded(why)) if why.contains("not in force")
            ),
            "a version seen while the guard is away"
        );
        let anew = guard(STARTED + 600, "second");
        assert_eq!(
            judged(&made_before, Some(&started), Ok(anew.clone())),
            Err(Untaken::GuardMadeAnew),
            "the binding deleted, the key patched, the binding made again"
        );
        assert_eq!(
            judged(&version(STARTED + 700), Some(&started), Ok(anew.clone())),
            Ok(()),
            "the Secret made again under a guard made anew (`keys restore`)"
        );
        assert_eq!(
            judged(&version(STARTED + 601), Some(&started), Ok(anew)),
            Err(Untaken::GuardMadeAnew),
            "made before the new guard's informer could enforce it"
        );
    }
}
