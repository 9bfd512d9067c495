//! Which sources a workload opts in to: its annotations combined with the
//! settings' defaults and exclusions (docs/design.md, "Opting in").

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::duration::{parse_go_duration, DurationError};
use crate::model::keys;
use crate::model::readers::Readers;
use crate::model::selection::{ListError, SourceList};
use crate::model::settings::{Settings, MAX_SETTLE_SECS};
use crate::model::source::SourceId;

/// Why a workload's annotations were refused: each names the annotation
/// and the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptInError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error("{annotation}: bad token {value:?}: {source}")]
    Renew {
        annotation: &'static str,
        value: String,
        source: DurationError,
    },
    #[error("{annotation}: bad token {value:?}: must be at least {min}s")]
    RenewTooShort {
        annotation: &'static str,
        value: String,
        min: u64,
    },
    #[error(transparent)]
    Window(#[from] crate::model::window::WindowError),
    #[error(transparent)]
    Approval(#[from] crate::model::approval::ApprovalError),
    #[error("{annotation}: bad token {value:?}: a Go duration from 1s to 1h (e.g. 10s)", annotation = keys::SETTLE)]
    Settle { value: String },
}

#[derive(Debug, Clone, Default)]
pub struct OptIn {
    pub snapshot: SourceList,
    pub watch: SourceList,
    pub exclude: SourceList,
    /// `renew-duration` in seconds.
    pub renew_secs: Option<u64>,
    /// `settle` in seconds: how long its watched sources must be quiet
    /// before a watch rollout, which then takes all their changes at once.
    pub settle_secs: Option<u64>,
}

/// The shortest renew-duration accepted. Anything shorter would roll a
/// workload on nearly every admission.
pub(crate) const MIN_RENEW_SECS: u64 = 60;

impl OptIn {
    /// Reads a workload's annotations. Errors name the annotation and the bad
    /// token, as the user must find it.
    pub fn from_annotations(
        annotations: Option<&serde_json::Map<String, Value>>,
        settings: &Settings,
    ) -> Result<OptIn, OptInError> {
        let get = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
        let list = |key: &str, wildcard: bool| -> Result<SourceList, ListError> {
            match get(key) {
                Some(v) => SourceList::parse(key, v, wildcard),
                None => Ok(SourceList::default()),
            }
        };
        let mut snapshot = list(keys::SNAPSHOT, true)?;
        let mut watch = list(keys::WATCH, true)?;
        // `exclude: "*"` is the workload's opt-out: it wins over the
        // settings' defaults and every source's word, as any exclusion does
        // (docs/design.md, "Opting in").
        let exclude = list(keys::EXCLUDE, true)?;
        if settings.snapshot_by_default && snapshot.is_empty() {
            snapshot = SourceList::all();
        }
        if settings.watch_by_default && watch.is_empty() {
            watch = SourceList::all();
        }
        let renew_secs = match get(keys::RENEW_DURATION) {
            None => None,
            Some(v) => {
                let secs = parse_go_duration(v).map_err(|source| OptInError::Renew {
                    annotation: keys::RENEW_DURATION,
                    value: v.to_string(),
                    source,
                })?;
                if secs < MIN_RENEW_SECS {
                    return Err(OptInError::RenewTooShort {
                        annotation: keys::RENEW_DURATION,
                        value: v.to_string(),
                        min: MIN_RENEW_SECS,
                    });
                }
                Some(secs)
            }
        };
        // Checked here, with the others, so that a window that cannot be
        // read is refused at the write that sets it, not found out when a
        // rollout is due (the host reads it again then).
        if let Some(windows) = get(keys::ROLLOUT_WINDOW) {
            crate::model::window::parse(windows)?;
        }
        if let Some(zone) = get(keys::ROLLOUT_WINDOW_ZONE) {
            crate::model::window::check_zone(zone)?;
        }
        crate::model::approval::check(annotations)?;
        let settle_secs = match get(keys::SETTLE) {
            None => settings.settle_secs,
            Some(v) => match parse_go_duration(v) {
                Ok(secs) if (1..=MAX_SETTLE_SECS).contains(&secs) => Some(secs),
                _ => {
                    return Err(OptInError::Settle {
                        value: v.chars().take(64).collect(),
                    })
                }
            },
        };
        Ok(OptIn {
            snapshot,
            watch,
            exclude,
            renew_secs,
            settle_secs,
        })
    }

    /// The settle time that applies in watch mode `mode`: settling takes
    /// every pending change into one rollout, so it applies only where a
    /// change rolls by itself (`roll`). In `approve` mode each change rolls
    /// only once its own content is approved, and a rollout must never take
    /// along a change nobody approved; in `notify` mode nothing rolls.
    pub fn settle_in(&self, mode: crate::model::approval::WatchMode) -> Option<u64> {
        self.settle_secs
            .filter(|_| mode == crate::model::approval::WatchMode::Roll)
    }

    /// Cheap check for the pass-through path, from borrowed annotations.
    pub(crate) fn any_opt_in(annotations: Option<&BTreeMap<String, String>>, settings: &Settings) -> bool {
        settings.snapshot_by_default
            || settings.watch_by_default
            || annotations.is_some_and(|a| {
                a.contains_key(keys::SNAPSHOT) || a.contains_key(keys::WATCH) || a.contains_key(keys::RENEW_DURATION)
            })
    }

    /// Excluded by the workload's `exclude` or by the settings.
    pub fn excluded(&self, id: &SourceId, settings: &Settings) -> bool {
        settings.is_excluded(id) || self.exclude.matches(id)
    }

    /// Watch implies snapshot (the KEP: watch only with snapshot). A
    /// source's word never makes a workload snapshot it: only what the
    /// workload (or the settings) opt in is pinned, so a workload the
    /// webhook is not even called for is never touched because of a
    /// ConfigMap ("The source decides").
    pub fn snapshots(&self, id: &SourceId, settings: &Settings) -> bool {
        !self.excluded(id, settings) && (self.snapshot.matches(id) || self.watch.matches(id))
    }

    /// How this workload stands towards edits of `id`, given what the
    /// source says of its readers (docs/design.md, "The source decides"):
    /// the more particular word wins. An exclusion keeps the source out
    /// altogether; the workload's own name for the source beats the
    /// source's word; the source's word beats the workload's `*`, its
    /// whole kinds and the settings' defaults.
    pub fn standing(&self, id: &SourceId, readers: Readers, settings: &Settings) -> Standing {
        if !self.snapshots(id, settings) {
            return Standing::Unpinned;
        }
        if self.watch.names(id) {
            return Standing::Named;
        }
        match readers {
            Readers::Ignore => Standing::Ignored,
            Readers::Watch if !self.snapshot.names(id) => Standing::Called,
            Readers::Watch if !self.watch.matches(id) => Standing::PinnedByName,
            _ => Standing::Own(self.watch.matches(id)),
        }
    }

    /// Whether edits of `id` roll this workload out ([`Self::standing`]).
    pub fn watches(&self, id: &SourceId, readers: Readers, settings: &Settings) -> bool {
        self.standing(id, readers, settings).watches()
    }
}

/// How a workload stands towards one source's edits ([`OptIn::standing`]):
/// whether they roll it, and whose word decided, as `plan` and `status`
/// explain it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It does not snapshot the source (not opted in, or excluded): its
    /// edits never roll it, whatever the source says.
    Unpinned,
    /// It names the source in its own `watch`: watched, whatever the
    /// source says.
    Named,
    /// The source says `ignore`, and the workload does not name it in
    /// `watch`: not watched.
    Ignored,
    /// The source says `watch`, and the workload snapshots it without
    /// naming it (`*`, a whole kind, `snapshotByDefault`): watched.
    Called,
    /// The source says `watch`, but the workload names it in `snapshot`
    /// alone: a pin it asked for by name, not watched.
    PinnedByName,
    /// The source says nothing: the workload's own words decide (`true`:
    /// its `watch` takes the source).
    Own(bool),
}

