//! `config-snapshot keys`: the signing keyring's life (docs/security.md,
//! "The signing key"), run by a key administrator with their kubeconfig:
//! the guard lets them, and serve's ServiceAccount, write the key Secret.
//!
//! - `check`: whether the caller may manage the key, as Kubernetes judges
//!   it (who the API server says they are, and a dry-run write that the
//!   guard and RBAC judge as they would the real one);
//! - `list`: the keys' ids, the current one first (never a key);
//! - `rotate`: a new current key; the others still verify;
//! - `restore -f BACKUP`: a backup's keys join the ring (the current key
//!   stays current), and the Secret is written again under its guard
//!   (created anew if it predates the guard, as after a reinstall);
//! - `sign-unsigned`: after an upgrade from a version that did not sign,
//!   lists the unsigned, well-formed snapshots and, with `--yes`, signs
//!   them. serve never does: an unsigned object with our label could be
//!   anyone's, and only an operator can tell.
//!
//! serve's replicas watch the Secret and use a changed ring at once.

use config_snapshot_policy::model::object::ObjectExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context as _, Result};
use clap::{Args as ClapArgs, Subcommand};
use config_snapshot_policy::model::keys as labels;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use config_snapshot::cluster::proof::{Keyring, Prover, SIGNATURE};
use config_snapshot::serve::trust::signing::{ring_of, KeySecret};
use config_snapshot::tools::printable;

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    command: Keys,
    /// serve's namespace, where the key Secret is (as `release`'s: `-n`
    /// names workloads' namespaces wherever it is taken).
    #[arg(long = "serve-namespace", global = true, default_value = "config-snapshot")]
    namespace: String,
    /// The key Secret's name (serve's `--signing-key-secret`).
    #[arg(long, global = true, default_value = "config-snapshot-signing-key")]
    secret: String,
    /// The guard's ValidatingAdmissionPolicy and binding (serve's
    /// `--signing-key-guard`): a written Secret is created after it is in
    /// force, so that serve trusts it.
    #[arg(long, global = true, default_value = "config-snapshot-signing-key")]
    guard: String,
    /// serve's ServiceAccount, which the guard names.
    #[arg(long, global = true, default_value = "config-snapshot")]
    service_account: String,
}

#[derive(Subcommand)]
enum Keys {
    /// Whether you may manage the key: who the API server says you are (as
    /// `kubectl auth whoami`), whether the key's guard is in force, and a
    /// server-side dry run of a write to the key Secret, judged by RBAC and
    /// the guard. Exits 1 if you may not, or if the guard is not in force.
    Check,
    /// The keys' ids, the current one first.
    List,
    /// Makes a new key current; the earlier ones still verify what they
    /// signed.
    Rotate,
    /// Adds a backup's keys (a `kubectl get secret -o yaml` of the key
    /// Secret) to the ring, or writes the ring from it if there is none.
    Restore {
        #[arg(long, short = 'f')]
        file: PathBuf,
    },
    /// Lists snapshots made by a version that did not sign (well formed,
    /// unsigned, and made before the key Secret was: a version that signs
    /// made that Secret, and signs what it makes, so anything unsigned made
    /// since is a look-alike); with `--yes`, signs them with the current
    /// key.
    SignUnsigned {
        /// Namespaces to look in (every one: omit).
        #[arg(long = "in", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// Only objects made before this time (RFC 3339); default: when the
        /// key Secret was made.
        #[arg(long)]
        made_before: Option<String>,
        #[arg(long)]
        yes: bool,
    },
}

