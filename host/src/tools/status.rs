//! `status` and `approve`: what a workload's watched changes wait for, read
//! from its own annotations (docs/design.md, "Notify and approve"), and
//! which of them an approval may name. Both read the workload: the host
//! keeps on it everything a person needs (the pending record, the last
//! watch rollout, the last rollback), so any replica, or none, can answer.
//! `status` also reads what the sources it pins say of their readers
//! (docs/design.md, "The source decides"), which is on the sources.

use config_snapshot_policy::model::approval::{Entries, WatchMode};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::records::{Rollback, WatchRollout};
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use config_snapshot_policy::model::template;
use serde::Serialize;
use serde_json::Value;

use crate::tools::history::Target;
use crate::tools::printable;

/// What a workload's watched changes wait for.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    pub workload: String,
    pub namespace: String,
    pub watch: Option<String>,
    pub watch_mode: &'static str,
    /// `settle` as written, and until when its recorded changes settle
    /// (unix seconds).
    pub settle: Option<(String, Option<i64>)>,
    /// The window and, if it is closed now, when it opens.
    pub rollout_window: Option<Window>,
    /// Source → the snapshot its held change would roll to.
    pub pending: Vec<(String, String)>,
    /// Source → the snapshot approved and not yet rolled.
    pub approved: Vec<(String, String)>,
    /// The last watch rollout: when (unix seconds), which source, to what.
    pub last_watch_rollout: Option<(i64, String, String)>,
    /// The last rollback: when (unix seconds), and how many so far.
    pub last_rollback: Option<(i64, u64)>,
    /// Each source it pins that says something of its readers, and whether
    /// it watches the source, by that word and its own.
    pub readers: Vec<SaidBySource>,
    /// The sources it pins that could not be read (a Secret a viewer may
    /// not get): what they say of their readers is not shown.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<String>,
}

/// What one source says of its readers (`config-snapshot.io/readers`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SaidBySource {
    /// `configmap/app`.
    pub source: String,
    /// `watch` or `ignore` (`None`: a value that is neither).
    pub says: Option<&'static str>,
    /// Why the value is read as no word, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether the workload watches the source.
    pub watched: bool,
}

/// What `status` reads besides the workload.
pub struct Around<'a> {
    /// The policy's settings as installed (`snapshotByDefault` pins every
    /// workload).
    pub settings: &'a Settings,
    /// The sources the workload pins ([`pinned`]), as read.
    pub sources: &'a [Value],
    /// Those that could not be read.
    pub unread: &'a [SourceId],
}

/// The sources `workload`'s template names that it snapshots: those whose
/// word about their readers `status` reads.
pub fn pinned(workload: &Value, settings: &Settings) -> Vec<SourceId> {
    let Ok(optin) = OptIn::from_annotations(workload.annotations(), settings) else {
        return Vec::new();
    };
    kinds::template_of(workload)
        .map(template::own_groups)
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.id)
        .filter(|id| optin.snapshots(id, settings))
        .collect()
}

