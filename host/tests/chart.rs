//! The release's one version and the chart's documentation, held to the
//! files they describe: the crate, the chart, the image and the Kubewarden
//! policy carry one version; the chart's README lists exactly its values,
//! with their defaults.

use std::collections::BTreeMap;

use serde_json::Value;

mod support;
use support::paths::root;

fn text(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_yaml_ng::from_str(&text(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every place a release names its version, with what it names there.
fn versions() -> Vec<(String, String)> {
    let chart = yaml("deploy/helm/config-snapshot/Chart.yaml");
    let values = yaml("deploy/helm/config-snapshot/values.yaml");
    let artifacthub = yaml("artifacthub-pkg.yml");
    let metadata = yaml("policy-metadata.yml");
    let image_tag = |path: &str, repository: &str| -> String {
        let t = text(path);
        let at = t
            .find(&format!("{repository}:"))
            .unwrap_or_else(|| panic!("{path} names {repository}"));
        t[at + repository.len() + 1..]
            .split(|c: char| c.is_whitespace() || c == '"')
            .next()
            .unwrap()
            .to_string()
    };
    let changelog = text("CHANGELOG.md");
    let released = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## ["))
        .and_then(|l| l.split(']').next())
        .expect("CHANGELOG.md has a version heading")
        .to_string();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    vec![
        ("Chart.yaml version".into(), s(&chart["version"])),
        ("Chart.yaml appVersion".into(), s(&chart["appVersion"])),
        ("values.yaml image.tag".into(), s(&values["image"]["tag"])),
        (
            "deploy/serve image".into(),
            image_tag(
                "deploy/serve/deployment.yaml",
                "ghcr.io/config-snapshot/config-snapshot",
            ),
        ),
        ("artifacthub-pkg.yml version".into(), s(&artifacthub["version"])),
        (
            "artifacthub-pkg.yml image".into(),
            s(&artifacthub["containersImages"][0]["image"])
                .rsplit(":v")
                .next()
                .unwrap()
                .to_string(),
        ),
        (
            "policy-metadata.yml io.kubewarden.policy.version".into(),
            s(&metadata["annotations"]["io.kubewarden.policy.version"]),
        ),
        (
            "deploy/kubewarden policy module".into(),
            image_tag(
                "deploy/kubewarden/policy.yaml",
                "ghcr.io/config-snapshot/policies/config-snapshot",
            )
            .trim_start_matches('v')
            .to_string(),
        ),
        ("CHANGELOG.md".into(), released),
    ]
}

#[test]
fn one_version_across_crate_chart_image_and_policy() {
    let crate_version = env!("CARGO_PKG_VERSION");
    let wrong: Vec<String> = versions()
        .into_iter()
        .filter(|(_, v)| v != crate_version)
        .map(|(at, v)| format!("{at}: {v:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the crate is {crate_version}; these differ: {wrong:#?}"
    );
    // Every versioned link of the Artifact Hub package, too.
    let artifacthub = text("artifacthub-pkg.yml");
    for tagged in artifacthub.split("config-snapshot:v").skip(1) {
        assert!(
            tagged.starts_with(crate_version),
            "artifacthub-pkg.yml names v{tagged:.10}"
        );
    }
    for release in artifacthub.split("releases/download/v").skip(1) {
        assert!(
            release.starts_with(crate_version),
            "artifacthub-pkg.yml links v{release:.10}"
        );
    }
}

/// The values a chart user sets: maps flattened to dotted keys, except
/// the ones that are objects by nature (the policy's settings, resources,
/// labels), which are values themselves.
fn flattened(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    let whole = |key: &str| key == "settings" || key == "resources" || key.ends_with(".labels");
    match value {
        Value::Object(map) if !whole(prefix) && !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flattened(&key, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), value.clone());
        }
    }
}

/// The README's values table: key and default (JSON, as `values.yaml`
/// gives it).
fn documented() -> BTreeMap<String, Value> {
    text("deploy/helm/config-snapshot/README.md")
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let key = cells[0].trim_start_matches("| ").trim_matches('`').to_string();
            let default = cells[1].trim_matches('`');
            let default: Value =
                serde_json::from_str(default).unwrap_or_else(|e| panic!("README default of {key}: {default}: {e}"));
            (key, default)
        })
        .collect()
}

