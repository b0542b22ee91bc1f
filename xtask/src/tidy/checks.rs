//! The conformance suite's checks, held to their tests and their docs:
//! every variant of `kpm_conformance::Check` is named in a unit test of
//! `crates/kpm-conformance/src/tests/` (its `check()` helper, a scripted
//! plugin in, outcomes out), and the tables of `docs/plugin-authors.md`
//! name each check (by the name the report gives it) and nothing else.
//! Read from the source's text, so that tidy needs no build of the suite.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::Result;

/// The enum's file, its tests and the docs, from the workspace root.
const CHECK_RS: &str = "crates/kpm-conformance/src/check.rs";
const TESTS: &str = "crates/kpm-conformance/src/tests";
const DOCS: &str = "docs/plugin-authors.md";

pub(super) fn check(root: &Path, problems: &mut Vec<String>) -> Result {
    let source = fs::read_to_string(root.join(CHECK_RS))?;
    let mut tests = String::new();
    super::walk(&root.join(TESTS), &mut |path| {
        if path.extension().is_some_and(|ext| ext == "rs") {
            tests.push_str(&fs::read_to_string(path).unwrap_or_default());
        }
    })?;
    let docs = fs::read_to_string(root.join(DOCS))?;
    check_tests(&variants(&source), &tests, problems);
    check_docs(&names(&source), &docs, problems);
    Ok(())
}

/// The variants of `pub enum Check { … }`: each line of its body that
/// starts with an upper-case name.
fn variants(source: &str) -> Vec<String> {
    let body = source.split_once("pub enum Check {").map_or("", |(_, rest)| rest);
    let body = body.split_once("\n}").map_or("", |(body, _)| body);
    body.lines()
        .map(str::trim)
        .filter(|line| line.starts_with(|c: char| c.is_ascii_uppercase()))
        .filter_map(|line| line.split(['(', ',']).next())
        .map(str::to_owned)
        .collect()
}

/// The names the report gives the checks: the strings of `fn base_name`'s arms.
fn names(source: &str) -> BTreeSet<String> {
    let body = source.split_once("fn base_name(").map_or("", |(_, rest)| rest);
    let body = body.split_once("\n    }\n").map_or("", |(body, _)| body);
    body.lines()
        .filter_map(|line| line.split_once("=> \"")?.1.split_once('"').map(|(name, _)| name))
        .map(str::to_owned)
        .collect()
}

fn check_tests(variants: &[String], tests: &str, problems: &mut Vec<String>) {
    if variants.is_empty() {
        problems.push(format!("{CHECK_RS}: no `pub enum Check` with variants found"));
    }
    for variant in variants {
        if !tests.contains(&format!("Check::{variant}")) {
            problems.push(format!(
                "{CHECK_RS}: Check::{variant} has no unit test: name it in a test of {TESTS}/ \
                 that runs `check()` on a plugin that passes or breaks it"
            ));
        }
    }
}

/// The docs' tables name a check by its name in backticks, in their first
/// column: each check once at least, and no other.
fn check_docs(names: &BTreeSet<String>, docs: &str, problems: &mut Vec<String>) {
    let documented: BTreeSet<String> = docs
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once("` |").map(|(name, _)| name))
        .map(str::to_owned)
        .collect();
    for missing in names.difference(&documented) {
        problems.push(format!(
            "{DOCS}: no table row for the check `{missing}`: write `| `{missing}` | … |`"
        ));
    }
    // Only rows in the checks' tables (their first cell a check's name, as
    // backticked text) are held to the enum; rows of other tables name
    // scenarios and are not checks.
    let section = docs.split_once("## Testing a driver in CI").map_or("", |(_, rest)| rest);
    let section = section.split_once("\n## ").map_or(section, |(section, _)| section);
    for line in section.lines() {
        let Some(name) = line.strip_prefix("| `").and_then(|rest| rest.split_once("` |")) else {
            continue;
        };
        if !names.contains(name.0) {
            problems
                .push(format!("{DOCS}: the table row `{}` names no check of {CHECK_RS}", name.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "pub enum Check {\n    /// Doc.\n    Registers,\n    NodePrepareResources(DraService),\n}\n\
        impl Check {\n    fn base_name(self) -> &'static str {\n        match self {\n            Registers => \"registers\",\n            NodePrepareResources(_) => \"NodePrepareResources\",\n        }\n    }\n}\n";

    #[test]
    fn a_check_without_a_test_or_a_row_is_named() {
        assert_eq!(variants(SOURCE), ["Registers", "NodePrepareResources"]);
        let mut problems = Vec::new();
        check_tests(&variants(SOURCE), "check(Check::Registers)", &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("Check::NodePrepareResources has no unit test"));

        let docs = "## Testing a driver in CI\n| `registers` | … |\n| `gone` | … |\n## Next\n| `other` | x |\n";
        let mut problems = Vec::new();
        check_docs(&names(SOURCE), docs, &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("no table row for the check `NodePrepareResources`"));
        assert!(problems[1].contains("`gone` names no check"));
    }
}
