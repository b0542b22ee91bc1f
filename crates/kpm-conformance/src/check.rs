//! The checks of the suite: each one thing the kubelet does with a plugin,
//! with the rule the plugin is held to and the kubelet source that holds
//! it there. One enum, so that the report, the docs' table
//! (`docs/plugin-authors.md`, compared by a test) and the unit tests
//! (`xtask tidy` wants one per check) cannot leave one out.

// The matches below read as tables of the checks.
#![allow(clippy::enum_glob_use)]

use std::fmt::{self, Write as _};

use kpm::PluginKind;
use kpm::dra::DraService;

/// One check of the suite. Those of a DRA driver's claims run once per
/// service the driver offers, and carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Check {
    /// The plugin registers within the bound.
    Registers,
    /// Each registration socket answers `GetInfo` within the kubelet's second.
    GetInfoWithin1s,
    /// The handler of its type takes it.
    TypeChecks,
    /// Every kubelet minor from 1.32 calls a DRA driver on a service it offers.
    KubeletMinors,
    /// Registration sockets are named as the conventions say.
    SocketNames,
    /// A device plugin's first list.
    ListAndWatch,
    /// A device plugin's `Allocate`.
    Allocate,
    /// `Allocate` of an id never listed.
    AllocateUnknownId,
    /// A device plugin's `GetPreferredAllocation`, when offered.
    GetPreferredAllocation,
    /// A device plugin's `PreStartContainer`, when required.
    PreStartContainer,
    /// A device's health change, provoked by the health-change hook.
    HealthChange,
    /// The `ListAndWatch` stream stays open.
    StreamStaysOpen,
    /// A CSI driver's node id, the same on every call.
    NodeIdStable,
    /// A CSI driver's topology, as the Node's labels.
    TopologyKeys,
    /// A CSI driver's `GetPluginInfo` name.
    GetPluginInfoName,
    /// A CSI driver's `NodeGetCapabilities`.
    NodeGetCapabilities,
    /// A DRA driver's ResourceSlices, read back from the API server.
    ResourceSlices,
    /// A claim allocated to the driver, prepared.
    NodePrepareResources(DraService),
    /// The same claim prepared again.
    PrepareAgain(DraService),
    /// The claim unprepared.
    NodeUnprepareResources(DraService),
    /// A claim never prepared, unprepared.
    UnprepareUnknownClaim(DraService),
    /// A claim of another driver sent along.
    ClaimOfAnotherDriver(DraService),
    /// Two claims sharing one device that allows multiple allocations.
    SharedDevice(DraService),
    /// The claim prepared again after its unprepare (a late call).
    PrepareAfterUnprepare(DraService),
    /// A DRA driver's `DRAResourceHealth` streams, when it serves them.
    ResourceHealth,
    /// The plugin registers again when the kubelet restarts.
    KubeletRestart,
    /// A device plugin's devices after the kubelet's restart.
    DevicesAfterKubeletRestart,
    /// A DRA driver's ResourceSlices, wiped as a restarting kubelet wipes them.
    SlicesAfterWipe,
    /// SIGTERM: the plugin goes, its sockets with it.
    Sigterm,
    /// The plugin started anew after SIGTERM.
    PluginRestart,
    /// A DRA driver's claim prepared again after a reboot.
    PrepareAfterReboot,
    /// A device plugin's second instance started beside the first, as a
    /// rolling update with `maxSurge` starts it, and the first stopped.
    RollingUpdate,
}

/// The DRA services a driver's claims are checked on, in the order they run.
pub(crate) const SERVICES: [DraService; 2] = [DraService::V1, DraService::V1beta1];

