//! The status API's JSON documents: thin wrappers of the library's types,
//! which serialize themselves (the `kpm` crate's feature `serde`).

use std::time::SystemTime;

use kpm::csi::{CsiDriver, NodeInfo};
use kpm::device::ResourceStatus;
use kpm::dra::DraDriverStatus;
use kpm::kube::KubeStatus;
use kpm::{KubeletHandle, PluginEvent, PluginStatus};
use serde::Serialize;

/// The body of `GET /v1/plugins`.
#[derive(Debug, Serialize)]
pub(crate) struct PluginList {
    pub(crate) plugins: Vec<PluginStatus>,
    pub(crate) csi_drivers: Vec<CsiDriver>,
    pub(crate) node: NodeInfo,
    pub(crate) device_resources: Vec<ResourceStatus>,
    pub(crate) dra_drivers: Vec<DraDriverStatus>,
    /// What kpm published to the API server; `null` when it does not publish.
    pub(crate) kubernetes: Option<KubeStatus>,
}

impl From<&KubeletHandle> for PluginList {
    fn from(kubelet: &KubeletHandle) -> Self {
        Self {
            plugins: kubelet.manager().status(),
            csi_drivers: kubelet.csi_drivers().list(),
            node: kubelet.node_info().unwrap_or_default(),
            device_resources: kubelet.devices().resources(),
            dra_drivers: kubelet.dra().drivers(),
            kubernetes: kubelet.kubernetes(),
        }
    }
}

/// One line of `GET /v1/events`: `{"time", "event", …}`, the time it was
/// sent (RFC 3339, UTC) and the event as [`PluginEvent`] serializes, or
/// `subscribed` first, once the stream is live.
#[derive(Debug, Serialize)]
pub(crate) struct EventLine<'a> {
    #[serde(serialize_with = "kpm_api::json::rfc3339")]
    time: SystemTime,
    #[serde(flatten)]
    event: Event<'a>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Event<'a> {
    Subscribed { event: &'static str },
    Plugin(&'a PluginEvent),
}

impl<'a> EventLine<'a> {
    /// The line of `event`, sent now.
    pub(crate) fn new(event: &'a PluginEvent) -> Self {
        Self { time: SystemTime::now(), event: Event::Plugin(event) }
    }

    /// The first line: from now on nothing is missed.
    pub(crate) fn subscribed() -> Self {
        Self { time: SystemTime::now(), event: Event::Subscribed { event: "subscribed" } }
    }
}
