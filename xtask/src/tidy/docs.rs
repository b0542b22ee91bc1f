//! The docs against what they describe, where drift is easy to miss:
//!
//! - `docs/operations.md` names every metric kpm serves (the names
//!   `crates/kpm-status/src/metrics/` and kpm-doctor's `metrics.rs` register,
//!   a counter with its `_total`);
//! - the README's layout has a line per workspace crate and none for a
//!   crate that is gone, and its `kpm-cli` line lists the CLI's subcommands
//!   (read from the clap `enum Command` in `crates/kpm-cli/src/cli.rs`), as
//!   does `crates/kpm-cli/README.md` (the crates.io page), each as
//!   `` `kpm SUBCOMMAND` ``;
//! - the README's Rust version ("1.89 or newer") is the workspace's
//!   `rust-version`.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use super::walk;
use super::workspace::Crate;
use crate::Result;

const OPERATIONS: &str = "docs/operations.md";
const README: &str = "README.md";
const CLI_README: &str = "crates/kpm-cli/README.md";
/// Where the metrics kpm serves are registered: the CLI's (`kpm run`) and
/// the doctor's (`kpm doctor --watch`), files or directories.
const METRICS: &[&str] = &["crates/kpm-status/src/metrics", "crates/kpm-doctor/src/metrics.rs"];
/// Where the CLI's clap `enum Command` is.
const CLI_MAIN: &str = "crates/kpm-cli/src/cli.rs";
/// The crate whose subcommands the READMEs list.
const CLI_CRATE: &str = "kpm-cli";

/// Runs every check of this module on the tree at `root`.
pub(super) fn check(root: &Path, crates: &[Crate], problems: &mut Vec<String>) -> Result {
    let read = |path: &str| {
        fs::read_to_string(root.join(path))
            .map_err(|err| format!("tidy: cannot read {path}: {err}"))
    };
    let mut metric_sources = Vec::new();
    let mut io_error = None;
    let mut read_source = |path: &Path| {
        if path.extension().is_some_and(|ext| ext == "rs") {
            let shown = path.strip_prefix(root).unwrap_or(path).display().to_string();
            match fs::read_to_string(path) {
                Ok(text) => metric_sources.push((shown, text)),
                Err(err) => io_error = Some(format!("tidy: cannot read {shown}: {err}")),
            }
        }
    };
    for source in METRICS {
        let path = root.join(source);
        if path.is_file() {
            read_source(&path);
        } else if path.is_dir() {
            walk(&path, &mut read_source)?;
        } else {
            // Moved metrics must not pass unchecked.
            problems.push(format!(
                "{source} is gone: name where its metrics went in METRICS (xtask/src/tidy/docs.rs)"
            ));
        }
    }
    if let Some(err) = io_error {
        return Err(err.into());
    }
    check_metrics(&metric_sources, &read(OPERATIONS)?, problems);

    let readme = read(README)?;
    check_layout(&readme, crates, problems);
    match cli_subcommands(&read(CLI_MAIN)?) {
        Some(subcommands) => {
            let cli_dir = crates.iter().find(|krate| krate.name == CLI_CRATE).map(|k| &k.dir);
            if let Some(cli_dir) = cli_dir {
                check_layout_subcommands(&readme, cli_dir, &subcommands, problems);
            }
            check_named_subcommands(README, &readme, &subcommands, false, problems);
            check_named_subcommands(CLI_README, &read(CLI_README)?, &subcommands, true, problems);
        }
        None => problems.push(format!(
            "{CLI_MAIN}: tidy found no `#[derive(.., Subcommand)] enum Command {{ .. }}` to read \
             the CLI's subcommands from (xtask/src/tidy/docs.rs)"
        )),
    }
    match workspace_rust_version(&read("Cargo.toml")?) {
        Some(version) => check_rust_version(&readme, &version, problems),
        None => problems
            .push("Cargo.toml: no `rust-version = \"…\"` under [workspace.package]".to_owned()),
    }
    Ok(())
}

/// What comes before a trailing `#[cfg(test)] mod tests`, whose names are
/// the tests' and not served.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at])
}

/// A metric a source registers: its name as served, a counter's with
/// `_total` where the source says so by calling a `counter…` helper
/// (elsewhere either spelling passes).
fn metric_names(text: &str) -> Vec<Metric> {
    let code = without_tests(text);
    let mut names = Vec::new();
    for prefix in ["\"kpm_", "\"plugin_manager_"] {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            if !rest[end..].starts_with('"') {
                continue;
            }
            // The function it is passed to: `counter(encoder, "kpm_x", …)`.
            let before = &code[..at];
            let called = before.rfind('(').map_or("", |open| {
                let head = &before[..open];
                let start = head
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |index| index + 1);
                &head[start..]
            });
            names.push(Metric {
                name: rest[..end].to_owned(),
                counter: called.starts_with("counter"),
            });
        }
    }
    names
}

