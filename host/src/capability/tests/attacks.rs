//! The capability attacked (docs/security.md): a guest, or a forged
//! review, asking for what no real admission of the object could cause.

use super::*;
use crate::cluster::proof::Prover;
use crate::lifecycle::Rules;
use config_snapshot_policy::model::content::snapshot_object;
use config_snapshot_policy::model::settings::Settings;
use std::num::NonZeroU32;

fn read(cap: &Capability, op: &str, body: Value) -> Result<Vec<u8>, HostError> {
    cap.answer("kubewarden", "kubernetes", op, &serde_json::to_vec(&body).unwrap())
}

fn secret_proposal(ns: &str, type_: &str, data: Value) -> Value {
    let content = Content::from_object(SourceKind::Secret, &json!({"type": type_, "data": data})).unwrap();
    let name = Prover::replay().snapshot_name(ns, "creds", &content);
    snapshot_object(&SourceId::new(SourceKind::Secret, "creds"), ns, &name, "3", &content)
}

/// A guest reads only the request's namespace.
#[test]
fn guest_reads_stay_in_the_request_namespace() {
    let (backend, cap) = capability(false);
    backend.put(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bootstrap", "namespace": "kube-system"}, "data": {"t": "c2VjcmV0"}}));
    for (op, body) in [
        (
            "get_resource",
            json!({"api_version": "v1", "kind": "Secret", "name": "bootstrap", "namespace": "kube-system",
                "disable_cache": true}),
        ),
        (
            "list_resources_by_namespace",
            json!({"api_version": "v1", "kind": "Secret", "namespace": "kube-system"}),
        ),
    ] {
        let err = read(&cap, op, body).unwrap_err();
        assert_eq!(err.code, Code::Refused, "{op}: {err}");
        assert!(!err.message.contains("c2VjcmV0"));
    }
    let err = write(
        &cap,
        "list_referencing",
        json!({"kind": "Deployment", "namespace": "kube-system", "source_kind": "Secret", "source_name": "bootstrap"}),
    )
    .unwrap_err();
    assert_eq!(err.code, Code::Refused, "{err}");
}

/// An object that carries our label, is immutable and is even named for
/// its content, but that the host did not sign: the guest sees it
/// unlabelled, it is never deleted, and it is never reused as a snapshot.
#[test]
fn a_forged_label_is_not_a_snapshot() {
    let (backend, cap) = capability(false);
    let mut forged = good_snapshot("team-a");
    forged["metadata"]["uid"] = json!("forged-uid");
    forged["metadata"]["resourceVersion"] = json!("5");
    backend.put(forged.clone());
    let name = name_of(&forged);
    let err = write(
        &cap,
        "delete_snapshot",
        json!({"kind": "ConfigMap", "name": name, "uid": "forged-uid", "resourceVersion": "5"}),
    )
    .unwrap_err();
    assert_eq!(err.code, Code::Refused, "{err}");
    assert!(
        backend.cluster.get("ConfigMap", "team-a", &name).unwrap().is_some(),
        "kept"
    );
    let seen: Value = serde_json::from_slice(
        &read(
            &cap,
            "get_resource",
            json!({"api_version": "v1", "kind": "ConfigMap", "name": name, "namespace": "team-a",
                "disable_cache": false}),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(
        !keys::is_snapshot(&seen),
        "the guest sees it as a plain ConfigMap: {seen}"
    );
    let listed: Value = serde_json::from_slice(
        &read(
            &cap,
            "list_resources_by_namespace",
            json!({"api_version": "v1", "kind": "ConfigMap", "namespace": "team-a",
            "label_selector": format!("{}={}", keys::MANAGED_BY, keys::MANAGED_BY_VALUE)}),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(listed["items"], json!([]), "a selector on our label does not find it");
    let err = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap_err();
    assert_eq!(err.code, Code::Refused, "not reused: {err}");
    assert!(backend.writes.lock().unwrap().is_empty());
    // Signed, the same object is ours.
    backend.put(signed(forged));
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
}

/// A Secret snapshot is Opaque or its source's own type, never one that
/// has the API server mint a credential into it.
#[test]
fn a_snapshot_secret_is_never_a_token() {
    let (backend, cap) = capability(false);
    backend.put(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "creds", "namespace": "team-a"}, "data": {"tls.crt": "YQ==", "tls.key": "Yg=="}}),
    );
    for type_ in [
        "kubernetes.io/service-account-token",
        "bootstrap.kubernetes.io/token",
        "kubernetes.io/dockerconfigjson",
    ] {
        let proposal = secret_proposal("team-a", type_, json!({"tls.crt": "YQ==", "tls.key": "Yg=="}));
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": proposal})),
            &backend,
            &cap,
            type_,
        );
    }
    for type_ in ["kubernetes.io/tls", "Opaque"] {
        let proposal = secret_proposal("team-a", type_, json!({"tls.crt": "YQ==", "tls.key": "Yg=="}));
        write(&cap, "create_snapshot", json!({"object": proposal})).unwrap();
    }
}

/// A Secret snapshot's name must be the keyed one: the plain SHA-256
/// name a guest (or a stock host) would compute is refused, and the
/// name the host gives reveals nothing of the content's plain hash.
#[test]
fn secret_snapshot_names_are_keyed() {
    let (backend, cap) = capability(false);
    let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
    let (plain_name, plain) = plain_snapshot(&SourceId::new(SourceKind::Secret, "creds"), "team-a", "1", &content);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": plain})),
        &backend,
        &cap,
        "plain name",
    );
    let answer: Value = serde_json::from_slice(
        &write(
            &cap,
            "snapshot_name",
            json!({"source": {"kind": "Secret", "name": "creds"}, "contentHash": content.hash()}),
        )
        .unwrap(),
    )
    .unwrap();
    let keyed = answer["name"].as_str().unwrap();
    assert_ne!(keyed, plain_name);
    assert!(!keyed.contains(&content.hash()[..10]), "{keyed}");
}

