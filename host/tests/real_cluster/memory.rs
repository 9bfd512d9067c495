//! serve's resident memory against the raw bytes of the ConfigMaps and
//! Secrets it watches (docs/BENCHMARKS.md, "Memory"): 1,000 and 10,000
//! objects of 8 KiB in a namespace, created with kube-rs, and serve's RSS
//! (from /proc) once its cache holds them. Reloader's users report 2.6 to
//! 5 times the raw size (Reloader #321); serve keeps sources as metadata and
//! a digest, never their data.
//!
//! `REAL_CLUSTER_PART=memory` runs it and prints the table; with
//! `BENCH_WRITE_DOCS=1` it writes it into docs/BENCHMARKS.md.

use std::collections::BTreeMap;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};

use super::*;

const OBJECT_BYTES: usize = 8 << 10;

/// 8 KiB of a value per object, different in each.
fn value(i: usize) -> String {
    let seed = format!("{i:08}");
    seed.repeat(OBJECT_BYTES / seed.len())
}

async fn create(client: &kube::Client, ns: &str, kind: &str, n: usize) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let (configmaps, secrets) = (configmaps.clone(), secrets.clone());
            async move {
                let meta = ObjectMeta {
                    name: Some(format!("o-{i}")),
                    ..Default::default()
                };
                let data = BTreeMap::from([("v".to_string(), value(i))]);
                let created = if kind == "Secret" {
                    let secret = Secret {
                        metadata: meta,
                        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
                        ..Default::default()
                    };
                    secrets.create(&PostParams::default(), &secret).await.map(|_| ())
                } else {
                    let cm = ConfigMap {
                        metadata: meta,
                        data: Some(data),
                        ..Default::default()
                    };
                    configmaps.create(&PostParams::default(), &cm).await.map(|_| ())
                };
                created.unwrap_or_else(|e| panic!("creating {kind} o-{i}: {e}"));
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

pub fn memory_table(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    serve.stop();
    // As the image runs it: from the module precompiled at build time, so
    // the compiler's code and working memory are not part of the figure.
    let precompiled = std::env::temp_dir().join(format!("config-snapshot-memory-{}.cwasm", std::process::id()));
    let made = std::process::Command::new(ServeProcess::this_build())
        .arg("precompile")
        .arg(crate::support::paths::policy())
        .arg("--output")
        .arg(&precompiled)
        .status()
        .unwrap();
    assert!(made.success(), "precompiling the policy");
    let mut flags = serve_flags("{}");
    let precompiled_arg: &'static str = Box::leak(precompiled.display().to_string().into_boxed_str());
    flags.extend(["--precompiled", precompiled_arg]);
    let mut quiet = ServeProcess::start_logging(kubeconfig, &flags, "warn");
    quiet.wait_ready();
    config_snapshot::use_ring_for_tls();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&cp.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    });
    let mut rows = Vec::new();
    let settle_rss = |serve: &ServeProcess| {
        // The allocator gives back what it freed a second after a burst:
        // the lowest of five readings, a second apart.
        (0..5)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_secs(1));
                serve.rss_bytes()
            })
            .min()
            .unwrap()
    };
    let baseline = settle_rss(&quiet);
    for kind in ["Secret", "ConfigMap"] {
        for n in [1_000usize, 10_000] {
            let ns = format!("memory-{}-{n}", kind.to_lowercase());
            cp.namespace(&ns);
            let before = quiet.metric(&format!("config_snapshot_cache_objects{{kind=\"{kind}\"}}"));
            runtime.block_on(create(&client, &ns, kind, n));
            eventually(&format!("serve's cache to hold {n} {kind}s"), 300, || {
                (quiet.metric(&format!("config_snapshot_cache_objects{{kind=\"{kind}\"}}")) >= before + n as f64)
                    .then_some(())
            });
            let resident = settle_rss(&quiet);
            let raw = (n * OBJECT_BYTES) as f64;
            cp.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
            eventually("the namespace to go", 600, || {
                cp.try_kubectl(&["get", "namespace", &ns], None).is_err().then_some(())
            });
            // What is given back once the objects have left the cache: the
            // burst of deletions is watch events too.
            eventually(&format!("serve's cache to let go of the {kind}s"), 300, || {
                (quiet.metric(&format!("config_snapshot_cache_objects{{kind=\"{kind}\"}}")) <= before).then_some(())
            });
            let after = settle_rss(&quiet);
            rows.push(format!(
                "| {kind}s | {n} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} |",
                raw / 1048576.0,
                resident as f64 / 1048576.0,
                resident.saturating_sub(baseline) as f64 / 1048576.0,
                resident as f64 / raw,
                resident.saturating_sub(baseline) as f64 / raw,
                after as f64 / 1048576.0,
            ));
            eprintln!("memory: {}", rows.last().unwrap());
        }
    }
    let build = if cfg!(debug_assertions) {
        "unoptimised"
    } else {
        "release"
    };
    let text = format!(
        "Measured {} ({build} build), serve's RSS at start {:.1} MiB; each object holds 8 KiB of data. \
         The raw bytes are the objects' data; \"per raw byte\" divides serve's whole RSS, \"added\" only what \
         the objects added to it; \"after\" is serve's RSS once they were deleted and had left its cache.\n\n\
         | kind | objects | raw MiB | serve RSS MiB | added MiB | RSS per raw byte | added per raw byte | after MiB |\n\
         |---|---|---|---|---|---|---|---|\n{}\n",
        super::bench::today(),
        baseline as f64 / 1048576.0,
        rows.join("\n")
    );
    eprintln!("{text}");
    super::bench::publish("bench-memory", &text);
    drop(quiet);
    let _ = std::fs::remove_file(&precompiled);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
}
