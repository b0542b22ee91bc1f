//! What a pass of the doctor comes to, as published: the condition, the
//! typed report's status and the Events are all built from one
//! [`Standing`], so that they cannot disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm::PluginKind;

use kpm_report::{
    BlindStatus, CANNOT_JUDGE_REASON, ConditionStatus, Counts, FindingEntry, HEALTHY_REASON,
    KubeletPluginReportStatus, KubeletStatus, MAX_ENTRIES, MAX_MESSAGE_BYTES, MAX_REASON_BYTES,
    PLUGIN_NOT_FOUND_REASON, PLUGIN_REGISTERED_REASON, PluginEntry, PodContainer, ShownRegistered,
    Verdict,
};

use crate::condition::PluginsCondition;
use crate::{Blind, Diagnosis, Failure};

impl PluginsCondition {
    /// The condition `report` comes to: `Unknown` when the doctor could
    /// not look ([`CANNOT_JUDGE_REASON`]). `kpm doctor`'s exit status and
    /// [`Diagnosis::ok`] follow it too.
    pub fn of(report: &Diagnosis) -> Self {
        Standing::of(report).condition()
    }
}

/// What a report comes to, as far as the condition and the Events go,
/// owned: `--watch` holds the one it published, compares each pass with
/// it, and publishes [`condition`](Self::condition); a single pass is
/// [`PluginsCondition::of`]. One builder for both, so that a node's
/// doctor, watching or not, cannot tell it two ways.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Standing {
    /// Every socket judged (the report's rows), by path: what the typed
    /// report lists.
    pub(crate) sockets: BTreeMap<PathBuf, Socket>,
    /// Each failing socket's or object's verdict, by path.
    pub(crate) failing: BTreeMap<PathBuf, Failing>,
    /// Why the doctor could not look, when it could not.
    pub(crate) blind: Option<Blind>,
    /// The kubelet judged.
    pub(crate) kubelet: KubeletStatus,
    /// What the node's API objects show registered, when read.
    pub(crate) registered: Option<ShownRegistered>,
}

/// A socket as published: what the plugin told of itself and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Socket {
    pub(crate) kind: Option<PluginKind>,
    pub(crate) name: Option<String>,
    pub(crate) verdict: Verdict,
    pub(crate) reason: String,
    /// The pod container behind it.
    pub(crate) pod: Option<PodContainer>,
}

impl Socket {
    /// How a message names it at `path`.
    pub(crate) fn subject(&self, path: &Path) -> String {
        subject(self.name.as_deref(), path)
    }
}

/// How a message names a plugin: its `name`, else the file name of its
/// `path`.
pub(crate) fn subject(name: Option<&str>, path: &Path) -> String {
    match name {
        Some(name) => name.to_owned(),
        None => path
            .file_name()
            .map_or_else(|| path.display().to_string(), |name| name.to_string_lossy().into_owned()),
    }
}

/// A failure as published: its verdict, and how the message and an Event
/// name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failing {
    pub(crate) verdict: Verdict,
    pub(crate) subject: String,
    /// The plugin, driver or resource it is about, when it names one.
    pub(crate) name: Option<String>,
    pub(crate) reason: String,
    /// The failing row it is part of ([`Diagnosis::cause_of`]): it has its
    /// Event, but is not counted again.
    pub(crate) cause: Option<PathBuf>,
    /// The pod container behind the failing socket, which its Events are
    /// related to.
    pub(crate) pod: Option<PodContainer>,
}

impl Failing {
    fn of(failure: &Failure<'_>, name: Option<&str>, cause: Option<PathBuf>) -> Self {
        Self {
            verdict: failure.verdict,
            subject: failure.subject(),
            name: name.map(str::to_owned),
            reason: failure.reason.to_owned(),
            cause,
            pod: None,
        }
    }
}

