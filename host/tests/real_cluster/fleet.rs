//! Two serve replicas with `--leader-elect` on a real Lease of the real
//! kube-apiserver, behind one webhook address (a TCP proxy in front of both,
//! as a Service is in a cluster), and the leader killed with SIGKILL in the
//! middle of a storm of source edits it admitted itself, holding their
//! rollouts in its queue. The survivor takes the Lease once it goes
//! unrenewed, its resync derives the lost rollout, and within the resync
//! interval + the lease + the storm guard + slack:
//! - no rollout is lost: the workload runs the storm's last edit;
//! - none is repeated beyond the storm guard: the rollouts (the Deployment
//!   controller's ReplicaSets) are the guard's interval apart, each to a
//!   content of its own;
//! - nothing dangles, and the garbage is collected.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicUsize;

use super::*;

/// How long an unrenewed Lease stays held (the failover's floor).
const LEASE_SECS: u64 = 3;
/// serve_flags's resync interval.
const RESYNC_SECS: u64 = 5;
/// The storm the leader admits, then the edits the survivor admits.
const EDITS: usize = 12;
const AFTER: usize = 3;

/// One address in front of several replicas, as a Service's endpoints are:
/// a new connection goes to the preferred replica, or the next one that
/// accepts it. kube-apiserver keeps its connection to a webhook open, so
/// admissions stay with one replica until that one dies.
struct Proxy {
    address: SocketAddr,
    preferred: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(backends: Vec<SocketAddr>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let preferred = Arc::new(AtomicUsize::new(0));
        let first = preferred.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let start = first.load(Ordering::SeqCst);
                let upstream = (0..backends.len())
                    .map(|i| backends[(start + i) % backends.len()])
                    .find_map(|to| TcpStream::connect_timeout(&to, Duration::from_secs(1)).ok());
                let Some(upstream) = upstream else { continue };
                pipe(client, upstream);
            }
        });
        Proxy { address, preferred }
    }

    fn prefer(&self, index: usize) {
        self.preferred.store(index, Ordering::SeqCst);
    }
}

/// Copies bytes both ways until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    for (mut from, mut to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Both);
            let _ = from.shutdown(std::net::Shutdown::Both);
        });
    }
}

const LEADER: &str = "config_snapshot_leader ";

/// Waits until exactly one of `replicas` leads; answers which.
fn one_leader(replicas: &[ServeProcess]) -> usize {
    eventually("one leader on the real Lease", 60, || {
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|&i| replicas[i].metric(LEADER) == 1.0)
            .collect();
        (leading.len() == 1).then(|| leading[0])
    })
}

fn edit(cp: &ControlPlane, ns: &str, n: usize) {
    cp.apply(ns, &config_map("app-config", json!({"edit": n.to_string()})));
}

