//! The sockets beside `kubelet.sock` in `device-plugins/`: device plugins
//! that registered through `kubelet.sock` rather than the registry, judged
//! as the device manager would connect to them and named by the kubelet's
//! checkpoint.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::time::Duration;

use kpm::Kubelet;

use crate::checkpoint::{self, Resource};
use crate::host::{Host, Seen};
use kpm_report::Verdict;

use crate::found::Found;
use crate::judge::{Row, quietly};

/// The sockets of `root`'s `device-plugins/` but `kubelet.sock` and the
/// endpoints of registry plugins already `found`: device plugins that
/// registered through `kubelet.sock`, inspected as the device manager
/// would connect to them, named by the kubelet's checkpoint and added to
/// `found`; the checkpoint is returned (read once a pass: it also says what the kubelet kept
/// across its restart). Each inspection is bounded by `bound`.
pub(crate) async fn judge(
    referee: &Kubelet,
    host: &Host,
    root: &Seen,
    bound: Duration,
    found: &mut Found,
) -> Result<Option<checkpoint::Checkpoint>, String> {
    let dir = &root.join(kpm::api::DEVICE_PLUGINS_DIR_NAME);
    let checkpoint = checkpoint::read(dir);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return checkpoint,
        Err(err) => {
            found.unseen.push(format!("{}: cannot be listed: {err}", dir.on_host().display()));
            return checkpoint;
        }
    };
    // The endpoints advertised, paths on the host as the rows are.
    let endpoints: BTreeSet<&Path> = found
        .plugins
        .iter()
        .filter_map(|row| row.endpoint.as_deref())
        .map(kpm::api::endpoint_path)
        .collect();
    let sockets = entries.filter_map(Result::ok).filter(|entry| {
        entry.file_type().is_ok_and(|kind| std::os::unix::fs::FileTypeExt::is_socket(&kind))
            && entry.file_name() != kpm::api::KUBELET_SOCKET_NAME
            && !endpoints.contains(dir.on_host_of(&entry.path()).as_path())
    });
    let inspections = sockets.map(|entry| {
        let socket = dir.join(entry.file_name());
        let devices = referee.handle().devices().clone();
        let path = socket.on_host().to_path_buf();
        let inspection = quietly(async move {
            let name = entry.file_name().to_string_lossy().into_owned();
            devices.inspect_endpoint(&name, socket.on_host()).await
        });
        (path, inspection)
    });
    let mut rows = Vec::new();
    for (path, inspected) in crate::inspections::each(inspections, bound).await {
        let inspected = match inspected {
            Ok(inspected) => inspected,
            Err(lost) => {
                rows.push(lost.row(&path, "device-plugins"));
                continue;
            }
        };
        let row = match inspected {
            Ok(report) => {
                let mut row = Row::new(Verdict::Ok, &path, "device-plugins", report.to_string());
                row.served_by = report.server_pid.map(|pid| host.process(pid));
                row.service = Some(Box::new(report));
                row
            }
            Err(kpm::device::DeviceError::Dial { source, .. }) if source.is_gone() => Row::new(
                Verdict::Stale,
                &path,
                "device-plugins",
                inspect_reason(&source),
            )
            .hint(
                "nothing listens on it: a device plugin that is gone left it; it no longer counts",
            ),
            Err(err) => {
                Row::new(Verdict::ServiceFailing, &path, "device-plugins", inspect_reason(&err))
                    .hint("the device plugin's service fails: see its logs")
            }
        };
        let mut row = row;
        row.kind = Some(kpm::PluginKind::Device);
        rows.push(row);
    }
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    if rows.iter().any(|row| row.verdict == Verdict::Ok) {
        match &checkpoint {
            Ok(Some(checkpoint)) => {
                for row in &mut rows {
                    held_by_kubelet(row, &checkpoint.registered);
                }
            }
            Ok(None) => found.unseen.push(format!(
                "{}: missing (no kubelet's device manager wrote it); the resources of the \
                 device plugins there are not named",
                dir.on_host().join(checkpoint::FILE_NAME).display()
            )),
            Err(err) => found.unseen.push(err.clone()),
        }
    }
    found.plugins.extend(rows);
    checkpoint
}

/// The fix when the kubelet's device manager, or the Node it updates, holds
/// other devices than a device plugin lists.
pub(crate) const LAGGING_DEVICES: &str = "the kubelet's view lags the plugin's list: if it stays \
    so, the kubelet lost the plugin's ListAndWatch stream; restart the plugin";

/// Names the resource a live plugin on `kubelet.sock` serves, by its healthy
/// devices in the kubelet's checkpoint; says so when the kubelet holds none
/// of them, or others.
fn held_by_kubelet(row: &mut Row, registered: &checkpoint::RegisteredDevices) {
    let Some(report) = row.device_report() else { return };
    let (healthy, file) = (report.healthy, checkpoint::FILE_NAME);
    match registered.resource_of(&report.healthy_ids) {
        Resource::Same(resource) => row.name = Some(resource.to_owned()),
        Resource::Differs(resource, held) => {
            row.name = Some(resource.to_owned());
            row.verdict = Verdict::KubeletMismatch;
            row.reason = format!(
                "the plugin lists {healthy} healthy devices; the kubelet's device manager holds {} \
                 healthy of {resource} ({file})",
                held.len()
            );
            row.hint = LAGGING_DEVICES.into();
        }
        Resource::NotHeld => {
            row.verdict = Verdict::NotRegistered;
            row.reason = format!(
                "the plugin lists {healthy} healthy devices; the kubelet's device manager holds \
                 none of them ({file})"
            );
            row.hint = "the kubelet did not register it, or dropped it: see the kubelet's log \
                        (device manager); the plugin registers again when it restarts, or when \
                        kubelet.sock is created anew"
                .into();
        }
        Resource::Unknown => {}
    }
}

fn inspect_reason(err: &(dyn std::error::Error + 'static)) -> String {
    kpm::api::error_chain(err)
}
