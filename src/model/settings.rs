//! Policy settings (docs/design.md, "Opting in"), validated by `validate_settings`.

use serde::Deserialize;

use crate::model::duration::{parse_go_duration, DurationError};
use crate::model::selection::{ListError, SourceList};
use crate::model::source::{SourceId, SourceKind};

/// Why settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// Not JSON, an unknown key, or a value of the wrong type: serde's
    /// message names the key and the value.
    #[error("invalid settings: {0}")]
    Json(String),
    #[error(transparent)]
    Excluded(#[from] ListError),
    #[error("orphanGracePeriod: {0}")]
    GracePeriod(#[from] DurationError),
    /// A grace period shorter than an admission can take to be stored
    /// would let a sweep delete a snapshot its workload is about to name.
    #[error(
        "orphanGracePeriod: {0}s is shorter than the minimum of {MIN_ORPHAN_GRACE_SECS}s: a snapshot \
         has no owner and no reference until the request that made it is stored, which kube-apiserver \
         allows up to its request timeout (60 s by default)"
    )]
    GracePeriodTooShort(u64),
    #[error("settle: {0}")]
    Settle(DurationError),
    #[error("settle: {0}s is longer than the most of 3600s: a longer hold is a rollout window's job")]
    SettleTooLong(u64),
}

/// The shortest `orphanGracePeriod` accepted. A snapshot made during an
/// admission is unowned and unreferenced until kube-apiserver stores the
/// request, after the other webhooks, up to its request timeout (60 s by
/// default). A sweep inside that window would leave the stored workload
/// naming a snapshot that no longer exists.
pub(crate) const MIN_ORPHAN_GRACE_SECS: u64 = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnMissingSource {
    Warn,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnSnapshotFailure {
    Reject,
    Warn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WithoutSnapshotCapability {
    Checksum,
    Warn,
    Reject,
}

/// Every setting's key, as users write it (the Kubewarden UI's questions
/// ask each one: host/tests/packaging.rs).
pub const KEYS: [&str; 9] = [
    "snapshotByDefault",
    "watchByDefault",
    "excludedSources",
    "onMissingSource",
    "onSnapshotFailure",
    "withoutSnapshotCapability",
    "orphanGracePeriod",
    "secretChecksumKey",
    "settle",
];

/// Settings as the user writes them. Unknown keys are refused: a misspelt
/// `watchByDefalut` silently doing nothing is worse than an error.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RawSettings {
    pub snapshot_by_default: bool,
    pub watch_by_default: bool,
    pub excluded_sources: Vec<String>,
    pub on_missing_source: OnMissingSource,
    pub on_snapshot_failure: OnSnapshotFailure,
    pub without_snapshot_capability: WithoutSnapshotCapability,
    pub orphan_grace_period: String,
    pub secret_checksum_key: Option<String>,
    /// The settle time of a workload without its own `settle` annotation
    /// (Go duration; `0s`: none).
    pub settle: String,
}

impl Default for RawSettings {
    fn default() -> Self {
        RawSettings {
            snapshot_by_default: false,
            watch_by_default: false,
            excluded_sources: vec!["configmap/kube-root-ca.crt".to_string()],
            on_missing_source: OnMissingSource::Warn,
            on_snapshot_failure: OnSnapshotFailure::Reject,
            without_snapshot_capability: WithoutSnapshotCapability::Checksum,
            orphan_grace_period: "10m".to_string(),
            secret_checksum_key: None,
            settle: "0s".to_string(),
        }
    }
}

/// The ConfigMap of the cluster's CA, never snapshot ([`Settings::is_excluded`]).
pub const CLUSTER_CA: &str = "kube-root-ca.crt";

/// The longest `settle` accepted, on a workload or as the default: a
/// change held longer is a rollout window's job. (Here, below `optin`,
/// which reads it too.)
pub(crate) const MAX_SETTLE_SECS: u64 = 3600;

/// Validated settings, with the lists and durations parsed once.
#[derive(Debug, Clone)]
pub struct Settings {
    pub snapshot_by_default: bool,
    pub watch_by_default: bool,
    pub excluded_sources: SourceList,
    pub on_missing_source: OnMissingSource,
    pub on_snapshot_failure: OnSnapshotFailure,
    pub without_snapshot_capability: WithoutSnapshotCapability,
    pub orphan_grace_period_secs: u64,
    /// Checksum mode's key for Secrets' checksums (`None`: each Secret's
    /// uid).
    pub secret_checksum_key: Option<String>,
    /// The default settle time in seconds (`None`: none).
    pub settle_secs: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings::try_from(RawSettings::default()).expect("defaults are valid")
    }
}

