//! One look at the runtime's containers: every run it keeps, grouped by the
//! pod container it is a run of, and the status of those asked about.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpm_api::cri::v1 as cri;
use kpm_report::{ContainerState, PodContainer, Termination};

/// The kubelet's labels on every container it creates.
const POD_NAME: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const POD_UID: &str = "io.kubernetes.pod.uid";
const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// The pod a container belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// A host path mounted into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostMount {
    /// Where the container sees it.
    pub container_path: PathBuf,
    /// The path on the host.
    pub host_path: PathBuf,
    /// Mounted read-only.
    pub readonly: bool,
}

/// One run of a pod's container, as the runtime keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Run {
    /// The runtime's id of this run (64 hex digits for containerd and
    /// CRI-O), the one its processes' cgroups name.
    pub id: String,
    /// Its pod.
    pub pod: PodRef,
    /// The container's name in the pod's spec.
    pub container: String,
    /// Which run it is: 0 for the first, the restart count for the latest.
    pub attempt: u32,
    /// Its state.
    pub state: ContainerState,
    /// What `ContainerStatus` said, when it was asked
    /// ([`Runtime::load_status`](crate::Runtime::load_status)).
    pub status: Option<RunStatus>,
}

/// What the runtime's `ContainerStatus` says of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunStatus {
    /// When it ended, if it has.
    pub finished_at: Option<SystemTime>,
    /// Its exit code, once ended.
    pub exit_code: i32,
    /// Why it is in its state (`Error`, `Completed`, `OOMKilled`).
    pub reason: String,
    /// The host paths mounted into it.
    pub mounts: Vec<HostMount>,
    /// Its log file on the host, when the kubelet asked for one.
    pub log_path: Option<PathBuf>,
}

impl Run {
    /// The run from the runtime's list, if the kubelet made it (it has the
    /// kubelet's pod labels).
    pub(crate) fn listed(container: cri::Container) -> Option<Self> {
        let label = |key: &str| container.labels.get(key).filter(|v| !v.is_empty()).cloned();
        let metadata = container.metadata.clone().unwrap_or_default();
        let name = label(CONTAINER_NAME).unwrap_or(metadata.name);
        Some(Self {
            pod: PodRef {
                namespace: label(POD_NAMESPACE)?,
                name: label(POD_NAME)?,
                uid: label(POD_UID)?,
            },
            container: name,
            attempt: metadata.attempt,
            state: state(container.state()),
            id: container.id,
            status: None,
        })
    }

    /// The path inside this run's container where `host_path` is mounted,
    /// when one of its mounts covers it (the deepest).
    pub fn container_path_of(&self, host_path: &Path) -> Option<PathBuf> {
        let mounts = &self.status.as_ref()?.mounts;
        mounts
            .iter()
            .filter_map(|mount| {
                let below = host_path.strip_prefix(&mount.host_path).ok()?;
                Some((mount.host_path.components().count(), mount.container_path.join(below)))
            })
            .max_by_key(|(depth, _)| *depth)
            .map(|(_, path)| path)
    }

    /// How it ended, once it has and its status was asked.
    fn termination(&self) -> Option<Termination> {
        let status = self.status.as_ref()?;
        let finished = status.finished_at?;
        Some(Termination {
            reason: status.reason.clone(),
            exit_code: status.exit_code,
            finished_at: k8s_openapi::jiff::Timestamp::try_from(finished).ok().map(Time),
        })
    }
}

impl RunStatus {
    pub(crate) fn from_cri(status: &cri::ContainerStatus) -> Self {
        Self {
            finished_at: since_epoch(status.finished_at),
            exit_code: status.exit_code,
            reason: status.reason.clone(),
            mounts: status
                .mounts
                .iter()
                .filter(|mount| !mount.host_path.is_empty())
                .map(|mount| HostMount {
                    container_path: PathBuf::from(&mount.container_path),
                    host_path: PathBuf::from(&mount.host_path),
                    readonly: mount.readonly,
                })
                .collect(),
            log_path: (!status.log_path.is_empty()).then(|| PathBuf::from(&status.log_path)),
        }
    }
}

/// A CRI time (nanoseconds since the epoch, 0 for none).
fn since_epoch(nanos: i64) -> Option<SystemTime> {
    let nanos = u64::try_from(nanos).ok().filter(|&n| n > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))
}

fn state(state: cri::ContainerState) -> ContainerState {
    match state {
        cri::ContainerState::ContainerCreated => ContainerState::Waiting,
        cri::ContainerState::ContainerRunning => ContainerState::Running,
        cri::ContainerState::ContainerExited => ContainerState::Terminated,
        cri::ContainerState::ContainerUnknown => ContainerState::Unknown,
    }
}

/// Every run the runtime keeps of the kubelet's containers, at one look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Containers {
    /// By id.
    runs: BTreeMap<String, Run>,
    /// The ids of each pod container's runs, by pod uid and container, the
    /// latest first: grouped once, for the doctor asks per run.
    by_container: BTreeMap<(String, String), Vec<String>>,
}

