//! Within a crate, no cycle among the top-level modules under `src/`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use super::walk;
use crate::Result;

/// Which top-level modules of a crate refer to which others: a module is a
/// file `src/a.rs` or a directory `src/a/`, and it refers to `b` where one of
/// its files says `crate::b` (also inside `use crate::{b, …}`), outside
/// comments. The crate root (`lib.rs`, `main.rs`) and `src/bin` are no modules.
pub(super) fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    walk(src, &mut |path| {
        let Ok(relative) = path.strip_prefix(src) else { return };
        let Some(first) = relative.components().next() else { return };
        let first = first.as_os_str().to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        let is_rust = path.extension().is_some_and(|ext| ext == "rs");
        if is_rust && !["lib", "main", "bin"].contains(&module.as_str()) {
            modules.entry(module).or_default().push(path.to_path_buf());
        }
    })?;
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, files) in &modules {
        let mut refers = BTreeSet::new();
        for file in files {
            refers.extend(
                crate_references(&fs::read_to_string(file)?)
                    .into_iter()
                    .filter(|name| name != module && names.contains(name)),
            );
        }
        graph.insert(module.clone(), refers);
    }
    Ok(graph)
}

/// The first path segments after `crate::` in `text`, comments left out:
/// `crate::a::x` and `use crate::{a, b::c}` give `a` (and `b`).
fn crate_references(text: &str) -> BTreeSet<String> {
    // Comments out, lines kept: a `use` group may span several.
    let code: Vec<&str> = text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("//") {
                ""
            } else {
                line.split(" //").next().unwrap_or(line)
            }
        })
        .collect();
    let code = code.join("\n");
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            names.extend(group_heads(group));
        } else {
            names.extend(identifier(rest));
        }
    }
    names
}

/// The first segment of each path in a `{a, b::c, d::{e}}` group (whose
/// opening brace is already consumed), up to its closing brace.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0_usize;
    let mut at_start = true;
    for (index, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_start = true,
            c if at_start && !c.is_whitespace() => {
                at_start = false;
                heads.extend(identifier(&group[index..]));
            }
            _ => {}
        }
    }
    heads
}

/// The identifier `text` starts with, if any.
fn identifier(text: &str) -> Option<String> {
    let end = text.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(text.len());
    (end > 0).then(|| text[..end].to_owned())
}

/// Each cycle of the graph: one path `a → b → … → a` per strongly connected
/// set of two or more modules, starting at its first module by name.
pub(super) fn module_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|node| (node, reach(node))).collect();
    let mut done = BTreeSet::new();
    let mut cycles = Vec::new();
    for (node, reaches) in &reached {
        if done.contains(*node) || !reaches.contains(*node) {
            continue;
        }
        let set: BTreeSet<&String> = reaches
            .iter()
            .filter(|other| reached.get(other).is_some_and(|back| back.contains(*node)))
            .collect();
        done.extend(set.iter().map(|name| (*name).clone()));
        cycles.push(shortest_cycle(graph, node, &set));
    }
    cycles
}

/// The shortest path from `start` back to itself within `set`, both ends
/// included.
fn shortest_cycle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    start: &String,
    set: &BTreeSet<&String>,
) -> Vec<String> {
    let mut previous: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten().filter(|next| set.contains(next)) {
            if next == start {
                // Walk back from `node` to `start`, which has no predecessor.
                let mut path = vec![start.clone()];
                let mut at = node;
                loop {
                    path.push(at.clone());
                    match previous.get(at) {
                        Some(before) => at = before,
                        None => break,
                    }
                }
                path.reverse();
                return path;
            }
            if !previous.contains_key(next) {
                previous.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    vec![start.clone()]
}

/// Reports each cycle.
pub(super) fn check_cycles(cycles: &[(String, Vec<String>)], problems: &mut Vec<String>) {
    for (krate, cycle) in cycles {
        problems.push(format!(
            "{krate}: its modules refer to each other in a cycle: {}",
            cycle.join(" → ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crate_references_read_paths_and_use_groups_but_not_comments() {
        let text = "//! See [`crate::doc`].\n\
                    use crate::{a, b::{C, d}, e::f as g};\n\
                    use crate::h::I; // crate::comment\n\
                    let x = crate::j::k();\n\
                    pub(crate) fn l() -> $crate::m {}\n\
                    use crate::{\n    n::O,\n    // crate::p\n    q,\n};\n";
        let found: Vec<String> = crate_references(text).into_iter().collect();
        assert_eq!(found, ["a", "b", "e", "h", "j", "n", "q"]);
    }

    fn graph(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            graph.entry((*from).to_owned()).or_default().insert((*to).to_owned());
            graph.entry((*to).to_owned()).or_default();
        }
        graph
    }

    #[test]
    fn module_cycles_are_found_with_their_path() {
        assert!(module_cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        let cycles = module_cycles(&graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("x", "y"),
            ("y", "x"),
        ]));
        assert_eq!(cycles, [vec!["a", "b", "c", "a"], vec!["x", "y", "x"]]);
    }

    #[test]
    fn a_module_cycle_is_reported_with_its_path() {
        let cycles = [("kpm-cache".to_owned(), vec!["a".into(), "b".into(), "a".into()])];
        let mut problems = Vec::new();
        check_cycles(&cycles, &mut problems);
        assert_eq!(problems, ["kpm-cache: its modules refer to each other in a cycle: a → b → a"]);
    }

    #[test]
    fn the_module_graph_comes_from_the_files_under_src() {
        let src = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = src.path().join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        };
        write("lib.rs", "//! Root.\nuse crate::a::X;\n");
        write("a.rs", "//! A.\nuse crate::b::Y;\n");
        write("b/mod.rs", "//! B.\nmod inner;\n");
        write("b/inner.rs", "//! Inner.\nuse crate::{a, lib};\n");
        write("bin/tool.rs", "//! A binary.\nuse crate::a;\n");
        let graph = module_graph(src.path()).unwrap();
        assert_eq!(graph.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(module_cycles(&graph), [vec!["a", "b", "a"]]);
    }
}