/// A metric name a source registers.
#[derive(Debug, PartialEq)]
struct Metric {
    /// As registered, without `_total`.
    name: String,
    /// Registered through a `counter…` helper: served with `_total`.
    counter: bool,
}

impl Metric {
    /// How a document must spell it: with `_total` for a known counter.
    fn spellings(&self) -> Vec<String> {
        let total = format!("{}_total", self.name);
        if self.counter { vec![total] } else { vec![self.name.clone(), total] }
    }
}

/// The words of a document, as a metric or identifier is spelt.
fn words(text: &str) -> BTreeSet<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect()
}

/// Every metric the sources register is named in `docs/operations.md`.
fn check_metrics(sources: &[(String, String)], operations: &str, problems: &mut Vec<String>) {
    let named = words(operations);
    for (file, text) in sources {
        for metric in metric_names(text) {
            let spellings = metric.spellings();
            if !spellings.iter().any(|spelling| named.contains(spelling.as_str())) {
                let name = &spellings[0];
                problems.push(format!(
                    "{OPERATIONS} does not name the metric `{name}` that {file} serves: add it, \
                     with what it counts, to the `--metrics-addr` paragraph"
                ));
            }
        }
    }
}

/// The lines of the first code block under the README's `## Layout`.
fn layout_lines(readme: &str) -> Option<Vec<&str>> {
    let section = readme.split("\n## Layout\n").nth(1)?;
    let block = section.split("```").nth(1)?;
    Some(block.lines().skip(1).filter(|line| !line.trim().is_empty()).collect())
}

/// The README's layout has one line per workspace crate, and none for a
/// `crates/` directory that is no crate.
fn check_layout(readme: &str, crates: &[Crate], problems: &mut Vec<String>) {
    let Some(lines) = layout_lines(readme) else {
        problems.push(format!("{README} has no ``` block under `## Layout`"));
        return;
    };
    let listed: BTreeSet<&str> = lines
        .iter()
        .filter_map(|line| line.split_whitespace().next())
        .map(|path| path.trim_end_matches('/'))
        .collect();
    for krate in crates.iter().filter(|krate| !listed.contains(krate.dir.as_str())) {
        problems.push(format!(
            "{README}, Layout: no line for crate {}: write `{}  <what it is for>`",
            krate.name, krate.dir
        ));
    }
    for path in listed.iter().filter(|path| path.starts_with("crates/")) {
        if !crates.iter().any(|krate| krate.dir == *path) {
            problems
                .push(format!("{README}, Layout: `{path}` is no workspace crate: remove its line"));
        }
    }
}

/// The CLI's subcommands, from its clap `enum Command`: each variant's name
/// in kebab case, as clap derives it, or its `#[command(name = "…")]`.
fn cli_subcommands(main_rs: &str) -> Option<Vec<String>> {
    let derive = main_rs
        .match_indices("#[derive(")
        .map(|(at, _)| at)
        .find(|at| main_rs[*at..].lines().next().is_some_and(|line| line.contains("Subcommand")))?;
    let body = main_rs[derive..].split_once("enum Command {\n")?.1;
    let mut subcommands = Vec::new();
    let mut renamed = None;
    for line in body.lines().take_while(|line| *line != "}") {
        // Variants sit at one indentation level; their fields deeper.
        let Some(item) = line.strip_prefix("    ").filter(|item| !item.starts_with(' ')) else {
            continue;
        };
        if let Some(name) =
            item.strip_prefix("#[command(name = \"").and_then(|rest| rest.split('"').next())
        {
            renamed = Some(name.to_owned());
        } else if item.starts_with(|c: char| c.is_ascii_uppercase()) {
            let variant: String =
                item.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            subcommands.push(renamed.take().unwrap_or_else(|| kebab_case(&variant)));
        }
    }
    (!subcommands.is_empty()).then_some(subcommands)
}

/// `DoctorCluster` → `doctor-cluster`.
fn kebab_case(name: &str) -> String {
    let mut kebab = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            kebab.push('-');
        }
        kebab.push(c.to_ascii_lowercase());
    }
    kebab
}

/// The README layout's line for the CLI lists its subcommands, in any
/// order, after the first `:`, up to the `;`: "the `kpm` binary: run, list,
/// …; status API".
fn check_layout_subcommands(
    readme: &str,
    cli_dir: &str,
    subcommands: &[String],
    problems: &mut Vec<String>,
) {
    let write = subcommands.join(", ");
    let Some(line) = layout_lines(readme)
        .into_iter()
        .flatten()
        .find(|line| line.split_whitespace().next() == Some(cli_dir))
    else {
        // check_layout reports the missing line.
        return;
    };
    // In any order: the README may list them as a reader meets them.
    let listed: Option<BTreeSet<&str>> = line
        .split_once(':')
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(list, _)| list.split(',').map(str::trim).collect());
    let expected: BTreeSet<&str> = subcommands.iter().map(String::as_str).collect();
    if listed.is_none_or(|listed| listed != expected) {
        problems.push(format!(
            "{README}, Layout: the line of {cli_dir} lists the CLI's subcommands (from \
             {CLI_MAIN}) after its first `:` and up to a `;`: write `: {write};`"
        ));
    }
}

