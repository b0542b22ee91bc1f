//! Generated gRPC code and constants of the kubelet plugin APIs.
//!
//! One module per API and version, generated from `proto/` by `cargo xtask
//! codegen` into `src/gen/`, one file per proto package, and checked in (so
//! building kpm needs no `protoc`; `cargo xtask ci` checks it is fresh):
//!
//! | module | proto package | served by |
//! |---|---|---|
//! | [`registration::v1`] | `pluginregistration` | every plugin, on its registration socket |
//! | [`csi::v1`] (feature `csi`) | `csi.v1` | CSI drivers |
//! | [`deviceplugin::v1beta1`] (feature `device`) | `v1beta1` | the node agent (`Registration`) and device plugins (`DevicePlugin`) |
//! | [`dra::v1`], [`dra::v1beta1`] (feature `dra`) | `k8s.io.kubelet.pkg.apis.dra.v1`, `…v1beta1` | DRA drivers |
//! | [`dra_health::v1`], [`dra_health::v1alpha1`] (feature `dra`) | `v1`, `v1alpha1` | DRA drivers (optional) |
//! | [`cri::v1`] (feature `cri`) | `runtime.v1` | the container runtime (containerd, CRI-O), read by `kpm doctor` |
//!
//! The generated code is transport-agnostic: clients take any tonic channel,
//! servers plug into any tonic router. `tests/wire.rs` pins every gRPC path
//! and the encoding of `PluginInfo` and `RegistrationStatus` to literal
//! bytes, so a renamed package or a renumbered field fails a test rather
//! than a node.
//!
//! Besides the wire code, the crate holds what every side of the protocol
//! shares: [`constants`] (plugin types, paths, versions and the bounds on
//! plugin input), [`PluginKind`] (the kubelet's plugin types and every name
//! they go by), [`gotext`] (Go's renderings of values in error texts),
//! [`is_extended_resource_name`] and [`is_nonzero_quantity`] (the names
//! device plugins advertise, and whether a Node's capacity of one counts),
//! [`is_label_key`] and [`is_label_value`] (what a CSI driver's topology
//! must be to become the Node's labels),
//! [`config`] (the bounds on configured durations), [`backoff`] (kpm's one
//! exponential backoff, validated where it is made), [`FileId`] (the
//! identity of a socket file, built from metadata the caller read),
//! [`endpoint_path`] (the socket path of an endpoint a plugin advertises) and, with
//! feature `serde`, `json` (how the status types write times in JSON).
//!
//! Nothing here does IO, and the crate depends on neither tokio, hyper nor
//! rustix: dialing, binding and the fd budget are the `kpm-transport`
//! crate's. Being the lowest crate is also why the shared facts live here:
//! every other kpm crate depends on it, so each names them from one place.

#![deny(missing_docs)]

pub mod backoff;
pub mod config;
pub mod constants;
mod endpoint;
mod file_id;
pub mod gotext;
#[cfg(feature = "serde")]
pub mod json;
mod kind;
mod resource_name;

pub use constants::{CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN};
pub use endpoint::endpoint_path;
pub use file_id::FileId;
pub use kind::{ApiObject, PluginKind};
pub use resource_name::{
    is_dns1123_subdomain, is_extended_resource_name, is_label_key, is_label_value,
    is_nonzero_quantity,
};

/// The plugin registration API (`pluginregistration.Registration`).
pub mod registration {
    /// Version v1. The proto package is `pluginregistration` in every version,
    /// so v1alpha1, v1beta1 and v1 plugins are all served by this code.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/pluginregistration.rs");
    }
}

/// The subset of the Container Storage Interface that kpm calls.
#[cfg(feature = "csi")]
pub mod csi {
    /// CSI v1 (`csi.v1`): `Identity` and the `Node` calls made at registration.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/csi.v1.rs");
    }
}

/// The device plugin API.
#[cfg(feature = "device")]
pub mod deviceplugin {
    /// Version v1beta1 (proto package `v1beta1`).
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1beta1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/v1beta1.rs");
    }
}

/// The Dynamic Resource Allocation kubelet plugin API.
#[cfg(feature = "dra")]
pub mod dra {
    /// Version v1 (`k8s.io.kubelet.pkg.apis.dra.v1`), advertised as `v1.DRAPlugin`.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/k8s.io.kubelet.pkg.apis.dra.v1.rs");
    }
    /// Version v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1`), advertised as
    /// `v1beta1.DRAPlugin`. Identical to v1 except that `Device` has no `share_id`.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1beta1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs");
    }
}

/// The optional DRA resource health API.
#[cfg(feature = "dra")]
pub mod dra_health {
    /// Version v1 (proto package `v1`), advertised as `v1.DRAResourceHealth`.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/v1.rs");
    }
    /// Version v1alpha1 (proto package `v1alpha1`), advertised as `v1alpha1.DRAResourceHealth`.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1alpha1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/v1alpha1.rs");
    }

    /// The two versions are one message in two proto packages: a
    /// `v1alpha1` report, field by field, as `v1`.
    impl From<v1alpha1::DeviceHealth> for v1::DeviceHealth {
        fn from(health: v1alpha1::DeviceHealth) -> Self {
            Self {
                device: health.device.map(|id| v1::DeviceIdentifier {
                    pool_name: id.pool_name,
                    device_name: id.device_name,
                }),
                health: health.health,
                last_updated_time: health.last_updated_time,
                health_check_timeout_seconds: health.health_check_timeout_seconds,
                message: health.message,
            }
        }
    }
}

/// The Container Runtime Interface, the part `kpm doctor` reads: which
/// containers run, how they ended, what they mount, where they log.
#[cfg(feature = "cri")]
pub mod cri {
    /// Version v1 (proto package `runtime.v1`), the `RuntimeService`.
    // Generated from proto/ by `cargo xtask codegen` (do not edit): its items
    // carry the proto comments where there are any.
    #[allow(missing_docs)]
    pub mod v1 {
        #![allow(missing_debug_implementations, unreachable_pub)]
        #![allow(clippy::all, clippy::pedantic)]
        include!("gen/runtime.v1.rs");
    }
}
