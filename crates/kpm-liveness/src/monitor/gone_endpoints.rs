//! Gone endpoints: the endpoint a plugin reported (a CSI driver's socket,
//! say) is watched on the filesystem (see [`crate::endpoints`]). A plugin
//! whose endpoint socket is removed is deregistered and not registered again
//! until a socket is back there ([`DesiredState::hold`] and
//! [`DesiredState::release`]); one whose socket was replaced by another file
//! is registered anew.
//!
//! [`DesiredState::hold`]: kpm_cache::DesiredState::hold
//! [`DesiredState::release`]: kpm_cache::DesiredState::release

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kpm_api::FileId;
use kpm_cache::{Generation, PluginEvent};

use super::{Done, State};
use crate::endpoints::socket_at;
use crate::probe::accepts;

/// How long a socket file that appeared at an awaited endpoint may
/// refuse connections before the plugin is registered anyway (and told
/// why it fails): a server binds its file a moment before it listens.
const LISTEN_WINDOW: Duration = Duration::from_secs(5);

impl State<'_> {
    /// Stops awaiting the endpoint of `socket`: registered again, in
    /// whichever incarnation.
    pub(super) fn stop_awaiting_endpoint(&mut self, socket: &Path) {
        let emptied: Vec<PathBuf> = self
            .awaiting_endpoint
            .iter_mut()
            .filter_map(|(endpoint, sockets)| {
                (sockets.remove(socket).is_some() && sockets.is_empty()).then(|| endpoint.clone())
            })
            .collect();
        for endpoint in emptied {
            self.awaiting_endpoint.remove(&endpoint);
            self.disarm_if_unused(&endpoint);
        }
    }

    /// Watches `endpoint` on the filesystem (see [`EndpointWatch::arm`]).
    ///
    /// [`EndpointWatch::arm`]: crate::endpoints::EndpointWatch::arm
    pub(super) fn arm(&mut self, endpoint: &Path) {
        if let Err(error) = self.endpoints.arm(endpoint) {
            tracing::warn!(
                endpoint = %endpoint.display(), %error,
                "cannot watch a plugin's endpoint; its removal is left to the probes"
            );
        }
        self.count_endpoints();
    }

    /// Stops watching `endpoint` once no followed plugin uses it and none
    /// awaits it.
    pub(super) fn disarm_if_unused(&mut self, endpoint: &Path) {
        // Through the index of who is served where: a thousand plugins
        // leaving at once must not scan every followed one each.
        let watched =
            |socket: &PathBuf| self.followed.get(socket).is_some_and(|f| f.endpoint_watched);
        let mut served = self.served_at.get(endpoint).into_iter().flatten();
        if self.awaiting_endpoint.contains_key(endpoint) || served.any(watched) {
            return;
        }
        self.endpoints.disarm(endpoint);
        self.count_endpoints();
    }

    fn count_endpoints(&self) {
        let armed = self.endpoints.len();
        self.monitor.counters.watched_endpoints.store(armed, Ordering::Relaxed);
    }

    /// Something changed where `endpoint` is: a plugin whose endpoint
    /// socket is gone is deregistered and awaits one there again, one whose
    /// socket was replaced by another file is registered anew, awaiting ones
    /// are released when a socket is there.
    pub(super) fn look_at_endpoint(&mut self, endpoint: &Path) {
        // Moves the watch down to the endpoint's directory once it exists.
        self.arm(endpoint);
        let now = socket_at(endpoint);
        let served: Vec<(PathBuf, Generation, Option<FileId>)> = self
            .served_at
            .get(endpoint)
            .into_iter()
            .flatten()
            .filter_map(|socket| {
                let followed = self.followed.get(socket).filter(|f| f.endpoint_watched)?;
                Some((socket.clone(), followed.generation, followed.endpoint_file))
            })
            .collect();
        for (socket, generation, was) in served {
            match (was, now) {
                (Some(was), Some(now)) if was != now => {
                    self.monitor.counters.endpoints_gone.fetch_add(1, Ordering::Relaxed);
                    let reason = format!("its endpoint {} was replaced", endpoint.display());
                    self.renew(&socket, generation, 0, reason);
                }
                (_, None) => self.endpoint_gone(&socket, generation, endpoint),
                // Served again before it was followed: that file is its own.
                (None, Some(now)) => {
                    if let Some(followed) = self.followed.get_mut(&socket) {
                        followed.endpoint_file = Some(now);
                    }
                }
                (Some(_), Some(_)) => {}
            }
        }
        if now.is_some()
            && self.awaiting_endpoint.contains_key(endpoint)
            && self.reappeared.insert(endpoint.into())
        {
            let (endpoint, budget) = (endpoint.to_path_buf(), self.monitor.budget.clone());
            self.tasks.spawn(async move {
                let accepts = accepts(&endpoint, LISTEN_WINDOW, &budget).await;
                Done::EndpointBack { endpoint, accepts }
            });
        }
        self.disarm_if_unused(endpoint);
    }

    /// A socket is at `endpoint` again: the plugins awaiting it are
    /// registered.
    pub(super) fn endpoint_back(&mut self, endpoint: &Path, accepts: bool) {
        self.reappeared.remove(endpoint);
        // Gone again meanwhile: its removal was an event of its own.
        if socket_at(endpoint).is_none() {
            return;
        }
        let Some(awaiting) = self.awaiting_endpoint.remove(endpoint) else { return };
        for (socket, generation) in awaiting {
            if self.monitor.desired.release(&socket, generation).is_some() {
                tracing::info!(
                    socket = %socket.display(), endpoint = %endpoint.display(), accepts,
                    "the plugin's endpoint is back; registering it again"
                );
            }
        }
        self.disarm_if_unused(endpoint);
    }

    /// The plugin's endpoint socket is gone: deregistered, through the
    /// executor, and not registered again until the endpoint is back (a
    /// registration now could only fail, and node-driver-registrar exits
    /// when told so).
    fn endpoint_gone(&mut self, socket: &Path, generation: Generation, endpoint: &Path) {
        let info = self.monitor.actual.get(socket).filter(|info| info.generation == generation);
        let reason = format!("its endpoint {} was removed; waiting for it", endpoint.display());
        let awaiting =
            info.filter(|_| self.monitor.desired.hold(socket, generation, reason.clone()));
        if awaiting.is_some() {
            // Before `forget`, which stops watching an endpoint nobody needs.
            let sockets = self.awaiting_endpoint.entry(endpoint.to_path_buf()).or_default();
            sockets.insert(socket.to_path_buf(), generation);
        }
        self.forget(socket, Some(generation));
        let Some(info) = awaiting else { return };
        self.monitor.counters.endpoints_gone.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            socket = %socket.display(), plugin = %info.plugin.name, plugin_type = %info.plugin_type,
            endpoint = %endpoint.display(), "the plugin's endpoint was removed; deregistering it"
        );
        self.monitor.events.publish(PluginEvent::Unresponsive {
            socket: socket.to_path_buf(),
            generation,
            plugin_type: info.plugin_type,
            name: info.plugin.name,
            failures: 0,
            reason,
        });
    }
}
