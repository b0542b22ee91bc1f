//! The pods behind the node's sockets, asked of the kubelet's container
//! runtime (`kpm-pods`): each socket a containerized process serves gets
//! its pod container, and a socket nothing serves gets the container that
//! last served it, when that container's runs said so in their logs. What
//! such a run printed before it exited is read with the table of known
//! lines, so a registrar that crash-loops on a refused registration is
//! judged by why it was refused, not as a leftover; a pod that should
//! serve a socket and serves none is a finding of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm::transport::{Dialer, HostRoot, Reach, fd};
use kpm_pods::{Containers, LogLine, Run, Runtime};
use kpm_report::{ContainerState, Verdict};

use crate::Finding;
use crate::found::Found;
use crate::host::View;
use crate::judge::Row;
use crate::log_lines::{self, Explained};

/// The longest quote of a log line the doctor shows on the node.
pub(crate) const MAX_QUOTE_BYTES: usize = 300;

/// How much of a run's log is read: the end, where it said why it exited.
const LOG_TAIL_BYTES: u64 = 64 * 1024;

/// Names the pod container behind each row `found` that one serves or
/// last served, asking the runtime whose socket is `endpoint` (a path as
/// the judged kubelet sees it, read in `view`), and adds to its findings
/// the pods that should serve a socket under `root_dir` and do not.
/// Returns the runtime as it was seen, for the watch's looks; why it could
/// not be asked is said among what `found` could not see.
pub(crate) async fn name(
    found: &mut Found,
    (view, root_dir): (&View, &Path),
    endpoint: &Path,
    timeout: Duration,
) -> Option<RuntimeSeen> {
    let Found { plugins: rows, findings, unseen, .. } = found;
    let reach = Reach::new(fd::budget().clone(), view.host_root().clone());
    let dialer = Dialer::new(reach, timeout);
    let looked = async {
        let mut runtime = Runtime::connect(&dialer, endpoint).await?;
        let mut containers = runtime.containers().await?;
        let wanted = statuses_wanted(rows, &containers);
        runtime.load_status(&mut containers, wanted.iter().map(String::as_str)).await?;
        Ok::<_, kpm_pods::PodsError>(containers)
    };
    let containers = match tokio::time::timeout(timeout, looked).await {
        Ok(Ok(containers)) => containers,
        Ok(Err(err)) => {
            unseen.push(format!("{err}; the pods behind the sockets are not named"));
            return None;
        }
        Err(_) => {
            unseen.push(format!(
                "the container runtime at {} did not answer within {}; the pods behind the \
                 sockets are not named",
                endpoint.display(),
                humantime::format_duration(timeout)
            ));
            return None;
        }
    };
    for row in rows.iter_mut() {
        if let Some(run) = served(row, &containers) {
            row.pod = Some(containers.pod_container(run));
        } else if row.verdict == Verdict::Stale {
            last_server(row, &containers, view);
        }
    }
    findings.extend(without_socket(rows, &containers, view, root_dir));
    let host = view.host_root().clone();
    Some(RuntimeSeen { endpoint: endpoint.to_path_buf(), host, runs: runs_of(&containers) })
}

/// The container runtime as a pass saw it: where it is asked, and each
/// run it kept and its state. A look between passes lists the runs again
/// ([`RuntimeSeen::changed`]): a container that started, ended or
/// restarted makes the watch judge at once, as a pod that should serve a
/// socket and does not changes no file the watch sees.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeSeen {
    endpoint: PathBuf,
    /// Where this process sees the judged kubelet's files.
    host: HostRoot,
    runs: Vec<(String, ContainerState)>,
}

impl RuntimeSeen {
    /// Whether the runtime's runs differ from the pass's now, asked with
    /// `dialer`'s budget and timeout; a runtime that cannot be asked has
    /// not changed (the next pass says why).
    pub(crate) async fn changed(&self, dialer: &Dialer) -> bool {
        let reach = Reach::new(dialer.budget().clone(), self.host.clone());
        let dialer = Dialer::new(reach, dialer.connect_timeout());
        let listed = async {
            let mut runtime = Runtime::connect(&dialer, &self.endpoint).await?;
            runtime.containers().await
        };
        match tokio::time::timeout(dialer.connect_timeout(), listed).await {
            Ok(Ok(containers)) => runs_of(&containers) != self.runs,
            _ => false,
        }
    }
}

/// Each run of `containers` and its state, by id.
fn runs_of(containers: &Containers) -> Vec<(String, ContainerState)> {
    containers.runs().map(|run| (run.id.clone(), run.state)).collect()
}