impl Check {
    /// Every check, in the order a run makes them; a DRA claim's once per service.
    pub fn all() -> Vec<Self> {
        use Check::*;
        let before = [Registers, GetInfoWithin1s, TypeChecks, KubeletMinors, SocketNames];
        let device = [
            ListAndWatch,
            Allocate,
            AllocateUnknownId,
            GetPreferredAllocation,
            PreStartContainer,
            HealthChange,
            StreamStaysOpen,
        ];
        let csi = [NodeIdStable, TopologyKeys, GetPluginInfoName, NodeGetCapabilities];
        let claims = SERVICES.into_iter().flat_map(Self::of_service);
        let after = [
            KubeletRestart,
            DevicesAfterKubeletRestart,
            SlicesAfterWipe,
            Sigterm,
            PluginRestart,
            PrepareAfterReboot,
            RollingUpdate,
        ];
        before
            .into_iter()
            .chain(device)
            .chain(csi)
            .chain([ResourceSlices])
            .chain(claims)
            .chain([ResourceHealth])
            .chain(after)
            .collect()
    }

    /// The claim checks of one DRA service, in the order they run.
    pub(crate) fn of_service(service: DraService) -> [Self; 7] {
        [
            Self::NodePrepareResources(service),
            Self::PrepareAgain(service),
            Self::NodeUnprepareResources(service),
            Self::UnprepareUnknownClaim(service),
            Self::ClaimOfAnotherDriver(service),
            Self::SharedDevice(service),
            Self::PrepareAfterUnprepare(service),
        ]
    }

    /// The name the report gives it (`GetInfo within 1 s`,
    /// `NodePrepareResources v1`).
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The type of plugin it is made on; `None` for every type.
    pub fn plugin_kind(&self) -> Option<PluginKind> {
        use Check::*;
        match self {
            Registers | GetInfoWithin1s | TypeChecks | SocketNames | KubeletRestart | Sigterm
            | PluginRestart => None,
            ListAndWatch
            | Allocate
            | AllocateUnknownId
            | GetPreferredAllocation
            | PreStartContainer
            | HealthChange
            | StreamStaysOpen
            | DevicesAfterKubeletRestart
            | RollingUpdate => Some(PluginKind::Device),
            NodeIdStable | TopologyKeys | GetPluginInfoName | NodeGetCapabilities => {
                Some(PluginKind::Csi)
            }
            KubeletMinors
            | ResourceSlices
            | NodePrepareResources(_)
            | PrepareAgain(_)
            | NodeUnprepareResources(_)
            | UnprepareUnknownClaim(_)
            | ClaimOfAnotherDriver(_)
            | SharedDevice(_)
            | PrepareAfterUnprepare(_)
            | ResourceHealth
            | SlicesAfterWipe
            | PrepareAfterReboot => Some(PluginKind::Dra),
        }
    }

