use super::keyring::KeyringError;
use super::*;
use base64::Engine as _;
use config_snapshot_policy::model::content::snapshot_object;
use config_snapshot_policy::model::source::SourceId;
use serde_json::json;

const KEY: &[u8] = b"a test key of thirty-two bytes!!";
const OTHER: &[u8] = b"another key, also thirty-two by!";

fn prover() -> Prover {
    Prover::new(KEY)
}

fn made_in(p: &Prover, namespace: &str, kind: SourceKind, data: Value) -> Value {
    let content = Content::from_object(kind, &json!({ "data": data })).unwrap();
    let name = p.snapshot_name(namespace, "app", &content);
    let mut object = snapshot_object(&SourceId::new(kind, "app"), namespace, &name, "7", &content);
    p.sign(&mut object);
    object
}

fn made(p: &Prover, kind: SourceKind, data: Value) -> Value {
    made_in(p, "shop", kind, data)
}

#[test]
fn what_the_host_signed_verifies_and_nothing_forged_does() {
    let p = prover();
    let good = made(&p, SourceKind::ConfigMap, json!({"mode": "blue"}));
    assert_eq!(p.verify(&good), Ok(()));
    let mut relabelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-proxy", "namespace": "kube-system",
                     "labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE}},
        "data": {"config": "x"}});
    assert_eq!(
        p.verify(&relabelled),
        Err(Unproven::Mutable),
        "a labelled real ConfigMap"
    );
    relabelled["immutable"] = json!(true);
    assert_eq!(p.verify(&relabelled), Err(Unproven::NoSource));
    // Another key's signature does not verify.
    let other = Prover::new(OTHER);
    assert_eq!(
        other.verify(&good),
        Err(Unproven::Name),
        "another installation's snapshot: named by another key"
    );
    let mut copied = good.clone();
    copied["metadata"]["annotations"][SIGNATURE] = json!(other.signature_of("ConfigMap", "shop", "x", "app", "y"));
    assert_eq!(p.verify(&copied), Err(Unproven::Signature));
    // The name (and the signature) bound to one namespace fail in another.
    let mut moved = good.clone();
    moved["metadata"]["namespace"] = json!("kube-system");
    assert_eq!(p.verify(&moved), Err(Unproven::Name));
    // Data that is not what the hash says.
    let mut tampered = good.clone();
    tampered["data"]["mode"] = json!("green");
    assert_eq!(p.verify(&tampered), Err(Unproven::Content));
    let mut unsigned = good.clone();
    unsigned["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(SIGNATURE);
    assert_eq!(p.verify(&unsigned), Err(Unproven::Unsigned));
}

/// A snapshot's name is keyed: the same content gets another name under
/// another key, for another source, or in another namespace (a name read
/// in `prod` is no oracle in `dev`), and the plain SHA-256 of a Secret's
/// content appears nowhere on it.
#[test]
fn names_are_keyed_per_namespace_and_a_secret_carries_no_plain_hash() {
    let p = prover();
    let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
    let name = p.snapshot_name("prod", "db", &content);
    assert!(!name.contains(&content.hash()[..10]), "{name}");
    assert_ne!(Prover::new(OTHER).snapshot_name("prod", "db", &content), name);
    assert_ne!(p.snapshot_name("prod", "other-db", &content), name);
    assert_ne!(p.snapshot_name("dev", "db", &content), name, "per namespace");
    assert_eq!(p.snapshot_name("prod", "db", &content), name, "deterministic");
    let secret = made_in(&p, "prod", SourceKind::Secret, json!({"pw": "aHVudGVyMg=="}));
    assert_eq!(p.verify(&secret), Ok(()));
    let text = secret.to_string();
    assert!(!text.contains(&content.hash()), "no unkeyed hash on it: {text}");
    assert!(!secret.has_annotation(keys::CONTENT_HASH));
    // A ConfigMap's too (whoever learned the door could otherwise have
    // serve name any namespace's content by its plain hash), the same
    // content of a Secret and a ConfigMap of one name apart.
    let cm = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
    let named = p.snapshot_name("prod", "app", &cm);
    assert_ne!(named, snapshot_name("app", &cm.hash()), "not the plain hash's");
    assert_ne!(p.snapshot_name("dev", "app", &cm), named, "per namespace");
    assert_ne!(Prover::new(OTHER).snapshot_name("prod", "app", &cm), named, "per key");
    let as_secret = Content {
        kind: SourceKind::Secret,
        type_: "Opaque".into(),
        ..cm.clone()
    };
    assert_ne!(
        p.name_for(SourceKind::Secret, "prod", "app", &cm.hash()),
        named,
        "per kind ({as_secret:?})"
    );
    // The full content hash stays on a ConfigMap snapshot, for whoever may
    // read it: they can read its data anyway.
    let made = made_in(&p, "prod", SourceKind::ConfigMap, json!({"a": "1"}));
    assert_eq!(made.annotation(keys::CONTENT_HASH), Some(cm.hash().as_str()));
}