/// The pods that should serve a plugin socket and do not: a container
/// that can create sockets where the kubelet looks for them (it mounts
/// the registry or `device-plugins/` read-write), whose last run failed
/// (ended with an exit code other than 0) and that has ended or keeps
/// restarting, in a pod no socket of the node is served by or was left
/// by. A pod running as it should, serving elsewhere, is not told, nor
/// one whose containers ended well (a pod being deleted).
fn without_socket(
    rows: &[Row],
    containers: &Containers,
    view: &View,
    root_dir: &Path,
) -> Vec<Finding> {
    let watched = [
        root_dir.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME),
        root_dir.join(kpm::api::DEVICE_PLUGINS_DIR_NAME),
    ];
    let mut findings: Vec<Finding> = Vec::new();
    for latest in containers.latest().filter(|run| may_have_left_a_socket(run)) {
        let Some(mount) = latest.status.as_ref().and_then(|status| {
            status.mounts.iter().find(|mount| {
                !mount.readonly
                    && watched.iter().any(|dir| {
                        dir.starts_with(&mount.host_path) || mount.host_path.starts_with(dir)
                    })
            })
        }) else {
            continue;
        };
        let uid = &latest.pod.uid;
        let served = rows.iter().any(|row| row.pod.as_ref().is_some_and(|pod| &pod.uid == uid));
        let path = PathBuf::from(format!("pods/{}/{}", latest.pod.namespace, latest.pod.name));
        if served || findings.iter().any(|finding| finding.path == path) {
            continue;
        }
        let pod = containers.pod_container(latest);
        // A run that ended well is a pod being deleted or done (a
        // registrar removes its socket and exits 0 on SIGTERM), not one
        // that fails to serve.
        if pod.last_termination.as_ref().is_none_or(|ended| ended.exit_code == 0) {
            continue;
        }
        let known = containers.runs_of(latest).into_iter().find_map(|run| {
            let lines = log_of(run, view)?;
            lines.iter().rev().find_map(|line| log_lines::explain(&line.text))
        });
        // Its last words say why, when they are a known line.
        let (said, hint) = match &known {
            Some(explained) => {
                (format!("; its log: {}", explained.known.means), explained.known.cause.fix())
            }
            None => (
                String::new(),
                format!(
                    "the kubelet registers a plugin once its registration socket is in {} (a \
                     device plugin: once it calls Register on kubelet.sock): `{}` shows why it \
                     does not get there",
                    watched[0].display(),
                    pod.logs_command()
                ),
            ),
        };
        findings.push(Finding {
            verdict: Verdict::PodWithoutSocket,
            path,
            name: None,
            reason: format!(
                "{pod} mounts {} at {} and serves no socket there{said}",
                mount.host_path.display(),
                mount.container_path.display()
            ),
            hint,
            cause: None,
        });
    }
    findings
}

/// The run serving `row`'s socket, by its process's container.
fn served<'a>(row: &Row, containers: &'a Containers) -> Option<&'a Run> {
    containers.by_id(row.served_by.as_ref()?.container_id.as_deref()?)
}

/// The runs whose status a look needs: the earlier runs of a restarted
/// container serving a socket (how it last ended), and, when a socket is
/// stale or a pod should serve one, every run of a container that is not
/// running or has restarted.
fn statuses_wanted(rows: &[Row], containers: &Containers) -> Vec<String> {
    let mut wanted = Vec::new();
    for row in rows {
        if let Some(run) = served(row, containers).filter(|run| run.attempt > 0) {
            wanted.extend(containers.runs_of(run).iter().map(|run| run.id.clone()));
        }
    }
    // A stale socket's last server, or a pod that should serve one, is
    // among the containers that ended or restarted: few on a sound node.
    for latest in containers.latest().filter(|run| may_have_left_a_socket(run)) {
        wanted.extend(containers.runs_of(latest).iter().map(|run| run.id.clone()));
    }
    wanted
}

/// Whether a container's latest run may be one that left a socket behind.
fn may_have_left_a_socket(latest: &Run) -> bool {
    latest.state != ContainerState::Running || latest.attempt > 0
}

/// Finds the container whose runs served the stale socket of `row` (one
/// that mounts its directory and whose log names it), names it, and
/// judges the row by what its last run said, when that is a known line.
fn last_server(row: &mut Row, containers: &Containers, view: &View) {
    for latest in containers.latest().filter(|run| may_have_left_a_socket(run)) {
        for run in containers.runs_of(latest) {
            let Some(inside) = run.container_path_of(&row.path) else { continue };
            let Some(lines) = log_of(run, view) else { continue };
            let inside = inside.to_string_lossy();
            let on_host = row.path.to_string_lossy();
            if !lines
                .iter()
                .any(|line| line.text.contains(&*inside) || line.text.contains(&*on_host))
            {
                continue;
            }
            let pod = containers.pod_container(run);
            let known = lines
                .iter()
                .rev()
                .find_map(|line| log_lines::explain(&line.text).map(|explained| (explained, line)));
            match known {
                Some((explained, line)) => judge_by(row, &explained, line),
                None => {
                    row.hint = format!(
                        "{}; it was last served by {pod}: `{}` shows what its last run said",
                        row.hint,
                        pod.logs_command()
                    );
                }
            }
            row.pod = Some(pod);
            return;
        }
    }
}

/// The row judged by the known line its server's last run printed.
fn judge_by(row: &mut Row, explained: &Explained, line: &LogLine) {
    let cause = explained.known.cause;
    row.verdict = cause.verdict();
    row.reason = match &explained.endpoint {
        Some(endpoint) => {
            row.endpoint = Some(endpoint.clone());
            format!(
                "{} (the endpoint: {endpoint}); nothing listens on it since",
                explained.known.means
            )
        }
        None => format!("{}; nothing listens on it since", explained.known.means),
    };
    row.hint = cause.fix();
    row.said = Some(quote(&line.text));
}

/// `text` cut to [`MAX_QUOTE_BYTES`] at a character boundary.
fn quote(text: &str) -> String {
    if text.len() <= MAX_QUOTE_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The last lines of `run`'s log, read in `view`.
fn log_of(run: &Run, view: &View) -> Option<Vec<LogLine>> {
    let path = run.status.as_ref()?.log_path.as_deref()?;
    kpm_pods::log_tail(view.path(path).as_ref(), LOG_TAIL_BYTES).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_is_cut_at_a_character() {
        assert_eq!(quote("short"), "short");
        let long = "é".repeat(200);
        let cut = quote(&long);
        assert!(cut.len() <= MAX_QUOTE_BYTES + "…".len());
        assert!(cut.ends_with('…'));
    }
}