    /// The rule the plugin is held to, in one line.
    pub fn rule(&self) -> &'static str {
        use Check::*;
        match self {
            Registers => {
                "the kubelet registers it within the bound, by its registration socket or kubelet.sock"
            }
            GetInfoWithin1s => "each registration socket answers GetInfo within the kubelet's 1 s",
            TypeChecks => "the handler of its type takes it (what kpm probe shows)",
            KubeletMinors => {
                "every kubelet minor from 1.32 calls a DRA driver on a service it offers"
            }
            SocketNames => {
                "registration sockets are named <name>-reg.sock, or <name>-<uid>-reg.sock per instance (a warning)"
            }
            ListAndWatch => {
                "the first list comes at once, each id once, each health Healthy or Unhealthy"
            }
            Allocate => {
                "one container response per request, naming only what a runtime can give a container"
            }
            AllocateUnknownId => "an id never listed is refused (a warning)",
            GetPreferredAllocation => {
                "when offered, it answers without error, within the ids, the must-includes and the size (those a warning)"
            }
            PreStartContainer => "when required, it answers without error",
            HealthChange => "a health change reaches the kubelet, in a message with the whole list",
            StreamStaysOpen => "the ListAndWatch stream stays open",
            NodeIdStable => {
                "NodeGetInfo gives the same non-empty node id on every call and across restarts"
            }
            TopologyKeys => "topology keys and values are label keys and values",
            GetPluginInfoName => "GetPluginInfo names the driver that registered",
            NodeGetCapabilities => "NodeGetCapabilities answers",
            ResourceSlices => "the driver publishes a ResourceSlice with a device for its node",
            NodePrepareResources(_) => {
                "a claim allocated as the scheduler allocates it prepares, its CDI ids resolving in valid CDI specs"
            }
            PrepareAgain(_) => "the same claim prepared again answers the same",
            NodeUnprepareResources(_) => "the claim unprepares, and its CDI devices go (a warning)",
            UnprepareUnknownClaim(_) => "a claim never prepared unprepares without error",
            ClaimOfAnotherDriver(_) => "a claim of another driver is left out (a warning)",
            SharedDevice(_) => {
                "two claims sharing a device (allowMultipleAllocations) each prepare, kept apart (distinct CDI ids, else a warning), and one unprepared leaves the other's CDI devices"
            }
            KubeletRestart => "it registers again when the kubelet restarts",
            DevicesAfterKubeletRestart => {
                "after the kubelet restarts, its devices are as healthy as before (NVIDIA/k8s-device-plugin#426)"
            }
            SlicesAfterWipe => {
                "its ResourceSlices, wiped as a restarting kubelet wipes them, come back (kubernetes-sigs/dra-example-driver#330)"
            }
            Sigterm => "on SIGTERM it exits, removes its sockets and is deregistered",
            PluginRestart => {
                "started anew, it registers again, its devices healthy and its node id the same"
            }
            PrepareAfterReboot => {
                "after a reboot (the driver restarted, the CDI directory emptied), a claim it had prepared prepares again with its CDI specs back (kubernetes#141433)"
            }
            PrepareAfterUnprepare(_) => {
                "a claim prepared again after its unprepare (a late call) prepares as at first (kubernetes-sigs/dra-driver-nvidia-gpu#1162)"
            }
            ResourceHealth => {
                "each DRAResourceHealth stream it advertises (v1alpha1, the one 1.36 kubelets open, and v1) opens, reports a prepared claim's devices, renews them within their timeout, stays open and sends a provoked change (warnings: the kubelet only shows health)"
            }
            RollingUpdate => {
                "a second instance started beside the first takes the resource over, which keeps its devices once the first stops; an endpoint both share is a warning (NVIDIA/k8s-device-plugin#1792)"
            }
        }
    }

    /// The kubelet source that holds the plugin to the rule, in
    /// kubernetes/kubernetes (or the library its plugins are built on).
    pub fn source(&self) -> &'static str {
        use Check::*;
        match self {
            Registers | KubeletRestart | Sigterm => {
                "pkg/kubelet/pluginmanager/reconciler/reconciler.go"
            }
            GetInfoWithin1s | TypeChecks => {
                "pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go"
            }
            KubeletMinors => "pkg/kubelet/cm/dra/plugin/registration.go",
            SocketNames => {
                "staging/src/k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go"
            }
            ListAndWatch | HealthChange | StreamStaysOpen => {
                "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go"
            }
            Allocate
            | AllocateUnknownId
            | GetPreferredAllocation
            | PreStartContainer
            | PluginRestart
            | DevicesAfterKubeletRestart => "pkg/kubelet/cm/devicemanager/manager.go",
            SlicesAfterWipe => "pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go",
            NodeIdStable | TopologyKeys => "pkg/volume/csi/nodeinfomanager/nodeinfomanager.go",
            GetPluginInfoName => "pkg/volume/csi/csi_plugin.go",
            NodeGetCapabilities => "pkg/volume/csi/csi_client.go",
            ResourceSlices => {
                "staging/src/k8s.io/dynamic-resource-allocation/resourceslice/resourceslicecontroller.go"
            }
            NodePrepareResources(_)
            | PrepareAgain(_)
            | NodeUnprepareResources(_)
            | UnprepareUnknownClaim(_)
            | ClaimOfAnotherDriver(_)
            | PrepareAfterUnprepare(_)
            | ResourceHealth
            | PrepareAfterReboot => "pkg/kubelet/cm/dra/manager.go",
            RollingUpdate => "pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go",
            SharedDevice(_) => {
                "staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go"
            }
        }
    }

    /// The docs' table of every check: `| check | plugins | rule | source |`,
    /// a DRA claim's once for both services.
    pub fn markdown_table() -> String {
        let mut table =
            String::from("| Check | Plugins | Rule | Kubelet source |\n|---|---|---|---|\n");
        for check in Self::all() {
            if matches!(check.service(), Some(DraService::V1beta1)) {
                continue;
            }
            let name = match check.service() {
                Some(_) => format!("{} v1, v1beta1", check.base_name()),
                None => check.name(),
            };
            let kind = check.plugin_kind().map_or("every", PluginKind::plugin_type);
            let _ = writeln!(
                table,
                "| {name} | {kind} | {} | `{}` |",
                check.rule().replace('|', "\\|"),
                check.source()
            );
        }
        table
    }

    /// The DRA service a claim check is made on.
    pub fn service(&self) -> Option<DraService> {
        use Check::*;
        match self {
            NodePrepareResources(service)
            | PrepareAgain(service)
            | NodeUnprepareResources(service)
            | UnprepareUnknownClaim(service)
            | ClaimOfAnotherDriver(service)
            | SharedDevice(service)
            | PrepareAfterUnprepare(service) => Some(*service),
            _ => None,
        }
    }

    /// The name without the service a claim check carries.
    fn base_name(self) -> &'static str {
        use Check::*;
        match self {
            Registers => "registers",
            GetInfoWithin1s => "GetInfo within 1 s",
            TypeChecks => "type checks",
            KubeletMinors => "kubelet minors",
            SocketNames => "socket names",
            ListAndWatch => "ListAndWatch",
            Allocate => "Allocate",
            AllocateUnknownId => "Allocate unknown id",
            GetPreferredAllocation => "GetPreferredAllocation",
            PreStartContainer => "PreStartContainer",
            HealthChange => "health change",
            StreamStaysOpen => "stream stays open",
            NodeIdStable => "node id stable",
            TopologyKeys => "topology keys",
            GetPluginInfoName => "GetPluginInfo name",
            NodeGetCapabilities => "NodeGetCapabilities",
            ResourceSlices => "ResourceSlices",
            NodePrepareResources(_) => "NodePrepareResources",
            PrepareAgain(_) => "prepare again",
            NodeUnprepareResources(_) => "NodeUnprepareResources",
            UnprepareUnknownClaim(_) => "unprepare unknown claim",
            ClaimOfAnotherDriver(_) => "claim of another driver",
            SharedDevice(_) => "shared device",
            PrepareAfterUnprepare(_) => "prepare after unprepare",
            ResourceHealth => "DRAResourceHealth",
            RollingUpdate => "rolling update",
            DevicesAfterKubeletRestart => "devices after kubelet restart",
            SlicesAfterWipe => "ResourceSlices after a wipe",
            PrepareAfterReboot => "prepare after reboot",
            KubeletRestart => "kubelet restart",
            Sigterm => "SIGTERM",
            PluginRestart => "plugin restart",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.base_name())?;
        match self.service() {
            Some(DraService::V1) => f.write_str(" v1"),
            Some(DraService::V1beta1) => f.write_str(" v1beta1"),
            None => Ok(()),
        }
    }
}

impl serde::Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_check_has_its_own_name() {
        let names: Vec<String> = Check::all().iter().map(Check::name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert!(names.contains(&"NodePrepareResources v1beta1".to_owned()));
    }

    /// The table of `docs/plugin-authors.md` between its markers is the
    /// enum's; `UPDATE_EXPECT=1` rewrites it.
    #[test]
    fn the_docs_table_is_the_enums() {
        const BEGIN: &str = "<!-- checks: generated from kpm_conformance::Check -->\n";
        const END: &str = "<!-- end of checks -->";
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugin-authors.md");
        let docs = std::fs::read_to_string(&path).unwrap();
        let start = docs.find(BEGIN).expect("the table's begin marker") + BEGIN.len();
        let end = start + docs[start..].find(END).expect("the table's end marker");
        let table = Check::markdown_table();
        if docs[start..end] == table {
            return;
        }
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, format!("{}{table}{}", &docs[..start], &docs[end..])).unwrap();
            return;
        }
        panic!(
            "the table of checks in {} is not Check's; run with UPDATE_EXPECT=1 to rewrite it:\n{table}",
            path.display()
        );
    }
}