/// What the `sources` `workload` pins say of their readers, and how the
/// workload stands towards each: the policy's own rule.
fn said_by_sources(workload: &Value, around: &Around) -> Vec<SaidBySource> {
    let Ok(optin) = OptIn::from_annotations(workload.annotations(), around.settings) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for id in pinned(workload, around.settings) {
        let Some(source) = around
            .sources
            .iter()
            .find(|s| s["kind"].as_str().and_then(SourceKind::from_kind) == Some(id.kind) && s.name() == id.name)
        else {
            continue;
        };
        if !source.has_annotation(keys::READERS) {
            continue;
        }
        let (readers, error) = match Readers::of(source) {
            Ok(readers) => (readers, None),
            Err(e) => (Readers::Unsaid, Some(format!("{e}; read as no word"))),
        };
        out.push(SaidBySource {
            source: id.to_string(),
            says: readers.name(),
            error,
            watched: optin.watches(&id, readers, around.settings),
        });
    }
    out
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Window {
    pub schedule: String,
    pub zone: String,
    /// `None` when open now; else why it holds (when it opens).
    pub held: Option<String>,
}

fn listed(entries: &Entries) -> Vec<(String, String)> {
    entries.iter().map(|(id, s)| (id.to_string(), s.to_string())).collect()
}

/// The status of `workload` (as stored) at `now`.
pub fn status(target: &Target, workload: &Value, around: &Around, now: i64) -> Status {
    let annotations = workload.annotations();
    let text = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    let rollout_window = text(keys::ROLLOUT_WINDOW).map(|schedule| Window {
        schedule: schedule.to_string(),
        zone: text(keys::ROLLOUT_WINDOW_ZONE).unwrap_or("UTC").to_string(),
        held: crate::lifecycle::window_clock::held(workload, now).map(|(_, why)| why),
    });
    Status {
        workload: target.to_string(),
        namespace: workload.namespace().unwrap_or_default().to_string(),
        watch: text(keys::WATCH).map(str::to_string),
        watch_mode: WatchMode::of(annotations).name(),
        settle: text(keys::SETTLE).map(|s| {
            let until = crate::lifecycle::verdict::settle_until(workload);
            (s.to_string(), (until > 0).then_some(until))
        }),
        rollout_window,
        pending: listed(&Entries::on(annotations, keys::PENDING)),
        approved: listed(&Entries::on(annotations, keys::APPROVE)),
        last_watch_rollout: WatchRollout::of(workload).map(|r| (r.at, r.source.to_string(), r.snapshot)),
        last_rollback: Rollback::of(workload).map(|r| (r.at, r.count)),
        readers: said_by_sources(workload, around),
        unread: around.unread.iter().map(SourceId::to_string).collect(),
    }
}

/// The text users read. Every value read off the workload is written
/// [`printable`]: its annotations are whatever their writer put there.
pub fn render(status: &Status, now: i64) -> String {
    let ago = |at: i64| format!("{}s ago", (now - at).max(0));
    let p = |text: &str| printable(text).into_owned();
    let mut out = format!("{} in namespace {}\n", p(&status.workload), p(&status.namespace));
    let mut line = |label: &str, value: String| out.push_str(&format!("  {label:<19}{value}\n"));
    line("watches", status.watch.as_deref().map_or_else(|| "nothing".into(), p));
    line("watch mode", status.watch_mode.to_string());
    if let Some((settle, until)) = &status.settle {
        let state = match until {
            Some(t) if *t > now => format!(": settling, {}s to go", t - now),
            _ => String::new(),
        };
        line("settle", format!("{}{state}", p(settle)));
    }
    if let Some(w) = &status.rollout_window {
        let state = w.held.as_deref().map_or_else(|| "open now".into(), p);
        line("rollout window", format!("{:?} ({}): {state}", w.schedule, p(&w.zone)));
    }
    if status.pending.is_empty() {
        line("pending", "nothing".into());
    }
    for (source, snapshot) in &status.pending {
        let next = match status.watch_mode {
            "approve" => format!("awaits `config-snapshot approve {}`", p(&status.workload)),
            "notify" => "announced; notify mode rolls nothing".to_string(),
            _ if status.rollout_window.as_ref().is_some_and(|w| w.held.is_some()) => {
                "waits for its rollout window".to_string()
            }
            _ if status.settle.is_some() => "rolls with the others once its sources settle".to_string(),
            _ => "rolls at its next look".to_string(),
        };
        line("pending", format!("{} -> {} ({next})", p(source), p(snapshot)));
    }
    for (source, snapshot) in &status.approved {
        line("approved", format!("{} -> {}", p(source), p(snapshot)));
    }
    if let Some((at, source, snapshot)) = &status.last_watch_rollout {
        line(
            "last watch rollout",
            format!("{} -> {}, {}", p(source), p(snapshot), ago(*at)),
        );
    }
    if let Some((at, count)) = status.last_rollback {
        line("last rollback", format!("{} (rollback {count})", ago(at)));
    }
    for said in &status.readers {
        let watched = if said.watched { "watched" } else { "not watched" };
        let says = match (said.says, &said.error) {
            (Some(word), _) => format!("{}: {word}", keys::READERS),
            (None, error) => error.clone().unwrap_or_default(),
        };
        line("source says", format!("{}: {says} ({watched})", said.source));
    }
    for source in &status.unread {
        line("source says", format!("{source}: could not read it"));
    }
    out
}

/// Why an approval was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApproveError {
    #[error(
        "{workload}'s watch mode is {mode}: nothing waits for an approval (set config-snapshot.io/watch-mode: approve)"
    )]
    NotApproveMode { workload: String, mode: &'static str },
    #[error("{workload} has no change pending")]
    NothingPending { workload: String },
    #[error("snapshot {snapshot} is not pending on {workload}: its source changed since (pending: {pending})")]
    NotPending {
        workload: String,
        snapshot: String,
        pending: String,
    },
}

