//! Within a crate, no cycle among the modules of one parent: neither among
//! the top-level modules under `src/` nor among the modules any module
//! declares (`a/b.rs` and `a/c.rs`, or a `mod c { … }` in `a.rs`). A cycle
//! between files of different parents is one between their ancestors that
//! are siblings, so it is found there; a parent and its own children are no
//! cycle (`a/mod.rs` takes `b::X`, `a/b.rs` takes `super::Y`), as a crate's
//! root and its modules are none.
//!
//! A file refers to a module where its code names a path that starts at
//! `crate::`, `super::` or `self::` (also inside `use` groups), comments and
//! strings left out; `super::` and `self::` are read from the module they are
//! written in, an inline `mod tests { … }` one. A path through a module the
//! file named so (`node::PROGRAMS` after `use super::node;`) says what it
//! takes from there, for the report.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::Path;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

use super::walk;
use super::workspace::Crate;
use crate::Result;

/// A module's path from its crate's root: `[]` for the root, `[a, b]` for
/// `crate::a::b`.
type ModulePath = Vec<String>;

/// The files of one module that name a sibling, and the paths they name
/// from that sibling on: `file → {node::PROGRAMS, …}`.
type Naming = BTreeMap<String, BTreeSet<String>>;

/// A cycle among the children of one module.
struct Cycle {
    /// The module whose children they are.
    parent: ModulePath,
    /// `a → b → a`: the first child again at the end.
    modules: Vec<String>,
    /// For each step of `modules`, what the first names of the second.
    steps: Vec<Naming>,
}

/// Reports each cycle of each crate's modules under `src/` (its binaries
/// under `src/bin/` left out).
pub(super) fn check(root: &Path, crates: &[Crate], problems: &mut Vec<String>) -> Result {
    let mut found = Vec::new();
    for krate in crates {
        let src = root.join(&krate.dir).join("src");
        let mut sources = Vec::new();
        let mut failed = None;
        walk(&src, &mut |path| {
            let Ok(relative) = path.strip_prefix(&src) else { return };
            let relative = relative.to_string_lossy().replace('\\', "/");
            if path.extension().is_some_and(|ext| ext == "rs") && !relative.starts_with("bin/") {
                match fs::read_to_string(path) {
                    Ok(text) => sources.push((relative, text)),
                    Err(err) => failed = Some(format!("{}: {err}", path.display())),
                }
            }
        })?;
        if let Some(failed) = failed {
            return Err(failed.into());
        }
        let shown = format!("{}/src", krate.dir);
        for cycle in crate_cycles(&shown, &sources)? {
            found.push((krate.name.as_str(), cycle));
        }
    }
    report(&found, problems);
    Ok(())
}

/// The cycles among the modules of one crate, from its sources: each file's
/// path under `src/` (`/`-separated) and its text; `src` is how the report
/// shows that folder.
fn crate_cycles(src: &str, sources: &[(String, String)]) -> Result<Vec<Cycle>> {
    let mut modules = BTreeSet::new();
    let mut files = Vec::new();
    for (relative, text) in sources {
        let Some(module) = file_module(relative) else { continue };
        for depth in 0..=module.len() {
            modules.insert(module[..depth].to_vec());
        }
        let tokens: TokenStream =
            text.parse().map_err(|err| format!("{src}/{relative}: not Rust tokens: {err}"))?;
        let mut found = Found::default();
        scan(tokens, &module, &mut found);
        modules.extend(found.modules.iter().cloned());
        files.push((format!("{src}/{relative}"), found));
    }
    let mut references = Vec::new();
    for (file, found) in files {
        // A module the file names by itself (`use super::node;`) is named
        // again by the paths that start with its name (`node::PROGRAMS`).
        let through_modules = found.plain.iter().filter_map(|(from, path)| {
            let (first, rest) = path.split_first()?;
            let (_, module) = found.references.iter().find(|(named_in, to)| {
                named_in == from && to.last() == Some(first) && modules.contains(to)
            })?;
            Some((from.clone(), [module.as_slice(), rest].concat()))
        });
        let named: Vec<_> = through_modules.collect();
        references.extend(
            found.references.into_iter().chain(named).map(|(from, to)| (file.clone(), from, to)),
        );
    }
    // Each reference is one between the children of the deepest module both
    // ends are in, if the end it names is a module.
    let mut siblings: BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, Naming>>> =
        BTreeMap::new();
    for (file, from, to) in references {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        let (Some(from_child), Some(to_child)) = (from.get(common), to.get(common)) else {
            continue;
        };
        if !modules.contains(&to[..=common]) {
            continue;
        }
        siblings
            .entry(to[..common].to_vec())
            .or_default()
            .entry(from_child.clone())
            .or_default()
            .entry(to_child.clone())
            .or_default()
            .entry(file)
            .or_default()
            .insert(to[common..].join("::"));
    }
    let mut cycles = Vec::new();
    for (parent, edges) in &siblings {
        let graph: BTreeMap<String, BTreeSet<String>> =
            edges.iter().map(|(from, to)| (from.clone(), to.keys().cloned().collect())).collect();
        for modules in module_cycles(&graph) {
            let steps = modules
                .windows(2)
                .map(|step| {
                    let naming = edges.get(&step[0]).and_then(|to| to.get(&step[1]));
                    naming.cloned().unwrap_or_default()
                })
                .collect();
            cycles.push(Cycle { parent: parent.clone(), modules, steps });
        }
    }
    Ok(cycles)
}

