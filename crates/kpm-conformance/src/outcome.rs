//! How a check ended, with its evidence: findings, each marked as a pass,
//! a warning, a failure or the reason for a skip, about a subject (a
//! socket, a resource, a claim…) when it has one, and timed when it
//! measured something. A check ends as its worst finding.

use std::path::PathBuf;
use std::time::Duration;

/// How a check ended, with its evidence. `Warned` is a pass with a
/// finding stricter than the kubelet: the kubelet copes, but the plugin
/// breaks a rule of its API that another node agent, or the next kubelet,
/// may hold it to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", content = "evidence", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome {
    Passed(Evidence),
    Warned(Evidence),
    Failed(Evidence),
    Skipped(Evidence),
}

/// What a finding, or an outcome, weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mark {
    /// Nothing judged: why.
    Skip,
    Pass,
    Warn,
    Fail,
}

impl Mark {
    /// `PASS`, `WARN`, `FAIL` or `SKIP`, as the report's lines show it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// What a finding is about.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum Subject {
    /// A socket: a registration socket or an endpoint, as on the node.
    Socket(PathBuf),
    /// A device plugin's extended resource.
    Resource(String),
    /// A plugin by its registered name (a CSI or DRA driver).
    Driver(String),
    /// A ResourceClaim of the check, by name.
    Claim(String),
    /// A DRA driver's device, `pool/device`.
    Device(String),
    /// A CDI spec file.
    CdiSpec(PathBuf),
    /// A kubelet minor of 1.x.
    KubeletMinor(u32),
}

/// One thing a check found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Finding {
    pub mark: Mark,
    /// What it is about, when it is about one thing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// How long what it measured took.
    #[serde(rename = "tookMs", serialize_with = "millis", skip_serializing_if = "Option::is_none")]
    pub took: Option<Duration>,
    /// What was found, and what the kubelet makes of it.
    pub said: String,
}

#[allow(clippy::ref_option, reason = "serde's serialize_with hands a reference")]
fn millis<S: serde::Serializer>(took: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match took {
        Some(took) => serializer.serialize_f64(took.as_secs_f64() * 1000.0),
        None => serializer.serialize_none(),
    }
}

impl Finding {
    /// Says what it is about.
    pub fn about(&mut self, subject: Subject) -> &mut Self {
        self.subject = Some(subject);
        self
    }

    /// Says how long what it measured took.
    pub fn took(&mut self, took: Duration) -> &mut Self {
        self.took = Some(took);
        self
    }
}

/// A check's findings, gathered one by one.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Evidence {
    findings: Vec<Finding>,
}

impl Evidence {
    /// The findings, in the order they were made.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The worst mark of the findings; `None` when there are none.
    pub fn worst(&self) -> Option<Mark> {
        self.findings.iter().map(|finding| finding.mark).max()
    }

    /// The findings' words, `; `-separated, as the report's line shows them.
    pub fn said(&self) -> String {
        let said: Vec<&str> = self.findings.iter().map(|finding| finding.said.as_str()).collect();
        said.join("; ")
    }

    /// Adds a finding marked `mark`, for its subject and time to be said.
    pub fn add(&mut self, mark: Mark, said: impl Into<String>) -> &mut Finding {
        self.findings.push(Finding { mark, subject: None, took: None, said: said.into() });
        let last = self.findings.len() - 1;
        &mut self.findings[last]
    }

    /// Adds `other`'s findings after these.
    pub(crate) fn append(&mut self, other: Self) {
        self.findings.extend(other.findings);
    }

    pub(crate) fn pass(&mut self, said: impl Into<String>) {
        self.add(Mark::Pass, said);
    }

    pub(crate) fn warn(&mut self, said: impl Into<String>) {
        self.add(Mark::Warn, said);
    }

    pub(crate) fn fail(&mut self, said: impl Into<String>) {
        self.add(Mark::Fail, said);
    }

    /// The outcome: as the worst finding; skipped with `if_none` when
    /// nothing was judged.
    pub(crate) fn outcome(mut self, if_none: &str) -> Outcome {
        match self.worst() {
            Some(Mark::Fail) => Outcome::Failed(self),
            Some(Mark::Warn) => Outcome::Warned(self),
            Some(Mark::Pass) => Outcome::Passed(self),
            Some(Mark::Skip) => Outcome::Skipped(self),
            None => {
                self.add(Mark::Skip, if_none);
                Outcome::Skipped(self)
            }
        }
    }

    /// Evidence of one finding.
    fn one(mark: Mark, said: String) -> Self {
        let mut evidence = Self::default();
        evidence.add(mark, said);
        evidence
    }
}

impl Outcome {
    pub(crate) fn passed(said: impl Into<String>) -> Self {
        Self::Passed(Evidence::one(Mark::Pass, said.into()))
    }

    pub(crate) fn warned(said: impl Into<String>) -> Self {
        Self::Warned(Evidence::one(Mark::Warn, said.into()))
    }

    pub(crate) fn failed(said: impl Into<String>) -> Self {
        Self::Failed(Evidence::one(Mark::Fail, said.into()))
    }

    pub(crate) fn skipped(said: impl Into<String>) -> Self {
        Self::Skipped(Evidence::one(Mark::Skip, said.into()))
    }

    /// Its mark: `Pass` for `Passed`, and so on.
    pub fn mark(&self) -> Mark {
        match self {
            Self::Passed(_) => Mark::Pass,
            Self::Warned(_) => Mark::Warn,
            Self::Failed(_) => Mark::Fail,
            Self::Skipped(_) => Mark::Skip,
        }
    }

    /// The evidence, whatever the result.
    pub fn evidence(&self) -> &Evidence {
        match self {
            Self::Passed(evidence)
            | Self::Warned(evidence)
            | Self::Failed(evidence)
            | Self::Skipped(evidence) => evidence,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_is_its_worst_finding() {
        let mut evidence = Evidence::default();
        evidence.pass("a");
        evidence.add(Mark::Warn, "b").about(Subject::Resource("vendor.com/gpu".into()));
        assert_eq!(evidence.clone().outcome("").mark(), Mark::Warn);
        evidence.add(Mark::Fail, "c").took(Duration::from_millis(3));
        let outcome = evidence.outcome("");
        assert_eq!(outcome.mark(), Mark::Fail);
        assert_eq!(outcome.evidence().said(), "a; b; c");
        let json = serde_json::to_value(&outcome).unwrap_or_default();
        assert_eq!(json["result"], "failed");
        assert_eq!(json["evidence"][1]["subject"]["resource"], "vendor.com/gpu");
        assert_eq!(json["evidence"][2]["tookMs"], 3.0);
        let skipped = Evidence::default().outcome("nothing to judge");
        assert_eq!(
            (skipped.mark(), skipped.evidence().said()),
            (Mark::Skip, "nothing to judge".into())
        );
    }
}
