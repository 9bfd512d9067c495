//! docs/troubleshooting.md lists exactly the messages the code emits.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod support;
use support::paths::root;

/// The string literals of a Rust file's non-test code.
fn literals(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    // Test modules sit at the end of each file.
    let end = [
        "#[cfg(test)]\nmod ",
        "#[cfg(test)]\n#[path",
        "#[cfg(test)]\npub(crate) mod",
    ]
    .iter()
    .filter_map(|m| text.find(m))
    .min()
    .unwrap_or(text.len());
    let code = &text[..end];
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == 'r'
            && matches!(chars.get(i + 1), Some('#') | Some('"'))
            && !chars[i.saturating_sub(1)].is_alphanumeric()
        {
            // A raw string: skip to its closing quote and hashes.
            let mut hashes = 0;
            i += 1;
            while chars.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < chars.len() && !(chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#'))) {
                i += 1;
            }
            i += hashes;
        } else if c == '\'' {
            // A char literal such as '"' or '\\'.
            if chars.get(i + 2) == Some(&'\'') {
                i += 2;
            } else if chars.get(i + 1) == Some(&'\\') && chars.get(i + 3) == Some(&'\'') {
                i += 3;
            }
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                    s.push(if chars.get(i) == Some(&'n') {
                        '\n'
                    } else {
                        chars.get(i).copied().unwrap_or(' ')
                    });
                } else {
                    s.push(chars[i]);
                }
                i += 1;
            }
            out.push(s);
        }
        i += 1;
    }
    out
}

/// Placeholders (`{id}`, `{}`, `{token:?}`) become `{…}`, and `{:?}`-quoted
/// values lose the quotes the doc does not show.
fn skeleton(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push_str("{…}");
                }
                depth += 1;
            }
            '}' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.replace("{…}{…}", "{…}")
}

/// Every `.rs` file under `dir`, its subdirectories included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

fn code_messages() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let policy: Vec<PathBuf> = rust_files(&root().join("src"))
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !name.ends_with("_tests.rs") && name != "fake.rs"
        })
        .collect();
    for file in policy {
        for lit in literals(&file) {
            if let Some(rest) = lit.strip_prefix("{SAY}") {
                out.insert(skeleton(&format!("config-snapshot: {rest}")));
            } else if lit.contains("bad token")
                || lit.contains("is not allowed here")
                || lit.contains("empty source list")
                || lit.starts_with("{annotation}: ")
            {
                out.insert(skeleton(&lit));
            }
        }
    }
    // The host's refusals: the capability's, the guard on deletes and the
    // snapshot budget.
    let mut host: Vec<PathBuf> = rust_files(&root().join("host/src/capability"))
        .into_iter()
        .filter(|p| !p.ends_with("tests.rs") && !p.parent().is_some_and(|d| d.ends_with("tests")))
        .collect();
    host.push(root().join("host/src/lifecycle/guard.rs"));
    host.push(root().join("host/src/lifecycle/budget.rs"));
    for file in host {
        for lit in literals(&file) {
            if lit.starts_with("refused") && lit.len() > "refused".len() {
                out.insert(skeleton(&lit));
            }
        }
    }
    out
}

/// The messages documented: the policy's in docs/troubleshooting.md (what a
/// user sees), the host's refusals in docs/serve.md (what an engineer
/// reads in serve's logs and inside the policy's messages).
fn doc_messages() -> BTreeSet<String> {
    let table_rows = |doc: &str| -> Vec<String> {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let text = match doc {
            "docs/serve.md" => text.split("## Host refusals").nth(1).unwrap_or_default().to_string(),
            _ => text,
        };
        text.lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l[3..].split('`').next().unwrap().to_string())
            .collect()
    };
    ["docs/troubleshooting.md", "docs/serve.md"]
        .iter()
        .flat_map(|doc| table_rows(doc))
        .map(|m| skeleton(&m))
        .collect()
}

#[test]
fn every_message_the_code_emits_is_documented_and_nothing_else() {
    let code = code_messages();
    let doc = doc_messages();
    assert!(code.len() > 30, "extraction found only {} messages", code.len());
    let undocumented: Vec<&String> = code.difference(&doc).collect();
    let stale: Vec<&String> = doc.difference(&code).collect();
    assert!(
        undocumented.is_empty(),
        "emitted but not in docs/troubleshooting.md:\n{undocumented:#?}"
    );
    assert!(
        stale.is_empty(),
        "in docs/troubleshooting.md but not emitted:\n{stale:#?}"
    );
}