/// The module a file under `src/` is the root of: `a/b.rs` and `a/b/mod.rs`
/// are `crate::a::b`, `lib.rs` and `main.rs` the crate root.
fn file_module(relative: &str) -> Option<ModulePath> {
    let mut path: ModulePath =
        relative.strip_suffix(".rs")?.split('/').map(str::to_owned).collect();
    match path.last().map(String::as_str) {
        Some("mod") => {
            path.pop();
        }
        Some("lib" | "main") if path.len() == 1 => path.clear(),
        _ => {}
    }
    Some(path)
}

/// What one file's code declares and names.
#[derive(Default)]
struct Found {
    /// Its inline modules (`mod tests { … }`).
    modules: Vec<ModulePath>,
    /// Each path it names from `crate`, `super` or `self`: the module it is
    /// named in, and the path resolved from the crate's root.
    references: Vec<(ModulePath, ModulePath)>,
    /// Each other path of two segments or more (`node::PROGRAMS`,
    /// `std::fs::read`): the module it is named in, and the path as written.
    plain: Vec<(ModulePath, Vec<String>)>,
}

/// Reads `tokens`, written in `module`, into `found`.
fn scan(tokens: TokenStream, module: &[String], found: &mut Found) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut at = 0;
    while at < tokens.len() {
        match &tokens[at] {
            TokenTree::Ident(ident) if ident == "mod" => {
                if let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(body))) =
                    (tokens.get(at + 1), tokens.get(at + 2))
                    && body.delimiter() == Delimiter::Brace
                {
                    let inner = [module, &[name.to_string()]].concat();
                    scan(body.stream(), &inner, found);
                    found.modules.push(inner);
                    at += 3;
                    continue;
                }
            }
            // `$crate` is the crate a macro is defined in, not a module.
            TokenTree::Ident(ident)
                if ["crate", "super", "self"].contains(&ident.to_string().as_str())
                    && !matches!(at.checked_sub(1).map(|before| &tokens[before]),
                        Some(TokenTree::Punct(punct)) if punct.as_char() == '$') =>
            {
                let (paths, next) = read_path(&tokens, at);
                for path in paths {
                    if let Some(to) = resolve(&path, module) {
                        found.references.push((module.to_vec(), to));
                    }
                }
                at = next;
                continue;
            }
            TokenTree::Ident(_) if is_path_separator(&tokens, at + 1) => {
                let (paths, next) = read_path(&tokens, at);
                found.plain.extend(paths.into_iter().map(|path| (module.to_vec(), path)));
                at = next;
                continue;
            }
            TokenTree::Group(group) => scan(group.stream(), module, found),
            _ => {}
        }
        at += 1;
    }
}