impl Standing {
    pub(crate) fn of(report: &Diagnosis) -> Self {
        let caused = report.plugins.iter().flat_map(|row| {
            report.caused_by(row).map(|finding| {
                let failing = Failing::of(
                    &finding.failure(),
                    finding.name.as_deref(),
                    Some(row.path.clone()),
                );
                (finding.path.clone(), failing)
            })
        });
        let rows = report.failing_rows().map(|row| {
            let failing = Failing {
                pod: row.pod.clone(),
                ..Failing::of(&row.failure(), row.name.as_deref(), None)
            };
            (row.path.clone(), failing)
        });
        let own = report.findings_of_their_own().filter(|finding| finding.verdict.fails()).map(
            |finding| {
                (
                    finding.path.clone(),
                    Failing::of(&finding.failure(), finding.name.as_deref(), None),
                )
            },
        );
        // Findings about one object share its path (`csinodes/NAME`): one
        // that counts is put in last, so that it wins.
        let failing = caused.chain(rows).chain(own).collect();
        let sockets = report
            .plugins
            .iter()
            .map(|row| {
                let socket = Socket {
                    kind: row.kind,
                    name: row.name.clone(),
                    verdict: row.verdict,
                    reason: row.reason.clone(),
                    pod: row.pod.clone(),
                };
                (row.path.clone(), socket)
            })
            .collect();
        let kubelet = KubeletStatus {
            root_dir: report.root_dir.display().to_string(),
            found_by: report.root_from.clone(),
            version: report.kubelet_version.clone(),
        };
        let registered = report.registered.clone();
        Self { sockets, failing, blind: report.blind.clone(), kubelet, registered }
    }

    /// Whether the node fails or could not be judged: either way, it is
    /// not healthy.
    pub(crate) fn fails(&self) -> bool {
        self.blind.is_some() || !self.failing.is_empty()
    }

    /// The condition of a node the doctor could not look at, when it could
    /// not: `Unknown`, and why.
    fn cannot_judge(&self) -> Option<PluginsCondition> {
        self.blind.as_ref().map(|blind| PluginsCondition {
            status: ConditionStatus::Unknown,
            reason: CANNOT_JUDGE_REASON.to_owned(),
            message: truncated(&blind.why, MAX_MESSAGE_BYTES).to_owned(),
        })
    }

    /// The condition of `plugin` alone ([`PluginConditionType`](crate::PluginConditionType)):
    /// `Unknown` when the doctor could not look, `True` when a socket of
    /// that name is registered, else `False` with the gravest verdict of
    /// those that name it ([`PLUGIN_NOT_FOUND_REASON`] when none does).
    pub(crate) fn plugin_condition(&self, plugin: &str) -> PluginsCondition {
        if let Some(unknown) = self.cannot_judge() {
            return unknown;
        }
        let named: Vec<(&PathBuf, &Socket)> = self
            .sockets
            .iter()
            .filter(|(_, socket)| socket.name.as_deref() == Some(plugin))
            .collect();
        let registered = named.iter().find(|(_, socket)| socket.verdict.registers());
        if let Some((path, _)) = registered {
            return PluginsCondition {
                status: ConditionStatus::True,
                reason: PLUGIN_REGISTERED_REASON.to_owned(),
                message: format!("{plugin} is registered ({})", path.display()),
            };
        }
        let gravest = named.iter().max_by_key(|(_, socket)| socket.verdict.severity());
        let (reason, message) = match gravest {
            Some((path, socket)) => (
                socket.verdict.reason(),
                format!(
                    "{plugin} ({}) is {}: {}",
                    path.display(),
                    socket.verdict.name(),
                    socket.reason
                ),
            ),
            None => (
                PLUGIN_NOT_FOUND_REASON.to_owned(),
                format!("no plugin socket of this node registers {plugin}"),
            ),
        };
        let message = truncated(&message, MAX_MESSAGE_BYTES).to_owned();
        PluginsCondition { status: ConditionStatus::False, reason, message }
    }