/// The headings of docs/design.md, as titles and as Markdown anchors.
fn design_sections() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let titles: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .collect();
    let anchors = titles
        .iter()
        .map(|t| {
            t.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    (titles, anchors)
}

fn sources_citing_the_design() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![
        root().join("src"),
        root().join("host/src"),
        root().join("host/tests"),
        root().join("docs"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "md") {
                files.push(path);
            }
        }
    }
    files.push(root().join("README.md"));
    // This test's own text names the forms it looks for.
    files.retain(|p| !p.ends_with("host/tests/docs.rs"));
    files
}

/// Every `docs/design.md, "Section"` citation in code and docs, and every
/// `design.md#anchor` link, names a section that exists; and the contract's
/// old name is cited nowhere.
#[test]
fn design_references_name_sections_that_exist() {
    let (titles, anchors) = design_sections();
    assert!(titles.contains("A rollback always wins"), "{titles:?}");
    let mut broken = Vec::new();
    let mut cited = 0;
    for path in sources_citing_the_design() {
        let text = std::fs::read_to_string(&path).unwrap();
        // A citation may wrap across comment lines.
        let mut flat = String::new();
        for line in text.lines() {
            let line = line.trim_start();
            let line = line
                .strip_prefix("//!")
                .or_else(|| line.strip_prefix("///"))
                .or_else(|| line.strip_prefix("//"))
                .unwrap_or(line);
            flat.push(' ');
            flat.push_str(line.trim());
        }
        let name = path.strip_prefix(root()).unwrap_or(&path).display().to_string();
        let mut rest = flat.as_str();
        while let Some(at) = rest.find("docs/design.md") {
            rest = &rest[at + "docs/design.md".len()..];
            let after = rest.trim_start_matches([',', ' ', '(']);
            if let Some(quoted) = after.strip_prefix('"') {
                let title = quoted.split('"').next().unwrap_or_default();
                cited += 1;
                if !titles.contains(title) {
                    broken.push(format!("{name}: \"{title}\""));
                }
            }
        }
        let mut rest = flat.as_str();
        while let Some(at) = rest.find("design.md#") {
            rest = &rest[at + "design.md#".len()..];
            let anchor: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '-').collect();
            if !anchors.contains(&anchor) {
                broken.push(format!("{name}: #{anchor}"));
            }
        }
        if flat.contains(&format!("{} §", "SPEC")) {
            broken.push(format!("{name}: cites a SPEC section; cite docs/design.md"));
        }
    }
    assert!(
        broken.is_empty(),
        "citations of sections that do not exist:\n{}",
        broken.join("\n")
    );
    assert!(cited >= 15, "only {cited} citations found: the scan is broken");
}

/// The settings tables (README and design.md), as (name, documented default).
fn documented_settings(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| setting | default |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
        }
        if in_table && line.starts_with("| `") {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |c: &str| c.trim_matches('`').to_string();
            rows.push((unquote(cells[1]), unquote(cells[2])));
        }
    }
    rows
}

/// Every documented setting exists, with the default it really has, and
/// every setting is documented: names from the policy's own refusal of an
/// unknown key, defaults by parsing each documented one.
#[test]
fn the_settings_tables_name_every_setting_with_its_real_default() {
    use config_snapshot_policy::model::settings::RawSettings;
    let refusal = serde_json::from_str::<RawSettings>(r#"{"probe": 1}"#)
        .unwrap_err()
        .to_string();
    let expected = refusal.split_once("expected one of").expect("serde names the fields").1;
    let real: BTreeSet<String> = expected
        .split(',')
        .map(|f| f.trim().trim_matches('`').split('`').next().unwrap().to_string())
        .filter(|f| !f.is_empty())
        .collect();
    for doc in ["docs/reference.md", "docs/design.md"] {
        let rows = documented_settings(&root().join(doc));
        let names: BTreeSet<String> = rows.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names, real, "{doc}'s settings table");
        for (name, default) in rows {
            let value: serde_json::Value =
                serde_json::from_str(&default).unwrap_or(serde_json::Value::String(default.clone()));
            let parsed: RawSettings = serde_json::from_value(serde_json::json!({ name.clone(): value }))
                .unwrap_or_else(|e| panic!("{doc}: {name} = {default}: {e}"));
            assert_eq!(
                format!("{parsed:?}"),
                format!("{:?}", RawSettings::default()),
                "{doc}: {name}'s documented default {default} is not its default"
            );
        }
    }
}

/// The user docs: what a user reads to install and run config-snapshot.
/// They say what to do and what one sees; which test proves what is in
/// docs/testing.md.
const USER_DOCS: [&str; 13] = [
    "README.md",
    "docs/quickstart.md",
    "docs/install.md",
    "docs/user-guide.md",
    "docs/reference.md",
    "docs/operations.md",
    "docs/troubleshooting.md",
    "docs/security.md",
    "docs/faq.md",
    "docs/migration.md",
    "docs/compatibility.md",
    "docs/gitops.md",
    "deploy/helm/config-snapshot/README.md",
];