/// The path whose first segment is `tokens[at]`: its segments, one list per
/// path of a `use` group at its end (`a::{b, c::d}` is `a::b` and
/// `a::c::d`), and the index past it.
fn read_path(tokens: &[TokenTree], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    while let Some(TokenTree::Ident(ident)) = tokens.get(at) {
        segments.push(ident.to_string());
        at += 1;
        if !is_path_separator(tokens, at) {
            break;
        }
        at += 2;
        if let Some(TokenTree::Group(group)) = tokens.get(at)
            && group.delimiter() == Delimiter::Brace
        {
            let items: Vec<TokenTree> = group.stream().into_iter().collect();
            let paths = items
                .split(|token| matches!(token, TokenTree::Punct(p) if p.as_char() == ','))
                .flat_map(|item| read_path(item, 0).0)
                .filter(|tail| !tail.is_empty())
                .map(|tail| [segments.clone(), tail].concat())
                .collect();
            return (paths, at + 1);
        }
    }
    (vec![segments], at)
}

/// Whether `tokens[at..]` starts with `::`.
fn is_path_separator(tokens: &[TokenTree], at: usize) -> bool {
    matches!(
        (tokens.get(at), tokens.get(at + 1)),
        (Some(TokenTree::Punct(first)), Some(TokenTree::Punct(second)))
            if first.as_char() == ':' && first.spacing() == Spacing::Joint && second.as_char() == ':'
    )
}

/// `path` (`crate::a::b`, `super::super::c`, `self::d`), written in
/// `module`, from the crate's root; `None` for any other path, and for a
/// `super` above the root.
fn resolve(path: &[String], module: &[String]) -> Option<ModulePath> {
    let (first, rest) = path.split_first()?;
    let mut resolved = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module.split_last()?.1.to_vec(),
        _ => return None,
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                resolved.pop()?;
            }
            // `use a::{self, …}` names `a` itself.
            "self" => {}
            _ => resolved.push(segment.clone()),
        }
    }
    Some(resolved)
}

/// Each cycle of the graph: one path `a → b → … → a` per strongly connected
/// set of two or more modules, starting at its first module by name.
fn module_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
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