#[test]
fn the_charts_readme_lists_its_values_with_their_defaults() {
    let mut values = BTreeMap::new();
    flattened("", &yaml("deploy/helm/config-snapshot/values.yaml"), &mut values);
    let documented = documented();
    let missing: Vec<&String> = values.keys().filter(|k| !documented.contains_key(*k)).collect();
    let extra: Vec<&String> = documented.keys().filter(|k| !values.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README values table: missing {missing:?}, not in values.yaml {extra:?}"
    );
    for (key, default) in &values {
        assert_eq!(&documented[key], default, "the README's default of {key}");
    }
}

/// The schema knows every value the chart has (it refuses unknown keys,
/// so a value it lacked could never be set) and each default passes it.
#[test]
fn the_values_schema_covers_every_value() {
    let schema: Value = serde_json::from_str(&text("deploy/helm/config-snapshot/values.schema.json")).unwrap();
    let mut values = BTreeMap::new();
    flattened("", &yaml("deploy/helm/config-snapshot/values.yaml"), &mut values);
    for key in values.keys() {
        let mut at = &schema;
        for part in key.split('.') {
            assert_eq!(
                at["additionalProperties"], false,
                "{key}: the schema refuses unknown keys beside {part}"
            );
            at = &at["properties"][part];
            assert!(!at.is_null(), "values.schema.json has no {key}");
        }
    }
    let chart = yaml("deploy/helm/config-snapshot/Chart.yaml");
    assert_eq!(
        chart["kubeVersion"], ">=1.30.0-0",
        "the chart states its minimum Kubernetes"
    );
}

/// The schema's `settings` are the settings serve parses
/// (`config_snapshot_policy::model::settings`): every key and no other, and
/// each word an enum lists is one the parser takes, as every word the
/// parser takes is listed. A typo is then refused by `helm install` or
/// `helm upgrade`, not by serve crash-looping after it.
#[test]
fn the_values_schema_holds_the_settings_serve_parses() {
    use config_snapshot_policy::model::settings::{Settings, KEYS};
    let schema: Value = serde_json::from_str(&text("deploy/helm/config-snapshot/values.schema.json")).unwrap();
    let settings = &schema["properties"]["settings"];
    assert_eq!(settings["additionalProperties"], false, "unknown settings are refused");
    let rules = settings["properties"].as_object().expect("the settings' properties");
    let mut keys: Vec<&str> = rules.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut parsed = KEYS.to_vec();
    parsed.sort_unstable();
    assert_eq!(keys, parsed, "the schema's settings are the parser's");
    let parses =
        |key: &str, value: Value| Settings::from_json(serde_json::json!({ key: value }).to_string().as_bytes()).is_ok();
    for (key, rule) in rules {
        let Some(words) = rule["enum"].as_array() else { continue };
        for word in words {
            assert!(
                parses(key, word.clone()),
                "{key}: the schema lists {word}, the parser refuses it"
            );
        }
        for word in ["warn", "reject", "checksum", "ignore", "fail", "Warn"] {
            if parses(key, word.into()) {
                assert!(
                    words.contains(&word.into()),
                    "{key}: the parser takes {word:?}, the schema lacks it"
                );
            }
        }
    }
    let defaults = serde_json::to_string(&yaml("deploy/helm/config-snapshot/values.yaml")["settings"]).unwrap();
    assert!(
        Settings::from_json(defaults.as_bytes()).is_ok(),
        "the chart's settings parse: {defaults}"
    );
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation but `-`
/// and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Artifact Hub shows the chart's README away from the repository, where
/// a relative link leads nowhere: every link is absolute, and each one into
/// this repository names a file, and a heading, that exist.
#[test]
fn the_charts_readme_links_work_on_artifact_hub() {
    const REPOSITORY: &str = "https://github.com/config-snapshot/config-snapshot/blob/main/";
    let readme = text("deploy/helm/config-snapshot/README.md");
    let mut checked = 0;
    for link in readme.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
        assert!(
            link.starts_with("https://"),
            "a relative link breaks on Artifact Hub: {link}"
        );
        let Some(path) = link.strip_prefix(REPOSITORY) else {
            continue;
        };
        let (file, heading) = path.split_once('#').unwrap_or((path, ""));
        let target = root().join(file);
        assert!(target.exists(), "{link}: no {file} in the repository");
        if !heading.is_empty() {
            let headings: Vec<String> = std::fs::read_to_string(&target)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(anchor)
                .collect();
            assert!(
                headings.iter().any(|h| h == heading),
                "{link}: no such heading in {file}"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 3,
        "the README's links into the repository were read ({checked})"
    );
}