/// ConfigMap snapshots named by the plain hash (before their names were
/// keyed) stay proven, and the host names them as aliases of the content:
/// upgrading renames nothing, so no template changes.
#[test]
fn plain_configmap_names_of_earlier_versions_stay_valid() {
    let p = prover();
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"mode": "blue"}})).unwrap();
    let plain = snapshot_name("app", &content.hash());
    let names = p.names_for(SourceKind::ConfigMap, "shop", "app", &content.hash());
    assert_eq!(names[0], p.snapshot_name("shop", "app", &content));
    assert!(names.contains(&plain), "{names:?}");
    let mut old = snapshot_object(
        &SourceId::new(SourceKind::ConfigMap, "app"),
        "shop",
        &plain,
        "7",
        &content,
    );
    p.sign(&mut old);
    assert_eq!(p.verify(&old), Ok(()));
}

/// Secret snapshots named by earlier schemes stay proven: keyed without
/// the namespace (c7d6a24's), and unkeyed (before names were keyed).
/// Upgrading renames nothing, so no template changes.
#[test]
fn names_of_earlier_schemes_stay_valid() {
    let p = prover();
    let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
    let hash = content.hash();
    let v1 = snapshot_name("app", &mac_with(p.ring().current(), &[SECRET_NAME_V1, "app", &hash]));
    let plain = snapshot_name("app", &hash);
    let names = p.names_for(SourceKind::Secret, "shop", "app", &hash);
    assert_eq!(names[0], p.snapshot_name("shop", "app", &content));
    assert!(names.contains(&v1) && names.contains(&plain), "{names:?}");
    for name in [v1, plain] {
        let mut old = snapshot_object(&SourceId::new(SourceKind::Secret, "app"), "shop", &name, "7", &content);
        // As those versions made them: with the content hash.
        old["metadata"]["annotations"][keys::CONTENT_HASH] = json!(hash);
        p.sign(&mut old);
        assert_eq!(p.verify(&old), Ok(()), "{name}");
        let mut lying = old.clone();
        lying["metadata"]["annotations"][keys::CONTENT_HASH] = json!("0".repeat(64));
        assert_eq!(p.verify(&lying), Err(Unproven::Content));
    }
}

/// After a rotation the new key signs and names, and what the old one
/// signed still verifies; a ring that lost the old key no longer
/// proves it.
#[test]
fn a_rotated_ring_still_proves_what_its_older_keys_signed() {
    let old = Keyring::of(KEY).unwrap();
    let p = Prover::with(&old);
    let before = made(&p, SourceKind::Secret, json!({"pw": "b2xk"}));
    let rotated = old.rotated(Zeroizing::new(OTHER.to_vec())).unwrap();
    p.replace(&rotated);
    assert_eq!(p.key_ids(), vec![Keyring::id(OTHER), Keyring::id(KEY)]);
    assert_eq!(p.verify(&before), Ok(()), "signed and named by the old key");
    let after = made(&p, SourceKind::Secret, json!({"pw": "b2xk"}));
    assert_ne!(
        after["metadata"]["name"], before["metadata"]["name"],
        "the new key names"
    );
    assert_eq!(p.verify(&after), Ok(()));
    assert!(Prover::new(KEY).verify(&after).is_err(), "another installation's");
    p.replace(&Keyring::of(OTHER).unwrap());
    assert!(p.verify(&before).is_err(), "the old key gone: unproven, left alone");
    assert_eq!(Keyring::of(b"short").err(), Some(KeyringError::Short(5)));
    assert_eq!(
        rotated.merged(&old).unwrap().ids(),
        rotated.ids(),
        "a restore adds no key twice"
    );
}