/// Reports each cycle of `found` (crate, cycle).
fn report(found: &[(&str, Cycle)], problems: &mut Vec<String>) {
    for (krate, cycle) in found {
        let modules = if cycle.parent.is_empty() {
            "its top-level modules".to_owned()
        } else {
            format!("the modules of `crate::{}`", cycle.parent.join("::"))
        };
        let naming: Vec<String> = cycle
            .steps
            .iter()
            .flatten()
            .map(|(file, names)| {
                // `node` goes where `node::PROGRAMS` says more.
                let names: Vec<&str> = names
                    .iter()
                    .filter(|name| {
                        !names.iter().any(|other| other.starts_with(&format!("{name}::")))
                    })
                    .map(String::as_str)
                    .collect();
                format!("{file} names {}", names.join(", "))
            })
            .collect();
        problems.push(format!(
            "{krate}: {modules} refer to each other in a cycle, {} ({}): move what they share \
             into one of them, or into a module of its own",
            cycle.modules.join(" → "),
            naming.join("; ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    /// The problems tidy reports for one crate, `kpm-x`, whose sources
    /// `fixture` holds: each file after a `//- PATH` line (PATH under
    /// `src/`).
    fn check(fixture: &str, expected: &Expect) {
        let mut sources: Vec<(String, String)> = Vec::new();
        for line in fixture.lines() {
            match (line.strip_prefix("//- "), sources.last_mut()) {
                (Some(path), _) => sources.push((path.trim().to_owned(), String::new())),
                (None, Some((_, text))) => {
                    text.push_str(line);
                    text.push('\n');
                }
                (None, None) => assert!(line.trim().is_empty(), "text before a file: {line}"),
            }
        }
        let cycles = crate_cycles("crates/kpm-x/src", &sources).unwrap();
        let found: Vec<(&str, Cycle)> = cycles.into_iter().map(|cycle| ("kpm-x", cycle)).collect();
        let mut problems = Vec::new();
        report(&found, &mut problems);
        expected.assert_eq(&problems.join("\n"));
    }

    #[test]
    fn top_level_modules_naming_each_other_are_a_cycle() {
        check(
            r"
//- lib.rs
mod a;
mod b;
use crate::a::X;
//- a.rs
use crate::b::Y;
//- b/mod.rs
mod inner;
//- b/inner.rs
use crate::{a, lib};
",
            &expect![[
                r"kpm-x: its top-level modules refer to each other in a cycle, a → b → a (crates/kpm-x/src/a.rs names b::Y; crates/kpm-x/src/b/inner.rs names a): move what they share into one of them, or into a module of its own"
            ]],
        );
    }

    #[test]
    fn sibling_files_naming_each_other_are_a_cycle() {
        // As node_e2e's kubelets.rs and node.rs were.
        check(
            r"
//- main.rs
mod node_e2e;
//- node_e2e/mod.rs
mod kubelets;
mod node;
use kubelets::Programs;
//- node_e2e/kubelets.rs
//! The kubelet axis.
use super::node;
fn missing() { node::PROGRAMS.iter(); }
//- node_e2e/node.rs
use super::kubelets::{self, Programs};
use super::{Env, NODE_NAME};
fn spawn() { kubelets::dra_flags(); }
",
            &expect![[
                r"kpm-x: the modules of `crate::node_e2e` refer to each other in a cycle, kubelets → node → kubelets (crates/kpm-x/src/node_e2e/kubelets.rs names node::PROGRAMS; crates/kpm-x/src/node_e2e/node.rs names kubelets::Programs, kubelets::dra_flags): move what they share into one of them, or into a module of its own"
            ]],
        );
    }

    #[test]
    fn crate_paths_super_super_and_inline_modules_name_siblings() {
        // `crate::a::c` from a/b.rs; `super::super::b` from a/c/d.rs; and a
        // test module's `super::` is the file's module.
        check(
            r"
//- lib.rs
//- a/mod.rs
//- a/b.rs
fn f() -> crate::a::c::T { todo!() }
//- a/c/mod.rs
mod d;
//- a/c/d.rs
#[cfg(test)]
mod tests {
    use super::super::super::b::f;
}
//- x.rs
mod y {
    pub(super) fn g() { super::z::h() }
}
mod z {
    pub(super) fn h() { self::inner::i(); super::y::g() }
    mod inner { pub(super) fn i() {} }
}
",
            &expect![[
                r"kpm-x: the modules of `crate::a` refer to each other in a cycle, b → c → b (crates/kpm-x/src/a/b.rs names c::T; crates/kpm-x/src/a/c/d.rs names b::f): move what they share into one of them, or into a module of its own
kpm-x: the modules of `crate::x` refer to each other in a cycle, y → z → y (crates/kpm-x/src/x.rs names z::h; crates/kpm-x/src/x.rs names y::g): move what they share into one of them, or into a module of its own"
            ]],
        );
    }

    #[test]
    fn a_parent_and_its_children_and_a_one_way_tree_are_no_cycle() {
        check(
            r"
//- lib.rs
pub(crate) mod a;
mod b;
pub use crate::a::Out;
//- a/mod.rs
mod c;
mod d;
pub(crate) use self::c::Out;
pub(super) struct Env;
//- a/c.rs
use super::d::{self, Shared};
use super::Env;
pub(crate) struct Out(Env);
//- a/d.rs
pub(in crate::a) struct Shared;
use super::super::b::Free;
//- b.rs
pub(crate) struct Free;
macro_rules! m { () => { $crate::a::Out } }
",
            &expect![[""]],
        );
    }

    #[test]
    fn comments_strings_and_doc_links_name_nothing() {
        check(
            r##"
//- lib.rs
//- a.rs
//! See [`crate::b`].
// crate::b::X
/* super::b */
const TEXT: &str = "crate::b::Y";
const RAW: &str = r#"use crate::b;"#;
//- b.rs
use crate::a::TEXT;
"##,
            &expect![[""]],
        );
    }

    #[test]
    fn module_cycles_are_found_with_their_path() {
        let graph = |edges: &[(&str, &str)]| {
            let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (from, to) in edges {
                graph.entry((*from).to_owned()).or_default().insert((*to).to_owned());
                graph.entry((*to).to_owned()).or_default();
            }
            graph
        };
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
}