/// The approve annotation that approves `only` (snapshot names; all that
/// is pending when empty) on `workload`, with the approvals it carries.
/// An approval must name what is pending now: a snapshot the user saw
/// whose source has since changed again is refused.
pub fn approval(target: &Target, workload: &Value, only: &[String]) -> Result<Entries, ApproveError> {
    let annotations = workload.annotations();
    let name = target.to_string();
    let mode = WatchMode::of(annotations);
    if mode != WatchMode::Approve {
        return Err(ApproveError::NotApproveMode {
            workload: name,
            mode: mode.name(),
        });
    }
    let pending = Entries::on(annotations, keys::PENDING);
    if pending.is_empty() {
        return Err(ApproveError::NothingPending { workload: name });
    }
    if let Some(missing) = only.iter().find(|s| !pending.iter().any(|(_, p)| p == s.as_str())) {
        return Err(ApproveError::NotPending {
            workload: name,
            snapshot: missing.clone(),
            pending: pending.to_string(),
        });
    }
    let mut approved = Entries::on(annotations, keys::APPROVE);
    for (id, snapshot) in pending.iter() {
        if only.is_empty() || only.iter().any(|s| s == snapshot) {
            approved.set(id.clone(), snapshot);
        }
    }
    Ok(approved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn web(annotations: Value) -> (Target, Value) {
        (
            Target::parse("deploy/web").unwrap(),
            json!({"metadata": {"name": "web", "namespace": "ns", "annotations": annotations}}),
        )
    }

    #[test]
    fn approves_what_is_pending_and_refuses_what_is_not() {
        let (t, w) = web(json!({
            keys::WATCH_MODE: "approve",
            keys::PENDING: "configmap/app=app-2, secret/db=db-k-9",
            keys::APPROVE: "configmap/other=other-1",
        }));
        let all = approval(&t, &w, &[]).unwrap();
        assert_eq!(
            all.to_string(),
            "configmap/other=other-1, configmap/app=app-2, secret/db=db-k-9"
        );
        let one = approval(&t, &w, &["app-2".into()]).unwrap();
        assert_eq!(one.to_string(), "configmap/other=other-1, configmap/app=app-2");
        let stale = approval(&t, &w, &["app-1".into()]).unwrap_err();
        assert!(matches!(stale, ApproveError::NotPending { .. }), "{stale}");
        assert!(stale.to_string().contains("changed since"));
    }

    #[test]
    fn refuses_outside_approve_mode_and_with_nothing_pending() {
        let (t, w) = web(json!({keys::PENDING: "configmap/app=app-2"}));
        assert!(matches!(
            approval(&t, &w, &[]),
            Err(ApproveError::NotApproveMode { mode: "roll", .. })
        ));
        let (t, w) = web(json!({keys::WATCH_MODE: "approve"}));
        assert!(matches!(
            approval(&t, &w, &[]),
            Err(ApproveError::NothingPending { .. })
        ));
    }

    /// Finding 9 of eff3694's review: `status` printed annotations raw, so
    /// whoever may annotate a workload could clear its reader's screen, or
    /// print a line of `status`'s own (an approval that is not there).
    #[test]
    fn status_prints_what_the_workload_says_escaped() {
        let now = 1_795_780_800;
        let (t, w) = web(json!({
            keys::WATCH: "configmap/app\u{1b}[2J",
            keys::SETTLE: "10s\n  approved           configmap/app -> app-forged",
            keys::ROLLOUT_WINDOW_ZONE: "UTC\u{9b}31m",
            keys::ROLLOUT_WINDOW: "0 22 * * 1-5 for 8h",
        }));
        let around = Around {
            settings: &Settings::default(),
            sources: &[],
            unread: &[],
        };
        let text = render(&status(&t, &w, &around, now), now);
        assert!(text.chars().all(|c| c == '\n' || !c.is_control()), "{text:?}");
        assert!(
            !text.lines().any(|l| l.trim_start().starts_with("approved")),
            "a line of its own: {text}"
        );
        assert!(text.contains("configmap/app\\u{1b}[2J"), "{text}");
    }

    #[test]
    fn status_reads_the_records_and_the_window() {
        // Friday 2026-11-27 12:00 UTC: a weeknight window is closed.
        let now = 1_795_780_800;
        let (t, w) = web(json!({
            keys::WATCH: "configmap/app",
            keys::WATCH_MODE: "approve",
            keys::ROLLOUT_WINDOW: "0 22 * * 1-5 for 8h",
            keys::PENDING: "configmap/app=app-2",
        }));
        let around = Around {
            settings: &Settings::default(),
            sources: &[],
            unread: &[],
        };
        let s = status(&t, &w, &around, now);
        assert_eq!(s.watch_mode, "approve");
        assert_eq!(s.pending, vec![("configmap/app".to_string(), "app-2".to_string())]);
        let held = s.rollout_window.as_ref().and_then(|w| w.held.clone()).unwrap();
        assert!(held.contains("2026-11-27 22:00"), "{held}");
        let text = render(&s, now);
        assert!(
            text.contains("configmap/app -> app-2 (awaits `config-snapshot approve deployment/web`)"),
            "{text}"
        );
    }

    /// `status` shows what each source the workload pins says of its
    /// readers, and whether the workload watches it by the policy's rule;
    /// a source it could not read is said, not guessed; a source it does
    /// not pin is not read at all.
    #[test]
    fn status_shows_what_the_sources_it_pins_say_of_their_readers() {
        let (t, mut w) = web(json!({
            "config-snapshot.io/snapshot": "*",
            keys::WATCH: "configmap/named",
            "config-snapshot.io/exclude": "configmap/out",
        }));
        let env = |kind: &str, name: &str| match kind {
            "configmap" => json!({"configMapRef": {"name": name}}),
            _ => json!({"secretRef": {"name": name}}),
        };
        let refs: Vec<Value> = [
            ("configmap", "flags"),
            ("configmap", "named"),
            ("configmap", "quiet"),
            ("configmap", "typo"),
            ("configmap", "out"),
            ("secret", "db"),
        ]
        .iter()
        .map(|(k, n)| env(k, n))
        .collect();
        w["kind"] = json!("Deployment");
        w["spec"] = json!({"template": {"spec": {"containers": [{"name": "c", "envFrom": refs}]}}});
        let source = |kind: &str, name: &str, word: Option<&str>| {
            let mut s = json!({"kind": kind, "metadata": {"name": name, "namespace": "ns"}});
            if let Some(word) = word {
                s["metadata"]["annotations"] = json!({keys::READERS: word});
            }
            s
        };
        let settings = Settings::default();
        let pins: Vec<String> = pinned(&w, &settings).iter().map(SourceId::to_string).collect();
        assert!(!pins.contains(&"configmap/out".to_string()), "{pins:?}");
        let sources = [
            source("ConfigMap", "flags", Some("watch")),
            source("ConfigMap", "named", Some("ignore")),
            source("ConfigMap", "quiet", None),
            source("ConfigMap", "typo", Some("true")),
        ];
        let unread = [SourceId::new(SourceKind::Secret, "db")];
        let around = Around {
            settings: &settings,
            sources: &sources,
            unread: &unread,
        };
        let s = status(&t, &w, &around, 0);
        let said: Vec<(&str, Option<&str>, bool)> = s
            .readers
            .iter()
            .map(|r| (r.source.as_str(), r.says, r.watched))
            .collect();
        assert_eq!(
            said,
            [
                ("configmap/flags", Some("watch"), true),
                ("configmap/named", Some("ignore"), true),
                ("configmap/typo", None, false),
            ]
        );
        let text = render(&s, 0);
        assert!(
            text.contains("configmap/flags: config-snapshot.io/readers: watch (watched)"),
            "{text}"
        );
        assert!(
            text.contains("configmap/named: config-snapshot.io/readers: ignore (watched)"),
            "{text}"
        );
        assert!(
            text.contains("configmap/typo: config-snapshot.io/readers: bad token \"true\""),
            "{text}"
        );
        assert!(text.contains("secret/db: could not read it"), "{text}");
    }
}