impl TryFrom<RawSettings> for Settings {
    type Error = SettingsError;

    fn try_from(raw: RawSettings) -> Result<Self, SettingsError> {
        let excluded = SourceList::parse("excludedSources", &raw.excluded_sources.join(","), false)?;
        let grace = parse_go_duration(&raw.orphan_grace_period)?;
        if grace < MIN_ORPHAN_GRACE_SECS {
            return Err(SettingsError::GracePeriodTooShort(grace));
        }
        Ok(Settings {
            snapshot_by_default: raw.snapshot_by_default,
            watch_by_default: raw.watch_by_default,
            excluded_sources: excluded,
            on_missing_source: raw.on_missing_source,
            on_snapshot_failure: raw.on_snapshot_failure,
            without_snapshot_capability: raw.without_snapshot_capability,
            orphan_grace_period_secs: grace,
            secret_checksum_key: raw.secret_checksum_key.filter(|k| !k.is_empty()),
            settle_secs: match parse_go_duration(&raw.settle).map_err(SettingsError::Settle)? {
                0 => None,
                secs if secs <= MAX_SETTLE_SECS => Some(secs),
                secs => return Err(SettingsError::SettleTooLong(secs)),
            },
        })
    }
}

impl Settings {
    /// Parses settings JSON; `null` or an empty payload means the defaults.
    pub fn from_json(payload: &[u8]) -> Result<Self, SettingsError> {
        let trimmed = payload.trim_ascii();
        if trimmed.is_empty() || trimmed == b"null" {
            return Ok(Settings::default());
        }
        let raw: RawSettings = serde_json::from_slice(trimmed).map_err(|e| SettingsError::Json(e.to_string()))?;
        Settings::try_from(raw)
    }