impl Standing {
    pub fn watches(self) -> bool {
        matches!(self, Standing::Named | Standing::Called | Standing::Own(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceKind;
    use serde_json::json;

    fn opt(ann: Value, settings: &Settings) -> Result<OptIn, OptInError> {
        OptIn::from_annotations(ann.as_object(), settings)
    }
    fn cm(n: &str) -> SourceId {
        SourceId::new(SourceKind::ConfigMap, n)
    }

    #[test]
    fn watch_implies_snapshot_and_exclude_wins() {
        let s = Settings::default();
        let o = opt(
            json!({keys::WATCH: "app", keys::EXCLUDE: "configmap/skip", keys::SNAPSHOT: "*"}),
            &s,
        )
        .unwrap();
        assert!(o.snapshots(&cm("app"), &s) && o.watches(&cm("app"), Readers::Unsaid, &s));
        assert!(o.snapshots(&cm("other"), &s) && !o.watches(&cm("other"), Readers::Unsaid, &s));
        assert!(!o.snapshots(&cm("skip"), &s));
        assert!(!o.snapshots(&cm("kube-root-ca.crt"), &s), "settings exclusion applies");
    }

    #[test]
    fn defaults_from_settings() {
        let s = Settings::from_json(br#"{"watchByDefault":true}"#).unwrap();
        let o = opt(json!({}), &s).unwrap();
        assert!(o.watches(&cm("x"), Readers::Unsaid, &s) && o.snapshots(&cm("x"), &s));
        let plain = Settings::default();
        assert!(!opt(json!({}), &plain).unwrap().snapshots(&cm("x"), &plain));
    }

    #[test]
    fn bad_values_name_annotation_and_token() {
        let s = Settings::default();
        let e = opt(json!({keys::RENEW_DURATION: "3 days"}), &s).unwrap_err();
        assert!(
            matches!(&e, OptInError::Renew { value, .. } if value == "3 days"),
            "{e}"
        );
        assert!(e.to_string().contains(keys::RENEW_DURATION), "{e}");
        let e = opt(json!({keys::RENEW_DURATION: "5s"}), &s).unwrap_err();
        assert!(
            matches!(&e, OptInError::RenewTooShort { value, .. } if value == "5s"),
            "{e}"
        );
        let e = opt(json!({keys::WATCH: "configmap/"}), &s).unwrap_err().to_string();
        assert!(e.contains(keys::WATCH) && e.contains("configmap/"), "{e}");
        assert_eq!(
            opt(json!({keys::RENEW_DURATION: "1h30m"}), &s).unwrap().renew_secs,
            Some(5400)
        );
    }

    /// `exclude: "*"` is one workload's way out when the settings opt
    /// every workload in (Reloader's `auto: "false"` under
    /// `--auto-reload-all`): nothing is snapshot or watched, whatever the
    /// defaults, its own lists or a source's word say.
    #[test]
    fn exclude_everything_wins_over_the_defaults_and_every_word() {
        let by_default = Settings::from_json(br#"{"snapshotByDefault":true,"watchByDefault":true}"#).unwrap();
        let out = opt(json!({keys::EXCLUDE: "*", keys::WATCH: "configmap/app"}), &by_default).unwrap();
        for id in [cm("app"), cm("other"), SourceId::new(SourceKind::Secret, "db")] {
            assert!(!out.snapshots(&id, &by_default), "{id}");
            for readers in [Readers::Unsaid, Readers::Watch, Readers::Ignore] {
                assert_eq!(out.standing(&id, readers, &by_default), Standing::Unpinned, "{id}");
            }
        }
        // Without it, the same workload snapshots and watches everything.
        let ruled = opt(json!({}), &by_default).unwrap();
        assert!(ruled.watches(&cm("other"), Readers::Unsaid, &by_default));
        // A whole kind keeps the other kind in.
        let no_secrets = opt(json!({keys::EXCLUDE: "secret/*"}), &by_default).unwrap();
        assert!(!no_secrets.snapshots(&SourceId::new(SourceKind::Secret, "db"), &by_default));
        assert!(no_secrets.watches(&cm("app"), Readers::Unsaid, &by_default));
    }

    /// The rule of who decides (docs/design.md, "The source decides"),
    /// case by case: the workload's name for a source beats the source's
    /// word, which beats the workload's `*`, whole kinds and defaults; a
    /// source never makes a workload snapshot it.
    #[test]
    fn the_more_particular_word_wins() {
        let s = Settings::default();
        let app = cm("app");
        let stand = |ann: Value, readers: Readers| opt(ann, &s).unwrap().standing(&app, readers, &s);
        use Readers::{Ignore, Unsaid, Watch};
        // Named in watch: watched, whatever the source says.
        for readers in [Unsaid, Watch, Ignore] {
            assert_eq!(stand(json!({keys::WATCH: "configmap/app"}), readers), Standing::Named);
            assert_eq!(stand(json!({keys::WATCH: "app"}), readers), Standing::Named);
        }
        // Snapshot through `*` or a whole kind: the source's word decides.
        for general in ["*", "configmap/*"] {
            assert_eq!(stand(json!({keys::SNAPSHOT: general}), Watch), Standing::Called);
            assert_eq!(stand(json!({keys::SNAPSHOT: general}), Ignore), Standing::Ignored);
            assert_eq!(stand(json!({keys::SNAPSHOT: general}), Unsaid), Standing::Own(false));
            assert_eq!(stand(json!({keys::WATCH: general}), Ignore), Standing::Ignored);
            assert_eq!(stand(json!({keys::WATCH: general}), Unsaid), Standing::Own(true));
        }
        // Named in snapshot alone: a pin the source's watch does not turn
        // into a watch (unless the workload's own watch takes it).
        assert_eq!(stand(json!({keys::SNAPSHOT: "app"}), Watch), Standing::PinnedByName);
        assert_eq!(
            stand(json!({keys::SNAPSHOT: "app", keys::WATCH: "*"}), Watch),
            Standing::Own(true)
        );
        assert_eq!(
            stand(json!({keys::SNAPSHOT: "app", keys::WATCH: "*"}), Ignore),
            Standing::Ignored
        );
        // Not opted in, or excluded: the source's watch reaches nothing.
        assert_eq!(stand(json!({}), Watch), Standing::Unpinned);
        assert_eq!(stand(json!({keys::SNAPSHOT: "secret/*"}), Watch), Standing::Unpinned);
        assert_eq!(
            stand(json!({keys::SNAPSHOT: "*", keys::EXCLUDE: "configmap/app"}), Watch),
            Standing::Unpinned
        );
        // snapshotByDefault pins every workload: the source's watch then
        // rolls them all; watchByDefault yields to its ignore.
        let by_default = Settings::from_json(br#"{"snapshotByDefault":true}"#).unwrap();
        let plain = opt(json!({}), &by_default).unwrap();
        assert_eq!(plain.standing(&app, Watch, &by_default), Standing::Called);
        let watching = Settings::from_json(br#"{"watchByDefault":true}"#).unwrap();
        let plain = opt(json!({}), &watching).unwrap();
        assert_eq!(plain.standing(&app, Ignore, &watching), Standing::Ignored);
        assert!(plain.watches(&app, Unsaid, &watching));
        for standing in [Standing::Named, Standing::Called, Standing::Own(true)] {
            assert!(standing.watches());
        }
        for standing in [
            Standing::Unpinned,
            Standing::Ignored,
            Standing::PinnedByName,
            Standing::Own(false),
        ] {
            assert!(!standing.watches());
        }
    }

    /// `watch` is the word that makes the most watchers, and `ignore` the
    /// fewest: the host counts a source whose word it has not read as
    /// `watch` (serve's hot path, a settling rollout's companions), so
    /// that it never skips a watcher the fresh read would find.
    #[test]
    fn watch_makes_the_most_watchers_and_ignore_the_fewest() {
        let settings = [
            Settings::default(),
            Settings::from_json(br#"{"snapshotByDefault":true}"#).unwrap(),
            Settings::from_json(br#"{"watchByDefault":true}"#).unwrap(),
        ];
        let lists = [
            None,
            Some("*"),
            Some("configmap/*"),
            Some("secret/*"),
            Some("app"),
            Some("configmap/app"),
        ];
        for s in &settings {
            for snapshot in lists {
                for watch in lists {
                    for exclude in [None, Some("*"), Some("app")] {
                        let mut ann = serde_json::Map::new();
                        for (key, value) in [
                            (keys::SNAPSHOT, snapshot),
                            (keys::WATCH, watch),
                            (keys::EXCLUDE, exclude),
                        ] {
                            if let Some(v) = value {
                                ann.insert(key.into(), json!(v));
                            }
                        }
                        let o = OptIn::from_annotations(Some(&ann), s).unwrap();
                        for id in [cm("app"), cm("other"), SourceId::new(SourceKind::Secret, "app")] {
                            let by = |r| o.watches(&id, r, s);
                            assert!(
                                !by(Readers::Ignore) || by(Readers::Unsaid),
                                "{ann:?} {id}: ignore watched more"
                            );
                            assert!(
                                !by(Readers::Unsaid) || by(Readers::Watch),
                                "{ann:?} {id}: no word watched more than watch"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn settle_is_a_bounded_duration() {
        let settings = Settings::default();
        let settle = |v: &str| opt(json!({keys::SETTLE: v}), &settings).map(|o| o.settle_secs);
        assert_eq!(settle("10s"), Ok(Some(10)));
        assert_eq!(settle("1h"), Ok(Some(3600)));
        for bad in ["0s", "2h", "soon", ""] {
            assert!(matches!(settle(bad), Err(OptInError::Settle { .. })), "{bad}");
        }
        // The settings' default, for a workload that sets none.
        let defaulted = Settings::from_json(br#"{"settle":"20s"}"#).unwrap();
        assert_eq!(opt(json!({}), &defaulted).unwrap().settle_secs, Some(20));
        assert_eq!(
            opt(json!({keys::SETTLE: "5s"}), &defaulted).unwrap().settle_secs,
            Some(5)
        );
    }
}
