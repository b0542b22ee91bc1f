//! Stub plugin services: just enough of each plugin type's own gRPC service
//! for a node agent to accept the plugin. Used by the example plugin,
//! `kpm demo` and tests; serve them next to the registration service with
//! [`RegistrarBuilder::routes`](crate::RegistrarBuilder::routes) or on their
//! own socket.

mod csi;
mod device;
mod dra;
mod dra_health;

use kpm_api::PluginKind;
use kpm_api::constants::DEVICE_HEALTHY;
use tonic::service::Routes;

pub use self::csi::StubCsiDriver;
pub use self::device::{DeviceList, StubDevicePlugin};
pub use self::dra::StubDraDriver;
pub use self::dra_health::DraDeviceHealth;

/// The stub service of `plugin_type` for a plugin called `name`: a device
/// plugin with two healthy devices, a CSI driver (Identity and Node, node id
/// `example-node`), or a DRA driver (v1 and v1beta1). Empty routes for other types.
pub fn routes(plugin_type: &str, name: &str) -> Routes {
    match PluginKind::from_plugin_type(plugin_type) {
        Some(PluginKind::Device) => {
            let (plugin, _devices) =
                StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY), ("dev-1", DEVICE_HEALTHY)]);
            plugin.routes()
        }
        Some(PluginKind::Csi) => StubCsiDriver::new(name, "example-node").routes(),
        Some(PluginKind::Dra) => StubDraDriver::new().routes(),
        None => Routes::default(),
    }
}

/// A rule of the kubelet's conversation with a plugin that a stub can be
/// made to break, to see a node agent or a conformance check (`kpm check`)
/// catch it. Each is named on the command line as its kebab-case name
/// (`allocate-no-response`); [`Misbehaviour::ALL`] lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Misbehaviour {
    /// Device plugin: `ListAndWatch` holds its stream open and never sends
    /// a list.
    NoDeviceList,
    /// Device plugin: lists every device twice.
    DuplicateIds,
    /// Device plugin: on a change, sends only the devices that changed, not
    /// the whole list.
    PartialUpdates,
    /// Device plugin: ends the `ListAndWatch` stream after the first list.
    StreamEnds,
    /// Device plugin: `Allocate` answers with no container response.
    AllocateNoResponse,
    /// Device plugin: `Allocate` hands the container a device node that
    /// does not exist on the host.
    AllocateMissingDevice,
    /// Device plugin: `Allocate` accepts ids it never listed.
    AllocateUnknownIds,
    /// Device plugin: `GetPreferredAllocation` answers the first ids
    /// offered, ignoring `must_include_deviceIDs`.
    PreferredIgnoresMustInclude,
    /// Device plugin: asks for `PreStartContainer` and fails it.
    PreStartFails,
    /// CSI driver: a different node id on every `NodeGetInfo`.
    NodeIdChanges,
    /// CSI driver: `GetPluginInfo` names another driver than the one
    /// registered.
    PluginInfoNameDiffers,
    /// CSI driver: `NodeGetCapabilities` is not implemented.
    NoNodeCapabilities,
    /// DRA driver: `NodeUnprepareResources` answers an error for a claim
    /// it never prepared (a kubelet unprepares such claims after a restart).
    UnprepareUnknownFails,
    /// DRA driver: `NodePrepareResources` also answers a claim it was not
    /// sent.
    PrepareAnswersUnsentClaim,
    /// DRA driver with CDI specs: `NodePrepareResources` answers a CDI
    /// device id that no spec defines.
    CdiIdUnresolved,
    /// DRA driver with CDI specs: writes a spec the CDI package refuses
    /// (an env entry without `=`).
    CdiSpecInvalid,
    /// DRA driver with CDI specs: a second `NodePrepareResources` of a claim
    /// answers another device than the first.
    PrepareAnswersDifferently,
    /// DRA driver with CDI specs: `NodeUnprepareResources` leaves the
    /// claim's spec file.
    UnprepareLeavesSpec,
    /// DRA driver with CDI specs: prepares a claim allocated to another
    /// driver with devices.
    PreparesForeignClaim,
    /// DRA driver with CDI specs: one CDI device and spec file per device,
    /// not per claim, removed when any claim on the device is unprepared:
    /// claims sharing a device are not kept apart.
    SpecPerDevice,
    /// DRA driver with CDI specs and a checkpoint: answers a claim its
    /// checkpoint holds from there, without writing its CDI spec again
    /// (after a reboot emptied the CDI directory, the container fails to
    /// start: kubernetes#141433).
    ReprepareWithoutSpec,
    /// DRA driver: refuses to prepare a claim it unprepared (a late
    /// `NodePrepareResources`: kubernetes-sigs/dra-driver-nvidia-gpu#1162).
    LatePrepareFails,
    /// DRA driver with health: ends its `DRAResourceHealth` stream after
    /// the first message.
    HealthStreamEnds,
    /// DRA driver with health: leaves device `dev-0`, the one it prepares
    /// claims with, out of its health reports.
    HealthOmitsDevice,
    /// DRA driver with health: sends its devices' health on changes only,
    /// never renewed within the timeout it gives.
    HealthNotRenewed,
    /// DRA driver with health: keeps sending the health it had when the
    /// stream opened, whatever changes.
    HealthChangeNotSent,
    /// DRA driver with health: on a change, sends only the devices that
    /// changed, not the whole list.
    HealthPartialUpdates,
}