/// In `file`, every `` `kpm WORD`` names a subcommand, and, where `all`,
/// every subcommand is named so.
fn check_named_subcommands(
    file: &str,
    text: &str,
    subcommands: &[String],
    all: bool,
    problems: &mut Vec<String>,
) {
    let named: BTreeSet<&str> = text
        .match_indices("`kpm ")
        .map(|(at, _)| {
            let rest = &text[at + "`kpm ".len()..];
            let end =
                rest.find(|c: char| !(c.is_ascii_lowercase() || c == '-')).unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|word| !word.is_empty())
        .collect();
    for word in named.iter().filter(|word| !subcommands.iter().any(|s| s == *word)) {
        problems.push(format!(
            "{file} names `kpm {word}`, which is no subcommand of the CLI ({CLI_MAIN}): \
             correct or remove it"
        ));
    }
    if all {
        for subcommand in subcommands.iter().filter(|s| !named.contains(s.as_str())) {
            problems.push(format!(
                "{file} does not name `kpm {subcommand}`: add a sentence on what it does"
            ));
        }
    }
}

/// The `rust-version` of `[workspace.package]`.
pub(super) fn workspace_rust_version(cargo_toml: &str) -> Option<String> {
    let section = cargo_toml.split("[workspace.package]").nth(1)?;
    let section = section.split("\n[").next()?;
    let line = section.lines().find(|line| line.trim_start().starts_with("rust-version"))?;
    Some(line.split('"').nth(1)?.to_owned())
}

/// Each "X or newer" on a line of the README that speaks of Rust says the
/// workspace's `rust-version`, and there is one.
fn check_rust_version(readme: &str, version: &str, problems: &mut Vec<String>) {
    let mut found = false;
    for (number, line) in readme.lines().enumerate().filter(|(_, line)| line.contains("Rust")) {
        for (at, _) in line.match_indices(" or newer") {
            found = true;
            let stated = line[..at].rsplit([' ', '(']).next().unwrap_or_default();
            if stated != version {
                problems.push(format!(
                    "{README}:{}: says Rust {stated}, the workspace's rust-version is {version}: \
                     write `{version} or newer`",
                    number + 1
                ));
            }
        }
    }
    if !found {
        problems.push(format!(
            "{README} does not say which Rust it needs: write `a Rust toolchain ({version} or \
             newer)` in its quick start"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::layers::fixtures::{unlisted_crate, workspace};

    const SCRAPE: &str = r#"//! Scrape.
fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
    counter(encoder, "kpm_liveness_probes", "Probes made.", self.probes)?;
    gauge(
        encoder,
        "kpm_liveness_watched_processes",
        "Processes watched.",
        self.watched,
    )?;
    registry.register("kpm_registration_latency_seconds", "Latency.", latency.clone());
    let label = "kpm_not_a_metric {";
}

#[cfg(test)]
mod tests {
    const EXPECTED: &str = "kpm_only_in_a_test";
}
"#;

    #[test]
    fn metric_names_are_the_registered_literals_counters_with_total() {
        let spellings: Vec<Vec<String>> =
            metric_names(SCRAPE).iter().map(Metric::spellings).collect();
        assert_eq!(
            spellings,
            [
                vec!["kpm_liveness_probes_total"],
                vec!["kpm_liveness_watched_processes", "kpm_liveness_watched_processes_total"],
                vec!["kpm_registration_latency_seconds", "kpm_registration_latency_seconds_total"],
            ]
        );
    }

    #[test]
    fn a_metric_missing_from_operations_md_is_reported() {
        let sources = [("crates/kpm-status/src/metrics/scrape.rs".to_owned(), SCRAPE.to_owned())];
        let complete = "`kpm_liveness_probes_total`, `kpm_liveness_watched_processes` and \
                        `kpm_registration_latency_seconds{le}`.";
        let mut problems = Vec::new();
        check_metrics(&sources, complete, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_metrics(&sources, &complete.replace("_probes_total", "_probes"), &mut problems);
        assert_eq!(
            problems,
            ["docs/operations.md does not name the metric `kpm_liveness_probes_total` that \
                 crates/kpm-status/src/metrics/scrape.rs serves: add it, with what it counts, to \
                 the `--metrics-addr` paragraph"]
        );
    }

    /// A README whose layout lists [`workspace`]'s crates.
    fn readme(cli_line: &str) -> String {
        let lines: String = workspace("kpm", None)
            .iter()
            .map(|krate| {
                if krate.name == CLI_CRATE {
                    format!("{}  {cli_line}\n", krate.dir)
                } else {
                    format!("{}  what it is for\n", krate.dir)
                }
            })
            .collect();
        format!(
            "# kpm\n\nWith Rust (1.89 or newer): `kpm run`.\n\n## Layout\n\n```\nproto/  the wire\n{lines}```\n\n## Development\n"
        )
    }

    #[test]
    fn the_layout_lists_every_crate_and_no_other() {
        let crates = workspace("kpm", None);
        let mut problems = Vec::new();
        check_layout(&readme("the binary: run; more"), &crates, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let mut crates = crates;
        crates.push(unlisted_crate());
        crates.retain(|krate| krate.name != "kpm-dra");
        check_layout(&readme("the binary: run; more"), &crates, &mut problems);
        assert_eq!(
            problems,
            [
                "README.md, Layout: no line for crate kpm-new: write `crates/kpm-new  <what it \
                 is for>`",
                "README.md, Layout: `crates/kpm-dra` is no workspace crate: remove its line",
            ]
        );
    }

    const MAIN: &str = r#"//! Main.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run.
    Run(run::RunArgs),
    /// List.
    List {
        #[command(flatten)]
        root: RootArgs,
        Nested: u8,
    },
    #[cfg(feature = "demo")]
    Demo,
    #[command(name = "doc")]
    Doctor(doctor::DoctorArgs),
    CheckAll,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OutputFormat {
    Table,
}
"#;

    #[test]
    fn subcommands_come_from_the_clap_enum() {
        assert_eq!(cli_subcommands(MAIN).unwrap(), ["run", "list", "demo", "doc", "check-all"]);
        assert_eq!(cli_subcommands("//! Main.\nenum Command {\n    Run,\n}\n"), None);
    }

    fn subcommands() -> Vec<String> {
        ["run", "list", "check"].map(str::to_owned).to_vec()
    }

    #[test]
    fn the_layout_lists_the_cli_subcommands() {
        let mut problems = Vec::new();
        let good = readme("the `kpm` binary: run, list, check; status API");
        check_layout_subcommands(&good, "crates/kpm-cli", &subcommands(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let reordered = readme("the `kpm` binary: check, run, list; status API");
        check_layout_subcommands(&reordered, "crates/kpm-cli", &subcommands(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let missing = readme("the `kpm` binary: run, list; status API");
        check_layout_subcommands(&missing, "crates/kpm-cli", &subcommands(), &mut problems);
        assert_eq!(
            problems,
            ["README.md, Layout: the line of crates/kpm-cli lists the CLI's subcommands \
                 (from crates/kpm-cli/src/cli.rs) after its first `:` and up to a `;`: write \
                 `: run, list, check;`"]
        );
    }

    #[test]
    fn the_cli_readme_names_every_subcommand_and_no_other() {
        let mut problems = Vec::new();
        let text = "`kpm run` runs; `kpm list -o json`, `kpm check -- cmd` and `kpm`.";
        check_named_subcommands(CLI_README, text, &subcommands(), true, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        let text = "`kpm run` runs; `kpm lists`.";
        check_named_subcommands(CLI_README, text, &subcommands(), true, &mut problems);
        assert_eq!(
            problems,
            [
                "crates/kpm-cli/README.md names `kpm lists`, which is no subcommand of the CLI \
                 (crates/kpm-cli/src/cli.rs): correct or remove it",
                "crates/kpm-cli/README.md does not name `kpm list`: add a sentence on what it \
                 does",
                "crates/kpm-cli/README.md does not name `kpm check`: add a sentence on what it \
                 does",
            ]
        );
        problems.clear();
        check_named_subcommands(README, text, &subcommands(), false, &mut problems);
        assert_eq!(problems.len(), 1, "only the unknown one: {problems:?}");
    }

    #[test]
    fn the_readme_rust_version_is_the_workspace_one() {
        let cargo = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.1.0\"\n\
                     rust-version = \"1.89\"\n\n[workspace.dependencies]\nrust-version = \"9\"\n";
        assert_eq!(workspace_rust_version(cargo).as_deref(), Some("1.89"));
        let mut problems = Vec::new();
        check_rust_version(&readme(""), "1.89", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_rust_version(&readme(""), "1.90", &mut problems);
        assert_eq!(
            problems,
            ["README.md:3: says Rust 1.89, the workspace's rust-version is 1.90: write `1.90 \
                 or newer`"]
        );
        problems.clear();
        check_rust_version("# kpm\n\nWith Go (1.22 or newer).\n", "1.90", &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
