//! Verdicts: what each socket of the node is to the kubelet, why, and what
//! fixes it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kpm::registry::{Ignored, RegistryEntry};
use kpm::transport::TransportError;
use kpm::{ExecutorError, Inspection, Kubelet, PluginKind, ServiceReport};
use kpm_report::Verdict;
use serde::Serialize;
use tracing::instrument::WithSubscriber as _;

use crate::Finding;
use crate::cause::Cause;
use crate::host::{Host, ProcessInfo, Seen, View};
use crate::kubelets::KubeletProcess;

impl crate::inspections::Lost {
    /// The socket at `path`, found in `found_in`, as a failing row.
    pub(crate) fn row(&self, path: &Path, found_in: &'static str) -> Row {
        match self {
            Self::Panicked(message) => Row::new(
                Verdict::Unreachable,
                path,
                found_in,
                format!("the doctor's inspection of it panicked: {message}"),
            )
            .hint("a kpm bug: report it with this socket's plugin; the kubelet may judge it otherwise"),
            Self::TimedOut(bound) => Row::new(
                Verdict::Unreachable,
                path,
                found_in,
                format!(
                    "its inspection did not end within {}: a plugin that accepts and never answers",
                    humantime::format_duration(*bound)
                ),
            )
            .hint("a hung plugin: look at its process (served by) and restart it"),
        }
    }
}

/// One socket or entry of the node.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct Row {
    /// What it is to the kubelet.
    pub verdict: Verdict,
    /// Its path on the host; for a plugin remembered registered whose
    /// socket is not known (the kubelet's checkpoint names a resource, not
    /// a socket), its type and name: `DevicePlugin/vendor.com/gpu`.
    pub path: PathBuf,
    /// `registry`, `device-plugins` or `deleted`, or `remembered`: a plugin
    /// registered before a node event and not since, of which nothing
    /// is left on the node to find.
    pub found_in: &'static str,
    /// The kind of plugin it is, by the type it reported (in
    /// `device-plugins/`, a device plugin); none when it told no type the
    /// kubelet has a handler for (its reason then says which it told).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<PluginKind>,
    /// The plugin's name, or a device plugin's resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The endpoint it advertised, a path on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The versions it advertised.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    /// What was seen (the service's answer when ok), or why it fails.
    pub reason: String,
    /// What fixes it; empty when nothing needs fixing.
    pub hint: String,
    /// What the node's API objects show of it (its CSINode entry, the
    /// Node's capacity, its ResourceSlices), when the API server was asked.
    #[serde(rename = "cluster", skip_serializing_if = "Option::is_none")]
    pub api_objects: Option<String>,
    /// The process serving its socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ProcessInfo>,
    /// The pod container serving its socket, or that last served it, as
    /// the container runtime tells it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<kpm_report::PodContainer>,
    /// The line of that container's last run that names the cause, cut to
    /// 300 bytes: shown on the node only, never published (a log may hold
    /// secrets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub said: Option<String>,
    /// The inspection's steps, in milliseconds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTaken>,
    /// What the handler saw of the plugin's own service, for the cluster's
    /// comparison.
    #[serde(skip)]
    pub(crate) service: Option<Box<dyn ServiceReport>>,
}

/// A step of an inspection and how long it took.
#[derive(Debug, Serialize)]
#[non_exhaustive]
pub struct StepTaken {
    /// The step's name: `dial`, `get-info`, ...
    pub step: &'static str,
    /// How long it took, in milliseconds.
    pub ms: f64,
}

impl Row {
    /// What a device plugin's service showed, when it is one that answered.
    pub(crate) fn device_report(&self) -> Option<&kpm::device::DevicePluginReport> {
        let report = self.service.as_deref()?;
        (report as &dyn std::any::Any).downcast_ref()
    }