    /// The condition: `Unknown` when the doctor could not look, `True` when
    /// nothing fails, else `False` with the first failing verdict.
    pub(crate) fn condition(&self) -> PluginsCondition {
        if let Some(unknown) = self.cannot_judge() {
            return unknown;
        }
        let mut failures: Vec<&Failing> =
            self.failing.values().filter(|failing| failing.cause.is_none()).collect();
        if failures.is_empty() {
            return PluginsCondition {
                status: ConditionStatus::True,
                reason: HEALTHY_REASON.to_owned(),
                message: format!("all {} plugin sockets of the node are ok", self.sockets.len()),
            };
        }
        failures.sort_by_key(|failure| std::cmp::Reverse(failure.verdict.severity()));
        let reason = failures.first().map_or(Verdict::Unreachable, |first| first.verdict).reason();
        let mut message = format!("{} failing: ", failures.len());
        for (i, failure) in failures.iter().enumerate() {
            let item = format!(
                "{}{} ({}): {}",
                if i == 0 { "" } else { "; " },
                failure.subject,
                failure.verdict.name(),
                failure.reason
            );
            let more = format!("; and {} more", failures.len() - i);
            // Room is kept for the "and N more" that would follow.
            if message.len() + item.len() + more.len() > MAX_MESSAGE_BYTES {
                if i == 0 {
                    let room = MAX_MESSAGE_BYTES.saturating_sub(message.len() + more.len() + 1);
                    message.push_str(truncated(&item, room));
                    message.push('…');
                    if failures.len() > 1 {
                        let _ = write!(message, "; and {} more", failures.len() - 1);
                    }
                } else {
                    message.push_str(&more);
                }
                break;
            }
            message.push_str(&item);
        }
        PluginsCondition { status: ConditionStatus::False, reason, message }
    }
}