/// Snapshot creation per namespace has a budget; a refused creation
/// writes nothing.
#[test]
fn snapshot_creation_past_the_budget_is_refused() {
    let backend = Arc::new(Recorder::default());
    let cap =
        capability_on(backend.clone(), false).with_budget(Arc::new(Budget::per_minute(NonZeroU32::new(2).unwrap())));
    let source = |v: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": "team-a"}, "data": {"k": v}})
    };
    for v in ["1", "2"] {
        backend.put(source(v));
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": v}})).unwrap();
        let proposal = proposal(&SourceId::new(SourceKind::ConfigMap, "app"), "team-a", &content);
        write(&cap, "create_snapshot", json!({"object": proposal})).unwrap();
    }
    backend.put(source("v"));
    let err = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap_err();
    assert_eq!(err.code, Code::TooLarge, "{err}");
    assert_eq!(backend.writes.lock().unwrap().len(), 2);
}

/// Finding 1 of docs/security.md: what serve writes comes only from what
/// the API server stored. A proposal whose content the source does not
/// hold (a forged review's, or a refused write's) is refused and writes
/// nothing; a key subset of what is stored is made. During a source's own
/// review nothing is made at all: its content is not stored yet.
#[test]
fn a_snapshot_is_made_only_of_stored_content() {
    let (backend, cap) = capability(false);
    let forged = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "never written"}})).unwrap();
    let never_stored = proposal(&SourceId::new(SourceKind::ConfigMap, "app"), "team-a", &forged);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": never_stored})),
        &backend,
        &cap,
        "content never stored",
    );
    let missing = proposal(&SourceId::new(SourceKind::ConfigMap, "ghost"), "team-a", &forged);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": missing})),
        &backend,
        &cap,
        "a source that does not exist",
    );
    // The stored source holds {k: v, other: o}: the key a template reads.
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();

    let reviewing_the_source = Capability {
        caller: Caller {
            subject: Subject {
                kind: "ConfigMap".into(),
                name: "app".into(),
                operation: "UPDATE".into(),
                ..Subject::default()
            },
            ..cap.caller.clone()
        },
        ..capability_on(backend.clone(), false)
    };
    let before = backend.writes.lock().unwrap().len();
    let err = write(
        &reviewing_the_source,
        "create_snapshot",
        json!({"object": good_snapshot("team-a")}),
    )
    .unwrap_err();
    assert_eq!(err.code, Code::Refused, "{err}");
    assert_eq!(backend.writes.lock().unwrap().len(), before, "nothing written");
}

