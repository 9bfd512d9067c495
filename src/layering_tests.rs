//! The policy's modules import one another without a circle: each can be
//! read knowing only those below it (issue 44; docs/architecture.md).
//! The graph is drawn from `crate::…` paths in code, not comments or test
//! modules, over the modules of `src/` (a folder is one module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The code of a module file: comment lines and the trailing
/// `#[cfg(test)]` module (the project's convention) taken off.
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

/// The folders of `src/`, lowest first: a module may use those in its
/// own folder and in the folders below.
const LAYERS: [&str; 4] = ["model", "host", "plan", "admit"];

/// Every module file of `src/` but the crate root and test files: (folder,
/// module, code). A folder's `mod.rs` is the module named as the folder.
fn modules() -> Vec<(String, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let files: Vec<std::path::PathBuf> = if path.is_dir() {
            std::fs::read_dir(&path).unwrap().map(|f| f.unwrap().path()).collect()
        } else {
            vec![path.clone()]
        };
        for file in files {
            let name = file.file_stem().unwrap().to_string_lossy().to_string();
            if name.ends_with("_tests") || name == "lib" {
                continue;
            }
            let module = if name == "mod" { stem.clone() } else { name };
            let folder = if path.is_dir() { stem.clone() } else { String::new() };
            out.push((folder, module, code(&std::fs::read_to_string(&file).unwrap())));
        }
    }
    out
}

/// Module → the modules it names through `crate::` (through a folder's
/// path or the crate root's re-export alike).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let names: BTreeSet<String> = modules.iter().map(|(_, m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, text) in &modules {
        let named = graph.entry(module.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let mut segments = text[i + "crate::".len()..].split("::").map(|s| {
                s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default()
            });
            let Some(mut target) = segments.next() else { continue };
            // `crate::model::keys` names `keys`, which stands in `model`.
            if LAYERS.contains(&target) {
                if let Some(inner) = segments.next().filter(|n| names.contains(*n)) {
                    target = inner;
                }
            }
            if target != module && names.contains(target) {
                named.insert(target.to_string());
            }
        }
    }
    graph
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
fn the_policys_modules_import_one_another_without_a_circle() {
    let graph = graph();
    assert!(graph.len() > 20, "the graph covers the modules: {:?}", graph.keys());
    let circles: Vec<Vec<String>> = graph.keys().filter_map(|m| circle(&graph, m)).collect();
    assert!(circles.is_empty(), "circles: {circles:?}");
}

#[test]
fn no_module_uses_a_folder_above_its_own() {
    let modules = modules();
    let layer = |module: &str| {
        modules
            .iter()
            .find(|(_, m, _)| m == module)
            .and_then(|(folder, _, _)| LAYERS.iter().position(|l| l == folder))
    };
    let graph = graph();
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| (from, t)))
        .filter(|(from, to)| matches!((layer(from), layer(to)), (Some(a), Some(b)) if b > a))
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(upward.is_empty(), "upward: {upward:?}");
    assert!(
        layer("keys") == Some(0) && layer("workload") == Some(3),
        "the folders are read"
    );
}

#[test]
fn the_circle_check_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
            .into_iter()
            .map(|(m, to)| (m.to_string(), to.into_iter().map(str::to_string).collect()))
            .collect();
    assert_eq!(
        circle(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(circle(&graph, "d"), None);
}
