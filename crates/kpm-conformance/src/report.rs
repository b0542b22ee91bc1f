//! The report of a run: each check's outcome with its evidence, rendered
//! as lines, as a JSON document or as JUnit XML, and asserted in a test.
//! The renderers read the same [`Report`], so they cannot disagree.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::SuiteError;
use crate::check::Check;
use crate::outcome::{Mark, Outcome};

/// One check made, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Checked {
    pub check: Check,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// How many checks passed (with or without warnings), failed and were skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Tally {
    pub passed: usize,
    pub warned: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Tally {
    fn of(checked: &[Checked]) -> Self {
        let mut tally = Self::default();
        for Checked { outcome, .. } in checked {
            let count = match outcome.mark() {
                Mark::Pass => &mut tally.passed,
                Mark::Warn => &mut tally.warned,
                Mark::Fail => &mut tally.failed,
                Mark::Skip => &mut tally.skipped,
            };
            *count += 1;
        }
        tally
    }
}

/// The report of a run, which is also its JSON document: the plugin's
/// command, each check with its result and evidence, the tally, and the
/// kept kubelet root (`null` unless kept).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    command: Vec<String>,
    checks: Vec<Checked>,
    #[serde(flatten)]
    tally: Tally,
    kept: Option<PathBuf>,
    #[serde(skip)]
    took: Duration,
    #[serde(skip)]
    strict: bool,
}

impl Report {
    pub(crate) fn new(
        command: Vec<String>,
        checks: Vec<(Check, Outcome)>,
        kept: Option<PathBuf>,
        took: Duration,
        strict: bool,
    ) -> Self {
        let checks: Vec<Checked> =
            checks.into_iter().map(|(check, outcome)| Checked { check, outcome }).collect();
        let tally = Tally::of(&checks);
        Self { command, checks, tally, kept, took, strict }
    }

    /// Every check made, in order.
    pub fn checks(&self) -> &[Checked] {
        &self.checks
    }

    /// How `check` ended, if it was made.
    pub fn outcome(&self, check: Check) -> Option<&Outcome> {
        self.checks.iter().find(|checked| checked.check == check).map(|checked| &checked.outcome)
    }

    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// The kept kubelet root, with the plugin's output in `plugin.out` and
    /// `plugin.err`, when the config asked to keep it.
    pub fn kept(&self) -> Option<&Path> {
        self.kept.as_deref()
    }

    /// Whether the plugin conforms: no check failed, nor warned in strict mode.
    pub fn conformant(&self) -> bool {
        self.tally.failed == 0 && !(self.strict && self.tally.warned > 0)
    }

    /// For a test: panics unless [`conformant`](Self::conformant), naming
    /// each check that failed (or warned, in strict mode) with its
    /// evidence; warnings are printed either way.
    ///
    /// # Panics
    ///
    /// When the plugin is not conformant: that is the assertion.
    #[track_caller]
    #[allow(clippy::panic, clippy::manual_assert, reason = "an assertion, for a test")]
    pub fn assert_conformant(&self) {
        let named = |mark: Mark| -> Vec<String> {
            self.checks
                .iter()
                .filter(|checked| checked.outcome.mark() == mark)
                .map(|checked| format!("{}: {}", checked.check, checked.outcome.evidence().said()))
                .collect()
        };
        let warned = named(Mark::Warn);
        if !warned.is_empty() && !self.strict {
            eprintln!("{}: warnings:\n  {}", self.title(), warned.join("\n  "));
        }
        let mut broken = named(Mark::Fail);
        if self.strict {
            broken.extend(warned);
        }
        if !broken.is_empty() {
            panic!("{} is not conformant:\n  {}", self.title(), broken.join("\n  "));
        }
    }

    /// `kpm check -- COMMAND…`: the report's first line, and the JUnit suite's name.
    fn title(&self) -> String {
        format!("kpm check -- {}", self.command.join(" "))
    }

    /// The report as lines: `PASS|WARN|FAIL|SKIP check evidence`, then the
    /// tally (warnings named only when there are some).
    pub fn text(&self) -> String {
        let mut text = self.title() + "\n";
        let names: Vec<String> = self.checks.iter().map(|checked| checked.check.name()).collect();
        // The evidence in one column, after the longest check's name.
        let width = names.iter().map(String::len).max().unwrap_or(0);
        for (name, Checked { outcome, .. }) in names.iter().zip(&self.checks) {
            let _ = writeln!(
                text,
                "{} {name:<width$} {}",
                outcome.mark().label(),
                outcome.evidence().said()
            );
        }
        if let Some(root) = &self.kept {
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

    /// The report as JUnit XML: one test suite named after the command,
    /// each check a test case of class `kpm check`; a failure or a skip
    /// carries its evidence as the message, a pass as its output, and a
    /// warning is a pass whose output begins `warning: ` (JUnit has no
    /// warnings).
    pub fn junit(&self) -> Result<String, SuiteError> {
        use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
        let cases = self.checks.iter().map(|Checked { check, outcome }| {
            let said = outcome.evidence().said();
            let mut status = match outcome.mark() {
                Mark::Pass | Mark::Warn => TestCaseStatus::success(),
                Mark::Fail => TestCaseStatus::non_success(NonSuccessKind::Failure),
                Mark::Skip => TestCaseStatus::skipped(),
            };
            if matches!(outcome.mark(), Mark::Fail | Mark::Skip) {
                status.set_message(said.as_str());
            }
            let mut case = TestCase::new(check.name(), status);
            case.set_classname("kpm check");
            match outcome.mark() {
                Mark::Pass => {
                    case.set_system_out(said);
                }
                Mark::Warn => {
                    case.set_system_out(format!("warning: {said}"));
                }
                Mark::Fail | Mark::Skip => {}
            }
            case
        });
        let mut suite = TestSuite::new(self.title());
        suite.set_time(self.took).add_test_cases(cases);
        let mut report = quick_junit::Report::new("kpm check");
        report.set_time(self.took).add_test_suite(suite);
        report.to_string().map_err(|err| SuiteError::RenderJunit(err.to_string()))
    }

    /// Writes [`junit`](Self::junit) to `path`.
    pub fn write_junit(&self, path: &Path) -> Result<(), SuiteError> {
        let xml = self.junit()?;
        std::fs::write(path, xml)
            .map_err(|source| SuiteError::WriteJunit { path: path.to_path_buf(), source })
    }
}