    pub(crate) fn new(
        verdict: Verdict,
        path: &Path,
        found_in: &'static str,
        reason: String,
    ) -> Self {
        Self {
            verdict,
            path: path.to_path_buf(),
            found_in,
            kind: None,
            name: None,
            endpoint: None,
            versions: Vec::new(),
            reason,
            hint: String::new(),
            api_objects: None,
            served_by: None,
            pod: None,
            said: None,
            steps: Vec::new(),
            service: None,
        }
    }

    /// The row as a [`Failure`](crate::Failure), whatever its verdict.
    pub(crate) fn failure(&self) -> crate::Failure<'_> {
        crate::Failure {
            verdict: self.verdict,
            path: &self.path,
            kind: self.kind,
            name: self.name.as_deref(),
            reason: &self.reason,
        }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }
}

/// `pid N COMMAND (container ID, up Ns)`, shortened for a table.
pub fn served_by(process: &ProcessInfo) -> String {
    let mut text = format!("pid {}", process.pid);
    if let Some(command) = &process.command {
        let program = command.split(' ').next().unwrap_or_default();
        let program =
            Path::new(program).file_name().map_or(program.into(), |name| name.to_string_lossy());
        let _ = write!(text, " {program}");
    }
    let mut about = Vec::new();
    if let Some(id) = &process.container_id {
        about.push(format!("container {}", &id[..id.len().min(12)]));
    }
    if let Some(secs) = process.running_secs {
        about.push(format!(
            "up {}",
            humantime::format_duration(std::time::Duration::from_secs(secs))
        ));
    }
    if !about.is_empty() {
        let _ = write!(text, " ({})", about.join(", "));
    }
    text
}

/// Every entry of `registry`, the sockets inspected concurrently, each
/// within `bound`; the error if the registry cannot be listed at all.
/// `host` names the processes; `differs`, the judged kubelet's ways.
pub(crate) async fn registry(
    referee: &Kubelet,
    host: &Host,
    registry: &Seen,
    bound: Duration,
    differs: &Differs<'_>,
) -> io::Result<Vec<Row>> {
    let entries = kpm::registry::survey(registry.as_ref())?;
    let mut rows = Vec::new();
    let mut inspections = Vec::new();
    for (read_at, entry) in entries {
        let path = registry.on_host_of(&read_at);
        match entry {
            RegistryEntry::Socket => {
                let manager = referee.handle().manager().clone();
                let socket = path.clone();
                inspections.push((path, quietly(async move { manager.inspect(&socket).await })));
            }
            RegistryEntry::Ignored(why) => rows.push(ignored(&path, why)),
            RegistryEntry::Unreadable(err) => rows.push(
                Row::new(Verdict::Unreadable, &path, "registry", format!("cannot be read: {err}"))
                    .hint("run kpm doctor as the user the kubelet runs as (root)"),
            ),
            _ => {}
        }
    }
    for (path, inspection) in crate::inspections::each(inspections, bound).await {
        rows.push(match inspection {
            Ok(inspection) => judge(host, &path, inspection, differs),
            Err(lost) => lost.row(&path, "registry"),
        });
    }
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(rows)
}

/// `inspection` without the referee's own log. It registers
/// nothing, so its lines would mislead (`validating CSI driver`, every
/// pass), and what it finds is the row.
pub(crate) fn quietly<F: std::future::Future>(
    inspection: F,
) -> tracing::instrument::WithDispatch<F> {
    inspection.with_subscriber(tracing::subscriber::NoSubscriber::default())
}

fn ignored(path: &Path, why: Ignored) -> Row {
    let hint = match why {
        Ignored::Hidden => "",
        _ => {
            "only Unix sockets register; if a plugin means this to be its socket, it must bind it here itself"
        }
    };
    Row::new(Verdict::Ignored, path, "registry", format!("the kubelet ignores it: {why}"))
        .hint(hint)
}

