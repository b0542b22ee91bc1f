//! Every `kpm …` command line in the project's Markdown (README.md,
//! docs/*.md, the crates' READMEs) parsed with the CLI's own definition, so
//! that a runbook's command runs as written (`kpm doctor --disable
//! DRAPlugin` did not: the flag takes `dra`).
//!
//! Two kinds of command line are read:
//! - in fenced code blocks, every line (with its `\` continuations) and
//!   every command of it (`&&`, `;`, `|`, `&` split them) run as `kpm`,
//!   `sudo kpm`, `kubectl kpm`, `cargo run -p kpm-cli -- …` or
//!   `target/*/kpm`: each must parse whole;
//! - in prose, inline code that starts with `kpm`, `sudo kpm` or `kubectl
//!   kpm`. A synopsis is read with its first choices (`[-o table|json]` as
//!   `-o table`), and a mention may stop short: at a subcommand whose
//!   required arguments follow in the text (`kpm check`), or at a flag
//!   whose value does (`kpm doctor --kubeconfig`), which must exist.

use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::{CommandFactory as _, Parser as _};

use crate::cli::Cli;

/// A command line found in a document.
#[derive(Debug)]
struct Found {
    /// `file:line`.
    at: String,
    line: usize,
    /// kpm's arguments, the program left out.
    args: Vec<String>,
    /// In prose: it may stop short (see the module's doc).
    mention: bool,
}

/// The Markdown files whose commands are checked, under the workspace root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "crates"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            match dir {
                "docs" if path.extension().is_some_and(|ext| ext == "md") => files.push(path),
                "crates" if path.join("README.md").is_file() => files.push(path.join("README.md")),
                _ => {}
            }
        }
    }
    files.sort();
    files
}

/// The command lines of one document.
fn command_lines(name: &str, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut fenced = false;
    // Prose since the last fence, from its first line: an inline span may
    // go on to the next line.
    let mut prose: Option<(usize, String)> = None;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            found.extend(
                prose.take().into_iter().flat_map(|(first, text)| mentions(name, first, &text)),
            );
            continue;
        }
        if !fenced {
            let (_, text) = prose.get_or_insert_with(|| (number, String::new()));
            text.push_str(line);
            text.push('\n');
            continue;
        }
        let (start, joined) = match pending.take() {
            Some((start, before)) => (start, format!("{before} {line}")),
            None => (number, line.to_owned()),
        };
        if let Some(unfinished) = joined.strip_suffix('\\') {
            pending = Some((start, unfinished.to_owned()));
            continue;
        }
        let line = joined.trim_start().strip_prefix("$ ").unwrap_or(&joined);
        for args in invocations(line) {
            found.push(Found { at: format!("{name}:{start}"), line: start, args, mention: false });
        }
    }
    found.extend(prose.into_iter().flat_map(|(first, text)| mentions(name, first, &text)));
    found.sort_by_key(|found| found.line);
    found
}

/// The shell words that separate one command from the next.
const SEPARATORS: [&str; 5] = ["&&", "||", "|", ";", "&"];

/// kpm's arguments in each command of a shell line run as kpm.
fn invocations(line: &str) -> Vec<Vec<String>> {
    // A line the shell could not split (an open quote) holds no command.
    let Some(words) = shlex::split(line) else { return Vec::new() };
    let mut commands = Vec::new();
    for command in words.split(|word| SEPARATORS.contains(&word.as_str())) {
        // A redirection ends what is kpm's.
        let command: Vec<&str> = command
            .iter()
            .map(String::as_str)
            .take_while(|word| !word.starts_with('>') && !word.starts_with("2>"))
            .collect();
        if let Some(args) = kpm_args(&command) {
            commands.push(args.iter().map(|arg| (*arg).to_owned()).collect());
        }
    }
    commands
}

/// The arguments after the program, when `command` runs kpm.
fn kpm_args<'a>(command: &'a [&'a str]) -> Option<&'a [&'a str]> {
    // Variables set for the command, then `sudo`.
    let start = command.iter().position(|word| !word.contains('=') || word.starts_with('-'))?;
    let mut rest = &command[start..];
    if rest.first() == Some(&"sudo") {
        rest = &rest[1..];
    }
    match rest {
        ["kpm", args @ ..] | ["kubectl", "kpm", args @ ..] => Some(args),
        [program, args @ ..] if program.ends_with("/kpm") => Some(args),
        ["cargo", "run", cargo @ ..] if cargo.windows(2).any(|w| w == ["-p", "kpm-cli"]) => {
            let dashes = cargo.iter().position(|word| *word == "--")?;
            Some(&cargo[dashes + 1..])
        }
        _ => None,
    }
}

/// kpm's arguments in each inline code span of `prose` (from line
/// `first` of document `name`) that runs kpm with arguments, a synopsis read
/// with its first choices.
fn mentions(name: &str, first: usize, prose: &str) -> Vec<Found> {
    let mut found = Vec::new();
    let mut offset = 0;
    for (index, piece) in prose.split('`').enumerate() {
        let at = offset;
        offset += piece.len() + 1;
        if index % 2 == 0 {
            continue;
        }
        let span = piece.replace('\n', " ");
        let span = span.strip_prefix("sudo ").unwrap_or(&span);
        let span = span.strip_prefix("kubectl ").unwrap_or(span);
        // `kpm` alone names the program.
        let Some(args) = span.strip_prefix("kpm ") else { continue };
        let synopsis = args.replace(['[', ']', '…'], "");
        let args: Vec<String> = synopsis
            .split_whitespace()
            .map(|word| word.split('|').next().unwrap_or(word).to_owned())
            .collect();
        // `kpm …` names the program and any command of it.
        if args.is_empty() {
            continue;
        }
        let line = first + prose[..at].matches('\n').count();
        found.push(Found { at: format!("{name}:{line}"), line, args, mention: true });
    }
    found
}

/// Why `found` does not parse, if it does not.
fn problem(found: &Found) -> Option<String> {
    let argv = std::iter::once("kpm").chain(found.args.iter().map(String::as_str));
    let error = Cli::try_parse_from(argv).err()?;
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return None;
    }
    if found.mention && stops_short(&found.args, error.kind()) {
        return None;
    }
    let first = error.to_string();
    let first = first.lines().next().unwrap_or_default().to_owned();
    Some(format!("{}: `kpm {}`: {first}", found.at, found.args.join(" ")))
}