    /// Whether `id` is never snapshot: one of `excludedSources`, or the
    /// cluster CA's ConfigMap whatever they say. kube-controller-manager
    /// keeps `kube-root-ca.crt` in every namespace, and every Pod's
    /// service-account volume names it: a pinned copy would keep a rotated
    /// CA from a bare Pod. So setting `excludedSources` to exclude something
    /// else never takes it out of the exclusions (found by an evaluator:
    /// it did).
    pub(crate) fn is_excluded(&self, id: &SourceId) -> bool {
        (id.kind == SourceKind::ConfigMap && id.name == CLUSTER_CA) || self.excluded_sources.matches(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec() {
        let s = Settings::from_json(b"{}").unwrap();
        assert!(!s.snapshot_by_default && !s.watch_by_default);
        assert!(s.is_excluded(&SourceId::new(SourceKind::ConfigMap, "kube-root-ca.crt")));
        assert!(!s.is_excluded(&SourceId::new(SourceKind::Secret, "kube-root-ca.crt")));
        assert_eq!(s.on_missing_source, OnMissingSource::Warn);
        assert_eq!(s.on_snapshot_failure, OnSnapshotFailure::Reject);
        assert_eq!(s.without_snapshot_capability, WithoutSnapshotCapability::Checksum);
        assert_eq!(s.orphan_grace_period_secs, 600);
        assert_eq!(Settings::from_json(b"null").unwrap().orphan_grace_period_secs, 600);
    }

    /// KEYS are the keys the settings take: each is accepted, and a
    /// document setting every one of them is read whole.
    #[test]
    fn keys_are_every_setting() {
        let every = serde_json::json!({"snapshotByDefault": true, "watchByDefault": true,
            "excludedSources": ["x"], "onMissingSource": "reject", "onSnapshotFailure": "warn",
            "withoutSnapshotCapability": "warn", "orphanGracePeriod": "2m", "secretChecksumKey": "k", "settle": "10s"});
        let mut keys: Vec<&str> = every.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        let mut expected = KEYS.to_vec();
        expected.sort();
        assert_eq!(keys, expected);
        assert_eq!(
            Settings::from_json(every.to_string().as_bytes()).unwrap().settle_secs,
            Some(10)
        );
        assert!(Settings::from_json(br#"{"snapshotByDefalut":true}"#).is_err());
        assert_eq!(Settings::default().settle_secs, None);
        assert!(matches!(
            Settings::from_json(br#"{"settle":"2h"}"#),
            Err(SettingsError::SettleTooLong(7200))
        ));
    }

    #[test]
    fn every_setting_is_read() {
        let s = Settings::from_json(
            br#"{"snapshotByDefault":true,"watchByDefault":true,"excludedSources":["secret/x","y"],
                "onMissingSource":"reject","onSnapshotFailure":"warn",
                "withoutSnapshotCapability":"reject","orphanGracePeriod":"1h"}"#,
        )
        .unwrap();
        assert!(s.snapshot_by_default && s.watch_by_default);
        assert!(s.is_excluded(&SourceId::new(SourceKind::Secret, "x")));
        assert!(s.is_excluded(&SourceId::new(SourceKind::ConfigMap, "y")));
        assert!(
            s.is_excluded(&SourceId::new(SourceKind::ConfigMap, "kube-root-ca.crt")),
            "the cluster's CA stays excluded whatever excludedSources says"
        );
        assert!(!s.is_excluded(&SourceId::new(SourceKind::Secret, "kube-root-ca.crt")));
        assert_eq!(s.on_missing_source, OnMissingSource::Reject);
        assert_eq!(s.on_snapshot_failure, OnSnapshotFailure::Warn);
        assert_eq!(s.without_snapshot_capability, WithoutSnapshotCapability::Reject);
        assert_eq!(s.orphan_grace_period_secs, 3600);
    }

    #[test]
    fn bad_settings_are_refused_with_a_clear_message() {
        let err = Settings::from_json(br#"{"watchByDefalut":true}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("watchByDefalut"), "{err}");
        let err = Settings::from_json(br#"{"onMissingSource":"ignore"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ignore"), "{err}");
        let err = Settings::from_json(br#"{"orphanGracePeriod":"ten minutes"}"#).unwrap_err();
        assert!(matches!(err, SettingsError::GracePeriod(_)), "{err}");
        assert!(err.to_string().contains("orphanGracePeriod"), "{err}");
        let err = Settings::from_json(br#"{"excludedSources":["*"]}"#).unwrap_err();
        assert!(
            matches!(err, SettingsError::Excluded(ListError::Wildcard { .. })),
            "{err}"
        );
        assert!(Settings::from_json(b"[1,2]").is_err());
    }

    /// `excludedSources` takes a whole kind (`secret/*`: no Secret is
    /// ever copied, Reloader's ignoreSecrets), never `*`.
    #[test]
    fn excluded_sources_take_a_whole_kind() {
        let s = Settings::from_json(br#"{"excludedSources":["secret/*"]}"#).unwrap();
        assert!(s.is_excluded(&SourceId::new(SourceKind::Secret, "db")));
        assert!(!s.is_excluded(&SourceId::new(SourceKind::ConfigMap, "db")));
    }

    /// A grace period shorter than an admission can take to be stored is
    /// refused; the minimum itself is accepted.
    #[test]
    fn a_grace_period_below_the_request_timeout_is_refused() {
        for short in ["0s", "1s", "59s"] {
            let err = Settings::from_json(format!(r#"{{"orphanGracePeriod":"{short}"}}"#).as_bytes()).unwrap_err();
            assert!(matches!(err, SettingsError::GracePeriodTooShort(_)), "{short}: {err}");
            assert!(err.to_string().contains("orphanGracePeriod"), "{err}");
        }
        let s = Settings::from_json(br#"{"orphanGracePeriod":"1m"}"#).unwrap();
        assert_eq!(s.orphan_grace_period_secs, MIN_ORPHAN_GRACE_SECS);
    }
}
