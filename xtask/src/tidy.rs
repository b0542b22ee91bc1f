//! Source-tree rules that rustc and clippy do not check. Runs as `cargo xtask
//! tidy`, inside `cargo xtask ci`, and as a unit test.
//!
//! - every Rust source file starts with a `//!` module doc;
//! - no trailing whitespace;
//! - no `#[ignore]`d or `#[should_panic]` tests;
//! - no gRPC server on a plain Unix listener stream outside `kpm_transport`;
//! - `LAYERS` names every workspace crate and nothing else, and each crate's
//!   kpm dependencies, as `cargo metadata` reads them, follow it
//!   (`kpm-test-support` is allowed as a dev-dependency of any crate, and
//!   so is the crate itself, for its `testing` feature);
//! - `docs/ARCHITECTURE.md` has a `###` heading for each crate and none for a
//!   crate that is not one, and its dependency list is `LAYERS`, written out;
//! - within a crate, the top-level modules under `src/` form no cycle of
//!   `crate::` references.
//! - every crate that is published carries the registry's metadata
//!   (`REGISTRY_METADATA`), and a library docs.rs's too.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use cargo_metadata::{DependencyKind, MetadataCommand, TargetKind};

use crate::Result;

/// Which internal crates each workspace crate may depend on (normal and dev
/// dependencies alike), as the dependency list of `docs/ARCHITECTURE.md`
/// states them, in the same order. Tidy fails on a crate missing here, on a
/// name here that is no workspace crate, and on a list that says otherwise,
/// so that the table, the manifests and ARCHITECTURE.md change together.
const LAYERS: &[(&str, &[&str])] = &[
    // The wire: generated code and constants, no IO.
    ("kpm-api", &[]),
    ("kpm-transport", &["kpm-api"]),
    ("kpm-cache", &[]),
    ("kpm-executor", &["kpm-api", "kpm-transport", "kpm-cache"]),
    ("kpm-watcher", &["kpm-api", "kpm-cache"]),
    ("kpm-liveness", &["kpm-api", "kpm-transport", "kpm-cache"]),
    // The transport only for its tests' plugins.
    ("kpm-reconciler", &["kpm-api", "kpm-transport", "kpm-cache", "kpm-executor"]),
    ("kpm-csi", &["kpm-api", "kpm-transport", "kpm-cache"]),
    ("kpm-device", &["kpm-api", "kpm-transport", "kpm-cache"]),
    ("kpm-dra", &["kpm-api", "kpm-transport", "kpm-cache"]),
    // Publishing to the Kubernetes API: the handlers' seams, nothing else.
    ("kpm-kube", &["kpm-api", "kpm-csi", "kpm-device", "kpm-dra"]),
    ("kpm-registrar", &["kpm-api", "kpm-transport"]),
    // The library: never the registrar, whose stubs are for tests and demos.
    (
        "kpm",
        &[
            "kpm-api",
            "kpm-transport",
            "kpm-cache",
            "kpm-executor",
            "kpm-watcher",
            "kpm-liveness",
            "kpm-reconciler",
            "kpm-csi",
            "kpm-device",
            "kpm-dra",
            "kpm-kube",
        ],
    ),
    // The diagnosis: the facade's inspection, read-only, and the API.
    ("kpm-doctor", &["kpm"]),
    // The transport only through the facade's curated `kpm::transport`.
    ("kpm-cli", &["kpm", "kpm-api", "kpm-doctor", "kpm-registrar"]),
    // The load generator of `cargo xtask bench`: plugins only, kpm runs as a process.
    ("kpm-bench", &["kpm-api", "kpm-transport", "kpm-registrar"]),
    ("kpm-tests", &["kpm", "kpm-registrar"]),
    ("kpm-test-support", &["kpm-api"]),
    ("xtask", &[]),
];

/// The shared test helpers: any crate may have them as a dev-dependency, and
/// none as a normal one.
const TEST_SUPPORT: &str = "kpm-test-support";

/// What every published crate's manifest sets, so that its page on the
/// registry reads alike: `readme` names a file that exists.
const REGISTRY_METADATA: &[&str] =
    &["description", "repository", "readme", "keywords", "categories"];

/// What a published library sets besides, for its docs.rs page.
const DOCS_METADATA: &[&str] = &["documentation", "[package.metadata.docs.rs]"];