/// In a namespace the webhook excludes, the host writes nothing, whoever
/// asks.
#[test]
fn an_excluded_namespace_gets_no_writes() {
    let backend = Arc::new(Recorder::default());
    let rules = Rules {
        excluded_namespaces: vec!["kube-system".into()],
        ..Rules::new(Settings::default(), Arc::new(Prover::replay()))
    };
    let caller = Caller {
        uid: "forged".into(),
        namespace: "kube-system".into(),
        dry_run: false,
        subject: Default::default(),
    };
    let cap = Capability::new(
        backend.clone(),
        caller,
        Arc::new(rules),
        Arc::default(),
        Arc::new(crate::lifecycle::Silent),
    );
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": good_snapshot("kube-system")})),
        &backend,
        &cap,
        "excluded",
    );
}

/// Round 3, finding 6: a revision that names snapshots stages an adoption
/// only for those that exist (and are the host's): one naming made-up
/// snapshots takes no place in the effect queue. Before, each such review
/// queued an adoption that waited and retried for 30 s.
#[test]
fn an_adoption_of_snapshots_that_do_not_exist_stages_nothing() {
    let (backend, cap) = capability(false);
    let made_up = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"kind": "ConfigMap", "name": format!("app-{i:010x}")}))
            .collect()
    };
    let answer = write(
        &cap,
        "adopt",
        json!({"owner": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1"}, "snapshots": made_up(64)}),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&answer).unwrap(),
        json!({"queued": false})
    );
    assert!(cap.take_staged().is_empty(), "an adoption of nothing was queued");
    // An unsigned look-alike is not one either.
    let mut forged = good_snapshot("team-a");
    forged["metadata"]["uid"] = json!("forged-uid");
    backend.put(forged.clone());
    write(
        &cap,
        "adopt",
        json!({"owner": {"kind": "ReplicaSet", "name": "web-1"}, "snapshots": [{"kind": "ConfigMap", "name": name_of(&forged)}]}),
    )
    .unwrap();
    assert!(cap.take_staged().is_empty(), "a look-alike's adoption was queued");
    // A real one is adopted, and only it.
    backend.put(signed(good_snapshot("team-a")));
    let mut snapshots = made_up(3);
    snapshots.push(json!({"kind": "ConfigMap", "name": name_of(&good_snapshot("team-a"))}));
    write(
        &cap,
        "adopt",
        json!({"owner": {"kind": "ReplicaSet", "name": "web-1"}, "snapshots": snapshots}),
    )
    .unwrap();
    let staged = cap.take_staged();
    assert!(
        matches!(&staged[..], [Effect::Adopt { snapshots, .. }] if snapshots.len() == 1),
        "{staged:?}"
    );
}

/// A request that is not the operation's is refused as such, and its
/// message does not carry the guest's value back whole: serve logs it.
#[test]
fn a_malformed_request_is_refused_without_echoing_it() {
    let (backend, cap) = super::capability(false);
    let long = "s3cr3t".repeat(2000);
    for (op, body) in [
        ("adopt", json!({"owner": long, "snapshots": []})),
        (
            "delete_snapshot",
            json!({"kind": "ConfigMap", "name": "app", "uid": {"x": long}}),
        ),
        ("patch_workload", json!({"apiVersion": "apps/v1", "kind": long})),
    ] {
        let err = super::write(&cap, op, body).unwrap_err();
        assert_eq!(err.code, Code::BadRequest, "{op}: {err}");
        assert!(err.message.starts_with(&format!("invalid {op} request: ")), "{err}");
        assert!(err.message.chars().count() < 200, "{op}: {} chars", err.message.len());
    }
    // Duplicates do not slip under the bound on a watch rollout's keys.
    let keys: Vec<&str> = vec!["k"; 1025];
    let patch = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "patch": [],
        "snapshot": "app-1", "keys": keys,
        "source": {"kind": "ConfigMap", "name": "app", "contentHash": "a".repeat(64)}});
    let err = super::write(&cap, "patch_workload", patch).unwrap_err();
    assert_eq!(err.code, Code::Refused, "{err}");
    assert!(backend.writes.lock().unwrap().is_empty());
    assert!(cap.take_staged().is_empty());
}