/// Nothing is ours because of when it was made: an unsigned snapshot
/// is unproven, whatever its age, and only listed as unsigned.
#[test]
fn an_unsigned_snapshot_is_never_ours() {
    let p = prover();
    let mut old = made(&p, SourceKind::ConfigMap, json!({"mode": "blue"}));
    old["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(SIGNATURE);
    old["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
    assert!(!p.ours(&old) && p.forged(&old));
    assert!(p.unsigned(&old));
    let mut mutable = old.clone();
    mutable["immutable"] = json!(false);
    assert!(!p.unsigned(&mutable));
    p.sign(&mut old);
    assert!(p.proves(&old) && !p.unsigned(&old));
}

/// serve's cache keeps a source without its data: a keyed digest in
/// its place, and the verdict on its proof, which stand for them.
#[test]
fn a_digested_source_keeps_no_data_and_stands_for_it() {
    let p = prover();
    let ours = made(&p, SourceKind::Secret, json!({"pw": "aHVudGVyMg=="}));
    let kept = p.digested(&ours);
    assert!(kept.get("data").is_none() && digested(&kept), "{kept}");
    assert!(!kept.to_string().contains("aHVudGVyMg=="));
    assert_eq!(p.verify(&kept), Ok(()), "proven as it was cached");
    let content = Content::from_object(SourceKind::Secret, &ours).unwrap();
    assert!(p.holds(&kept, &content) && p.holds(&ours, &content));
    let other = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "eA=="}})).unwrap();
    assert!(!p.holds(&kept, &other));
    let mut forged = ours.clone();
    forged["metadata"]["annotations"][SIGNATURE] = json!("00");
    assert!(p.forged(&p.digested(&forged)), "a forgery stays one");
    let plain = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "data": {"pw": "eA=="}});
    assert!(!keys::is_snapshot(&p.digested(&plain)) && p.verify(&p.digested(&plain)).is_err());
}

/// Finding 6 of eff3694's review: a Secret applied client-side (`kubectl
/// apply`, Argo CD's default sync) carries its whole manifest, its
/// `stringData` in plain text, in an annotation, which the cache kept with
/// the rest of its metadata. Its cached copy keeps what its readers need,
/// config-snapshot's own annotations among it, and nothing else.
#[test]
fn a_digested_source_keeps_only_what_its_readers_need() {
    const CANARY: &str = "digested-canary-7f1c";
    let p = prover();
    let encoded = base64::engine::general_purpose::STANDARD.encode(CANARY);
    let manifest = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app"},
                          "stringData": {"password": CANARY}})
    .to_string();
    let mut secret = made(&p, SourceKind::Secret, json!({"password": encoded}));
    let owner = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r"}]);
    let metadata = secret["metadata"].as_object_mut().unwrap();
    metadata.insert("uid".into(), json!("u"));
    metadata.insert("creationTimestamp".into(), json!("2030-01-01T00:00:00Z"));
    metadata.insert("ownerReferences".into(), owner.clone());
    metadata.insert("finalizers".into(), json!([format!("example.com/{CANARY}")]));
    metadata.insert(
        "managedFields".into(),
        json!([{"manager": "kubectl", "fieldsV1": {CANARY: {}}}]),
    );
    let annotations = metadata["annotations"].as_object_mut().unwrap();
    annotations.insert(keys::LAST_APPLIED.into(), json!(manifest));
    annotations.insert("example.com/copy".into(), json!(encoded));
    let mut said: Vec<String> = annotations
        .keys()
        .filter(|k| k.starts_with(keys::PREFIX))
        .cloned()
        .collect();
    said.sort();
    assert!(said.len() >= 3, "a snapshot's own annotations: {said:?}");
    let kept = p.digested(&secret);
    let text = kept.to_string();
    assert!(
        !text.contains(CANARY) && !text.contains(&encoded),
        "the cache holds the Secret's value: {kept}"
    );
    let annotations = kept["metadata"]["annotations"].as_object().unwrap();
    let mut names: Vec<&String> = annotations.keys().collect();
    names.sort();
    assert_eq!(
        names,
        said.iter().collect::<Vec<_>>(),
        "config-snapshot's own, and only those"
    );
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "labels",
    ] {
        assert_eq!(kept["metadata"][field], secret["metadata"][field], "{field}");
    }
    assert_eq!(kept["metadata"]["ownerReferences"], owner);
    assert_eq!(p.verify(&kept), Ok(()), "still proven");
    let content = Content::from_object(SourceKind::Secret, &secret).unwrap();
    assert!(p.holds(&kept, &content));
    assert!(keys::snapshot_source(&kept).is_some(), "still a snapshot of its source");
}

#[test]
fn the_key_never_prints() {
    let p = prover();
    let printed = format!("{p:?} {:?}", Keyring::of(KEY).unwrap());
    assert!(!printed.contains("thirty"), "{printed}");
    assert!(printed.contains(&Keyring::id(KEY)), "{printed}");
}
