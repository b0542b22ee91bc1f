//! The node's [`KubeletPluginReport`]: created by server-side apply with
//! its Node as owner, then its status applied to `/status` when it changes
//! and at each heartbeat.
//!
//! A cluster without the CRD (404) or a doctor not allowed to write reports
//! (403, an older `ClusterRole`) is no reason to stop publishing the
//! condition and Events: the report is then said once in the log and
//! tried again after [`MAX_RETRY`](super::MAX_RETRY), without holding up
//! the rest.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{Patch, PatchParams};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{MAX_RETRY, NodePublisher, PublishError};
use crate::condition::FIELD_MANAGER;
use kpm_report::{KubeletPluginReport, KubeletPluginReportStatus};

/// Where the node's report stands.
#[derive(Debug, Default)]
pub(super) struct ReportState {
    /// The status to publish, without a heartbeat.
    pub(super) wanted: Option<KubeletPluginReportStatus>,
    /// The status last written (or found at start), without its heartbeat.
    published: Option<(KubeletPluginReportStatus, Instant)>,
    /// The object exists, owned by this Node's uid.
    object_ready: bool,
    /// Reports are not served or not allowed: not tried before then.
    suspended_until: Option<Instant>,
}

impl ReportState {
    /// The status before the one about to be set: the one wanted, else the
    /// one published.
    pub(super) fn latest(&self) -> Option<&KubeletPluginReportStatus> {
        self.wanted.as_ref().or(self.published.as_ref().map(|(status, _)| status))
    }

    /// When a write of the report is due without a change: its heartbeat,
    /// or the end of a suspension.
    pub(super) fn next_due(&self, heartbeat: Duration) -> Option<Instant> {
        self.wanted.as_ref()?;
        if let Some(until) = self.suspended_until {
            return Some(until);
        }
        self.published.as_ref().map(|(_, written_at)| *written_at + heartbeat)
    }
}

impl NodePublisher {
    /// Reads the report an earlier run wrote: its entries keep their
    /// `since`, and it is not written again before its heartbeat is due.
    pub(super) async fn adopt_report(&mut self) -> Result<(), PublishError> {
        let node = self.node.clone();
        let read = self.within("read report", self.reports.get_opt(&node)).await?;
        let found = match read {
            Ok(found) => found,
            Err(source) if is_unserved(&source) => {
                self.suspend_report(&source);
                return Ok(());
            }
            Err(source) => return Err(PublishError::ReadReport { node, source }),
        };
        let Some(found) = found else { return Ok(()) };
        self.report.object_ready =
            found.metadata.owner_references.unwrap_or_default().iter().any(|owner| {
                owner.kind == "Node" && Some(&owner.uid) == self.regarding_uid.as_ref()
            });
        let Some(mut status) = found.status else { return Ok(()) };
        let heartbeat = status.heartbeat_time.take();
        let age = heartbeat
            .and_then(|Time(at)| Duration::try_from(Timestamp::now().duration_since(at)).ok())
            .unwrap_or_default()
            .min(self.config.heartbeat());
        let written_at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        if let Some(wanted) = &mut self.report.wanted {
            wanted.keep_since(&status);
        }
        self.report.published = Some((status, written_at));
        Ok(())
    }

