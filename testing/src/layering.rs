//! The drawing behind the layering tests (issues 44 and 55): which module
//! of a crate names which, read from the paths in its code, and the two
//! faults a drawing can show, a circle and an arrow running back up.
//!
//! One file serves both crates: the host's tests use it from this crate,
//! and the policy's own test includes it by path, since the policy cannot
//! depend on a crate built on the host.

use std::collections::{BTreeMap, BTreeSet};

/// Module → the modules it names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The code of a module file: comments and the trailing test module (the
/// project's convention: `#[cfg(test)]` before an inline `mod … {`) taken off, so a
/// path named in a doc comment or a test draws no arrow. A `#[cfg(test)]`
/// on anything else (a test-only function) leaves the code after it read.
pub fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    let mut in_block = false;
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            // An inline module here is the trailing test module; a test
            // module in a file of its own (`mod tests;`, perhaps after a
            // `#[path]`) may stand anywhere, and the code goes on after it.
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or_default();
            if (next.starts_with("mod ") || next.starts_with("pub mod ")) && next.contains('{') {
                break;
            }
            continue;
        }
        out.push_str(&without_comments(line, &mut in_block));
        out.push('\n');
    }
    out
}

/// One line without its comments (`//` to the end, `/* … */` across lines),
/// leaving string literals whole: `"https://…"` is code.
fn without_comments(line: &str, in_block: &mut bool) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if *in_block {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                *in_block = false;
            }
            continue;
        }
        if in_string {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('/', Some('/')) => break,
            ('/', Some('*')) => {
                chars.next();
                *in_block = true;
            }
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

fn ident(text: &str) -> &str {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
}

/// Every path the code names after `prefix`, as its segments, with
/// groups spread out: `super::{a, b::{C, D}}` names `[a]`, `[b, C]` and
/// `[b, D]`. Segments stop at the first that is not an identifier.
pub fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        spread(&text[i + prefix.len()..], &mut Vec::new(), &mut out);
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The paths of one tail, `a::b::{c, d}`, each with `head` before it.
fn spread(rest: &str, head: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = rest;
    let depth = head.len();
    let mut grouped = false;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut level = 0usize;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' if level > 0 => level -= 1,
                    '}' | ',' if level == 0 => {
                        let item = group[start..j].trim();
                        if !item.is_empty() {
                            spread(item, head, out);
                        }
                        if c == '}' {
                            break;
                        }
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            grouped = true;
            break;
        }
        let name = ident(rest);
        if name.is_empty() {
            break;
        }
        head.push(name.to_string());
        match rest[name.len()..].strip_prefix("::") {
            Some(tail) => rest = tail,
            None => break,
        }
    }
    if !grouped && head.len() > depth {
        out.push(head.clone());
    }
    head.truncate(depth);
}

/// A circle through `from`, if there is one.
pub fn circle(graph: &Graph, from: &str) -> Option<Vec<String>> {
    fn walk(graph: &Graph, at: &str, from: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
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

/// Every circle of the graph, one through each module on one.
pub fn circles(graph: &Graph) -> Vec<Vec<String>> {
    graph.keys().filter_map(|m| circle(graph, m)).collect()
}

/// The arrows from a module to one on a higher layer, as `from -> to`;
/// `layer` says where a module stands (None: on no layer).
pub fn upward(graph: &Graph, layer: impl Fn(&str) -> Option<usize>) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |t| (from, t)))
        .filter(|(from, to)| matches!((layer(from), layer(to)), (Some(a), Some(b)) if b > a))
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    }

    #[test]
    fn the_reader_keeps_code_that_looks_like_a_comment_and_drops_the_test_module() {
        let text = code(concat!(
            "let u = \"https://x\"; use crate::a; // crate::b\n",
            "/* crate::c\n crate::d */ use crate::e;\n",
            "#[cfg(test)]\nfn helper() { crate::f::g() }\n",
            "#[cfg(test)]\nmod layering_tests;\nuse crate::i;\n",
            "#[cfg(test)]\nmod tests { use crate::h; }\n",
        ));
        let names: Vec<String> = paths_after(&text, "crate::").iter().map(|p| p.join("::")).collect();
        assert_eq!(names, ["a", "e", "f::g", "i"]);
    }

    #[test]
    fn the_reader_spreads_groups_and_skips_comments() {
        let text = code(
            "use super::{a, b::{C, D}, e};\n// super::x\nuse super::f::G;\n#[cfg(test)]\nmod tests { use super::t; }",
        );
        let paths = paths_after(&text, "super::");
        let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(names, ["a", "b::C", "b::D", "e", "f::G"]);
        assert!(
            paths_after("my_crate::x", "crate::").is_empty(),
            "a longer name is not the prefix"
        );
    }

    #[test]
    fn the_drawing_finds_circles_and_arrows_up() {
        let g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]);
        assert_eq!(
            circle(&g, "a"),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        assert_eq!(circle(&g, "d"), None);
        assert_eq!(circles(&g).len(), 3);
        let layer = |m: &str| Some(usize::from(m == "a"));
        assert_eq!(upward(&g, layer), ["c -> a", "d -> a"]);
    }
}
