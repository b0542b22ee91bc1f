//! The pod container behind a socket, in the words an operator's next
//! command needs: `kubectl -n NAMESPACE logs POD -c CONTAINER --previous`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A container of a pod on the node: the one serving a plugin's socket, or
/// the one that last served it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodContainer {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID, which tells this pod from a later one of its name.
    pub uid: String,
    /// The container's name in the pod's spec.
    pub container: String,
    /// How often the kubelet has restarted it (its run's attempt number).
    pub restarts: u32,
    /// Its state now.
    pub state: ContainerState,
    /// How its last run ended: this run, when it has ended, else the
    /// previous one, when the runtime still keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_termination: Option<Termination>,
}

/// A container's state, in the pod status's words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ContainerState {
    /// Created and not started yet.
    Waiting,
    /// Running.
    Running,
    /// Ended; with restarts, the kubelet starts it again after its back-off
    /// (`CrashLoopBackOff`).
    Terminated,
    /// The runtime does not know, or a newer doctor wrote a state this
    /// reader does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

/// How a container's run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Termination {
    /// Why, as the runtime says it: `Error`, `Completed`, `OOMKilled`.
    pub reason: String,
    /// The process's exit code.
    pub exit_code: i32,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

impl PodContainer {
    /// `NAMESPACE/POD`.
    pub fn pod_name(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }

    /// The command that shows what its last ended run printed: its current
    /// run's log once that ended, else, when it restarted and runs again,
    /// the run before's (`--previous`).
    pub fn logs_command(&self) -> String {
        let previous = if self.restarts > 0 && self.state != ContainerState::Terminated {
            " --previous"
        } else {
            ""
        };
        format!("kubectl -n {} logs {} -c {}{previous}", self.namespace, self.pod, self.container)
    }
}

impl std::fmt::Display for PodContainer {
    /// `pod kube-system/csi-node-x, container registrar (terminated, 7 restarts, last Error exit 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pod {}/{}, container {} ({}",
            self.namespace, self.pod, self.container, self.state
        )?;
        match self.restarts {
            0 => {}
            1 => write!(f, ", 1 restart")?,
            n => write!(f, ", {n} restarts")?,
        }
        if let Some(ended) = &self.last_termination {
            write!(f, ", last {} exit {}", ended.reason_or_default(), ended.exit_code)?;
        }
        write!(f, ")")
    }
}

impl Termination {
    /// Its reason, or `Error`/`Completed` by its exit code when the runtime
    /// gave none.
    pub fn reason_or_default(&self) -> &str {
        match (self.reason.as_str(), self.exit_code) {
            ("", 0) => "Completed",
            ("", _) => "Error",
            (reason, _) => reason,
        }
    }
}

impl std::fmt::Display for ContainerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::Terminated => "terminated",
            Self::Unknown => "unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registrar(state: ContainerState, restarts: u32, exit_code: i32) -> PodContainer {
        PodContainer {
            namespace: "kube-system".into(),
            pod: "csi-node-x".into(),
            uid: "u1".into(),
            container: "registrar".into(),
            restarts,
            state,
            last_termination: (restarts > 0 || state == ContainerState::Terminated)
                .then(|| Termination { reason: String::new(), exit_code, finished_at: None }),
        }
    }

    #[test]
    fn a_container_reads_as_an_operator_names_it() {
        let looping = registrar(ContainerState::Terminated, 7, 1);
        assert_eq!(
            looping.to_string(),
            "pod kube-system/csi-node-x, container registrar (terminated, 7 restarts, last Error exit 1)"
        );
        assert_eq!(looping.logs_command(), "kubectl -n kube-system logs csi-node-x -c registrar");
        let again = registrar(ContainerState::Running, 1, 2);
        assert_eq!(
            again.logs_command(),
            "kubectl -n kube-system logs csi-node-x -c registrar --previous"
        );
        let fresh = registrar(ContainerState::Running, 0, 0);
        assert_eq!(fresh.to_string(), "pod kube-system/csi-node-x, container registrar (running)");
    }

    #[test]
    fn a_state_a_newer_doctor_wrote_reads_as_unknown() {
        let state: ContainerState = serde_json::from_str("\"Paused\"").unwrap();
        assert_eq!(state, ContainerState::Unknown);
        let json = serde_json::to_value(registrar(ContainerState::Terminated, 2, 1)).unwrap();
        assert_eq!(json["state"], "Terminated");
        assert_eq!(json["lastTermination"]["exitCode"], 1);
    }
}