pub fn run(args: Args) -> Result<ExitCode> {
    config_snapshot::use_ring_for_tls();
    super::runtime()?.block_on(async move {
        let client = Client::try_default()
            .await
            .context("connecting to the API server (KUBECONFIG or in-cluster)")?;
        let secret = KeySecret {
            client: client.clone(),
            namespace: args.namespace.clone(),
            name: args.secret.clone(),
            service_account: args.service_account.clone(),
            guard: args.guard.clone(),
            trust_unguarded: true,
        };
        let current = || async {
            let api: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
            api.get_opt(&args.secret)
                .await
                .with_context(|| format!("reading Secret {}/{}", args.namespace, args.secret))
        };
        let missing = || no_secret(&args.namespace, &args.secret);
        match &args.command {
            Keys::Check => {
                if !check(&client, &args, &secret).await? {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Keys::List => {
                let live = current().await?.ok_or_else(missing)?;
                for (i, id) in ring_of(&live)?.ids().iter().enumerate() {
                    println!("{id}{}", if i == 0 { "  (current: signs and names)" } else { "" });
                }
            }
            Keys::Rotate => {
                let live = current().await?.ok_or_else(missing)?;
                let ring = ring_of(&live)?
                    .rotated(Keyring::generate_key())
                    .map_err(|e| anyhow!("{e}"))?;
                secret.write(&ring).await?;
                println!("rotated: {} signs now; {} keys verify", ring.ids()[0], ring.ids().len());
            }
            Keys::Restore { file } => {
                let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
                let backup: Secret =
                    serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not a Secret", file.display()))?;
                let restored = ring_of(&backup)?;
                let ring = match current().await? {
                    Some(live) => ring_of(&live)?.merged(&restored).map_err(|e| anyhow!("{e}"))?,
                    None => restored,
                };
                secret.write(&ring).await?;
                println!("restored: {} keys verify; {} signs", ring.ids().len(), ring.ids()[0]);
            }
            Keys::SignUnsigned {
                namespaces,
                made_before,
                yes,
            } => {
                let live = current().await?.ok_or_else(missing)?;
                let prover = Prover::with(&ring_of(&live)?);
                let before = match made_before {
                    Some(text) => config_snapshot_policy::model::duration::parse_rfc3339(text)
                        .ok_or_else(|| anyhow!("--made-before {text:?}: not an RFC 3339 time"))?,
                    None => live
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.as_second())
                        .ok_or_else(|| anyhow!("the key Secret has no creation time: give --made-before"))?,
                };
                let found = sign_unsigned(&client, &prover, namespaces, before, *yes).await?;
                if found > 0 && !*yes {
                    println!("{found} unsigned; sign them with --yes if config-snapshot made them");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Prints who the caller is, whether the key's guard is in force, and
/// whether a write to the key Secret would be taken; whether the caller may
/// manage a guarded key. A dry run is judged by authorization and every
/// admission policy as the write itself, and changes nothing; so what this
/// says is Kubernetes' answer, not a reading of the guard's expression. A
/// write taken without the guard proves nothing (anyone with edit in serve's
/// namespace could make it, and serve trusts no key written so), so the
/// check fails then, saying why.
async fn check(client: &Client, args: &Args, key: &KeySecret) -> Result<bool> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("asking the API server who you are (SelfSubjectReview, Kubernetes 1.28 and later)")?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    let name = user.username.unwrap_or_default();
    let groups = user.groups.unwrap_or_default();
    println!("you are {name:?}, in the groups {groups:?}");
    let guarded = guard_in_force(key, args).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let mut written = secrets
        .patch(&args.secret, &dry, &Patch::Merge(json!({})))
        .await
        .map(|_| ());
    if written.as_ref().err().and_then(reason) == Some("NotFound") {
        // No key yet (serve makes it when it starts): the guard judges a
        // create of it the same way.
        let placeholder = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(args.secret.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        let create = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        written = secrets.create(&create, &placeholder).await.map(|_| ());
    }
    let what = format!("the key Secret {}/{}", args.namespace, args.secret);
    match written {
        Ok(()) if guarded => {
            println!("{what}: you may manage it (a dry-run write was taken by RBAC and the guard)");
            Ok(true)
        }
        Ok(()) => {
            println!(
                "{what}: RBAC lets you write it, and so anyone it lets write Secrets in {}",
                args.namespace
            );
            Ok(false)
        }
        Err(kube::Error::Api(status)) if status.reason == "Forbidden" => {
            println!(
                "{what}: RBAC does not let you write Secrets in {}: {}",
                args.namespace,
                printable(&status.message)
            );
            Ok(false)
        }
        // A ValidatingAdmissionPolicy's refusal (reason Invalid).
        Err(kube::Error::Api(status)) if status.reason == "Invalid" => {
            println!(
                "{what}: the guard refuses you: {}\nA key administrator adds your user to the chart's \
                 keyAdministratorUsers, or one of your groups to keyAdministrators (docs/install.md)",
                printable(&status.message)
            );
            Ok(false)
        }
        Err(e) => Err(e).with_context(|| format!("a dry-run write to {what}")),
    }
}

/// Whether the key's guard is in force, said; `true` too when the caller
/// may not read it (reading cluster-wide policies is an admin's right, and
/// a key administrator named by user often has none).
async fn guard_in_force(key: &KeySecret, args: &Args) -> Result<bool> {
    match key.guard().await {
        Ok(_) => {
            println!("the guard (ValidatingAdmissionPolicy {}) is in force", args.guard);
            Ok(true)
        }
        Err(e)
            if e.downcast_ref::<kube::Error>()
                .is_some_and(|e| reason(e) == Some("Forbidden")) =>
        {
            println!(
                "the guard: you may not read ValidatingAdmissionPolicies, so whether it is in force is not known here (a cluster admin's `keys check` says)"
            );
            Ok(true)
        }
        Err(e) if e.downcast_ref::<kube::Error>().is_some() => Err(e),
        Err(e) => {
            println!("{e}: serve trusts no key Secret written while it is not");
            Ok(false)
        }
    }
}

/// The reason the API server gave for refusing (`Forbidden`, `NotFound`,
/// `Invalid`: a ValidatingAdmissionPolicy's denial), if it answered.
fn reason(error: &kube::Error) -> Option<&str> {
    match error {
        kube::Error::Api(status) => Some(status.reason.as_str()),
        _ => None,
    }
}

fn no_secret(namespace: &str, secret: &str) -> anyhow::Error {
    anyhow!("no Secret {namespace}/{secret}: serve makes one when it starts")
}

/// Lists (and with `sign`, signs) the unsigned, well-formed snapshots in
/// `namespaces` (all if empty) made before `before` (unix seconds). How
/// many there were. One made at or after `before` is named and left.
async fn sign_unsigned(
    client: &Client,
    prover: &Prover,
    namespaces: &[String],
    before: i64,
    sign: bool,
) -> Result<usize> {
    let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
    let params = ListParams::default().labels(&selector);
    let mut found = 0;
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    for scope in scopes {
        let mut objects: Vec<Value> = Vec::new();
        let configmaps: Api<ConfigMap> = match scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        for item in configmaps.list(&params).await?.items {
            objects.push(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": item.metadata,
                "data": item.data, "binaryData": item.binary_data, "immutable": item.immutable}),
            );
        }
        let secrets: Api<Secret> = match scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        for item in secrets.list(&params).await?.items {
            objects.push(json!({"apiVersion": "v1", "kind": "Secret", "metadata": item.metadata,
                "data": item.data, "type": item.type_, "immutable": item.immutable}));
        }
        for mut object in objects {
            if !prover.unsigned(&object) {
                continue;
            }
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let ns = object.namespace().unwrap_or_default().to_string();
            let name = object.name().to_string();
            let made = object
                .creation_timestamp()
                .and_then(config_snapshot_policy::model::duration::parse_rfc3339);
            if made.is_none_or(|t| t >= before) {
                println!("{kind} {ns}/{name}: unsigned, but made after the key: not config-snapshot's, left alone");
                continue;
            }
            found += 1;
            println!("{kind} {ns}/{name}: unsigned");
            if !sign {
                continue;
            }
            prover.sign(&mut object);
            let patch = json!({"metadata": {
                "resourceVersion": object.meta("resourceVersion"),
                "annotations": {SIGNATURE: object.annotation(SIGNATURE)},
            }});
            let params = PatchParams::default();
            let result = if kind == "Secret" {
                Api::<Secret>::namespaced(client.clone(), &ns)
                    .patch(&name, &params, &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            } else {
                Api::<ConfigMap>::namespaced(client.clone(), &ns)
                    .patch(&name, &params, &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => println!("  signed"),
                Err(e) => println!("  not signed: {}", printable(&e.to_string())),
            }
        }
    }
    Ok(found)
}
