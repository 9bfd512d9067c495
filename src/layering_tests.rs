//! The policy's modules import one another without a circle: each can be
//! read knowing only those below it (issue 44; docs/architecture.md).
//! The graph is drawn from `crate::…` and `super::…` paths in code, not comments or test
//! modules, over the modules of `src/` (a folder is one module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

// The drawing the host's layering tests use too; the policy cannot depend
// on the crate that holds it (it is built on the host), so it reads the file.
#[path = "../testing/src/layering.rs"]
mod layering;
use layering::{circles, code, paths_after, upward};

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

/// Module → the modules it names through `crate::` or `super::` (through
/// a folder's path or the crate root's re-export alike).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let names: BTreeSet<String> = modules.iter().map(|(_, m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, text) in &modules {
        let named = graph.entry(module.clone()).or_default();
        let mut paths = paths_after(text, "crate::");
        paths.extend(paths_after(text, "super::"));
        for path in paths {
            // `crate::model::keys` names `keys`, which stands in `model`.
            let target = match path.get(1) {
                Some(inner) if LAYERS.contains(&path[0].as_str()) && names.contains(inner) => inner,
                _ => &path[0],
            };
            if target != module && names.contains(target) {
                named.insert(target.clone());
            }
        }
    }
    graph
}

#[test]
fn the_policys_modules_import_one_another_without_a_circle() {
    let graph = graph();
    assert!(graph.len() > 20, "the graph covers the modules: {:?}", graph.keys());
    let circles = circles(&graph);
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
    let upward = upward(&graph, layer);
    assert!(upward.is_empty(), "upward: {upward:?}");
    assert!(
        layer("keys") == Some(0) && layer("workload") == Some(3),
        "the folders are read"
    );
}