    /// Writes the report when it changed or its heartbeat is due.
    pub(super) async fn write_report(&mut self) -> Result<(), PublishError> {
        let Some(wanted) = self.report.wanted.clone() else { return Ok(()) };
        let now = Instant::now();
        if self.report.suspended_until.is_some_and(|until| now < until) {
            return Ok(());
        }
        let due = self.report.published.as_ref().is_none_or(|(published, written_at)| {
            *published != wanted || now >= *written_at + self.config.heartbeat()
        });
        if !due {
            return Ok(());
        }
        if !self.report.object_ready {
            match self.apply_report_object().await? {
                Ok(()) => self.report.object_ready = true,
                Err(source) if is_unserved(&source) => {
                    self.suspend_report(&source);
                    return Ok(());
                }
                Err(source) => {
                    return Err(PublishError::WriteReport { node: self.node.clone(), source });
                }
            }
        }
        let mut status = wanted.clone();
        status.heartbeat_time = Some(Time(Timestamp::now()));
        let patch = serde_json::json!({
            "apiVersion": KubeletPluginReport::api_version(&()),
            "kind": KubeletPluginReport::kind(&()),
            "metadata": { "name": self.node },
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let node = self.node.clone();
        let written = self
            .within(
                "write report",
                self.reports.patch_status(&node, &params, &Patch::Apply(&patch)),
            )
            .await?;
        match written {
            Ok(_) => {}
            Err(source) => {
                // Deleted since it was made: made again at the next try.
                if matches!(&source, kube::Error::Api(status) if status.code == 404) {
                    self.report.object_ready = false;
                }
                if is_forbidden(&source) {
                    self.suspend_report(&source);
                    return Ok(());
                }
                return Err(PublishError::WriteReport { node, source });
            }
        }
        if self.report.suspended_until.take().is_some() {
            info!(node = %self.node, "writing the KubeletPluginReport again");
        }
        self.stats.report_writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.report.published = Some((wanted, Instant::now()));
        Ok(())
    }

    /// Creates the report, or makes this Node its owner, by server-side
    /// apply of its metadata and spec.
    async fn apply_report_object(&self) -> Result<Result<(), kube::Error>, PublishError> {
        let owner = self.regarding_uid.as_ref().map(|uid| {
            serde_json::json!([{ "apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid }])
        });
        let mut metadata = serde_json::json!({ "name": self.node });
        if let Some(owner) = owner {
            metadata["ownerReferences"] = owner;
        }
        let patch = serde_json::json!({
            "apiVersion": KubeletPluginReport::api_version(&()),
            "kind": KubeletPluginReport::kind(&()),
            "metadata": metadata,
            "spec": { "nodeName": self.node },
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = self
            .within("create report", self.reports.patch(&self.node, &params, &Patch::Apply(&patch)))
            .await?;
        Ok(applied.map(drop))
    }

    /// Stops trying the report until [`MAX_RETRY`] from now, said once.
    fn suspend_report(&mut self, err: &kube::Error) {
        if self.report.suspended_until.is_none() {
            warn!(
                node = %self.node,
                error = %kpm::api::error_chain(err),
                "cannot write the node's KubeletPluginReport: is its CRD installed, and may the \
                 doctor get, create and patch kubeletpluginreports (kubectl apply -k \
                 deploy/doctor)? The Node condition and Events are published without it"
            );
        }
        self.report.suspended_until = Some(Instant::now() + MAX_RETRY);
    }
}

/// The status of the report a doctor published of `node` before, with its
/// heartbeat: what [`Doctor::remember`](crate::Doctor::remember) takes.
/// `None` when there is none, or when reports are not served (no CRD) or
/// not allowed (403): then nothing was published to remember. The request
/// is bounded by `timeout`.
pub async fn last_report(
    client: kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<Option<KubeletPluginReportStatus>, PublishError> {
    let reports: kube::Api<KubeletPluginReport> = kube::Api::all(client);
    let read = tokio::time::timeout(timeout, reports.get_opt(node)).await.map_err(|_| {
        PublishError::Timeout { step: "read report", node: node.to_owned(), timeout }
    })?;
    match read {
        Ok(found) => Ok(found.and_then(|report| report.status)),
        Err(source) if is_unserved(&source) => Ok(None),
        Err(source) => Err(PublishError::ReadReport { node: node.to_owned(), source }),
    }
}

/// The API server does not serve reports (no CRD) or does not let the
/// doctor read or write them.
fn is_unserved(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404) || is_forbidden(err)
}

fn is_forbidden(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 403)
}
