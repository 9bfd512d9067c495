//! docs/serve.md's "Try it on a real control plane" recipe, run as a new
//! user would run it: its shell block, taken from the document, with the
//! cluster admin's kubeconfig (X.509 v3 client certificates: rustls
//! refuses v1). Only what a test must change is changed: the state
//! directory, the ports (free ones, not 9443/9080), the binaries already
//! built (the `make ... && cargo build` line), the control plane already
//! up (the `control-plane.sh up` line), and the pid kept to stop serve.

use std::process::Command;

use serde_json::json;

use super::support::process::{free_port, ServeProcess};
use super::{config_map, env_ref, eventually, register_at, root, workload, ControlPlane};

/// The recipe's serve, by pid: stopped when done, or when the test fails.
struct Stopped(String);

impl Stopped {
    fn stop(&self) {
        let _ = Command::new("kill").arg(&self.0).status();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The shell block of the recipe, as the document shows it.
fn documented_block() -> String {
    let doc = std::fs::read_to_string(root().join("docs/serve.md")).unwrap();
    let section = doc
        .split("## Try it on a real control plane")
        .nth(1)
        .expect("docs/serve.md has the recipe");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the recipe has a shell block");
    block.to_string()
}

pub fn documented_recipe(cp: &ControlPlane, serve: &ServeProcess) {
    let block = documented_block();
    let (webhook, metrics) = (free_port(), free_port());
    let binary = env!("CARGO_BIN_EXE_config-snapshot");
    let mut script = String::from("set -euo pipefail\n");
    let mut ran_serve = false;
    for line in block.lines() {
        if line.starts_with("make ") || line.contains("control-plane.sh up") {
            continue;
        }
        let line = line
            .replace("/tmp/cp", cp.dir.to_str().unwrap())
            .replace("target/release/config-snapshot", binary)
            .replace("127.0.0.1:9443", &format!("127.0.0.1:{webhook}"))
            .replace("127.0.0.1:9080", &format!("127.0.0.1:{metrics}"));
        ran_serve |= line.contains(binary);
        script.push_str(&line);
        script.push('\n');
    }
    assert!(ran_serve, "the recipe starts serve:\n{block}");
    let pid = cp.dir.join("recipe-serve.pid");
    let log = cp.dir.join("recipe-serve.log");
    script.push_str(&format!("echo $! > {}\n", pid.display()));
    let status = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(cp.dir.join("recipe-serve.err")).unwrap())
        .status()
        .unwrap();
    let serve_log = || {
        std::fs::read_to_string(&log).unwrap_or_default()
            + &std::fs::read_to_string(cp.dir.join("recipe-serve.err")).unwrap_or_default()
    };
    assert!(
        status.success(),
        "the documented recipe failed:\n{script}\n{}",
        serve_log()
    );
    let recipe_serve = Stopped(std::fs::read_to_string(&pid).unwrap().trim().to_string());
    let stop = || recipe_serve.stop();

    // serve as the cluster admin is ready once its caches have synced: the
    // admin certificate passed rustls.
    let ready = format!("http://127.0.0.1:{metrics}/readyz");
    let up = (0..150).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        Command::new("curl")
            .args(["-sf", &ready])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !up {
        stop();
        panic!(
            "serve, started as docs/serve.md shows, never became ready:\n{}",
            serve_log()
        );
    }

    // Registered as the recipe says (the shipped configuration, so in the
    // place of the other tests' serve), it pins a Deployment's config.
    let cert = std::fs::read_to_string(cp.dir.join("serve.crt")).unwrap();
    let hook = super::yaml("deploy/serve/webhook.yaml").remove(0);
    register_at(cp, format!("127.0.0.1:{webhook}").parse().unwrap(), &cert, hook);
    let answered = || {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{metrics}/metrics")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("config_snapshot_admission_decisions_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let ns = "story-recipe";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let pinned = eventually("the documented serve pins a Deployment", 30, || {
        cp.apply(
            ns,
            &workload(
                "Deployment",
                "web",
                json!({"config-snapshot.io/snapshot": "*"}),
                "nginx:1",
                json!([{"configMapRef": {"name": "app"}}]),
                2,
            ),
        );
        let name = env_ref(&cp.get(ns, "deployment", "web")?);
        (name != "app" && answered() > 0.0).then_some(name)
    });
    stop();
    // The other tests' serve answers again.
    super::register(cp, serve, super::yaml("deploy/serve/webhook.yaml").remove(0));
    super::webhook_answers(cp);
    assert!(pinned.starts_with("app-"), "{pinned}");
    eprintln!("docs/serve.md's recipe, run as documented with the admin kubeconfig: serve pinned {pinned}");
}