/// The file whose crate headings and dependency list tidy checks.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// A workspace crate, as tidy needs it.
#[derive(Debug)]
struct Crate {
    name: String,
    /// Its directory relative to the workspace root, `/`-separated.
    dir: String,
    /// Its dependencies on other workspace crates.
    deps: Vec<Dependency>,
    /// Not `publish = false`.
    published: bool,
    /// It has a library target.
    library: bool,
    /// Which of `REGISTRY_METADATA` and `DOCS_METADATA` its manifest sets.
    metadata: Vec<&'static str>,
}

/// A dependency of one workspace crate on another.
#[derive(Debug)]
struct Dependency {
    name: String,
    /// A dev-dependency (normal and build dependencies are not).
    dev: bool,
}

pub(crate) fn check(root: &Path) -> Result {
    let mut problems = Vec::new();
    for file in rust_sources(root)? {
        check_source(root, &file, &fs::read_to_string(&file)?, &mut problems);
    }
    let crates = workspace_crates(root)?;
    check_layers(&crates, &mut problems);
    check_registry_metadata(&crates, &mut problems);
    check_architecture(&crates, &fs::read_to_string(root.join(ARCHITECTURE))?, &mut problems);
    let mut cycles = Vec::new();
    for krate in &crates {
        let src = root.join(&krate.dir).join("src");
        if src.is_dir() {
            let graph = module_graph(&src)?;
            cycles
                .extend(module_cycles(&graph).into_iter().map(|cycle| (krate.name.clone(), cycle)));
        }
    }
    check_cycles(&cycles, &mut problems);
    if problems.is_empty() {
        println!("tidy: ok");
        Ok(())
    } else {
        Err(format!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "))
            .into())
    }
}

/// The workspace's crates and their dependencies on each other, from one run
/// of `cargo metadata` (without resolving external dependencies).
fn workspace_crates(root: &Path) -> Result<Vec<Crate>> {
    let metadata =
        MetadataCommand::new().manifest_path(root.join("Cargo.toml")).no_deps().exec()?;
    let members: BTreeSet<&str> =
        metadata.workspace_packages().iter().map(|package| package.name.as_str()).collect();
    let mut crates = Vec::new();
    for package in metadata.workspace_packages() {
        let dir = package.manifest_path.parent().unwrap_or(&package.manifest_path);
        let deps = package
            .dependencies
            .iter()
            .filter(|dep| dep.path.is_some() && members.contains(dep.name.as_str()))
            .map(|dep| Dependency {
                name: dep.name.clone(),
                dev: dep.kind == DependencyKind::Development,
            })
            .collect();
        let set = [
            ("description", package.description.is_some()),
            ("repository", package.repository.is_some()),
            ("readme", package.readme.as_ref().is_some_and(|readme| dir.join(readme).is_file())),
            ("keywords", !package.keywords.is_empty()),
            ("categories", !package.categories.is_empty()),
            ("documentation", package.documentation.is_some()),
            ("[package.metadata.docs.rs]", package.metadata.pointer("/docs/rs").is_some()),
        ];
        crates.push(Crate {
            name: package.name.to_string(),
            dir: dir.strip_prefix(&metadata.workspace_root).unwrap_or(dir).as_str().to_owned(),
            deps,
            published: package.publish.as_ref().is_none_or(|registries| !registries.is_empty()),
            library: package.targets.iter().any(|target| target.is_kind(TargetKind::Lib)),
            metadata: set.iter().filter(|(_, set)| *set).map(|(key, _)| *key).collect(),
        });
    }
    crates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(crates)
}

/// Every crate's dependencies against `LAYERS`, and `LAYERS` against the
/// workspace.
fn check_layers(crates: &[Crate], problems: &mut Vec<String>) {
    for krate in crates {
        let Some((_, allowed)) = LAYERS.iter().find(|(name, _)| *name == krate.name) else {
            problems.push(format!(
                "workspace crate {} has no entry in LAYERS (xtask/src/tidy.rs)",
                krate.name
            ));
            continue;
        };
        for dep in &krate.deps {
            // A dev-dependency on the crate itself turns on its `testing`
            // feature for its own tests: no edge between crates.
            if dep.dev && (dep.name == TEST_SUPPORT || dep.name == krate.name) {
                continue;
            }
            if !allowed.contains(&dep.name.as_str()) {
                problems.push(format!(
                    "{} depends on {}, which its layer does not allow (xtask/src/tidy.rs LAYERS)",
                    krate.name, dep.name
                ));
            }
        }
    }
    let known = |name: &str| crates.iter().any(|krate| krate.name == name);
    for (name, allowed) in LAYERS {
        if !known(name) {
            problems.push(format!("LAYERS names {name}, which is not a workspace crate"));
        }
        for dep in allowed.iter().filter(|dep| !known(dep)) {
            problems.push(format!(
                "LAYERS lets {name} depend on {dep}, which is not a workspace crate"
            ));
        }
    }
}

