//! Source-tree rules that rustc and clippy do not check. Runs as `cargo xtask
//! tidy`, inside `cargo xtask ci`, and as a unit test. Each rule lives in a
//! module of its own and adds one line per problem, naming the file and what
//! to write:
//!
//! - `source`: every Rust source file starts with a `//!` module doc, has no
//!   trailing whitespace, no `#[ignore]`d or `#[should_panic]` tests, and no
//!   gRPC server on a plain Unix listener stream outside `kpm_transport`;
//! - `layers`: `LAYERS` names every workspace crate and nothing else, each
//!   crate's kpm dependencies (normal and dev apart), as `cargo metadata`
//!   reads them, follow it, and it allows nothing that no manifest uses
//!   (`kpm-test-support` is allowed as a dev-dependency of any crate, and
//!   so is the crate itself, for its `testing` feature);
//! - `architecture`: `docs/ARCHITECTURE.md` has a `###` heading for each
//!   crate and none for a crate that is not one, and its dependency list is
//!   `LAYERS`, written out;
//! - `modules`: within a crate, the modules of one parent (the top-level
//!   ones under `src/`, and those any module declares) form no cycle of
//!   `crate::`, `super::` and `self::` references;
//! - `registry`: every crate that is published carries the registry's
//!   metadata, and a library docs.rs's too;
//! - `docs`: `docs/operations.md` names every metric kpm serves, the
//!   README's layout lists the workspace's crates and the CLI's subcommands
//!   (as does `crates/kpm-cli/README.md`), and its Rust version is the
//!   workspace's `rust-version`;
//! - `checks`: every check of the conformance suite (`kpm_conformance::Check`)
//!   has a unit test, and the tables of `docs/plugin-authors.md` name each
//!   check and no other;
//! - `dockerfile`: the Dockerfile's `FROM rust:X` is that `rust-version` too;
//! - `size`: no file of library code is over 600 lines, tests, generated
//!   code and the tools that ship nowhere (`xtask`, `kpm-e2e`, `kpm-bench`)
//!   left out.

use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;

mod architecture;
mod checks;
mod dockerfile;
mod docs;
mod layers;
mod modules;
mod registry;
mod size;
mod source;
mod workspace;

pub(crate) fn check(root: &Path) -> Result {
    let mut problems = Vec::new();
    for file in rust_sources(root)? {
        source::check_source(root, &file, &fs::read_to_string(&file)?, &mut problems);
    }
    let crates = workspace::workspace_crates(root)?;
    layers::check_layers(&crates, &mut problems);
    registry::check_registry_metadata(&crates, &mut problems);
    architecture::check_architecture(
        &crates,
        &fs::read_to_string(root.join(architecture::ARCHITECTURE))?,
        &mut problems,
    );
    modules::check(root, &crates, &mut problems)?;
    docs::check(root, &crates, &mut problems)?;
    checks::check(root, &mut problems)?;
    dockerfile::check(root, &mut problems)?;
    size::check(root, &crates, &mut problems)?;
    if problems.is_empty() {
        println!("tidy: ok");
        Ok(())
    } else {
        Err(format!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "))
            .into())
    }
}

/// Every Rust source file tidy's line rules read: generated code left out.
fn rust_sources(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for top in ["crates", "xtask", "e2e", "tests"] {
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
}
