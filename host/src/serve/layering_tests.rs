//! serve's rooms import one another without a circle, and none reaches
//! back up into `mod.rs`, which calls them all (issue 55): each file can be
//! read knowing only the files it names. Drawn from `super::…` and
//! `crate::serve::…` paths in code, not comments or test modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The code of a file: comment lines and the trailing `#[cfg(test)]`
/// module (the project's convention) taken off.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or_default());
        out.push('\n');
    }
    out
}

fn ident(text: &str) -> &str {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
}

/// The first segment of each path a `super::` (or `crate::serve::`) names:
/// `super::a::B` names `a`; `super::{a, b::C}` names `a` and `b`.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(ident(group[start..j].trim()).to_string());
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(group[start..j].trim()).to_string());
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest).to_string());
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// File → the sibling files it names, and the names it takes from
/// `mod.rs` itself (anything `super::` names that is no sibling).
fn graph() -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/serve");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" && !stem.ends_with("_tests") {
            files.insert(stem, code(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    let mut graph = BTreeMap::new();
    let mut upward = Vec::new();
    for (file, text) in &files {
        let named: &mut BTreeSet<String> = graph.entry(file.clone()).or_default();
        let mut names = named_after(text, "super::");
        names.extend(named_after(text, "crate::serve::"));
        for name in names {
            if files.contains_key(&name) {
                if &name != file {
                    named.insert(name);
                }
            } else {
                upward.push(format!("{file} -> mod.rs ({name})"));
            }
        }
    }
    (graph, upward)
}

/// A circle through `from`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        from: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == from {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, from, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_string()];
    walk(graph, from, from, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn serves_files_import_one_another_without_a_circle() {
    let (graph, _) = graph();
    assert!(
        graph.len() > 15 && graph["prefetch"].contains("apiserver"),
        "the graph covers serve's files: {graph:?}"
    );
    let circles: Vec<Vec<String>> = graph.keys().filter_map(|m| circle(&graph, m)).collect();
    assert!(circles.is_empty(), "circles: {circles:?}");
}

#[test]
fn no_file_of_serve_reaches_back_up_into_mod_rs() {
    let (_, upward) = graph();
    assert!(upward.is_empty(), "upward: {upward:?}");
}

#[test]
fn the_reader_sees_groups_and_circles() {
    assert_eq!(
        named_after("use super::{a, b::{C, D}, e};\nuse super::f::G;", "super::"),
        ["a", "b", "e", "f"]
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec!["a"]), ("c", vec!["a"])]
        .into_iter()
        .map(|(m, to)| (m.to_string(), to.into_iter().map(str::to_string).collect()))
        .collect();
    assert_eq!(circle(&graph, "a"), Some(vec!["a".into(), "b".into(), "a".into()]));
    assert_eq!(circle(&graph, "c"), None);
}