/// A mention that ends where the text goes on: required arguments left
/// out, or a last flag, known to its subcommand, whose value is left out.
fn stops_short(args: &[String], kind: ErrorKind) -> bool {
    match (kind, args) {
        (ErrorKind::MissingRequiredArgument, _) => true,
        (ErrorKind::InvalidValue, [subcommand, .., last]) if last.starts_with("--") => {
            let command = Cli::command();
            let Some(subcommand) = command.find_subcommand(subcommand) else { return false };
            let flag = last.trim_start_matches('-');
            subcommand.get_arguments().any(|arg| arg.get_long() == Some(flag))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        command_lines("doc.md", text).iter().filter_map(problem).collect()
    }

    #[test]
    fn every_kpm_command_line_in_the_docs_parses() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut found = Vec::new();
        for path in documents(&root) {
            let text = std::fs::read_to_string(&path).expect("a readable document");
            let name = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
            found.extend(command_lines(&name, &text));
        }
        let problems: Vec<String> = found.iter().filter_map(problem).collect();
        assert!(problems.is_empty(), "command lines that do not parse:\n{}", problems.join("\n"));
        // Both kinds are found: the extraction itself works on the docs.
        assert!(found.iter().filter(|found| !found.mention).count() >= 15, "{found:#?}");
        assert!(found.iter().filter(|found| found.mention).count() >= 30, "{found:#?}");
    }

    #[test]
    fn a_command_line_that_does_not_parse_is_named_with_its_place() {
        let text = "Run `kpm doctor --disable DRAPlugin` to judge as that kubelet.\n\
                    ```sh\n\
                    RUST_LOG=debug sudo kpm run --root-dir /var/lib/kubelet --bogus &\n\
                    kubectl kpm doctor --cluster -l pool=gpu | grep failing\n\
                    cargo run -p kpm-cli -- list \\\n  -o yaml\n\
                    ```\n";
        let problems = problems(text);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].starts_with(
                "doc.md:1: `kpm doctor --disable DRAPlugin`: error: invalid value 'DRAPlugin'"
            ),
            "{problems:#?}"
        );
        assert!(problems[1].starts_with("doc.md:3: `kpm run --root-dir /var/lib/kubelet --bogus`: error: unexpected argument '--bogus'"), "{problems:#?}");
        assert!(
            problems[2].starts_with("doc.md:5: `kpm list -o yaml`: error: invalid value 'yaml'"),
            "{problems:#?}"
        );
    }

    #[test]
    fn synopses_and_mentions_that_stop_short_are_read_as_the_text_means() {
        let text = "`kpm list [-o table|json]`, `kpm check -- PLUGIN-COMMAND…`, `kpm check`, `kpm …`, \
                    `kpm doctor --kubeconfig`, `sudo kpm run`, `kpm probe SOCKET`\n\
                    ```\n\
                    echo 40 > /tmp/limit   # within 10 s, kpm list shows 40\n\
                    cargo install kpm-cli && kpm demo\n\
                    target/release/kpm run --root-dir /tmp/kb > /tmp/log 2>&1 &\n\
                    ```\n";
        assert_eq!(problems(text), Vec::<String>::new());
        let found = command_lines("doc.md", text);
        let lines: Vec<String> = found.iter().map(|found| found.args.join(" ")).collect();
        assert_eq!(
            lines,
            [
                "list -o table",
                "check -- PLUGIN-COMMAND",
                "check",
                "doctor --kubeconfig",
                "run",
                "probe SOCKET",
                "demo",
                "run --root-dir /tmp/kb",
            ]
        );
        // A mention's last flag must exist, and a code block's line parse whole.
        assert_eq!(problems("`kpm doctor --kubeconfigs`\n").len(), 1);
        assert_eq!(problems("```\nkpm doctor --kubeconfig\n```\n").len(), 1);
    }
}
