//! serve's rooms import one another without a circle, and none reaches
//! back up into `mod.rs`, which calls them all (issue 55): each file can be
//! read knowing only the files it names. Drawn from `super::…` and
//! `crate::serve::…` paths in code, not comments or test modules: the
//! host's own drawing (`crate::layering_tests`), serve's part of it.

use config_snapshot_testing::layering::{circles, Graph};

/// File → the sibling files it names, read off the host's drawing, and the
/// files that name `mod.rs` itself (anything `super::` names that is no
/// sibling lands there).
fn graph() -> (Graph, Vec<String>) {
    let mut graph = Graph::new();
    let mut upward = Vec::new();
    for (room, named) in crate::layering_tests::graph() {
        let Some(file) = room.strip_prefix("serve::") else {
            continue;
        };
        let siblings = graph.entry(file.to_string()).or_default();
        for to in named {
            match to.strip_prefix("serve::") {
                Some(sibling) => {
                    siblings.insert(sibling.to_string());
                }
                None if to == "serve" => upward.push(format!("{file} -> mod.rs")),
                None => {}
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
