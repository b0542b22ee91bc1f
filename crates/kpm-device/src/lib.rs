//! The handler for device plugins, with the kubelet's semantics
//! (`pkg/kubelet/cm/devicemanager`: handler, client, registration server and
//! the registration-relevant parts of the manager).
//!
//! # Registration paths
//!
//! Both end in the same connection of `(resource, socket)` (see *Endpoints
//! and devices*):
//!
//! - **Plugin watcher.** A registration socket of type `DevicePlugin`; the
//!   plugin manager calls [`DeviceManager`] as a [`kpm_cache::PluginHandler`].
//!   *validate*: one of the versions is exactly `v1beta1`, and the name is an
//!   extended resource name ([`is_extended_resource_name`]); the endpoint is
//!   not checked. *register*: connects to the endpoint, which is a socket
//!   path (the `GetInfo` endpoint or the registration socket itself).
//!   *deregister*: keyed by (resource, socket): only if that socket is the
//!   resource's current endpoint is its stream closed and the grace period
//!   started; a stale socket's deregistration is a no-op.
//! - **`kubelet.sock`.** [`DeviceManager::serve_registration`] serves
//!   `v1beta1.Registration/Register` on `<dir>/kubelet.sock`, created fresh
//!   (a stale file is removed; a socket a live process answers on is refused
//!   with [`DeviceError::KubeletSocketInUse`]). A request is checked in the
//!   kubelet's order (version `v1beta1`, extended resource name), then its
//!   endpoint must be a socket file name inside `dir` (not absolute, no `/`,
//!   not `.` or `..`); then `dir/<endpoint>` is connected. The `Register`
//!   call returns once the plugin is connected, as in the kubelet. Once
//!   `kubelet.sock` is bound, every other socket in `dir` is removed, as the
//!   kubelet's device manager does at start: the protocol's signal to
//!   plugins that watch their own socket to serve and register again. It is
//!   the one place kpm unlinks sockets it did not create.
//!
//! # Endpoints and devices
//!
//! Connecting dials the socket ([`DeviceConfig::dial_timeout`], 10 s), calls
//! `GetDevicePluginOptions` ([`DeviceConfig::call_timeout`]) and then follows
//! the plugin's `ListAndWatch` stream in a background task; `register`
//! returns before the first device list arrives. Each update **replaces** the
//! resource's devices: health `Healthy` counts as healthy, anything else as
//! unhealthy; capacity is every device, allocatable the healthy ones
//! ([`ResourceStatus`]).
//!
//! A resource has one current endpoint. A new registration for it (either
//! path) becomes the current endpoint at once: the previous endpoint's stream
//! is closed, a pending removal is cancelled, and the previous devices stay
//! until the new endpoint's first `ListAndWatch` update replaces them. When
//! the current endpoint's stream ends or breaks (the plugin exited, crashed
//! or closed it), or it is deregistered, all of the resource's devices become
//! `Unhealthy` at once and the resource is removed after
//! [`DeviceConfig::grace_period`] (5 min), unless a plugin registers for it
//! first. Everything that happens to an endpoint is keyed by its connection,
//! so the stream end of a replaced endpoint never touches its successor,
//! whichever order things happen in.
//!
//! A registration of the socket that already is the resource's current
//! endpoint, and still the same socket file, is accepted without a second
//! connection (kubernetes PR #139765). A plugin that restarted and re-created
//! its socket at the same path is a different file and is connected again.
//!
//! Node agents call [`DeviceManager::allocate`],
//! [`get_preferred_allocation`](DeviceManager::get_preferred_allocation)
//! (an error if the plugin's options say it is not available) and
//! [`pre_start_container`](DeviceManager::pre_start_container) (only called
//! if the plugin's options say `pre_start_required`), on the resource's
//! current endpoint's connection, within the configured timeouts.
//! [`DeviceManager::changes`] signals every change of
//! [`resources`](DeviceManager::resources).
//! [`DeviceManager::inspect_endpoint`] is the read-only look that `kpm
//! probe`, `kpm check` and `kpm doctor` take: the same dial and options as
//! connecting, then the first `ListAndWatch` list ([`DevicePluginReport`]),
//! nothing kept.
//!
//! # Owner and views
//!
//! Whoever creates the manager ([`DeviceManager::try_new`], which checks the
//! [`DeviceConfig`] once and takes the fd budget its connections pay from)
//! owns its lifecycle: it hands the manager to
//! the plugin manager as the `DevicePlugin` handler (registrations and
//! deregistrations go only through that path and `kubelet.sock`), serves
//! `kubelet.sock`, lends [`connection`](DeviceManager::connection)s to
//! liveness, follows [`hangups`](DeviceManager::hangups) and calls
//! [`shutdown`](DeviceManager::shutdown). Everyone else gets a
//! [`DeviceView`] ([`DeviceManager::view`]): the reads above and the three
//! calls, which use a registration without changing it, and nothing that
//! registers, deregisters, connects, serves or shuts down.
//!
//! # Differences from the kubelet
//!
//! - **One endpoint per resource.** Since #135437 the kubelet keeps every
//!   connected socket of a resource and promotes an arbitrary survivor when
//!   the primary goes. Here the newest registration replaces the previous
//!   endpoint and closes its stream. (With several endpoints, the kubelet's
//!   device set is whatever the latest update of any of them said, since
//!   each update replaces the set.)
//! - **Removal is a timer.** The kubelet removes a resource past its grace
//!   period only when `GetCapacity` next runs; here a tokio timer removes it
//!   when the grace period ends, and [`ResourceStatus::removal_at`] says when.
//! - **A repeated registration is not an error.** The kubelet rejects a
//!   second connect of a connected (resource, socket) with `device plugin
//!   already connected`, which made a plugin that restarted quickly on the
//!   same socket retry forever; here it is accepted without a new
//!   connection, and a re-created socket file is connected again.
//! - **Endpoints are confined** to the device-plugins directory (the fix
//!   #138382 was still open upstream).
//! - **No files of its own but `kubelet.sock`.** Like the kubelet, kpm
//!   removes the other sockets in the device-plugins directory at start
//!   (see above), but it writes no `DEPRECATION` file and no checkpoint, and
//!   leaves directories and other files alone: plugins register again when
//!   `kubelet.sock` is re-created.
//! - **No serve retry loop or health check.** The kubelet restarts a failed
//!   registration server every second and reports its health; a failure of
//!   the tonic server here is logged.
//! - **Deadlines.** `GetDevicePluginOptions` has a timeout (none upstream,
//!   kubernetes #127457); the options sent in a `Register` request are not
//!   used: those from `GetDevicePluginOptions` are, on both paths.
//!
//! The crate depends on `kpm-api`, `kpm-transport` and `kpm-cache` only.
//! `manager/tests.rs` drives the manager's state machine on paused time
//! without sockets; `tests/` runs fake plugins on real sockets.

#![deny(missing_docs)]

mod config;
mod error;
mod kubelet_socket;
mod manager;
mod validation;
mod view;

pub use config::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_DIAL_TIMEOUT, DEFAULT_GRACE_PERIOD, DEFAULT_PRE_START_TIMEOUT,
    DeviceConfig,
};
pub use error::{DeviceConfigError, DeviceError};
pub use kpm_api::is_extended_resource_name;
pub use kubelet_socket::KubeletSocket;
pub use manager::{DeviceManager, DevicePluginReport, DeviceStatus, ResourceStatus};
pub use validation::{validate_plugin, validate_register_request};
pub use view::DeviceView;

/// The device plugin API types a node agent passes to and gets from the
/// manager.
pub use kpm_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, ContainerPreferredAllocationResponse, DevicePluginOptions,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
