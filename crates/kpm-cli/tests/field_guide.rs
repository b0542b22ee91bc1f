//! `docs/field-guide.md` held true: every line of its ```` ```log
//! verdict=NAME ```` blocks is one the real `kpm doctor explain` knows and
//! explains to that verdict, with a fix; every section names the trackers
//! it comes from.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;

use kpm_report::Verdict;

/// A section (`### N. title`) of the guide.
struct Section {
    title: String,
    body: Vec<String>,
}

/// A ```` ```log verdict=NAME ```` block: its verdict, its lines and the
/// section it is in.
struct LogBlock {
    verdict: String,
    lines: Vec<String>,
    section: String,
}

fn guide() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/field-guide.md");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn sections(guide: &str) -> Vec<Section> {
    let mut sections: Vec<Section> = Vec::new();
    for line in guide.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            let numbered = title.split_once(". ").is_some_and(|(number, _)| {
                !number.is_empty() && number.chars().all(|c| c.is_ascii_digit())
            });
            assert!(numbered, "a section's title is `### N. title`: {line}");
            sections.push(Section { title: title.to_owned(), body: Vec::new() });
        } else if let Some(section) = sections.last_mut() {
            section.body.push(line.to_owned());
        }
    }
    sections
}

/// Every ```` ```log verdict=NAME ```` block. Any other block whose info
/// string starts with `log` is a mistake, and fails.
fn log_blocks(guide: &str) -> Vec<LogBlock> {
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        if let Some(title) = line.strip_prefix("### ") {
            title.clone_into(&mut section);
        }
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<String> =
            lines.by_ref().take_while(|line| *line != "```").map(str::to_owned).collect();
        if !info.starts_with("log") {
            continue;
        }
        let verdict = info
            .strip_prefix("log verdict=")
            .filter(|verdict| !verdict.is_empty() && !verdict.contains(char::is_whitespace))
            .unwrap_or_else(|| panic!("in {section}: a log block is ```log verdict=NAME: {line}"));
        assert!(!body.is_empty(), "in {section}: an empty log block");
        assert!(
            body.iter().all(|line| !line.trim().is_empty()),
            "in {section}: a blank line in a log block"
        );
        blocks.push(LogBlock {
            verdict: verdict.to_owned(),
            lines: body,
            section: section.clone(),
        });
    }
    blocks
}

#[test]
fn every_section_names_its_reports() {
    let guide = guide();
    let sections = sections(&guide);
    assert!(sections.len() >= 15, "{} sections, not 15 or more", sections.len());
    for (at, section) in sections.iter().enumerate() {
        let number = section.title.split_once(". ").unwrap().0;
        assert_eq!(
            number,
            (at + 1).to_string(),
            "sections are numbered 1, 2, …: {}",
            section.title
        );
        let reported = section
            .body
            .iter()
            .find(|line| line.starts_with("**Reported:**"))
            .unwrap_or_else(|| panic!("{}: no **Reported:** line", section.title));
        assert!(
            reported.contains("](https://github.com/"),
            "{}: its **Reported:** line has no link: {reported}",
            section.title
        );
        for field in
            ["**What the user saw:**", "**kpm doctor says:**", "**Fix:**", "**Reproduced by:**"]
        {
            assert!(
                section.body.iter().any(|line| line.starts_with(field)),
                "{}: no {field}",
                section.title
            );
        }
    }
}

#[test]
fn every_log_line_is_explained_to_its_verdict_with_a_fix() {
    let guide = guide();
    let blocks = log_blocks(&guide);
    assert!(blocks.len() >= 15, "{} log blocks, not 15 or more", blocks.len());
    for block in &blocks {
        for line in &block.lines {
            let output = support::kpm(&["doctor", "explain", line]);
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            let what = format!("in {}: {line}\n{stdout}{stderr}", block.section);
            assert_eq!(output.status.code(), Some(0), "not known: {what}");
            let verdict = stdout
                .lines()
                .find_map(|line| line.strip_prefix("verdict:"))
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("no verdict: line: {what}"));
            assert_eq!(verdict, block.verdict, "{what}");
            assert!(
                stdout.lines().any(|line| line.starts_with("fix:") && line.len() > "fix:".len()),
                "no fix: line: {what}"
            );
        }
    }
}

#[test]
fn the_index_has_a_row_of_each_section_with_a_verdict_of_its_log_blocks() {
    let guide = guide();
    let blocks = log_blocks(&guide);
    let rows: Vec<&str> = guide.lines().filter(|line| line.starts_with("| ")).collect();
    for (at, section) in sections(&guide).iter().enumerate() {
        let number = at + 1;
        let row = rows
            .iter()
            .find(|row| row.starts_with(&format!("| {number} | ")))
            .unwrap_or_else(|| panic!("the index has no row {number} ({})", section.title));
        let verdict = row.trim_end_matches(['|', ' ']).rsplit('|').next().unwrap().trim();
        let verdict = verdict.trim_matches('`');
        assert!(Verdict::from_name(verdict).is_some(), "row {number}: {verdict} is no verdict");
        let of_section: Vec<&str> = blocks
            .iter()
            .filter(|block| block.section == section.title)
            .map(|block| block.verdict.as_str())
            .collect();
        assert!(
            of_section.is_empty() || of_section.contains(&verdict),
            "row {number} says {verdict}, its log blocks {of_section:?}"
        );
    }
}

/// Section 16's line, gRPC's words alone: not explained, exit 1, and what
/// the line would need to name; the same words with a socket are known.
#[test]
fn a_line_of_grpcs_words_alone_is_not_explained_and_says_what_it_would_need() {
    let alone = "rpc error: code = Unavailable desc = transport is closing";
    let output = support::kpm(&["doctor", "explain", alone]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("not explained: `transport is closing`"), "{stdout}");
    assert!(stdout.contains("device-plugins/kubelet.sock"), "{stdout}");
    assert!(!stdout.contains("verdict:"), "{stdout}");
    let named = format!("{alone}: dial unix /var/lib/kubelet/device-plugins/kubelet.sock");
    let output = support::kpm(&["doctor", "explain", &named]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("verdict:    not-registered-again"), "{stdout}");
    assert!(
        stdout.contains("kubelet     /var/lib/kubelet/device-plugins/kubelet.sock"),
        "{stdout}"
    );
}
