//! Which pod and container serve a node's plugin sockets, and how their
//! runs ended, read where the kubelet keeps them: the container runtime
//! (containerd, CRI-O) through the CRI, read-only, and the container logs
//! the kubelet has the runtime write under `/var/log/pods`.
//!
//! - [`Runtime`] asks the runtime on its socket (the kubelet's
//!   `containerRuntimeEndpoint`) for the containers it keeps, running and
//!   exited: [`Containers`], a snapshot of one look. It calls
//!   `ListContainers` once and `ContainerStatus` only for the containers a
//!   caller asks about ([`Runtime::load_status`]), each at most once: the
//!   doctor looks at every change of the node, and a node runs many
//!   containers that serve no plugin.
//! - [`Run`] is one run of a pod's container (the runtime keeps the
//!   current one and, for a restarted container, the one before); from
//!   the runs of one container, [`Containers::pod_container`] makes the
//!   report's [`PodContainer`](kpm_report::PodContainer): its pod, restarts,
//!   state and last termination.
//! - [`log_tail`] reads the last lines of a run's log (the CRI log format),
//!   bounded in bytes.
//!
//! It never creates, stops, removes or execs anything, and never asks for
//! the runtime's verbose status (the container's whole spec, with its
//! environment, which may hold secrets). Paths the runtime names are the
//! host's; the caller says where it reads the host (a `/host` prefix in a
//! pod).

#![deny(missing_docs)]

mod containers;
mod logs;
mod runtime;

pub use crate::containers::{Containers, HostMount, PodRef, Run, RunStatus};
pub use crate::logs::{LogLine, log_tail};
pub use crate::runtime::{DEFAULT_ENDPOINT, PodsError, Runtime};