/// Every published crate sets `REGISTRY_METADATA`, a library `DOCS_METADATA`
/// too.
fn check_registry_metadata(crates: &[Crate], problems: &mut Vec<String>) {
    for krate in crates.iter().filter(|krate| krate.published) {
        let docs = if krate.library { DOCS_METADATA } else { &[] };
        for key in REGISTRY_METADATA.iter().chain(docs).filter(|key| !krate.metadata.contains(key))
        {
            problems.push(format!(
                "{} is published (no `publish = false`) but its Cargo.toml lacks `{key}` \
                 (see kpm-cache's)",
                krate.name
            ));
        }
    }
}

/// `docs/ARCHITECTURE.md`: one `###` heading naming each crate's directory
/// (`` ### `crates/kpm-cache` ``), none naming a `crates/` directory that is
/// no crate, and the dependency list of the paragraph starting "Dependency
/// direction" equal to [`dependency_list`].
fn check_architecture(crates: &[Crate], text: &str, problems: &mut Vec<String>) {
    let headed: BTreeSet<&str> = text
        .lines()
        .filter(|line| line.starts_with("### "))
        .flat_map(|line| line.split('`').skip(1).step_by(2))
        .map(|dir| dir.trim_end_matches('/'))
        .collect();
    for krate in crates {
        if !headed.contains(krate.dir.as_str()) {
            problems.push(format!(
                "{ARCHITECTURE} has no `### `{}`` heading for crate {}",
                krate.dir, krate.name
            ));
        }
    }
    for dir in headed.iter().filter(|dir| dir.starts_with("crates/")) {
        if !crates.iter().any(|krate| krate.dir == *dir) {
            problems.push(format!("{ARCHITECTURE} has a heading for `{dir}`, which is no crate"));
        }
    }

    let Some(paragraph) = text.split("\nDependency direction").nth(1) else {
        problems.push(format!("{ARCHITECTURE} has no paragraph starting \"Dependency direction\""));
        return;
    };
    let stated: Vec<&str> = paragraph
        .lines()
        .skip_while(|line| !line.starts_with("- `"))
        .take_while(|line| line.starts_with("- `"))
        .collect();
    let expected = dependency_list();
    let before = problems.len();
    for line in &expected {
        if !stated.contains(&line.as_str()) {
            problems.push(format!("{ARCHITECTURE}, dependency list: write `{line}` (from LAYERS)"));
        }
    }
    for line in &stated {
        if !expected.iter().any(|expected| expected == line) {
            problems.push(format!("{ARCHITECTURE}, dependency list: `{line}` is not in LAYERS"));
        }
    }
    if problems.len() == before && stated != expected {
        problems.push(format!("{ARCHITECTURE}, dependency list: not in the order of LAYERS"));
    }
}

/// The dependency list of `docs/ARCHITECTURE.md`, one line per crate of
/// `LAYERS`: "- `kpm-executor` → kpm-api, kpm-cache".
fn dependency_list() -> Vec<String> {
    LAYERS
        .iter()
        .map(|(name, deps)| {
            let deps = if deps.is_empty() { "none".to_owned() } else { deps.join(", ") };
            format!("- `{name}` → {deps}")
        })
        .collect()
}

/// Which top-level modules of a crate refer to which others: a module is a
/// file `src/a.rs` or a directory `src/a/`, and it refers to `b` where one of
/// its files says `crate::b` (also inside `use crate::{b, …}`), outside
/// comments. The crate root (`lib.rs`, `main.rs`) and `src/bin` are no modules.
fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
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

/// Reports each cycle.
fn check_cycles(cycles: &[(String, Vec<String>)], problems: &mut Vec<String>) {
    for (krate, cycle) in cycles {
        problems.push(format!(
            "{krate}: its modules refer to each other in a cycle: {}",
            cycle.join(" → ")
        ));
    }
}

/// Where a gRPC server may accept on a plain Unix listener: `kpm_transport`
/// itself, and the test that shows h2 alone refuses grpc-go's `:authority`.
/// Everything else accepts through `kpm_transport::bind` or `Incoming`.
const PLAIN_LISTENERS_ALLOWED: &[&str] =
    &["crates/kpm-transport/src/", "tests/tests/grpc_go_authority.rs"];