/// Each shell block of a doc: its line and its text.
fn shell_blocks(doc: &str) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if ["```sh", "```bash", "```console"].contains(&lines[i].trim()) {
            let end = lines[i + 1..]
                .iter()
                .position(|l| l.trim() == "```")
                .expect("a closed block")
                + i
                + 1;
            blocks.push((i + 1, lines[i + 1..end].join("\n")));
            i = end;
        }
        i += 1;
    }
    blocks
}

/// docs/testing.md's table of the user docs' shell blocks: (doc, first
/// line) → how it is checked.
fn shell_block_register() -> std::collections::BTreeMap<(String, String), String> {
    let text = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
    let section = text
        .split("## Shell blocks of the user docs")
        .nth(1)
        .expect("docs/testing.md lists the user docs' shell blocks");
    section
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" | `"))
        .map(|l| {
            let (doc, rest) = l[2..].split_once(" | `").unwrap();
            let (first, how) = rest.rsplit_once("` | ").unwrap();
            (
                (doc.trim().to_string(), first.to_string()),
                how.trim_end_matches('|').trim().to_string(),
            )
        })
        .collect()
}

/// Every shell block of the user docs is listed in docs/testing.md: run
/// here (`offline`: against the repository, with this build's binary on
/// PATH), or with the test that does the same, or why nothing can. The user
/// docs themselves carry no such notes.
#[test]
fn every_user_shell_block_is_run_or_said_here() {
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_config-snapshot"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let register = shell_block_register();
    let (mut run, mut said) = (0, 0);
    let mut listed = BTreeSet::new();
    for doc in USER_DOCS {
        for (line, block) in shell_blocks(doc) {
            let at = format!("{doc}:{line}");
            let first = block.lines().next().unwrap_or_default().to_string();
            let key = (doc.to_string(), first.clone());
            let how = register
                .get(&key)
                .unwrap_or_else(|| panic!("{at}: a shell block docs/testing.md does not list: `{first}`"));
            listed.insert(key);
            if how == "offline" {
                let out = std::process::Command::new("bash")
                    .arg("-c")
                    .arg(format!("set -euo pipefail\n{block}"))
                    .current_dir(root())
                    .env("PATH", &path)
                    .env("NO_COLOR", "1")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{at}: the block failed:\n{block}\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                run += 1;
            } else {
                assert!(how.len() > 10, "{at}: say how it is checked, or why not");
                // A test named as doing the same exists.
                for word in how.split_whitespace() {
                    let word = word.trim_matches(|c: char| c == ',' || c == ';' || c == '(' || c == ')');
                    if word.starts_with("host/tests/") {
                        assert!(root().join(word).exists(), "{at}: {word} does not exist");
                    }
                }
                said += 1;
            }
        }
    }
    let stale: Vec<_> = register.keys().filter(|k| !listed.contains(*k)).collect();
    assert!(
        stale.is_empty(),
        "docs/testing.md lists blocks no user doc holds: {stale:?}"
    );
    eprintln!("user docs: {run} shell blocks run, {said} said where they are checked");
    assert!(run >= 1, "{run}");
}

