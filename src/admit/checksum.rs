//! Checksum mode: the host has no write capability (stock Kubewarden), so
//! no snapshot can be made (docs/design.md, "Without the write
//! capability"). `withoutSnapshotCapability` says what to do instead.

use serde_json::Value;
use sha2::Digest;

use crate::admit::context::Context;
use crate::host::reads::{Lookup, Reads};
use crate::host::CallError;
use crate::model::content::{self, Content};
use crate::model::keys;
use crate::model::kinds::WorkloadKind;
use crate::model::optin::{OptIn, Standing};
use crate::model::readers::Readers;
use crate::model::references::SourceRefs;
use crate::model::request::{Outcome, SAY};
use crate::model::settings::{Settings, WithoutSnapshotCapability};
use crate::model::source::SA_TOKEN;
use crate::model::source::{SourceId, SourceKind};
use crate::plan::rewrite::{apply, set_marks};
use crate::plan::Target;

pub(crate) fn degrade(
    ctx: &Context,
    reads: &Reads,
    (kind, object): (WorkloadKind, &mut Value),
    groups: &[SourceRefs],
    optin: &OptIn,
    why: &CallError,
) -> Outcome {
    match ctx.settings.without_snapshot_capability {
        WithoutSnapshotCapability::Reject => Outcome::reject(
            format!("{SAY}this host cannot create snapshots ({why}) and withoutSnapshotCapability is reject"),
            500,
        ),
        WithoutSnapshotCapability::Warn => Outcome::accept_with(vec![format!(
            "{SAY}this host cannot create snapshots ({why}); references left unchanged, so config changes will not roll out and rollback will not restore config"
        )]),
        // A Job or Pod made directly never rolls out: a checksum on it
        // would change nothing. It reads its sources as they are when its
        // pods start.
        WithoutSnapshotCapability::Checksum if kind.is_standalone() => Outcome::accept_with(vec![format!(
            "{SAY}this host cannot create snapshots ({why}); a {} made directly reads its sources as they are when its pods start",
            kind.kind()
        )]),
        WithoutSnapshotCapability::Checksum => {
            let mut marks = Vec::new();
            let mut warnings = vec![format!(
                "{SAY}this host cannot create snapshots; stamped config checksums instead, so a config change rolls out on the next apply, but rollout undo will not restore old config"
            )];
            for group in groups {
                if !optin.snapshots(&group.id, ctx.settings) {
                    continue;
                }
                // The planner read this source already: the same answer.
                match reads.source(group.id.kind, &group.id.name) {
                    Ok(Some(source)) => {
                        if source.get("type").and_then(Value::as_str) == Some(SA_TOKEN) {
                            continue;
                        }
                        // A checksum is what rolls the workload on its next
                        // write after an edit: a source whose edits roll
                        // none of its readers gets none, as it gets no
                        // watch rollout where snapshots are made (docs/design.md,
                        // "The source decides").
                        let readers = Readers::judged(&source, &group.id, &mut warnings);
                        if optin.standing(&group.id, readers, ctx.settings) == Standing::Ignored {
                            continue;
                        }
                        if let Ok(c) = Content::from_object(group.id.kind, &source) {
                            let hash = c.subset(group.key_subset().as_ref()).hash();
                            let checksum = match group.id.kind {
                                SourceKind::ConfigMap => hash,
                                SourceKind::Secret => secret_checksum(ctx.settings, &source, &hash),
                            };
                            marks.push((checksum_key(&group.id), checksum));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => warnings.push(format!("{SAY}could not read {}: {e}", group.id)),
                }
            }
            let template = object.pointer_mut(kind.template()).expect("checked by caller");
            let original = template.clone();
            let targets = vec![Target::Source; groups.len()];
            apply(template, groups, &targets, &OptIn::default(), None);
            let marks: Vec<(&str, String)> = marks.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            set_marks(template, marks);
            let changed = *template != original;
            Outcome {
                accepted: true,
                message: None,
                code: None,
                mutated: changed.then(|| object.clone()),
                warnings,
            }
        }
    }
}

/// A Secret's checksum on a pod template, which anyone who can read the
/// workload reads: an HMAC of its content hash, keyed so that it reveals
/// nothing about the value to them. The key is the setting
/// `secretChecksumKey` when given; else the Secret's own uid, which only
/// those who can read the Secret (or its metadata) know, so that guessing
/// a value needs access that reads it (docs/hash-spec.md). Under the
/// setting, one key for every namespace, the namespace is in the message
/// too: a checksum read in one namespace is no oracle for guesses made in
/// another. (A uid is one object's: the uid-keyed checksum keeps its form.)
pub(crate) fn secret_checksum(settings: &Settings, secret: &Value, content_hash: &str) -> String {
    use hmac::Mac as _;
    let meta = |field: &str| {
        secret
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (key, purpose, namespace) = match settings.secret_checksum_key.as_deref() {
        Some(key) => (key, "config-snapshot/secret-checksum/v2\0", Some(meta("namespace"))),
        None => (meta("uid"), "config-snapshot/secret-checksum/v1\0", None),
    };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(purpose.as_bytes());
    if let Some(namespace) = namespace {
        mac.update(namespace.as_bytes());
        mac.update(b"\0");
    }
    mac.update(content_hash.as_bytes());
    content::hex(&mac.finalize().into_bytes())
}

/// `config-snapshot.io/checksum-<kind>-<name>`, the name part shortened with
/// a hash when it would pass the 63 characters an annotation name allows.
pub fn checksum_key(id: &SourceId) -> String {
    let name_part = format!("checksum-{}-{}", id.kind.tag(), id.name);
    if name_part.len() <= 63 {
        return format!("{}{name_part}", keys::PREFIX);
    }
    let digest = content::hex(&sha2::Sha256::digest(id.name.as_bytes()));
    let head = name_part[..52].trim_end_matches(['-', '.']);
    format!("{}{head}-{}", keys::PREFIX, &digest[..10])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Under `secretChecksumKey` (one key for every namespace) the same
    /// value of `db` in two namespaces gets two checksums: a checksum read
    /// in `prod` confirms no guess made in `dev` (docs/security.md,
    /// finding 3). The uid-keyed checksum is one object's anyway.
    #[test]
    fn a_keyed_checksum_depends_on_the_namespace() {
        let keyed = Settings {
            secret_checksum_key: Some("one key for the cluster".into()),
            ..Settings::default()
        };
        let secret = |ns: &str| json!({"metadata": {"name": "db", "namespace": ns, "uid": "u-1"}});
        let hash = "0".repeat(64);
        let (prod, dev) = (
            secret_checksum(&keyed, &secret("prod"), &hash),
            secret_checksum(&keyed, &secret("dev"), &hash),
        );
        assert_ne!(prod, dev);
        assert_eq!(prod, secret_checksum(&keyed, &secret("prod"), &hash), "deterministic");
        let by_uid = Settings::default();
        assert_eq!(
            secret_checksum(&by_uid, &secret("prod"), &hash),
            secret_checksum(&by_uid, &secret("dev"), &hash),
            "the uid decides"
        );
    }
}