impl Containers {
    /// The runs listed (those the kubelet did not make are left out).
    pub fn new(runs: impl IntoIterator<Item = Run>) -> Self {
        let runs: BTreeMap<String, Run> =
            runs.into_iter().map(|run| (run.id.clone(), run)).collect();
        let mut grouped: BTreeMap<(String, String), Vec<&Run>> = BTreeMap::new();
        for run in runs.values() {
            grouped.entry((run.pod.uid.clone(), run.container.clone())).or_default().push(run);
        }
        let by_container = grouped
            .into_iter()
            .map(|(key, mut group)| {
                group.sort_by(|a, b| b.attempt.cmp(&a.attempt).then_with(|| a.id.cmp(&b.id)));
                (key, group.into_iter().map(|run| run.id.clone()).collect())
            })
            .collect();
        Self { runs, by_container }
    }

    /// Every run, by id.
    pub fn runs(&self) -> impl Iterator<Item = &Run> {
        self.runs.values()
    }

    /// The run with this id.
    pub fn by_id(&self, id: &str) -> Option<&Run> {
        self.runs.get(id)
    }

    /// Every run of `run`'s pod container, the latest first.
    pub fn runs_of<'a>(&'a self, run: &'a Run) -> Vec<&'a Run> {
        let key = (run.pod.uid.clone(), run.container.clone());
        let ids = self.by_container.get(&key).map_or(&[][..], Vec::as_slice);
        ids.iter().filter_map(|id| self.runs.get(id)).collect()
    }

    /// The latest run of each pod container, in the order of their ids.
    pub fn latest(&self) -> impl Iterator<Item = &Run> {
        let mut latest: Vec<&String> =
            self.by_container.values().filter_map(|ids| ids.first()).collect();
        latest.sort();
        latest.into_iter().filter_map(|id| self.runs.get(id))
    }

    /// `run`'s pod container as a report names it: its restarts and state
    /// are its latest run's, its last termination the latest run's when
    /// that has ended, else the run before (when its status was asked).
    pub fn pod_container(&self, run: &Run) -> PodContainer {
        let runs = self.runs_of(run);
        let latest = runs.first().copied().unwrap_or(run);
        let last_termination = runs.iter().find_map(|run| run.termination());
        PodContainer {
            namespace: latest.pod.namespace.clone(),
            pod: latest.pod.name.clone(),
            uid: latest.pod.uid.clone(),
            container: latest.container.clone(),
            restarts: latest.attempt,
            state: latest.state,
            last_termination,
        }
    }

    /// Records a status the runtime gave for one of the runs.
    pub(crate) fn set_status(&mut self, id: &str, status: RunStatus) {
        if let Some(run) = self.runs.get_mut(id) {
            run.status = Some(status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn run(id: &str, container: &str, attempt: u32, state: ContainerState) -> Run {
        Run {
            id: id.into(),
            pod: PodRef {
                namespace: "kube-system".into(),
                name: "csi-node-x".into(),
                uid: "u1".into(),
            },
            container: container.into(),
            attempt,
            state,
            status: None,
        }
    }

    fn ended(exit_code: i32, mounts: &[(&str, &str)]) -> RunStatus {
        RunStatus {
            finished_at: since_epoch(1_700_000_000_000_000_000),
            exit_code,
            reason: "Error".into(),
            mounts: mounts
                .iter()
                .map(|(inside, host)| HostMount {
                    container_path: inside.into(),
                    host_path: host.into(),
                    readonly: false,
                })
                .collect(),
            log_path: None,
        }
    }

    #[test]
    fn a_restarted_container_is_named_by_its_latest_run_and_its_last_end() {
        let mut previous = run("b", "registrar", 6, ContainerState::Terminated);
        previous.status = Some(ended(1, &[]));
        let latest = run("c", "registrar", 7, ContainerState::Running);
        let driver = run("d", "driver", 0, ContainerState::Running);
        let containers = Containers::new([previous.clone(), latest, driver]);
        let named = containers.pod_container(&previous);
        assert_eq!((named.restarts, named.state), (7, ContainerState::Running));
        let ended = named.last_termination.unwrap();
        assert_eq!((ended.reason.as_str(), ended.exit_code), ("Error", 1));
        let latest: Vec<&str> = containers.latest().map(|run| run.id.as_str()).collect();
        assert_eq!(latest, ["c", "d"]);
    }

    #[test]
    fn a_host_path_is_found_inside_the_deepest_mount_that_covers_it() {
        let mut registrar = run("a", "registrar", 0, ContainerState::Running);
        registrar.status = Some(ended(
            0,
            &[("/host", "/"), ("/registration", "/var/lib/kubelet/plugins_registry")],
        ));
        let socket = Path::new("/var/lib/kubelet/plugins_registry/x-reg.sock");
        assert_eq!(
            registrar.container_path_of(socket),
            Some(PathBuf::from("/registration/x-reg.sock"))
        );
        assert_eq!(
            registrar.container_path_of(Path::new("/etc/x")),
            Some(PathBuf::from("/host/etc/x"))
        );
        let unasked = run("b", "registrar", 0, ContainerState::Running);
        assert_eq!(unasked.container_path_of(socket), None);
    }

    #[test]
    fn a_cri_time_of_zero_is_none() {
        assert_eq!(since_epoch(0), None);
        assert_eq!(since_epoch(-1), None);
        assert!(since_epoch(1).is_some());
    }
}
