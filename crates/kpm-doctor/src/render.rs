//! A [`Diagnosis`] as `kpm doctor` prints it: a table, verdict first, then
//! each failure's reason and fix (with what the cluster keeps for a row
//! under that row, as part of it).

use std::fmt::Write as _;

use crate::Diagnosis;
use kpm_report::Verdict;

use crate::judge;

/// The report as a table, verdict first, then each failure's reason and
/// fix, what could not be seen, and a count.
pub fn render_table(report: &Diagnosis) -> String {
    let mut text =
        format!("kubelet root: {} (from {})\n", report.root_dir.display(), report.root_from);
    // Several kubelets on the host: which one, and how to pick another.
    if let Some(choice) = &report.choice {
        let _ = writeln!(text, "{choice}");
    }
    if let Some(unchecked) = &report.kubelet_unchecked {
        let _ = writeln!(text, "{unchecked}");
    }
    // Nothing judged: no table to show empty.
    if report.blind.is_none() || !report.plugins.is_empty() {
        rows_and_explanations(report, &mut text);
    }
    for what in &report.unseen {
        let _ = write!(text, "\nnot seen: {what}\n");
    }
    if let Some(blind) = &report.blind {
        let _ = write!(text, "\ncannot judge this node: {}\n  try: {}\n", blind.why, blind.hint);
        return text;
    }
    let failing = report.plugins.iter().filter(|row| row.verdict.fails()).count();
    let _ = write!(
        text,
        "\n{} entries: {} ok, {failing} failing",
        report.plugins.len(),
        report.plugins.iter().filter(|row| row.verdict == Verdict::Ok).count(),
    );
    match report.findings_of_their_own().count() {
        0 => text.push('\n'),
        n => {
            let _ = writeln!(text, "; {n} finding(s) about the node");
        }
    }
    text
}

/// One line per row, then each one that is not ok and each finding
/// explained with its fix.
fn rows_and_explanations(report: &Diagnosis, text: &mut String) {
    let mut rows = comfy_table::Table::new();
    rows.load_preset(comfy_table::presets::NOTHING);
    rows.set_header(["VERDICT", "TYPE", "NAME", "SOCKET", "POD", "SERVED BY"]);
    for row in &report.plugins {
        let socket = row.path.strip_prefix(&report.root_dir).unwrap_or(&row.path);
        rows.add_row([
            row.verdict.name().to_owned(),
            row.kind.map_or("-", kpm::PluginKind::plugin_type).to_owned(),
            row.name.clone().unwrap_or_else(|| "-".into()),
            socket.display().to_string(),
            row.pod.as_ref().map_or_else(|| "-".into(), pod_cell),
            row.served_by.as_ref().map_or_else(|| "-".into(), judge::served_by),
        ]);
    }
    text.push_str(&rows.trim_fmt());
    text.push('\n');
    for row in report.plugins.iter().filter(|row| row.verdict != Verdict::Ok) {
        let heading = format!("\n{}: {}", row.verdict.name(), row.path.display());
        explain(text, &heading, "  ", &row.reason, &row.hint);
        if let Some(pod) = &row.pod {
            let _ = writeln!(text, "  {pod}: `{}`", pod.logs_command());
        }
        if let Some(said) = &row.said {
            let _ = writeln!(text, "  it said: {said}");
        }
        // What the cluster keeps for this row, under it: one cause.
        for finding in report.caused_by(row) {
            let heading =
                format!("  kept for it: {}: {}", finding.verdict.name(), finding.path.display());
            explain(text, &heading, "    ", &finding.reason, &finding.hint);
        }
    }
    for finding in report.findings_of_their_own() {
        let heading = format!("\n{}: {}", finding.verdict.name(), finding.path.display());
        explain(text, &heading, "  ", &finding.reason, &finding.hint);
    }
}

/// `NAMESPACE/POD (CONTAINER)`, with its restarts when it has any.
fn pod_cell(pod: &kpm_report::PodContainer) -> String {
    match pod.restarts {
        0 => format!("{} ({})", pod.pod_name(), pod.container),
        n => format!("{} ({}, {n} restarts)", pod.pod_name(), pod.container),
    }
}

/// A heading, then the reason and the fix, `indent`ed under it.
fn explain(text: &mut String, heading: &str, indent: &str, reason: &str, hint: &str) {
    let _ = write!(text, "{heading}\n{indent}{reason}\n");
    if !hint.is_empty() {
        let _ = writeln!(text, "{indent}fix: {hint}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_the_doctor_was_not_checked_against_is_said_so_on_top() {
        let mut report = Diagnosis::of_parts(Vec::new(), Vec::new(), None);
        report.kubelet_version = Some("v1.30.14".to_owned());
        report.kubelet_unchecked = kpm_report::unchecked_note("v1.30.14");
        let text = render_table(&report);
        let second = text.lines().nth(1).unwrap_or_default();
        assert!(second.starts_with("kubelet v1.30.14 is a kubelet minor"), "{text}");
    }
}