/// The Deployment's rollouts: its ReplicaSets after the first, in order of
/// creation, as (creation time, the snapshot of app-config it pins).
fn rollouts(cp: &ControlPlane, ns: &str) -> Vec<(String, String)> {
    let view = cp.objects(ns);
    let mut sets: Vec<(String, String)> = view
        .0
        .iter()
        .filter(|o| o["kind"] == "ReplicaSet")
        .map(|rs| {
            (
                rs["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                env_ref(rs),
            )
        })
        .collect();
    sets.sort();
    sets.split_off(1.min(sets.len()))
}

/// The watch rollouts the replicas made, in time order: (unix seconds,
/// snapshot), from serve's own log line, written once the API server
/// accepted the patch. Not the ReplicaSets: the Deployment controller makes
/// one for the template it finds when it syncs, so a slow controller skips
/// some and bunches the others.
fn patches(replicas: &[ServeProcess]) -> Vec<(f64, String)> {
    let mut out: Vec<(f64, String)> = replicas
        .iter()
        .flat_map(|r| {
            r.logs()
                .lines()
                .filter_map(|line| {
                    let entry: Value = serde_json::from_str(line).ok()?;
                    let snapshot = entry["message"]
                        .as_str()?
                        .strip_prefix("watch: rolling out Deployment/web to ")?;
                    let timestamp = entry["timestamp"].as_str()?;
                    let whole = config_snapshot_policy::model::duration::parse_rfc3339(timestamp)? as f64;
                    let fraction: f64 = timestamp
                        .split_once('.')
                        .and_then(|(_, f)| format!("0.{}", f.trim_end_matches('Z')).parse().ok())
                        .unwrap_or(0.0);
                    Some((whole + fraction, snapshot.to_string()))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The story; `serve` (the single replica the other stories use) is
/// stopped for it and started again, registered as before, after it.
pub fn leader_killed_mid_storm(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path, ns: &str) {
    cp.namespace(ns);
    serve.stop();
    // The shortest orphan grace accepted, so that the collection of the
    // storm's unused snapshots is seen within the story.
    let settings = r#"{"orphanGracePeriod": "1m"}"#;
    let mut flags = serve_flags(settings);
    flags.extend([
        // The shipped Lease: RBAC grants its get and patch by name.
        "--leader-elect",
        "--lease-duration",
        "3s",
    ]);
    let mut replicas: Vec<ServeProcess> = (0..2)
        .map(|_| {
            let mut r = ServeProcess::start(kubeconfig, &flags);
            r.wait_ready();
            r
        })
        .collect();
    let leader = one_leader(&replicas);
    let survivor = 1 - leader;
    let proxy = Proxy::start(replicas.iter().map(|r| r.webhook).collect());
    // The leader admits the storm: its queue holds what the guard defers.
    proxy.prefer(leader);
    let ca = format!("{}{}", replicas[0].cert_pem, replicas[1].cert_pem);
    register_at(cp, proxy.address, &ca, yaml("deploy/serve/webhook.yaml").remove(0));
    webhook_answers(cp);

    edit(cp, ns, 0);
    let mut web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/watch": "app-config"}),
        "web:1",
        json!([{"configMapRef": {"name": "app-config"}}]),
        20,
    );
    web["spec"]["replicas"] = json!(0);
    cp.apply(ns, &web);
    settle(cp, ns);
    let generation = |cp: &ControlPlane| {
        cp.get(ns, "deployment", "web").unwrap()["metadata"]["generation"]
            .as_i64()
            .unwrap()
    };
    let before = generation(cp);
    let state = |replicas: &[ServeProcess]| {
        let logs: Vec<String> = replicas
            .iter()
            .map(|r| {
                r.logs()
                    .lines()
                    .filter(|l| l.contains(ns) || l.contains("lead"))
                    .map(String::from)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        format!(
            "rollouts: {:?}\nreplica logs:\n{}",
            rollouts(cp, ns),
            logs.join("\n---\n")
        )
    };

    for n in 1..=EDITS {
        edit(cp, ns, n);
    }
    // Right after the storm's last admission: the guard most likely holds
    // its rollout in the leader's queue, which dies with it.
    // The story is about a queue lost with its replica: the guard must
    // have held part of the storm on the leader.
    let held = replicas[leader].logs().matches("held by the storm guard").count();
    replicas[leader].stop();
    let killed = Instant::now();
    let killed_at = config_snapshot_policy::model::duration::unix_now();
    assert!(
        held > 0,
        "the storm never met the guard on the leader\n{}",
        state(&replicas)
    );
    // Resync interval + lease + guard interval + slack (the survivor's
    // relists after the failover, kubectl's own time).
    let bound = RESYNC_SECS + LEASE_SECS + INTERVAL_SECS + 20;
    let expected = json!({"edit": EDITS.to_string()});
    eventually_or(
        "the storm's last edit to roll out after the leader died",
        bound,
        || state(&replicas),
        || (effective(&cp.objects(ns), "Deployment", "web", ns, "configmap/app-config") == expected).then_some(()),
    );
    let took = killed.elapsed();
    // The leader may have let the last rollout go just before it died;
    // either way the survivor takes the Lease once it goes unrenewed.
    eventually_or(
        "the survivor to take the Lease",
        LEASE_SECS + RESYNC_SECS + 10,
        || state(&replicas),
        || (replicas[survivor].metric(LEADER) == 1.0).then_some(()),
    );
    let failover = killed.elapsed();
    eprintln!(
        "fleet: the last edit rolled out {took:?} after the leader was killed (bound {bound} s); the survivor led after {failover:?}"
    );

    // kube-apiserver's next connection goes to the survivor, which admits
    // and rolls out the edits that follow.
    for n in EDITS + 1..=EDITS + AFTER {
        edit(cp, ns, n);
    }
    let expected = json!({"edit": (EDITS + AFTER).to_string()});
    eventually_or(
        "the survivor to roll out the edits it admitted",
        RESYNC_SECS + INTERVAL_SECS + 20,
        || state(&replicas),
        || (effective(&cp.objects(ns), "Deployment", "web", ns, "configmap/app-config") == expected).then_some(()),
    );

    // Three resync passes later nothing more has moved.
    std::thread::sleep(Duration::from_secs(3 * RESYNC_SECS));
    settle(cp, ns);
    let mut done = patches(&replicas);
    // The killed leader's last patch may have been accepted with its log
    // line unwritten: then one ReplicaSet, made before the kill, pins a
    // snapshot no log names. It counts, at its creation time.
    let logged: BTreeSet<String> = done.iter().map(|(_, s)| s.clone()).collect();
    let unlogged: Vec<(String, String)> = rollouts(cp, ns)
        .into_iter()
        .filter(|(_, s)| !logged.contains(s))
        .collect();
    assert!(
        unlogged.len() <= 1,
        "rollouts no replica logged: {unlogged:?}\n{}",
        state(&replicas)
    );
    for (at, snapshot) in unlogged {
        let at = config_snapshot_policy::model::duration::parse_rfc3339(&at).expect("a creation time");
        assert!(
            at <= killed_at + 1,
            "{snapshot}: made after the kill, unlogged\n{}",
            state(&replicas)
        );
        done.push((at as f64, snapshot));
    }
    done.sort_by(|a, b| a.0.total_cmp(&b.0));
    let view = cp.objects(ns);
    assert_eq!(
        effective(&view, "Deployment", "web", ns, "configmap/app-config"),
        expected
    );
    // Every spec change was one watch rollout, each to a content of its
    // own (content-addressed: a content rolled out twice names its
    // snapshot twice).
    assert_eq!(
        (generation(cp) - before) as usize,
        done.len(),
        "a spec change that was not one watch rollout: {done:?}\n{}",
        state(&replicas)
    );
    let contents: BTreeSet<&String> = done.iter().map(|(_, s)| s).collect();
    assert_eq!(
        contents.len(),
        done.len(),
        "a content rolled out twice: {done:?}\n{}",
        state(&replicas)
    );
    assert!(!done.is_empty());
    // The guard held across both replicas (it holds a patch until a whole
    // second: one second of rounding).
    for pair in done.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= INTERVAL_SECS as f64 - 1.0,
            "two rollouts within the storm guard's interval: {done:?}\n{}",
            state(&replicas)
        );
    }
    no_dangling(&view, "after the failover");
    // The storm's unused snapshots go once the grace has passed.
    eventually_or(
        "the storm's unused snapshots to be collected",
        60 + 3 * RESYNC_SECS + 30,
        || state(&replicas),
        || {
            invariants::garbage_bounded(&cp.objects(ns).objects(), &Default::default())
                .is_empty()
                .then_some(())
        },
    );
    eprintln!(
        "fleet: {} rollouts for {} edits, the leader killed after edit {EDITS} (its guard had held {held} rollouts)",
        done.len(),
        EDITS + AFTER
    );

    // Back to the one replica the other stories use.
    drop(replicas);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    register(cp, serve, yaml("deploy/serve/webhook.yaml").remove(0));
    webhook_answers(cp);
    drop(proxy);
}