/// The status `outcome` comes to, its condition being `condition`, every
/// entry since `now` ([`keep_since`](KubeletPluginReportStatus::keep_since)
/// dates them). No heartbeat: the writer sets it.
pub(crate) fn status_of(
    outcome: &Standing,
    condition: &PluginsCondition,
    now: &Time,
) -> KubeletPluginReportStatus {
    let mut plugins: Vec<PluginEntry> = outcome
        .sockets
        .iter()
        .map(|(path, socket)| PluginEntry {
            socket: path.display().to_string(),
            kind: socket.kind,
            name: socket.name.clone(),
            verdict: socket.verdict.into(),
            reason: bounded(&socket.reason),
            since: now.clone(),
            pod: socket.pod.clone(),
        })
        .collect();
    // Failing first, the most severe first, so that the bound drops healthy
    // ones; the sort is stable, and the sockets come by path.
    plugins.sort_by_key(|entry| {
        let failing = outcome.failing.get(Path::new(&entry.socket));
        std::cmp::Reverse(failing.map_or(0, |failing| failing.verdict.severity()))
    });
    let mut findings: Vec<FindingEntry> = outcome
        .failing
        .iter()
        .filter(|(path, _)| !outcome.sockets.contains_key(*path))
        .map(|(path, failing)| FindingEntry {
            object: path.display().to_string(),
            name: failing.name.clone(),
            verdict: failing.verdict.into(),
            reason: bounded(&failing.reason),
            cause: failing.cause.as_ref().map(|cause| cause.display().to_string()),
            since: now.clone(),
        })
        .collect();
    let omitted =
        plugins.len().saturating_sub(MAX_ENTRIES) + findings.len().saturating_sub(MAX_ENTRIES);
    plugins.truncate(MAX_ENTRIES);
    findings.truncate(MAX_ENTRIES);
    let failing = outcome.failing.values().filter(|failing| failing.cause.is_none()).count();
    KubeletPluginReportStatus {
        health: condition.status.into(),
        reason: condition.reason.clone(),
        blind: outcome
            .blind
            .as_ref()
            .map(|blind| BlindStatus { why: bounded(&blind.why), hint: bounded(&blind.hint) }),
        kubelet: outcome.kubelet.clone(),
        counts: Counts {
            plugins: count(outcome.sockets.len()),
            failing: count(failing),
            omitted: count(omitted),
        },
        plugins,
        findings,
        registered: outcome.registered.clone(),
        heartbeat_time: None,
        doctor_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// `text` cut to [`MAX_REASON_BYTES`] on a character, marked when cut.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_REASON_BYTES {
        return text.to_owned();
    }
    let mut cut = truncated(text, MAX_REASON_BYTES - '…'.len_utf8()).to_owned();
    cut.push('…');
    cut
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a
/// character boundary.
pub(crate) fn truncated(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How `--watch` compares its passes.
impl Standing {
    /// Whether `other` has the same entries and verdicts, each failure
    /// behind the same pod container, and is as blind (reasons may carry
    /// figures that change from pass to pass, as may why the doctor cannot
    /// look, and a crash-looping container's restarts).
    pub(crate) fn agrees(&self, other: &Self) -> bool {
        self.sockets.len() == other.sockets.len()
            && self.kubelet == other.kubelet
            && self.blind.is_some() == other.blind.is_some()
            && self.failing.len() == other.failing.len()
            && self.failing.iter().zip(&other.failing).all(|((a, fa), (b, fb))| {
                a == b
                    && fa.verdict == fb.verdict
                    && same_container(fa.pod.as_ref(), fb.pod.as_ref())
            })
    }

    /// Whether every failure here is one of `before`'s, with the same
    /// verdict, or what a flapping one settled to: only recoveries and
    /// what held still for the flap hold, which need no second look. Going
    /// blind is none: a blind pass sees no failure because it sees nothing.
    pub(crate) fn only_better_than(&self, before: &Self) -> bool {
        (self.blind.is_none() || before.blind.is_some())
            && self.failing.iter().all(|(path, failing)| {
                before.failing.get(path).is_some_and(|was| {
                    was.verdict == failing.verdict || was.verdict == Verdict::Flapping
                })
            })
    }

    /// Whether a plugin here is newly found lost to a node event (the
    /// kubelet's start, a reboot): that needs no second look, for the
    /// event is a fact, not a flicker, and until it is published the
    /// condition vouches for a plugin the kubelet no longer has.
    pub(crate) fn newly_lost_to_a_node_event(&self, before: &Self) -> bool {
        self.failing.iter().any(|(path, failing)| {
            failing.verdict == Verdict::NotRegisteredAgain
                && before.failing.get(path).is_none_or(|was| was.verdict != failing.verdict)
        })
    }
}

/// Whether two failures are behind the same pod container (a new pod of a
/// DaemonSet is another), whatever its restarts.
fn same_container(
    a: Option<&kpm_report::PodContainer>,
    b: Option<&kpm_report::PodContainer>,
) -> bool {
    a.map(|pod| (&pod.uid, &pod.container)) == b.map(|pod| (&pod.uid, &pod.container))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::judge::Row;
    use crate::{Blind, Finding};

    fn row(verdict: Verdict, path: &str, name: Option<&str>, reason: &str) -> Row {
        let mut row = Row::new(verdict, Path::new(path), "registry", reason.to_owned());
        row.name = name.map(str::to_owned);
        row
    }

    fn ok(path: &str) -> Row {
        row(Verdict::Ok, path, None, "fine")
    }

    fn finding(verdict: Verdict, path: &str, reason: &str, cause: Option<&str>) -> Finding {
        Finding {
            name: None,
            verdict,
            path: PathBuf::from(path),
            reason: reason.to_owned(),
            hint: String::new(),
            cause: cause.map(PathBuf::from),
        }
    }

    #[test]
    fn a_node_the_doctor_could_not_look_at_is_unknown() {
        let blind = Blind {
            why: "/nonexistent/plugins_registry: cannot be listed".to_owned(),
            hint: "--root-dir".to_owned(),
        };
        // What was judged before the doctor went blind (the API server not
        // read) does not make it True or False.
        let report = Diagnosis::of_parts(vec![ok("/r/a.sock")], Vec::new(), Some(blind));
        let condition = PluginsCondition::of(&report);
        assert_eq!(condition.status, ConditionStatus::Unknown);
        assert_eq!(condition.reason, "CannotJudge");
        assert_eq!(condition.message, "/nonexistent/plugins_registry: cannot be listed");
        assert!(!report.ok);
    }

    #[test]
    fn a_healthy_node_is_true() {
        let report = Diagnosis::of_parts(
            vec![ok("/r/a.sock"), ok("/r/b.sock"), ok("/r/c.sock")],
            Vec::new(),
            None,
        );
        let condition = PluginsCondition::of(&report);
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(condition.reason, "PluginsHealthy");
        assert_eq!(condition.message, "all 3 plugin sockets of the node are ok");
        assert!(report.ok);
    }

    #[test]
    fn the_reason_is_the_first_failing_verdict_and_the_message_names_each_plugin() {
        let rows = vec![
            row(
                Verdict::NotRegistered,
                "/r/x.sock",
                Some("vendor.com/gpu"),
                "the kubelet holds none",
            ),
            row(Verdict::Stale, "/r/plugins_registry/a-reg.sock", None, "connection refused"),
            ok("/r/b.sock"),
            ok("/r/c.sock"),
            ok("/r/d.sock"),
        ];
        let report = Diagnosis::of_parts(rows, Vec::new(), None);
        let condition = PluginsCondition::of(&report);
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason, "Stale");
        assert_eq!(
            condition.message,
            "2 failing: a-reg.sock (stale): connection refused; \
             vendor.com/gpu (not-registered): the kubelet holds none"
        );
        assert!(!report.ok);
    }

    #[test]
    fn a_finding_caused_by_a_failing_row_counts_with_it() {
        let stale = "/r/plugins_registry/csi.example.com-reg.sock";
        let rows = vec![row(Verdict::Stale, stale, None, "connection refused")];
        let findings = vec![
            finding(Verdict::StaleCsiNodeEntry, "csinodes/node1", "kept for it", Some(stale)),
            // A cause that names no failing row explains nothing: it counts.
            finding(
                Verdict::OrphanedSlices,
                "resourceslices/gone.example.com",
                "gone",
                Some("/r/plugins_registry/nowhere-reg.sock"),
            ),
        ];
        let report = Diagnosis::of_parts(rows, findings, None);
        assert_eq!(report.failures().count(), 2);
        assert_eq!(report.cause_of(&report.findings[0]).map(|row| &row.path), Some(&stale.into()));
        assert!(report.cause_of(&report.findings[1]).is_none());
        let caused: Vec<&Path> =
            report.caused_by(&report.plugins[0]).map(|f| f.path.as_path()).collect();
        assert_eq!(caused, [Path::new("csinodes/node1")]);
        let condition = PluginsCondition::of(&report);
        assert_eq!(condition.reason, "Stale");
        assert_eq!(
            condition.message,
            "2 failing: csi.example.com-reg.sock (stale): connection refused; \
             gone.example.com (orphaned-slices): gone"
        );
        // The caused finding is still there, for its Event.
        let outcome = Standing::of(&report);
        let entry = &outcome.failing[Path::new("csinodes/node1")];
        assert_eq!(entry.cause.as_deref(), Some(Path::new(stale)));
    }

    #[test]
    fn the_message_is_bounded_and_says_how_many_more() {
        let many = (0..50)
            .map(|i| {
                let path = format!("/r/plugins_registry/p{i:02}-reg.sock");
                row(Verdict::Rejected, &path, Some("csi.example.com"), "too old")
            })
            .collect();
        let condition = PluginsCondition::of(&Diagnosis::of_parts(many, Vec::new(), None));
        assert!(condition.message.len() <= MAX_MESSAGE_BYTES, "{}", condition.message.len());
        assert!(condition.message.starts_with("50 failing: csi.example.com (rejected): too old; "));
        assert!(condition.message.ends_with(" more"), "{}", condition.message);
        // One failure longer than the bound alone is cut on a character.
        let long = "é".repeat(2000);
        let one = vec![row(Verdict::Rejected, "/r/plugins_registry/x.sock", None, &long)];
        let condition = PluginsCondition::of(&Diagnosis::of_parts(one, Vec::new(), None));
        assert!(condition.message.len() <= MAX_MESSAGE_BYTES);
        assert!(condition.message.ends_with('…'));
    }

    #[test]
    fn every_verdict_has_a_camel_case_reason() {
        assert_eq!(Verdict::NotARegistrationServer.reason(), "NotARegistrationServer");
        assert_eq!(Verdict::StaleCsiNodeEntry.reason(), "StaleCsiNodeEntry");
        for verdict in Verdict::all() {
            let reason = verdict.reason();
            assert!(reason.chars().all(|c| c.is_ascii_alphanumeric()), "{reason}");
            assert!(reason.starts_with(|c: char| c.is_ascii_uppercase()), "{reason}");
        }
    }

    // The typed report's status.

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn csi_row(verdict: Verdict, path: &str, reason: &str) -> Row {
        let mut row = Row::new(verdict, std::path::Path::new(path), "registry", reason.to_owned());
        row.kind = Some(PluginKind::Csi);
        row.name = Some("csi.example.com".to_owned());
        row
    }

    fn status(report: &Diagnosis, now: &Time) -> KubeletPluginReportStatus {
        let outcome = Standing::of(report);
        status_of(&outcome, &outcome.condition(), now)
    }

    #[test]
    fn every_socket_is_an_entry_failing_first_with_the_conditions_reason() {
        let stale_csi_node = Finding {
            name: Some("gone.example.com".to_owned()),
            verdict: Verdict::StaleCsiNodeEntry,
            path: PathBuf::from("csinodes/node1"),
            reason: "no live plugin of this node serves it".to_owned(),
            hint: String::new(),
            cause: None,
        };
        let report = Diagnosis::of_parts(
            vec![
                csi_row(Verdict::Ok, "/r/plugins_registry/a-reg.sock", "registered"),
                csi_row(Verdict::Stale, "/r/plugins_registry/b-reg.sock", "connection refused"),
            ],
            vec![stale_csi_node],
            None,
        );
        let status = status(&report, &at(100));
        assert_eq!(status.health, kpm_report::Health::Failing);
        assert_eq!(status.reason, "Stale");
        assert_eq!(status.counts, Counts { plugins: 2, failing: 2, omitted: 0 });
        let sockets: Vec<(&str, &str)> =
            status.plugins.iter().map(|e| (e.socket.as_str(), e.verdict.name())).collect();
        assert_eq!(
            sockets,
            [("/r/plugins_registry/b-reg.sock", "stale"), ("/r/plugins_registry/a-reg.sock", "ok")]
        );
        assert_eq!(status.plugins[0].kind, Some(PluginKind::Csi));
        assert_eq!(status.plugins[0].name.as_deref(), Some("csi.example.com"));
        assert_eq!(status.findings.len(), 1);
        assert_eq!(status.findings[0].object, "csinodes/node1");
        assert_eq!(status.findings[0].name.as_deref(), Some("gone.example.com"));
        assert_eq!(status.findings[0].verdict, Verdict::StaleCsiNodeEntry);
        assert_eq!(status.kubelet.root_dir, "/r");
        assert_eq!(status.kubelet.found_by, "--root-dir");
    }

    #[test]
    fn a_blind_report_cannot_judge_and_says_why() {
        let blind = Blind { why: "/r/plugins_registry: cannot be listed".into(), hint: "x".into() };
        let status = status(&Diagnosis::of_parts(Vec::new(), Vec::new(), Some(blind)), &at(1));
        assert_eq!(status.health, kpm_report::Health::CannotJudge);
        assert_eq!(status.reason, "CannotJudge");
        assert_eq!(status.blind.unwrap().why, "/r/plugins_registry: cannot be listed");
    }

    #[test]
    fn reasons_and_entries_are_bounded() {
        let long = "é".repeat(MAX_REASON_BYTES);
        let rows = (0..MAX_ENTRIES + 3)
            .map(|i| {
                csi_row(Verdict::Rejected, &format!("/r/plugins_registry/p{i:04}.sock"), &long)
            })
            .collect();
        let status = status(&Diagnosis::of_parts(rows, Vec::new(), None), &at(1));
        assert_eq!(status.plugins.len(), MAX_ENTRIES);
        assert_eq!(status.counts.omitted, 3);
        assert_eq!(usize::try_from(status.counts.plugins).unwrap(), MAX_ENTRIES + 3);
        let reason = &status.plugins[0].reason;
        assert!(reason.len() <= MAX_REASON_BYTES && reason.ends_with('…'), "{reason}");
    }

    #[test]
    fn an_entry_keeps_its_since_while_its_verdict_holds() {
        let path = "/r/plugins_registry/a-reg.sock";
        let before = status(
            &Diagnosis::of_parts(vec![csi_row(Verdict::Stale, path, "refused")], Vec::new(), None),
            &at(100),
        );
        // Still stale, with other words: since 100.
        let mut still = status(
            &Diagnosis::of_parts(
                vec![csi_row(Verdict::Stale, path, "refused again")],
                Vec::new(),
                None,
            ),
            &at(200),
        );
        still.keep_since(&before);
        assert_eq!(still.plugins[0].since, at(100));
        // Registered now: since 300.
        let mut fixed = status(
            &Diagnosis::of_parts(vec![csi_row(Verdict::Ok, path, "registered")], Vec::new(), None),
            &at(300),
        );
        fixed.keep_since(&still);
        assert_eq!(fixed.plugins[0].since, at(300));
    }
}
