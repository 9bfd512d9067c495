//! serve's wings stand in order and its rooms import one another without a
//! circle (issue 67): each wing uses only itself and the wings below it,
//! none reaches back up into `mod.rs` (which wires them all), and a file
//! can be read knowing only the files it names. Drawn from `super::…` and
//! `crate::serve::…` paths in code, not comments or test modules: the
//! host's own drawing (`crate::layering_tests`), serve's part of it.

use config_snapshot_testing::layering::{circles, Graph};

/// serve's wings, lowest first: a wing may use itself and those below it
/// (docs/architecture.md draws them).
const WINGS: [&str; 6] = ["tell", "view", "work", "answer", "intake", "trust"];

/// Room → the rooms of serve it names (`tell::metrics`, or `serve` for
/// `mod.rs` itself).
fn graph() -> Graph {
    let mut graph = Graph::new();
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
                None if to == "serve" => {
                    siblings.insert("serve".to_string());
                }
                None => {}
            }
        }
    }
    graph
}

/// The wing a room of serve stands in.
fn wing(room: &str) -> Option<usize> {
    WINGS.iter().position(|w| room.split("::").next() == Some(*w))
}

#[test]
fn serves_rooms_stand_in_wings_and_import_one_another_without_a_circle() {
    let graph = graph();
    assert!(
        graph.len() > 25 && graph["view::prefetch"].contains("view::apiserver"),
        "the graph covers serve's files: {graph:?}"
    );
    let loose: Vec<&String> = graph.keys().filter(|room| wing(room).is_none()).collect();
    assert!(loose.is_empty(), "every room of serve stands in a wing: {loose:?}");
    let circles = circles(&graph);
    assert!(circles.is_empty(), "circles: {circles:?}");
}

#[test]
fn each_wing_of_serve_uses_only_those_below_and_none_reaches_up_into_mod_rs() {
    let graph = graph();
    let mut up = Vec::new();
    for (room, named) in &graph {
        let from = wing(room).expect("every room stands in a wing");
        for to in named {
            match wing(to) {
                Some(to_wing) if to_wing <= from => {}
                _ => up.push(format!("{room} -> {to}")),
            }
        }
    }
    assert!(up.is_empty(), "arrows up: {up:?}");
}
