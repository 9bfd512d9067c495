//! serve's rooms import one another without a circle, and none reaches
//! back up into `mod.rs`, which calls them all (issue 55): each file can be
//! read knowing only the files it names. Drawn from `super::…` and
//! `crate::serve::…` paths in code, not comments or test modules; the
//! host's own drawing (`crate::layering_tests`) checks the wings around it.

use std::collections::BTreeMap;
use std::path::Path;

use config_snapshot_testing::layering::{circles, code, paths_after, Graph};

/// File → the sibling files it names, and the names it takes from
/// `mod.rs` itself (anything `super::` names that is no sibling).
fn graph() -> (Graph, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/serve");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" && !stem.ends_with("_tests") {
            files.insert(stem, code(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    let mut graph = Graph::new();
    let mut upward = Vec::new();
    for (file, text) in &files {
        let named = graph.entry(file.clone()).or_default();
        let mut paths = paths_after(text, "super::");
        paths.extend(paths_after(text, "crate::serve::"));
        for name in paths.into_iter().map(|p| p[0].clone()) {
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

#[test]
fn serves_files_import_one_another_without_a_circle() {
    let (graph, _) = graph();
    assert!(
        graph.len() > 15 && graph["prefetch"].contains("apiserver"),
        "the graph covers serve's files: {graph:?}"
    );
    let circles = circles(&graph);
    assert!(circles.is_empty(), "circles: {circles:?}");
}

#[test]
fn no_file_of_serve_reaches_back_up_into_mod_rs() {
    let (_, upward) = graph();
    assert!(upward.is_empty(), "upward: {upward:?}");
}