/// The row of the registration socket at `path` on the host, from its
/// inspection, as the judged kubelet takes it.
fn judge(host: &Host, path: &Path, inspection: Inspection, differs: &Differs<'_>) -> Row {
    let ((verdict, hint), reason) = match &inspection.outcome {
        Ok(()) => {
            ((Verdict::Ok, String::new()), inspection.service.as_ref().map(ToString::to_string))
        }
        Err(err) => (
            classify(err).map_or((Verdict::Unreachable, String::new()), |cause| {
                (cause.verdict(), cause.fix())
            }),
            Some(err.reason()),
        ),
    };
    let reason = reason.unwrap_or_default();
    let mut row = Row::new(verdict, path, "registry", reason).hint(hint);
    if let Some(info) = &inspection.info {
        row.kind = PluginKind::from_plugin_type(&info.r#type);
        row.name = Some(info.name.clone());
        row.versions.clone_from(&info.supported_versions);
    }
    row.endpoint = inspection.endpoint.as_ref().map(|endpoint| endpoint.target().into_owned());
    row.served_by = inspection.server_pid.map(|pid| host.process(pid));
    row.steps = inspection
        .steps
        .iter()
        .map(|taken| StepTaken { step: taken.step.name(), ms: taken.took.as_secs_f64() * 1000.0 })
        .collect();
    row.service = inspection.service;
    differs(&mut row, &inspection.outcome);
    row
}

/// What the judged kubelet does otherwise than the referee (`dra_by_minor`).
pub(crate) type Differs<'a> = dyn Fn(&mut Row, &Result<(), ExecutorError>) + Sync + 'a;

/// Why the register operation would fail on a socket.
fn classify(err: &ExecutorError) -> Option<Cause> {
    Some(match err {
        ExecutorError::Dial { source, .. } if source.is_gone() => Cause::NothingListens,
        ExecutorError::Dial { .. } if io_kind(err) == Some(io::ErrorKind::PermissionDenied) => {
            Cause::PermissionDenied
        }
        ExecutorError::Dial { .. } => Cause::Hung,
        ExecutorError::NotARegistrationSocket { .. } => Cause::ServiceSocketInRegistry,
        ExecutorError::GetInfoTimeout { .. } => Cause::SlowGetInfo,
        ExecutorError::GetInfo { .. } => Cause::GetInfoFails,
        ExecutorError::InvalidInfo { .. } => Cause::InvalidInfo,
        ExecutorError::UnknownPluginType { .. } => Cause::NoHandlerForType,
        ExecutorError::Validate { .. } => Cause::HandlerRefused,
        ExecutorError::InspectService { source, .. } if endpoint_is_gone(source.as_ref()) => {
            Cause::EndpointMissing
        }
        ExecutorError::InspectService { .. } => Cause::ServiceFails,
        _ => return None,
    })
}

/// Whether a handler's error comes from a transport that found nobody there.
fn endpoint_is_gone(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |err| err.source())
        .filter_map(|err| err.downcast_ref::<TransportError>())
        .any(TransportError::is_gone)
}

/// The kind of the first IO error in `err`'s chain.
fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    std::iter::successors(Some(err), |err| err.source())
        .find_map(|err| err.downcast_ref::<io::Error>())
        .map(io::Error::kind)
}