fn check_source(root: &Path, file: &Path, text: &str, problems: &mut Vec<String>) {
    let relative = file.strip_prefix(root).unwrap_or(file);
    let shown = relative.display();
    let plain_listener_allowed = PLAIN_LISTENERS_ALLOWED
        .iter()
        .any(|allowed| relative.to_string_lossy().starts_with(allowed));
    if !text.starts_with("//!") {
        problems.push(format!("{shown}: does not start with a `//!` module doc"));
    }
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        if line.ends_with(' ') || line.ends_with('\t') {
            problems.push(format!("{shown}:{number}: trailing whitespace"));
        }
        // Split so that this file does not trip its own rule.
        for banned in [concat!("#[", "ignore"), concat!("#[", "should_panic")] {
            if line.trim_start().starts_with(banned) {
                problems.push(format!("{shown}:{number}: `{banned}]` is not allowed"));
            }
        }
        if !plain_listener_allowed && line.contains(concat!("UnixListener", "Stream")) {
            problems.push(format!(
                "{shown}:{number}: a gRPC server accepts through `kpm_transport::bind` or \
                 `kpm_transport::Incoming`, which take any `:authority`"
            ));
        }
    }
}

fn rust_sources(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for top in ["crates", "xtask", "tests"] {
        walk(&root.join(top), &mut |path| {
            let generated = path.components().any(|c| c.as_os_str() == "gen");
            if path.extension().is_some_and(|ext| ext == "rs") && !generated {
                files.push(path.to_path_buf());
            }
        })?;
    }
    Ok(files)
}

fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) -> Result {
    if !dir.is_dir() {
        return Ok(());
    }
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "target" {
                walk(&path, visit)?;
            }
        } else {
            visit(&path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_tree_is_tidy() {
        check(&crate::project_root()).unwrap();
    }

    /// The workspace as `LAYERS` draws it, each crate with the dependencies
    /// its layer allows, and `extra` added to `name`'s.
    fn workspace(name: &str, extra: Dependency) -> Vec<Crate> {
        let mut crates: Vec<Crate> = LAYERS
            .iter()
            .map(|(krate, deps)| Crate {
                published: false,
                library: true,
                metadata: Vec::new(),
                name: (*krate).to_owned(),
                dir: format!("crates/{krate}"),
                deps: deps
                    .iter()
                    .map(|dep| Dependency { name: (*dep).to_owned(), dev: false })
                    .collect(),
            })
            .collect();
        if let Some(krate) = crates.iter_mut().find(|krate| krate.name == name) {
            krate.deps.push(extra);
        }
        crates
    }

    fn dep(name: &str, dev: bool) -> Dependency {
        Dependency { name: name.to_owned(), dev }
    }

    #[test]
    fn layering_violation_is_reported() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-cache", dep("kpm-executor", true)), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("kpm-cache depends on kpm-executor"));
    }

    #[test]
    fn test_support_is_a_dev_dependency_of_any_crate_only() {
        let mut problems = Vec::new();
        check_layers(&workspace("kpm-cache", dep(TEST_SUPPORT, true)), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_layers(&workspace("kpm-cache", dep(TEST_SUPPORT, false)), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    /// A crate that neither `LAYERS` nor ARCHITECTURE.md names.
    fn unlisted_crate() -> Crate {
        Crate {
            published: false,
            library: true,
            metadata: Vec::new(),
            name: "kpm-new".to_owned(),
            dir: "crates/kpm-new".to_owned(),
            deps: Vec::new(),
        }
    }

    #[test]
    fn layers_must_name_every_workspace_crate_and_nothing_else() {
        let mut crates = workspace("kpm", dep("kpm-api", false));
        crates.push(unlisted_crate());
        crates.retain(|krate| krate.name != "kpm-dra");
        let mut problems = Vec::new();
        check_layers(&crates, &mut problems);
        assert_eq!(
            problems,
            [
                "workspace crate kpm-new has no entry in LAYERS (xtask/src/tidy.rs)",
                "LAYERS names kpm-dra, which is not a workspace crate",
                "LAYERS lets kpm-kube depend on kpm-dra, which is not a workspace crate",
                "LAYERS lets kpm depend on kpm-dra, which is not a workspace crate",
            ]
        );
    }

    #[test]
    fn a_published_crate_carries_the_registry_metadata() {
        let mut crates = workspace("kpm", dep("kpm-api", false));
        let mut problems = Vec::new();
        check_registry_metadata(&crates, &mut problems);
        assert!(problems.is_empty(), "unpublished crates need none: {problems:?}");
        let all: Vec<&str> = REGISTRY_METADATA.iter().chain(DOCS_METADATA).copied().collect();
        for krate in &mut crates {
            krate.published = true;
            krate.metadata.clone_from(&all);
        }
        check_registry_metadata(&crates, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        crates[0].metadata.retain(|key| *key != "readme");
        crates[1].library = false;
        crates[1].metadata.retain(|key| !DOCS_METADATA.contains(key));
        check_registry_metadata(&crates, &mut problems);
        assert_eq!(
            problems,
            ["kpm-api is published (no `publish = false`) but its Cargo.toml lacks `readme` \
              (see kpm-cache's)"]
        );
    }

    /// An ARCHITECTURE.md that passes for [`workspace`]'s crates.
    fn architecture() -> String {
        let headings = LAYERS
            .iter()
            .map(|(name, _)| format!("### `crates/{name}`\n\nText.\n\n"))
            .collect::<Vec<_>>()
            .concat();
        format!(
            "# Architecture\n\nDependency direction: as follows.\n\n{}\n\nMore.\n\n## Code map\n\n{headings}",
            dependency_list().join("\n")
        )
    }

    #[test]
    fn architecture_matches_the_workspace_and_layers() {
        let crates = workspace("kpm", dep("kpm-api", false));
        let mut problems = Vec::new();
        check_architecture(&crates, &architecture(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(architecture().contains("- `kpm-executor` → kpm-api, kpm-transport, kpm-cache\n"));
        assert!(architecture().contains("- `kpm-api` → none\n"));
    }

    #[test]
    fn architecture_headings_must_name_each_crate_and_only_crates() {
        let mut crates = workspace("kpm", dep("kpm-api", false));
        crates.retain(|krate| krate.name != "kpm-dra");
        crates.push(unlisted_crate());
        let mut problems = Vec::new();
        check_architecture(&crates, &architecture(), &mut problems);
        assert_eq!(
            problems,
            [
                "docs/ARCHITECTURE.md has no `### `crates/kpm-new`` heading for crate kpm-new",
                "docs/ARCHITECTURE.md has a heading for `crates/kpm-dra`, which is no crate",
            ]
        );
    }

    #[test]
    fn a_dependency_list_that_differs_from_layers_shows_the_line_to_write() {
        let crates = workspace("kpm", dep("kpm-api", false));
        let text = architecture().replace(
            "- `kpm-kube` → kpm-api, kpm-csi, kpm-device, kpm-dra\n",
            "- `kpm-kube` → kpm-api\n",
        );
        let mut problems = Vec::new();
        check_architecture(&crates, &text, &mut problems);
        assert_eq!(
            problems,
            [
                "docs/ARCHITECTURE.md, dependency list: write `- `kpm-kube` → kpm-api, kpm-csi, kpm-device, kpm-dra` (from LAYERS)",
                "docs/ARCHITECTURE.md, dependency list: `- `kpm-kube` → kpm-api` is not in LAYERS",
            ]
        );
        problems.clear();
        let text = architecture().replace(
            "- `kpm-transport` → kpm-api\n- `kpm-cache` → none",
            "- `kpm-cache` → none\n- `kpm-transport` → kpm-api",
        );
        check_architecture(&crates, &text, &mut problems);
        assert_eq!(problems, ["docs/ARCHITECTURE.md, dependency list: not in the order of LAYERS"]);
        problems.clear();
        check_architecture(
            &crates,
            &architecture().replace("Dependency direction", "Layers"),
            &mut problems,
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

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

    #[test]
    fn missing_module_doc_and_banned_attributes_are_reported() {
        let mut problems = Vec::new();
        let text = format!("fn main() {{}} \n{}]\n", concat!("#[", "ignore"));
        check_source(Path::new("/r"), Path::new("/r/a.rs"), &text, &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn a_grpc_server_on_a_plain_listener_is_reported() {
        let text = format!(
            "//! Doc.\nlet incoming = {}::new(listener);\n",
            concat!("UnixListener", "Stream")
        );
        let mut problems = Vec::new();
        check_source(Path::new("/r"), Path::new("/r/crates/kpm-x/src/a.rs"), &text, &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        problems.clear();
        check_source(
            Path::new("/r"),
            Path::new("/r/crates/kpm-transport/src/uds/a.rs"),
            &text,
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:?}");
    }
}
