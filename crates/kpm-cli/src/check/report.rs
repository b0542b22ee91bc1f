//! `kpm check`'s report: each step's outcome with its evidence, and the one
//! report they make, rendered as lines, as a JSON document or as JUnit XML.
//! The three renderers read the same [`Report`], so they cannot disagree.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::CliError;

/// How a step ended, with its evidence. `Warned` is a pass with a finding
/// stricter than the kubelet: the kubelet copes, but the plugin breaks a
/// rule of its API that another node agent, or the next kubelet, may hold it to.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "result", content = "detail", rename_all = "lowercase")]
pub(super) enum Outcome {
    Passed(String),
    Warned(String),
    Failed(String),
    Skipped(String),
}

impl Outcome {
    /// `PASS`, `WARN`, `FAIL` or `SKIP`, as the report's lines show it.
    fn mark(&self) -> &'static str {
        match self {
            Self::Passed(_) => "PASS",
            Self::Warned(_) => "WARN",
            Self::Failed(_) => "FAIL",
            Self::Skipped(_) => "SKIP",
        }
    }

    /// The evidence, whatever the result.
    fn detail(&self) -> &str {
        match self {
            Self::Passed(detail)
            | Self::Warned(detail)
            | Self::Failed(detail)
            | Self::Skipped(detail) => detail,
        }
    }
}

/// A step's evidence as it is gathered, line by line, each line weighing
/// as a pass, a warning or a failure: the step ends as its worst line.
#[derive(Debug, Default)]
pub(super) struct Findings {
    lines: Vec<String>,
    warned: bool,
    failed: bool,
}

impl Findings {
    pub(super) fn pass(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    pub(super) fn warn(&mut self, line: impl Into<String>) {
        self.warned = true;
        self.lines.push(line.into());
    }

    pub(super) fn fail(&mut self, line: impl Into<String>) {
        self.failed = true;
        self.lines.push(line.into());
    }

    /// A pass or a failure, as `failed` says.
    pub(super) fn judge(&mut self, failed: bool, line: impl Into<String>) {
        if failed { self.fail(line) } else { self.pass(line) }
    }

    /// The outcome: failed if any line failed, else warned if any warned,
    /// else passed; skipped with `if_none` when nothing was judged. The
    /// evidence is the lines, `; `-separated.
    pub(super) fn outcome(self, if_none: &str) -> Outcome {
        let detail = self.lines.join("; ");
        match (self.failed, self.warned, self.lines.is_empty()) {
            (true, _, _) => Outcome::Failed(detail),
            (false, true, _) => Outcome::Warned(detail),
            (false, false, true) => Outcome::Skipped(if_none.to_owned()),
            (false, false, false) => Outcome::Passed(detail),
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

/// How many steps passed (with or without warnings), failed and were skipped.
#[derive(Debug, Default, serde::Serialize)]
struct Tally {
    passed: usize,
    warned: usize,
    failed: usize,
    skipped: usize,
}

impl Tally {
    fn of(steps: &[Checked]) -> Self {
        let mut tally = Self::default();
        for Checked { outcome, .. } in steps {
            let count = match outcome {
                Outcome::Passed(_) => &mut tally.passed,
                Outcome::Warned(_) => &mut tally.warned,
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

    /// The report as lines: `PASS|WARN|FAIL|SKIP step evidence`, then the
    /// tally (warnings named only when there are some).
    pub(super) fn text(&self) -> String {
        let mut text = self.title() + "\n";
        // The evidence in one column, after the longest step's name.
        let width = self.steps.iter().map(|checked| checked.step.len()).max().unwrap_or(0);
        for Checked { step, outcome } in &self.steps {
            let _ = writeln!(text, "{} {step:<width$} {}", outcome.mark(), outcome.detail());
        }
        if let Some(root) = self.kept {
            let _ = writeln!(
                text,
                "kept: {} (the plugin's output in plugin.out, plugin.err)",
                root.display()
            );
        }
        let Tally { passed, warned, failed, .. } = self.tally;
        let _ = match warned {
            0 => writeln!(text, "{passed} passed, {failed} failed"),
            _ => writeln!(text, "{passed} passed, {warned} warned, {failed} failed"),
        };
        text
    }

    /// Writes the report as JUnit XML to `path`: one test suite named after
    /// the command, each step a test case of class `kpm check`; a failure or
    /// a skip carries its evidence as the message, a pass as its output, and
    /// a warning is a pass whose output begins `warning: ` (JUnit has no
    /// warnings).
    pub(super) fn write_junit(&self, path: &Path, took: Duration) -> Result<(), CliError> {
        use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
        let cases = self.steps.iter().map(|Checked { step, outcome }| {
            let mut status = match outcome {
                Outcome::Passed(_) | Outcome::Warned(_) => TestCaseStatus::success(),
                Outcome::Failed(_) => TestCaseStatus::non_success(NonSuccessKind::Failure),
                Outcome::Skipped(_) => TestCaseStatus::skipped(),
            };
            if let Outcome::Failed(detail) | Outcome::Skipped(detail) = outcome {
                status.set_message(detail.as_str());
            }
            let mut case = TestCase::new(*step, status);
            case.set_classname("kpm check");
            match outcome {
                Outcome::Passed(detail) => {
                    case.set_system_out(detail.as_str());
                }
                Outcome::Warned(detail) => {
                    case.set_system_out(format!("warning: {detail}"));
                }
                Outcome::Failed(_) | Outcome::Skipped(_) => {}
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