/// The sockets still listening under `root`'s registry or `device-plugins/`
/// whose file is gone, each with the process that listens on it, as
/// `host` tells; `root` and `listening` (paths with their inodes) are as
/// the kubelet sees them, read in its `view`.
///
/// Gone means missing from a directory this process sees. A socket whose
/// directory it does not see at all tells nothing: the kubelet and its
/// plugins may run in another mount namespace, or the host be mounted
/// elsewhere than `--host-root` says, and the socket be where it belongs.
pub(crate) fn deleted(
    host: &Host,
    view: &View,
    root: &Path,
    listening: &BTreeMap<PathBuf, u64>,
) -> Vec<Row> {
    let dirs = [
        root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME),
        root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME),
    ];
    let gone = |path: &Path| {
        let seen = view.path(path);
        let seen = seen.as_ref();
        matches!(std::fs::symlink_metadata(seen), Err(err) if err.kind() == io::ErrorKind::NotFound)
            && seen.parent().is_some_and(Path::is_dir)
    };
    listening
        .iter()
        .filter(|(path, _)| dirs.iter().any(|dir| path.starts_with(dir)))
        .filter(|(path, _)| gone(path))
        .map(|(path, inode)| {
            let mut row = Row::new(
                Verdict::DeletedButListening,
                path,
                "deleted",
                "its file was removed while its process still listens: the kubelet deregistered it"
                    .into(),
            )
            .hint("restart the plugin (or its registrar) so that it binds its socket again");
            row.served_by = host.socket_holder(*inode).map(|pid| host.process(pid));
            row
        })
        .collect()
}

/// The registries of `roots` (but the one judged) that hold sockets while
/// no running kubelet has that root.
pub(crate) fn unwatched_registries(
    view: &View,
    root_dir: &Path,
    roots: &[PathBuf],
    kubelets: &[KubeletProcess],
) -> Vec<Finding> {
    roots
        .iter()
        .filter(|root| *root != root_dir && kubelets.iter().all(|k| &k.root_dir != *root))
        .filter_map(|root| {
            let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
            let entries = kpm::registry::survey(view.path(&registry).as_ref()).ok()?;
            let sockets = entries
                .iter()
                .filter(|(_, entry)| matches!(entry, kpm::registry::RegistryEntry::Socket))
                .count();
            (sockets > 0).then(|| Finding {
                name: None,
                verdict: Verdict::UnwatchedRegistry,
                reason: format!(
                    "{sockets} socket(s) in a registry no running kubelet watches (the kubelet's root is {})",
                    root_dir.display()
                ),
                hint: format!(
                    "the plugins' DaemonSets mount {} as the kubelet root: mount {} instead \
                     (node-driver-registrar's --kubelet-registration-path too)",
                    root.display(),
                    root_dir.display()
                ),
                path: registry,
                cause: None,
            })
        })
        .collect()
}