impl Misbehaviour {
    /// Every misbehaviour, with its name.
    pub const ALL: [(Self, &'static str); 27] = [
        (Self::NoDeviceList, "no-device-list"),
        (Self::DuplicateIds, "duplicate-ids"),
        (Self::PartialUpdates, "partial-updates"),
        (Self::StreamEnds, "stream-ends"),
        (Self::AllocateNoResponse, "allocate-no-response"),
        (Self::AllocateMissingDevice, "allocate-missing-device"),
        (Self::AllocateUnknownIds, "allocate-unknown-ids"),
        (Self::PreferredIgnoresMustInclude, "preferred-ignores-must-include"),
        (Self::PreStartFails, "pre-start-fails"),
        (Self::NodeIdChanges, "node-id-changes"),
        (Self::PluginInfoNameDiffers, "plugin-info-name-differs"),
        (Self::NoNodeCapabilities, "no-node-capabilities"),
        (Self::UnprepareUnknownFails, "unprepare-unknown-fails"),
        (Self::PrepareAnswersUnsentClaim, "prepare-answers-unsent-claim"),
        (Self::CdiIdUnresolved, "cdi-id-unresolved"),
        (Self::CdiSpecInvalid, "cdi-spec-invalid"),
        (Self::PrepareAnswersDifferently, "prepare-answers-differently"),
        (Self::UnprepareLeavesSpec, "unprepare-leaves-spec"),
        (Self::PreparesForeignClaim, "prepares-foreign-claim"),
        (Self::SpecPerDevice, "spec-per-device"),
        (Self::ReprepareWithoutSpec, "reprepare-without-spec"),
        (Self::LatePrepareFails, "late-prepare-fails"),
        (Self::HealthStreamEnds, "health-stream-ends"),
        (Self::HealthOmitsDevice, "health-omits-device"),
        (Self::HealthNotRenewed, "health-not-renewed"),
        (Self::HealthChangeNotSent, "health-change-not-sent"),
        (Self::HealthPartialUpdates, "health-partial-updates"),
    ];

    /// Its kebab-case name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(misbehaviour, _)| *misbehaviour == self)
            .map_or("", |(_, name)| name)
    }
}

impl std::fmt::Display for Misbehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`Misbehaviour`].
#[derive(Debug, thiserror::Error)]
#[error("unknown misbehaviour {0:?}; known: {known}", known = Misbehaviour::ALL.map(|(_, name)| name).join(", "))]
pub struct UnknownMisbehaviour(String);

impl std::str::FromStr for Misbehaviour {
    type Err = UnknownMisbehaviour;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(misbehaviour, _)| *misbehaviour)
            .ok_or_else(|| UnknownMisbehaviour(name.to_owned()))
    }
}

/// The misbehaviours a stub was given.
#[derive(Debug, Clone, Default)]
pub(crate) struct Misbehaviours(std::collections::HashSet<Misbehaviour>);

impl Misbehaviours {
    pub(crate) fn of(misbehaviours: impl IntoIterator<Item = Misbehaviour>) -> Self {
        Self(misbehaviours.into_iter().collect())
    }

    pub(crate) fn has(&self, misbehaviour: Misbehaviour) -> bool {
        self.0.contains(&misbehaviour)
    }
}
