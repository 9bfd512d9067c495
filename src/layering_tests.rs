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

/// Module → the modules it names through `crate::`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            for file in std::fs::read_dir(&path).unwrap() {
                let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
                texts.entry(name.clone()).or_default().push_str(&code(&text));
            }
        } else if !name.ends_with("_tests") && name != "lib" && name != "fake" {
            texts.insert(name, code(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let named = text
                .match_indices("crate::")
                .filter_map(|(i, _)| {
                    let rest = &text[i + "crate::".len()..];
                    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
                    Some(rest[..end].to_string())
                })
                .filter(|m| m != module && modules.contains(m))
                .collect();
            (module.clone(), named)
        })
        .collect()
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