/// CSI drivers registered under one name by several sockets: the kubelet
/// keeps the one with the highest version; one with an equal or lower
/// version is refused.
pub(crate) fn mark_duplicates(rows: &mut [Row]) {
    let highest = |row: &Row| kpm::csi::highest_supported_version(&row.versions).ok();
    let csi: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].verdict == Verdict::Ok && rows[i].kind == Some(PluginKind::Csi))
        .collect();
    for &i in &csi {
        let kept =
            csi.iter().copied().filter(|&j| rows[j].name == rows[i].name).max_by(|&a, &b| {
                // The highest version wins; of equals, the first path.
                highest(&rows[a]).cmp(&highest(&rows[b])).then(b.cmp(&a))
            });
        if let Some(kept) = kept
            && kept != i
        {
            let other = rows[kept].path.display().to_string();
            rows[i].verdict = Verdict::Rejected;
            rows[i].reason = format!(
                "{other} registers the same driver name with an equal or higher version; the kubelet refuses this one"
            );
            rows[i].hint = "remove the older driver's registrar (or its stale socket)".into();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn csi(path: &str, name: &str, versions: &[&str]) -> Row {
        let mut row = Row::new(Verdict::Ok, Path::new(path), "registry", "ok".to_owned());
        row.kind = Some(PluginKind::Csi);
        row.name = Some(name.to_owned());
        row.versions = versions.iter().map(|v| (*v).to_owned()).collect();
        row
    }

    #[test]
    fn of_two_registrars_of_one_driver_the_kubelet_keeps_the_higher_version() {
        let mut rows = vec![
            csi("/r/plugins_registry/a-reg.sock", "csi.example.com", &["1.0.0"]),
            csi("/r/plugins_registry/b-reg.sock", "csi.example.com", &["1.2.0"]),
            csi("/r/plugins_registry/c-reg.sock", "other.example.com", &["1.0.0"]),
        ];
        mark_duplicates(&mut rows);
        let verdicts: Vec<Verdict> = rows.iter().map(|row| row.verdict).collect();
        assert_eq!(verdicts, [Verdict::Rejected, Verdict::Ok, Verdict::Ok]);
        assert!(rows[0].reason.starts_with("/r/plugins_registry/b-reg.sock registers the same"));
        // Equal versions: the first path is kept, the other refused.
        let mut rows = vec![
            csi("/r/plugins_registry/a-reg.sock", "csi.example.com", &["1.0.0"]),
            csi("/r/plugins_registry/b-reg.sock", "csi.example.com", &["1.0.0"]),
        ];
        mark_duplicates(&mut rows);
        assert_eq!((rows[0].verdict, rows[1].verdict), (Verdict::Ok, Verdict::Rejected));
    }

    #[test]
    fn a_socket_listening_whose_file_is_gone_from_a_seen_directory_is_deleted_but_listening() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
        let present = root.join("plugins_registry/here.sock");
        std::fs::write(&present, "").unwrap();
        let listening: BTreeMap<PathBuf, u64> = [
            (root.join("plugins_registry/gone.sock"), 1),
            (present, 2),
            // Its directory is not seen at all: nothing can be told.
            (root.join("device-plugins/elsewhere.sock"), 3),
            // Not a plugin directory.
            (root.join("pods/x.sock"), 4),
        ]
        .into();
        let fake = crate::host::FakeHost::new();
        // The process holding the deleted socket, by its inode.
        fake.process(77, &["/usr/bin/some-plugin"], None);
        std::fs::create_dir_all(fake.at("/proc/77/fd")).unwrap();
        std::os::unix::fs::symlink("socket:[1]", fake.at("/proc/77/fd/3")).unwrap();
        let rows = deleted(&fake.host(), &View::at("/"), root, &listening);
        let paths: Vec<&Path> = rows.iter().map(|row| row.path.as_path()).collect();
        assert_eq!(paths, [root.join("plugins_registry/gone.sock")]);
        assert_eq!(rows[0].verdict, Verdict::DeletedButListening);
        let holder = rows[0].served_by.as_ref().unwrap();
        assert_eq!((holder.pid, holder.command.as_deref()), (77, Some("/usr/bin/some-plugin")));
    }

    #[test]
    fn a_lost_inspection_is_a_failing_row() {
        use crate::inspections::Lost;
        let bound = std::time::Duration::from_secs(12);
        let row = Lost::Panicked("x".into()).row(Path::new("/r/panics.sock"), "registry");
        assert!(row.verdict.fails());
        assert_eq!(row.reason, "the doctor's inspection of it panicked: x");
        let row = Lost::TimedOut(bound).row(Path::new("/r/hangs.sock"), "registry");
        assert!(row.verdict.fails());
        assert!(row.reason.starts_with("its inspection did not end within 12s"), "{}", row.reason);
    }

    #[test]
    fn the_process_serving_a_socket_is_named_short() {
        let process = ProcessInfo {
            pid: 42,
            command: Some("/usr/bin/csi-node-driver-registrar --v=5".to_owned()),
            container_id: Some("0123456789abcdef0123".to_owned()),
            running_secs: Some(90),
        };
        assert_eq!(
            served_by(&process),
            "pid 42 csi-node-driver-registrar (container 0123456789ab, up 1m 30s)"
        );
        let bare = ProcessInfo { pid: 7, command: None, container_id: None, running_secs: None };
        assert_eq!(served_by(&bare), "pid 7");
    }

    #[test]
    fn the_kubelets_types_read_as_a_sentence() {
        assert_eq!(crate::cause::kubelet_types(), "CSIPlugin, DevicePlugin and DRAPlugin");
    }
}
