//! Source-tree rules that rustc and clippy do not check. Runs as `cargo xtask
//! tidy`, inside `cargo xtask ci`, and as a unit test.
//!
//! - every Rust source file starts with a `//!` module doc;
//! - no trailing whitespace;
//! - no `#[ignore]`d or `#[should_panic]` tests;
//! - internal dependencies follow the layering in `docs/ARCHITECTURE.md`
//!   (`kpm-test-support` is allowed as a dev-dependency of any crate).

use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;

/// Which internal crates each crate may depend on (normal and dev dependencies
/// alike), as `docs/ARCHITECTURE.md` draws them. A crate missing from this
/// table may not depend on any `kpm-*` crate; tidy fails so that the table and
/// ARCHITECTURE.md are updated together.
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
    // The transport only through the facade's curated `kpm::transport`.
    ("kpm-cli", &["kpm", "kpm-api", "kpm-registrar"]),
    // The load generator of `cargo xtask bench`: plugins only, kpm runs as a process.
    ("kpm-bench", &["kpm-api", "kpm-transport", "kpm-registrar"]),
    ("kpm-tests", &["kpm", "kpm-registrar"]),
    ("kpm-test-support", &["kpm-api"]),
];

/// The shared test helpers: any crate may have them as a dev-dependency, and
/// none as a normal one.
const TEST_SUPPORT: &str = "kpm-test-support";

pub(crate) fn check(root: &Path) -> Result {
    let mut problems = Vec::new();
    for file in rust_sources(root)? {
        check_source(root, &file, &fs::read_to_string(&file)?, &mut problems);
    }
    for manifest in manifests(root)? {
        check_layers(&fs::read_to_string(&manifest)?, &mut problems);
    }
    if problems.is_empty() {
        println!("tidy: ok");
        Ok(())
    } else {
        Err(format!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "))
            .into())
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

fn check_layers(manifest: &str, problems: &mut Vec<String>) {
    let Some(name) = package_name(manifest) else { return };
    let allowed = LAYERS.iter().find(|(crate_name, _)| *crate_name == name).map(|(_, deps)| *deps);
    for Dependency { name: dep, dev } in internal_dependencies(manifest) {
        if dev && dep == TEST_SUPPORT {
            continue;
        }
        if !allowed.is_some_and(|deps| deps.contains(&dep.as_str())) {
            problems.push(format!(
                "{name} depends on {dep}, which its layer does not allow (xtask/src/tidy.rs LAYERS)"
            ));
        }
    }
}

fn package_name(manifest: &str) -> Option<&str> {
    manifest
        .lines()
        .skip_while(|line| line.trim() != "[package]")
        .find_map(|line| line.trim().strip_prefix("name = "))
        .map(|value| value.trim_matches('"'))
}

/// An internal dependency named in a manifest.
struct Dependency {
    name: String,
    /// Named in a `[dev-dependencies]` table.
    dev: bool,
}

/// `kpm-*` names used as dependency keys in any dependency table.
fn internal_dependencies(manifest: &str) -> Vec<Dependency> {
    let mut table = None;
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.ends_with("dependencies]").then(|| line.ends_with("dev-dependencies]"));
            continue;
        }
        if let Some(dev) = table {
            let key = line.split(['=', '.']).next().unwrap_or("").trim();
            if key.starts_with("kpm") {
                deps.push(Dependency { name: key.to_owned(), dev });
            }
        }
    }
    deps
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

fn manifests(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for top in ["crates", "xtask", "tests"] {
        walk(&root.join(top), &mut |path| {
            if path.file_name().is_some_and(|name| name == "Cargo.toml") {
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

    #[test]
    fn layering_violation_is_reported() {
        let manifest =
            "[package]\nname = \"kpm-cache\"\n\n[dependencies]\nkpm-executor.workspace = true\n";
        let mut problems = Vec::new();
        check_layers(manifest, &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("kpm-cache depends on kpm-executor"));
    }

    #[test]
    fn test_support_is_a_dev_dependency_of_any_crate_only() {
        let dev = concat!(
            "[package]\nname = \"kpm-cache\"\n\n",
            "[dev-dependencies]\nkpm-test-support.workspace = true\n"
        );
        let mut problems = Vec::new();
        check_layers(dev, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_layers(&dev.replace("dev-dependencies", "dependencies"), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
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