/// A guest cannot shield its watch rollout from a rollback: the count of
/// rollbacks the patch saw is the workload's at most, whatever it claims.
#[test]
fn a_patch_never_saw_more_rollbacks_than_the_workload_had() {
    let (backend, cap) = super::capability(false);
    let record = json!({"generation": 4, "count": 2, "at": "2026-01-01T00:00:00Z", "sources": {}});
    backend.put(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a", "uid": "w1",
                     "annotations": {keys::ROLLBACK: record.to_string()}}}));
    let patch = |name: &str, rollbacks: u64| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "patch": [],
            "rollbacks": rollbacks, "snapshot": "app-1",
            "source": {"kind": "ConfigMap", "name": "app", "contentHash": "a".repeat(64)}})
    };
    for (name, claimed, kept) in [("web", u64::MAX, 2), ("web", 3, 2), ("web", 1, 1), ("gone", 7, 0)] {
        super::write(&cap, "patch_workload", patch(name, claimed)).unwrap();
        let staged = cap.take_staged();
        let [Effect::Patch(intent)] = &staged[..] else {
            panic!("{staged:?}");
        };
        assert_eq!(intent.rollbacks, kept, "{name} claimed {claimed}");
    }
}

/// Finding 9 of eff3694's review: the host deleted whatever proven
/// snapshot a guest asked it to, named or not. Whatever the guest asks, a
/// snapshot a workload, a revision or a Pod of its namespace names stays;
/// an unused one may still go.
#[test]
fn a_snapshot_in_use_is_never_deleted_whatever_the_guest_asks() {
    let (backend, cap) = capability(false);
    let template = |snapshot: &str| json!({"spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": snapshot}}]}]}});
    let snapshot = |n: u32| {
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": format!("v{n}")}})).unwrap();
        let name = Prover::replay().snapshot_name("team-a", "app", &content);
        let mut object = snapshot_object(
            &SourceId::new(SourceKind::ConfigMap, "app"),
            "team-a",
            &name,
            "1",
            &content,
        );
        object["metadata"]["uid"] = json!(format!("snap-{n}"));
        let object = signed(object);
        backend.put(object.clone());
        (name, format!("snap-{n}"))
    };
    let holders = [
        ("apps/v1", "Deployment", true),
        ("apps/v1", "ReplicaSet", true),
        ("v1", "Pod", false),
    ];
    for (i, (api_version, kind, templated)) in holders.into_iter().enumerate() {
        let (name, uid) = snapshot(u32::try_from(i).unwrap());
        let spec = if templated {
            json!({"template": template(&name)})
        } else {
            template(&name)["spec"].clone()
        };
        backend.put(json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": format!("holder-{i}"), "namespace": "team-a", "uid": format!("h{i}")},
            "spec": spec}));
        let err = write(
            &cap,
            "delete_snapshot",
            json!({"kind": "ConfigMap", "name": name, "uid": uid}),
        )
        .unwrap_err();
        assert_eq!(err.code, Code::Refused, "named by a {kind}: {err}");
        assert!(err.message.contains("is named by"), "{err}");
        assert!(
            backend.cluster.get("ConfigMap", "team-a", &name).unwrap().is_some(),
            "{kind}"
        );
    }
    assert!(backend.writes.lock().unwrap().is_empty());
    let (unused, uid) = snapshot(9);
    write(
        &cap,
        "delete_snapshot",
        json!({"kind": "ConfigMap", "name": unused, "uid": uid}),
    )
    .expect("an unused snapshot goes");
    assert!(backend.cluster.get("ConfigMap", "team-a", &unused).unwrap().is_none());
}

