//! The device manager: one current endpoint per resource, the devices its
//! `ListAndWatch` stream reports, the grace period after it goes, and the
//! calls node agents make on it.
//!
//! Every endpoint connection gets an id. Everything that happens to an
//! endpoint later (a `ListAndWatch` update, the end of its stream, a grace
//! timer) carries that id and is dropped if the resource's current endpoint
//! has another: a late event of a replaced endpoint never touches its
//! successor. A deregistration carries what the plugin manager knows, the
//! (resource, socket) pair, and only acts if the current endpoint is that
//! socket.
//!
//! One [`DeviceManager`] type, one job per file, so that each can be read
//! without the others:
//!
//! - this file: the type, the state under its lock, its construction (the
//!   one place the config is checked) and its end (`shutdown`, `Drop`);
//! - `registry`: the two registration paths and deregistration, which
//!   endpoint is a resource's current one, and the reads of the resources;
//! - `connection`: an endpoint's connection, from dial and
//!   `GetDevicePluginOptions` through its `ListAndWatch` stream to its end;
//! - `calls`: `Allocate`, `GetPreferredAllocation` and `PreStartContainer`
//!   on the current endpoint, within their timeouts;
//! - `removal`: the grace timer of a resource whose endpoint went away;
//! - `rpc`: the plugin client and the bounded unary call that `connection`
//!   and `calls` both use (they do not use each other).

mod calls;
mod connection;
mod registry;
mod removal;
mod rpc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use kpm_api::FileId;
use kpm_api::deviceplugin::v1beta1::DevicePluginOptions;
use kpm_cache::Hangups;
use kpm_transport::Reach;
use kpm_transport::UdsChannel;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

pub use connection::DevicePluginReport;
pub use registry::{DeviceStatus, ResourceStatus};

use crate::config::DeviceConfig;
use crate::error::{DeviceConfigError, DeviceError};
use removal::Removal;

/// The device-plugin handler and manager. Shared as `Arc<DeviceManager>` by
/// its owner: the plugin-watcher path calls it as a
/// [`PluginHandler`](kpm_cache::PluginHandler),
/// [`serve_registration`](Self::serve_registration) serves `kubelet.sock`,
/// [`shutdown`](Self::shutdown) closes the endpoints. Everyone else gets a
/// [`DeviceView`](crate::DeviceView) ([`view`](Self::view)): they read
/// [`resources`](Self::resources) and call [`allocate`](Self::allocate) and
/// friends, but cannot register or deregister. See the [crate docs](crate).
#[derive(Debug)]
pub struct DeviceManager {
    /// Handed to endpoint tasks and timers, which must not keep the manager alive.
    this: Weak<DeviceManager>,
    /// Valid: checked once by [`DeviceManager::try_new`].
    config: DeviceConfig,
    state: Mutex<State>,
    /// Source of endpoint ids and removal tokens.
    next_id: AtomicU64,
    changes: watch::Sender<u64>,
    /// Endpoint sockets whose stream ended while current (see [`DeviceManager::hangups`]).
    hangups: Hangups,
    /// What endpoint connections and `kubelet.sock`'s accepted ones pay from.
    pub(crate) reach: Reach,
}

#[derive(Debug, Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    /// Set by `shutdown`: no new endpoints, no removal timers.
    closed: bool,
}

#[derive(Debug, Default)]
struct Resource {
    /// `None` after the endpoint went away, until one registers again.
    current: Option<Endpoint>,
    devices: BTreeMap<String, DeviceStatus>,
    /// The pending removal, while in the grace period.
    removal: Option<Removal>,
}

/// A connected endpoint.
#[derive(Debug)]
struct Endpoint {
    id: u64,
    socket: PathBuf,
    /// The socket file we connected to, to tell a restarted plugin's new
    /// socket at the same path from this one.
    file: Option<FileId>,
    options: DevicePluginOptions,
    /// The connection every call and the `ListAndWatch` stream go over.
    channel: UdsChannel,
    /// The `ListAndWatch` task; aborting it closes the stream.
    stream: Option<JoinHandle<()>>,
}

// === DeviceManager ===

impl DeviceManager {
    /// A manager without endpoints, once `config` passes
    /// [`DeviceConfig::validate`]: the only check of the config, so no
    /// later operation fails on it. Its connections, dialled and accepted,
    /// take permits of the budget of `reach`; pass
    /// [`kpm_transport::fd::budget()`](kpm_transport::fd::budget)`.clone()`
    /// for the process-wide one, on the host itself. Endpoints are paths on
    /// the host `reach` sees.
    pub fn try_new(
        config: DeviceConfig,
        reach: impl Into<Reach>,
    ) -> Result<Arc<Self>, DeviceConfigError> {
        config.validate()?;
        let reach = reach.into();
        Ok(Arc::new_cyclic(|this| Self {
            this: this.clone(),
            config,
            state: Mutex::default(),
            next_id: AtomicU64::new(1),
            changes: watch::Sender::new(0),
            hangups: Hangups::default(),
            reach,
        }))
    }

    /// The manager's settings.
    pub fn config(&self) -> DeviceConfig {
        self.config
    }

    /// A counter that changes whenever [`resources`](Self::resources) may
    /// have: an endpoint connected or went away, devices were reported, a
    /// resource was removed. Wait on it instead of polling.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Closes every endpoint's stream and waits for the streams to end.
    /// Devices are marked unhealthy; resources are kept (no grace timers
    /// run any more); later registrations are refused. Safe to call twice.
    pub async fn shutdown(&self) {
        let tasks = {
            let mut state = self.state.lock();
            state.closed = true;
            let mut tasks = Vec::new();
            for (resource, entry) in &mut state.resources {
                if let Some(removal) = entry.removal.take() {
                    removal.timer.abort();
                    tasks.push(removal.timer);
                }
                if let Some(endpoint) = entry.current.take() {
                    info!(resource, socket = %endpoint.socket.display(), "closing device plugin endpoint");
                    entry.mark_unhealthy();
                    if let Some(stream) = endpoint.stream {
                        stream.abort();
                        tasks.push(stream);
                    }
                }
            }
            tasks
        };
        self.changed();
        for task in tasks {
            // Aborted: the result is a cancellation error.
            let _ = task.await;
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn changed(&self) {
        self.changes.send_modify(|counter| *counter = counter.wrapping_add(1));
    }
}

impl Drop for DeviceManager {
    fn drop(&mut self) {
        for entry in self.state.get_mut().resources.values_mut() {
            if let Some(stream) = entry.current.take().and_then(|endpoint| endpoint.stream) {
                stream.abort();
            }
            if let Some(removal) = entry.removal.take() {
                removal.timer.abort();
            }
        }
    }
}

// === Helpers ===

fn shut_down(resource: &str, socket: &Path) -> DeviceError {
    DeviceError::ShutDown { resource: resource.to_owned(), socket: socket.to_path_buf() }
}

#[cfg(test)]
mod tests;
