//! `kpm check`'s report: each step's outcome with its evidence, and the one
//! report they make, rendered as lines, as a JSON document or as JUnit XML.
//! The three renderers read the same [`Report`], so they cannot disagree.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::CliError;

/// How a step ended, with its evidence.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "result", content = "detail", rename_all = "lowercase")]
pub(super) enum Outcome {
    Passed(String),
    Failed(String),
    Skipped(String),
}

impl Outcome {
    /// A step judged on several sockets: failed if any failed, skipped with
    /// `if_none` when there was nothing to judge, else passed; the evidence
    /// is the lines, `; `-separated.
    pub(super) fn judged(failed: bool, lines: &[String], if_none: &str) -> Self {
        match (failed, lines.is_empty()) {
            (true, _) => Self::Failed(lines.join("; ")),
            (false, true) => Self::Skipped(if_none.to_owned()),
            (false, false) => Self::Passed(lines.join("; ")),
        }
    }

    /// `PASS`, `FAIL` or `SKIP`, as the report's lines show it.
    fn mark(&self) -> &'static str {
        match self {
            Self::Passed(_) => "PASS",
            Self::Failed(_) => "FAIL",
            Self::Skipped(_) => "SKIP",
        }
    }

    /// The evidence, whatever the result.
    fn detail(&self) -> &str {
        match self {
            Self::Passed(detail) | Self::Failed(detail) | Self::Skipped(detail) => detail,
        }
    }
}

/// One step's name and outcome: `{"step": …, "result": …, "detail": …}`.
#[derive(Debug, serde::Serialize)]
struct Checked {
    step: &'static str,
    #[serde(flatten)]
    outcome: Outcome,
}

/// How many steps passed, failed and were skipped.
#[derive(Debug, Default, serde::Serialize)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Tally {
    fn of(steps: &[Checked]) -> Self {
        let mut tally = Self::default();
        for Checked { outcome, .. } in steps {
            let count = match outcome {
                Outcome::Passed(_) => &mut tally.passed,
                Outcome::Failed(_) => &mut tally.failed,
                Outcome::Skipped(_) => &mut tally.skipped,
            };
            *count += 1;
        }
        tally
    }
}

/// The report of a run, which is also its JSON document: the command, each
/// step with its result and evidence, the tally, and the kept root (`null`
/// unless kept).
#[derive(Debug, serde::Serialize)]
pub(super) struct Report<'a> {
    command: &'a [String],
    steps: Vec<Checked>,
    #[serde(flatten)]
    tally: Tally,
    kept: Option<&'a Path>,
}

impl<'a> Report<'a> {
    pub(super) fn new(
        command: &'a [String],
        steps: Vec<(&'static str, Outcome)>,
        kept: Option<&'a Path>,
    ) -> Self {
        let steps: Vec<Checked> =
            steps.into_iter().map(|(step, outcome)| Checked { step, outcome }).collect();
        let tally = Tally::of(&steps);
        Self { command, steps, tally, kept }
    }

    /// Whether no step failed.
    pub(super) fn passed(&self) -> bool {
        self.tally.failed == 0
    }

    /// `kpm check -- COMMAND…`: the report's first line, and the JUnit suite's name.
    fn title(&self) -> String {
        format!("kpm check -- {}", self.command.join(" "))
    }

    /// The report as lines: `PASS|FAIL|SKIP step evidence`, then the tally.
    pub(super) fn text(&self) -> String {
        let mut text = self.title() + "\n";
        for Checked { step, outcome } in &self.steps {
            let _ = writeln!(text, "{} {step:<20} {}", outcome.mark(), outcome.detail());
        }
        if let Some(root) = self.kept {
            let _ = writeln!(
                text,
                "kept: {} (the plugin's output in plugin.out, plugin.err)",
                root.display()
            );
        }
        let _ = writeln!(text, "{} passed, {} failed", self.tally.passed, self.tally.failed);
        text
    }

    /// Writes the report as JUnit XML to `path`: one test suite named after
    /// the command, each step a test case of class `kpm check`; a failure or
    /// a skip carries its evidence as the message, a pass as its output.
    pub(super) fn write_junit(&self, path: &Path, took: Duration) -> Result<(), CliError> {
        use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
        let cases = self.steps.iter().map(|Checked { step, outcome }| {
            let mut status = match outcome {
                Outcome::Passed(_) => TestCaseStatus::success(),
                Outcome::Failed(_) => TestCaseStatus::non_success(NonSuccessKind::Failure),
                Outcome::Skipped(_) => TestCaseStatus::skipped(),
            };
            if !matches!(outcome, Outcome::Passed(_)) {
                status.set_message(outcome.detail());
            }
            let mut case = TestCase::new(*step, status);
            case.set_classname("kpm check");
            if let Outcome::Passed(detail) = outcome {
                case.set_system_out(detail);
            }
            case
        });
        let mut suite = TestSuite::new(self.title());
        suite.set_time(took).add_test_cases(cases);
        let mut report = Report::new("kpm check");
        report.set_time(took).add_test_suite(suite);
        let failed = |err: &dyn std::fmt::Display| {
            CliError::Check(format!("write the JUnit report {}: {err}", path.display()))
        };
        let xml = report.to_string().map_err(|err| failed(&err))?;
        std::fs::write(path, xml).map_err(|err| failed(&err))
    }
}
