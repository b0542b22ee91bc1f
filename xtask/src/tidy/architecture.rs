//! `docs/ARCHITECTURE.md` against the workspace: a `###` heading per crate,
//! and its dependency list, `LAYERS` written out.

use std::collections::BTreeSet;

use super::layers::LAYERS;
use super::workspace::Crate;

/// The file whose crate headings and dependency list tidy checks.
pub(super) const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// `docs/ARCHITECTURE.md`: one `###` heading naming each crate's directory
/// (`` ### `crates/kpm-cache` ``), none naming a `crates/` directory that is
/// no crate, and the dependency list of the paragraph starting "Dependency
/// direction" equal to [`dependency_list`].
pub(super) fn check_architecture(crates: &[Crate], text: &str, problems: &mut Vec<String>) {
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
/// `LAYERS`, its normal dependencies first and its dev ones after `dev:`:
/// "- `kpm-executor` → kpm-api, kpm-cache",
/// "- `kpm-reconciler` → kpm-api, kpm-cache; dev: kpm-transport".
fn dependency_list() -> Vec<String> {
    LAYERS
        .iter()
        .map(|layer| {
            let deps =
                if layer.deps.is_empty() { "none".to_owned() } else { layer.deps.join(", ") };
            let dev = if layer.dev.is_empty() {
                String::new()
            } else {
                format!("; dev: {}", layer.dev.join(", "))
            };
            format!("- `{}` → {deps}{dev}", layer.name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::layers::fixtures::{unlisted_crate, workspace};

    /// An ARCHITECTURE.md that passes for [`workspace`]'s crates.
    fn architecture() -> String {
        let headings = LAYERS
            .iter()
            .map(|layer| format!("### `crates/{}`\n\nText.\n\n", layer.name))
            .collect::<Vec<_>>()
            .concat();
        format!(
            "# Architecture\n\nDependency direction: as follows.\n\n{}\n\nMore.\n\n## Code map\n\n{headings}",
            dependency_list().join("\n")
        )
    }

    #[test]
    fn architecture_matches_the_workspace_and_layers() {
        let crates = workspace("kpm", None);
        let mut problems = Vec::new();
        check_architecture(&crates, &architecture(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(architecture().contains("- `kpm-executor` → kpm-api, kpm-transport, kpm-cache\n"));
        assert!(architecture().contains("- `kpm-api` → none\n"));
        assert!(architecture().contains(
            "- `kpm-reconciler` → kpm-api, kpm-cache, kpm-executor; dev: kpm-transport\n"
        ));
        assert!(
            architecture().contains("- `kpm-tests` → none; dev: kpm, kpm-api, kpm-registrar\n")
        );
    }

    #[test]
    fn architecture_headings_must_name_each_crate_and_only_crates() {
        let mut crates = workspace("kpm", None);
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
        let crates = workspace("kpm", None);
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
            "- `kpm-transport` → kpm-api\n- `kpm-cache` → kpm-api",
            "- `kpm-cache` → kpm-api\n- `kpm-transport` → kpm-api",
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
}