/// Review of issue 63, finding 7: an admission that is told its revision's
/// adoption is queued gets a place the queue keeps; with none left for its
/// namespace, the revision is refused (its controller retries) rather than
/// created with an adoption that is then dropped.
#[test]
fn an_adoption_without_a_place_is_refused_not_promised() {
    use crate::lifecycle::{InFlight, Places};
    let backend = Arc::new(super::Recorder::default());
    let bounded = Arc::new(InFlight::bounded(Places::of(4)));
    let cap = Capability::new(
        backend.clone(),
        Caller {
            uid: "r".into(),
            namespace: "team-a".into(),
            dry_run: false,
            subject: Default::default(),
        },
        Arc::new(Rules::new(Settings::default(), Arc::new(Prover::replay()))),
        bounded.clone(),
        Arc::new(crate::lifecycle::Silent),
    );
    backend.put(signed(good_snapshot("team-a")));
    let adopt = || {
        write(
            &cap,
            "adopt",
            json!({"owner": {"kind": "ReplicaSet", "name": "web-1"},
                   "snapshots": [{"kind": "ConfigMap", "name": name_of(&good_snapshot("team-a"))}]}),
        )
    };
    // The namespace's one place (a quarter of four) is taken.
    let first = {
        adopt().unwrap();
        cap.take_staged().pop().unwrap()
    };
    bounded.begin(&first);
    let err = adopt().unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{err}");
    assert!(cap.take_staged().is_empty(), "an adoption without a place was staged");
    // Once it is over, the next is promised again.
    bounded.end(&first);
    adopt().unwrap();
    assert_eq!(cap.take_staged().len(), 1);
    // Other namespaces filling the whole queue do not get this one's
    // revisions refused (second review, finding 3): only its own share does.
    let others: Vec<Effect> = ["b", "c", "d", "e"]
        .iter()
        .map(|ns| {
            let mut other = first.clone();
            if let Effect::Adopt { namespace, .. } = &mut other {
                *namespace = (*ns).to_string();
            }
            bounded.begin(&other);
            other
        })
        .collect();
    assert_eq!(bounded.room("team-a"), crate::lifecycle::Room::Full);
    adopt().unwrap();
    assert_eq!(
        cap.take_staged().len(),
        1,
        "a full queue refused a namespace holding nothing"
    );
    others.iter().for_each(|o| {
        bounded.end(o);
    });
}

/// Review "Contained", finding 2: the sources one admission reads fresh
/// are kept for its snapshots, and a template naming 64 large ones would
/// have serve keep them all, many times the review's own body. What is
/// kept stays within the limit; a read past it is refused (`TooLarge`),
/// naming the limit and nothing of the content, and keeps nothing more.
#[test]
fn the_sources_an_admission_keeps_stay_within_its_limit() {
    const LIMIT: usize = 10_000;
    let backend = Arc::new(Recorder::default());
    let cap = capability_on(backend.clone(), false).holding_at_most(LIMIT);
    let data: serde_json::Map<String, Value> = (0..500).map(|i| (format!("k{i}"), json!("secret-ish"))).collect();
    for i in 0..64 {
        backend.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("big-{i}"), "namespace": "team-a"}, "data": data}));
    }
    let mut refused = 0;
    for i in 0..64 {
        let got = read(
            &cap,
            "get_resource",
            json!({"api_version": "v1", "kind": "ConfigMap", "name": format!("big-{i}"),
                "namespace": "team-a", "disable_cache": true}),
        );
        if let Err(err) = got {
            assert_eq!(err.code, Code::TooLarge, "{err}");
            assert!(err.message.contains(&LIMIT.to_string()), "{err}");
            assert!(
                !err.message.contains("secret-ish") && !err.message.contains("big-"),
                "{err}"
            );
            refused += 1;
        }
    }
    let kept = cap.stored.lock().unwrap();
    let held: usize = kept.values().map(crate::cluster::count::of).sum();
    assert!(held <= LIMIT, "{held} values kept");
    assert!(!kept.is_empty() && refused == 64 - kept.len(), "{refused} refused");
}