/// The user docs are instructions, not a lab notebook: no test names or
/// test files, no notes for the tests, no commit hashes, no history of
/// reviews. That evidence is kept in docs/testing.md.
#[test]
fn user_docs_are_instructions_not_evidence() {
    let evidence = [
        "host/tests",
        "_story",
        "::tests",
        "<!--",
        "Round 2",
        "Round 3",
        "round 3",
        "tried by hand",
        "lifecycle model",
        "a test checks",
        "a test keeps",
        "a test compares",
        "make test runs",
    ];
    let mut found = Vec::new();
    for doc in USER_DOCS {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (n, line) in text.lines().enumerate() {
            for word in evidence {
                if line.contains(word) {
                    found.push(format!("{doc}:{}: {word:?}", n + 1));
                }
            }
            // A commit of this repository, named by its hash.
            for word in line.split(|c: char| !c.is_ascii_hexdigit()) {
                if (7..=40).contains(&word.len())
                    && word.bytes().any(|b| b.is_ascii_digit())
                    && word.bytes().any(|b| b.is_ascii_alphabetic())
                {
                    let commit = std::process::Command::new("git")
                        .args(["rev-parse", "--verify", "--quiet", &format!("{word}^{{commit}}")])
                        .current_dir(root())
                        .output()
                        .is_ok_and(|o| o.status.success());
                    if commit {
                        found.push(format!("{doc}:{}: commit {word}", n + 1));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "evidence in the user docs (docs/testing.md is its place):\n{}",
        found.join("\n")
    );
}

/// The words of the user docs the issue "Docs a newcomer finishes" counted
/// at cd11c64: 17,474. The user docs together stay within half of it.
const USER_DOC_WORDS_AT_MOST: usize = 17_474 / 2;

#[test]
fn the_user_docs_are_at_most_half_what_they_were() {
    let words: Vec<(&str, usize)> = USER_DOCS
        .iter()
        .map(|doc| {
            let text = std::fs::read_to_string(root().join(doc)).unwrap();
            (*doc, text.split_whitespace().count())
        })
        .collect();
    let total: usize = words.iter().map(|(_, n)| n).sum();
    assert!(
        total <= USER_DOC_WORDS_AT_MOST,
        "the user docs hold {total} words, past {USER_DOC_WORDS_AT_MOST}: {words:?}"
    );
}

/// The reference's table of serve's flags lists exactly the flags `serve
/// --help` has.
#[test]
fn the_flags_table_is_serves_flags() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let flags: std::collections::BTreeSet<String> = help
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.starts_with("--")
                .then(|| l.split([' ', '=', ',', '<']).next().unwrap().to_string())
        })
        .filter(|f| f != "--help")
        .collect();
    let reference = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let table = reference
        .split("## serve's flags")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/reference.md has the flags table");
    let listed: std::collections::BTreeSet<String> = table
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .flat_map(|l| {
            let first = l.split(" | ").next().unwrap().to_string();
            first
                .split('`')
                .filter(|w| w.starts_with("--"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|f| flags.contains(f) || !f.starts_with("--lease-namespace"))
        .collect();
    let missing: Vec<&String> = flags.difference(&listed).collect();
    let extra: Vec<&String> = listed.difference(&flags).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/reference.md's flags: missing {missing:?}, not serve's {extra:?}"
    );
}

/// Every file and folder of the repository, as paths from its root
/// (`folder/` for a folder), leaving out build output and git's own.
fn repository_paths() -> Vec<String> {
    fn walk(dir: &Path, from: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if name == "target" || name.starts_with('.') {
                continue;
            }
            let relative = path.strip_prefix(from).unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                out.push(format!("{relative}/"));
                walk(&path, from, out);
            } else {
                out.push(relative);
            }
        }
    }
    let root = root().canonicalize().unwrap();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

/// docs/architecture.md is a newcomer's map: each file or folder it names
/// (`serve/view/prefetch.rs`, `capability/`, a path from the root) must be one
/// that exists, so a move or a rename that forgets the map fails here. A
/// name inside the diagram's policy box is the policy's, under `src/`.
#[test]
fn the_architecture_map_names_only_paths_that_exist() {
    let map = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let paths = repository_paths();
    let mut named = BTreeSet::new();
    for line in map.lines() {
        let within = if line.starts_with(" │") { "src/" } else { "" };
        for token in line
            .split(|c: char| c.is_whitespace() || "`()[],;:│─▶▼┐┘┌└┴┬|".contains(c))
            .map(|t| t.trim_end_matches('.'))
            .filter(|t| !t.contains('*') && !t.contains("//"))
            .filter(|t| {
                t.ends_with('/') && t.len() > 1 && t.chars().next().unwrap().is_ascii_alphabetic()
                    || [".rs", ".sh", ".md", ".yaml", ".toml"].iter().any(|e| t.ends_with(e))
            })
        {
            named.insert((within, token.to_string()));
        }
    }
    assert!(named.len() > 30, "the map names files: {named:?}");
    let missing: Vec<String> = named
        .iter()
        .filter(|(within, t)| {
            !paths
                .iter()
                .filter(|p| p.starts_with(within))
                .any(|p| p == t || p.ends_with(&format!("/{t}")))
        })
        .map(|(within, t)| format!("{within}{t}"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

/// Product code reaches an object's metadata through `ObjectExt`
/// (src/model/object.rs), which says which fields a function uses and
/// reads a forged shape as absent: no raw `["metadata"]` index outside it.
/// Test code (a `_tests.rs` file, a `tests` folder, a trailing
/// `#[cfg(test)]` module) builds its fixtures as it likes.
#[test]
fn product_code_reads_metadata_through_object_ext() {
    let mut raw = Vec::new();
    for dir in ["src", "host/src"] {
        for file in rust_files(&root().join(dir)) {
            let path = file.to_string_lossy().to_string();
            let name = file.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with("_tests.rs") || name == "tests.rs" || path.contains("/tests/") || name == "object.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.starts_with("#[cfg(test)]") {
                    break;
                }
                if line.contains("[\"metadata\"]") && !line.trim_start().starts_with("//") {
                    raw.push(format!("{path}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        raw.is_empty(),
        "raw metadata reads outside ObjectExt:\n{}",
        raw.join("\n")
    );
}
