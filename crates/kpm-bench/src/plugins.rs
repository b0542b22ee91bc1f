//! The simulated plugins: `kpm-registrar` device plugins that also serve the
//! stub `v1beta1.DevicePlugin` service on their registration socket, each
//! with its registration latency timed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpm_api::constants::DEVICE_HEALTHY;
use kpm_registrar::stub::{StubCsiDriver, StubDevicePlugin};
use kpm_registrar::{CSI_PLUGIN, DEVICE_PLUGIN, Registrar};
use tokio::task::JoinHandle;

use crate::Result;

/// How long any one plugin waits for `NotifyRegistrationStatus`.
pub(crate) const NOTIFY_TIMEOUT: Duration = Duration::from_secs(60);

/// The type of the simulated plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// `DevicePlugin`, serving the stub `v1beta1.DevicePlugin` (one healthy
    /// device) on its registration socket: kpm holds a `ListAndWatch`
    /// stream to each, as the kubelet does. The benchmark's choice.
    Device,
    /// `CSIPlugin`, serving the stub CSI Identity and Node services: kpm
    /// calls `NodeGetInfo` once and keeps no connection. For comparison.
    Csi,
}

/// The plugin name of plugin `index`: an extended resource name for device
/// plugins, a driver name for CSI.
pub(crate) fn name(kind: Kind, index: usize) -> String {
    match kind {
        Kind::Device => format!("bench.kpm/dev-{index:04}"),
        Kind::Csi => format!("drv-{index:04}.csi.bench.kpm"),
    }
}

/// A plugin serving its registration socket, and its pending outcome.
#[derive(Debug)]
pub(crate) struct Plugin {
    pub(crate) registrar: Registrar,
    pub(crate) timing: Timing,
}

/// When a plugin started (just before its socket was bound) and the task
/// that waits for its registration status.
#[derive(Debug)]
pub(crate) struct Timing {
    pub(crate) started: Instant,
    /// The arrival of `NotifyRegistrationStatus(true)`, or why none came.
    pub(crate) notified: JoinHandle<Result<Instant, String>>,
}

impl Timing {
    /// The plugin's latency from bind to notification, or why it has none.
    pub(crate) async fn latency(self) -> Result<Duration, String> {
        match self.notified.await {
            Ok(Ok(at)) => Ok(at.duration_since(self.started)),
            Ok(Err(reason)) => Err(reason),
            Err(err) => Err(format!("waiter failed: {err}")),
        }
    }

    /// When the notification arrived, or why none did.
    pub(crate) async fn arrival(self) -> Result<Instant, String> {
        self.notified.await.map_err(|err| format!("waiter failed: {err}"))?
    }
}

/// Binds plugin `index`'s registration socket in `dir` and starts serving it
/// (with one healthy device, for a device plugin); the clock starts just
/// before the bind.
pub(crate) async fn start(dir: &Path, kind: Kind, index: usize) -> Result<Plugin> {
    let name = name(kind, index);
    let (plugin_type, routes) = match kind {
        Kind::Device => {
            let (stub, _devices) = StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY)]);
            (DEVICE_PLUGIN, stub.routes())
        }
        Kind::Csi => (CSI_PLUGIN, StubCsiDriver::new(name.clone(), "bench-node").routes()),
    };
    let builder = Registrar::builder(plugin_type, name).socket_dir(dir).routes(routes);
    let started = Instant::now();
    let registrar = builder.serve().await?;
    let mut status = registrar.status();
    let notified = tokio::spawn(async move {
        match tokio::time::timeout(NOTIFY_TIMEOUT, status.wait_for(Option::is_some)).await {
            Ok(Ok(latest)) => {
                let at = Instant::now();
                match latest.as_ref() {
                    Some(status) if status.plugin_registered => Ok(at),
                    Some(status) => Err(format!("rejected: {}", status.error)),
                    None => Err("no status".to_owned()),
                }
            }
            Ok(Err(_)) => Err("the registrar stopped".to_owned()),
            Err(_) => Err(format!("no status within {NOTIFY_TIMEOUT:?}")),
        }
    });
    Ok(Plugin { registrar, timing: Timing { started, notified } })
}

/// The directory under the registry where `burst` binds its sockets before
/// renaming them into the registry all at once. kpm ignores hidden names.
pub(crate) const STAGING_DIR: &str = ".bench-staging";

/// Starts `count` plugins in `dir` one after the other, as fast as they bind.
/// Returns them with the time it took to bind them all.
pub(crate) async fn start_many(
    dir: &Path,
    kind: Kind,
    count: usize,
) -> Result<(Vec<Plugin>, Duration)> {
    let begin = Instant::now();
    let mut plugins = Vec::with_capacity(count);
    for index in 0..count {
        plugins.push(start(dir, kind, index).await?);
    }
    Ok((plugins, begin.elapsed()))
}

/// Waits until every plugin was notified; returns the registrars, their
/// latencies, the last arrival and the failures (socket: reason).
pub(crate) async fn settle(plugins: Vec<Plugin>) -> Settled {
    let mut settled = Settled::default();
    for Plugin { registrar, timing } in plugins {
        let started = timing.started;
        match timing.arrival().await {
            Ok(at) => {
                settled.latencies.push(at.duration_since(started));
                settled.last = Some(settled.last.map_or(at, |last: Instant| last.max(at)));
            }
            Err(reason) => settled.failures.push(failure(registrar.socket_path(), &reason)),
        }
        settled.registrars.push(registrar);
    }
    settled
}

/// Plugins once they all have their outcome.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    pub(crate) registrars: Vec<Registrar>,
    pub(crate) latencies: Vec<Duration>,
    /// The latest notification.
    pub(crate) last: Option<Instant>,
    pub(crate) failures: Vec<String>,
}

/// `socket: reason`, for the failures listed in the JSON.
pub(crate) fn failure(socket: &Path, reason: &str) -> String {
    format!("{}: {reason}", socket.display())
}

/// The registry directory under kpm's root.
pub(crate) fn registry_dir(root: &Path) -> PathBuf {
    root.join(kpm_api::constants::PLUGINS_REGISTRY_DIR_NAME)
}
