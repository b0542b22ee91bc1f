//! The plugin side of the kubelet plugin registration protocol: what
//! node-driver-registrar (CSI) and the DRA kubelet-plugin helper do for a
//! driver, as a library for Rust drivers, examples and tests.
//!
//! A plugin announces itself to the node agent (the kubelet, or kpm) by
//! serving `pluginregistration.Registration` on a Unix socket in the agent's
//! registry directory (`/var/lib/kubelet/plugins_registry`). The agent calls
//! `GetInfo` to learn the plugin's type, name, endpoint and versions, hands it
//! to the handler of its type, and reports the outcome with
//! `NotifyRegistrationStatus`. Removing the socket deregisters the plugin.
//!
//! [`Registrar::builder`] configures such a socket and
//! [`serve`](RegistrarBuilder::serve) binds it and starts answering; the
//! returned [`Registrar`] exposes the statuses received and removes its socket
//! on [`shutdown`](Registrar::shutdown) or drop.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use kpm_registrar::{DRA_PLUGIN, Registrar, RegistrarError};
//!
//! # async fn register() -> Result<(), RegistrarError> {
//! // Serve the DRA service on its own socket first, then register it:
//! let registrar = Registrar::builder(DRA_PLUGIN, "gpu.example.com")
//!     .endpoint("/var/lib/kubelet/plugins/gpu.example.com/dra.sock")
//!     // One socket per instance, so that a rolling update registers the new
//!     // instance next to the old one: `gpu.example.com-<uid>-reg.sock`.
//!     .rolling_update_uid("0d1c9bb0-6f1c-4b3e-9f55-2f0c3c0a8e11")
//!     .serve()
//!     .await?;
//!
//! let status = registrar.wait_for_status(Duration::from_secs(60)).await?;
//! if !status.plugin_registered {
//!     eprintln!("the node agent rejected the driver: {}", status.error);
//! }
//!
//! // ... serve until asked to stop, then deregister by removing the socket:
//! registrar.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Socket names follow node-driver-registrar and the DRA helper:
//! `<name>-reg.sock`, or `<name>-<uid>-reg.sock` with a rolling-update uid;
//! characters a file name cannot hold are replaced (see [`socket_file_name`]).
//!
//! Invariants:
//! - a socket a live server answers on is never removed or replaced: binding
//!   there fails with [`RegistrarError::Bind`]; a stale socket file is replaced;
//! - on shutdown only the very file this registrar bound is removed (same
//!   device, inode and birth time), never a newer instance's socket at the
//!   same path;
//! - `NotifyRegistrationStatus` is answered at once, whoever is listening
//!   (upstream's test plugin blocked there, so every notification timed
//!   out);
//! - the crate depends on `kpm-api` and `kpm-transport` only: a driver takes
//!   the plugin's side of the protocol without the plugin manager.
//!
//! A device plugin may register through the kubelet's `kubelet.sock`
//! instead, as most do: [`serve_device_plugin`] serves it and keeps it
//! registered across the kubelet's restarts.
//!
//! Feature `stub` (off by default) adds the `stub` module: minimal services
//! of each plugin type, for `examples/example_plugin.rs` (the command-line
//! plugin the README uses), `kpm demo`, the load generator and tests; they
//! are well-behaved plugins, not test fakes.

#![deny(missing_docs)]

mod error;
mod kubelet_sock;
mod naming;
mod registrar;
#[cfg(feature = "stub")]
pub mod stub;

pub use error::RegistrarError;
pub use kpm_api::constants::{CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN, MAX_SOCKET_PATH_BYTES};
pub use kpm_api::registration::v1::{PluginInfo, RegistrationStatus};
pub use kubelet_sock::{register_device_plugin, serve_device_plugin};
pub use naming::{SOCKET_SUFFIX, socket_file_name};
pub use registrar::{Registrar, RegistrarBuilder, default_versions};
