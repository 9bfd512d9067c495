//! The host's drawing (issue 55): its rooms (files) name one another
//! without a circle, so none reaches back up into a room that calls it,
//! and its wings (the top floor's folders) stand in order, each using only
//! the wings below it. The drawing is read from `crate::…` (the CLI's
//! `config_snapshot::…`), `super::…`, `self::…` and a folder's bare
//! `child::…` paths in code, not comments or test modules: a test may use
//! any wing (the simulator, most often).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use config_snapshot_testing::layering::{circles, code, paths_after, upward, Graph};

/// The wings, lowest first: a wing may use itself and those below it
/// (docs/architecture.md draws them).
/// `fuzz` (the fuzz targets' bodies, a feature's file) stands above
/// what it attacks; `cli`, in the binary, names the library as
/// `config_snapshot::`.
const WINGS: [&str; 9] = [
    "kubewarden",
    "cluster",
    "lifecycle",
    "capability",
    "replay",
    "serve",
    "tools",
    "fuzz",
    "cli",
];

/// Every room of the host but the crate roots and tests: its module path
/// (`serve::http`, a folder's `mod.rs` named as the folder) and its code.
fn rooms() -> BTreeMap<Vec<String>, String> {
    fn visit(dir: &Path, at: &[String], out: &mut BTreeMap<Vec<String>, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().to_string();
            let mut module = at.to_vec();
            if path.is_dir() {
                if stem != "tests" {
                    module.push(stem);
                    visit(&path, &module, out);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs")
                || stem.ends_with("_tests")
                || ["tests", "lib", "main"].contains(&stem.as_str())
            {
                continue;
            }
            if stem != "mod" {
                module.push(stem);
            }
            out.insert(module, code(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    let mut out = BTreeMap::new();
    visit(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut out);
    out
}

/// The room a path lands in: the longest room its segments begin with.
fn landing(rooms: &BTreeMap<Vec<String>, String>, path: &[String]) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| rooms.contains_key(p))
}

/// Room → the rooms it names, with module paths joined by `::` (serve's
/// own test reads its part).
pub(crate) fn graph() -> Graph {
    let rooms = rooms();
    let mut graph = Graph::new();
    for (room, text) in &rooms {
        let is_folder = rooms.keys().any(|r| r.len() > room.len() && r.starts_with(room));
        // `super::` is the folder above, from a file and a folder's
        // mod.rs alike (the mod.rs stands for the folder itself).
        let sup = &room[..room.len() - 1];
        let mut named: Vec<Vec<String>> = paths_after(text, "crate::");
        named.extend(paths_after(text, "config_snapshot::"));
        for p in paths_after(text, "super::") {
            named.push(sup.iter().cloned().chain(p).collect());
        }
        for p in paths_after(text, "self::") {
            named.push(room.iter().cloned().chain(p).collect());
        }
        if is_folder {
            // A folder calls its children by their bare names.
            for child in rooms
                .keys()
                .filter(|r| r.len() == room.len() + 1 && r.starts_with(room))
            {
                let name = child.last().unwrap();
                if text
                    .match_indices(&format!("{name}::"))
                    .any(|(i, _)| !text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                {
                    named.push(child.clone());
                }
            }
        }
        let entry = graph.entry(room.join("::")).or_default();
        for path in named {
            if let Some(to) = landing(&rooms, &path).filter(|to| to != room) {
                entry.insert(to.join("::"));
            }
        }
    }
    graph
}

fn wing(room: &str) -> Option<usize> {
    let first = room.split("::").next()?;
    WINGS.iter().position(|w| *w == first)
}

#[test]
fn the_hosts_rooms_name_one_another_without_a_circle() {
    let graph = graph();
    assert!(
        graph.len() > 80 && graph["serve::view::scope"].contains("serve::view::prefetch"),
        "the drawing covers the host's rooms: {:?}",
        graph.keys()
    );
    let circles = circles(&graph);
    assert!(circles.is_empty(), "circles: {circles:?}");
}

#[test]
fn the_top_floor_is_the_wings_and_each_uses_only_those_below() {
    let graph = graph();
    let top: BTreeSet<String> = graph
        .keys()
        .map(|r| r.split("::").next().unwrap().to_string())
        .collect();
    let wings: BTreeSet<String> = WINGS.iter().map(|w| w.to_string()).collect();
    assert_eq!(top, wings, "every room stands in a wing");
    let up = upward(&graph, wing);
    assert!(up.is_empty(), "arrows up between wings: {up:?}");
}
