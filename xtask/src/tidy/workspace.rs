//! The workspace as tidy sees it: its crates, from one `cargo metadata`.

use std::collections::BTreeSet;
use std::path::Path;

use cargo_metadata::{DependencyKind, MetadataCommand, TargetKind};

use crate::Result;

/// A workspace crate, as tidy needs it.
#[derive(Debug)]
pub(super) struct Crate {
    pub(super) name: String,
    /// Its directory relative to the workspace root, `/`-separated.
    pub(super) dir: String,
    /// Its dependencies on other workspace crates.
    pub(super) deps: Vec<Dependency>,
    /// Not `publish = false`.
    pub(super) published: bool,
    /// It has a library target.
    pub(super) library: bool,
    /// Which of `REGISTRY_METADATA` and `DOCS_METADATA` its manifest sets.
    pub(super) metadata: Vec<&'static str>,
}

/// A dependency of one workspace crate on another.
#[derive(Debug)]
pub(super) struct Dependency {
    pub(super) name: String,
    /// A dev-dependency (normal and build dependencies are not).
    pub(super) dev: bool,
}

/// The workspace's crates and their dependencies on each other, from one run
/// of `cargo metadata` (without resolving external dependencies).
pub(super) fn workspace_crates(root: &Path) -> Result<Vec<Crate>> {
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
