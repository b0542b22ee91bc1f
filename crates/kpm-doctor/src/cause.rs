//! Why a plugin is not registered, as the doctor tells it: each cause its
//! verdict and its fix, written once. The doctor's inspection of a socket
//! names one (`judge.rs`), so do the words a plugin's container printed
//! before it exited and the kubelet's own log lines (`log_lines.rs`,
//! `kpm doctor explain`).

use kpm::PluginKind;
use kpm_report::Verdict;

/// A known cause of a plugin's failure to register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
#[non_exhaustive]
pub enum Cause {
    /// Nothing listens on the registration socket.
    NothingListens,
    /// The socket refuses the doctor's user.
    PermissionDenied,
    /// The socket accepts no connection in time.
    Hung,
    /// A plugin's own service socket (a CSI driver's) is in the registry.
    ServiceSocketInRegistry,
    /// `GetInfo` does not answer within the kubelet's 1 s.
    SlowGetInfo,
    /// `GetInfo` answers with an error.
    GetInfoFails,
    /// `GetInfo`'s answer breaks the kubelet's bounds.
    InvalidInfo,
    /// The plugin's type has no handler in this kubelet (a DRA driver with
    /// DRA disabled, a typo).
    NoHandlerForType,
    /// The handler of its type refuses it (versions, a name taken).
    HandlerRefused,
    /// The advertised endpoint is missing or refuses.
    EndpointMissing,
    /// The advertised endpoint is missing, as the registrar's own last run
    /// was told by the kubelet: its `--kubelet-registration-path` names no
    /// socket on the host.
    RegistrationPathWrong,
    /// The plugin's own service fails.
    ServiceFails,
    /// The kubelet has no CSI driver of this name registered on the node
    /// (a volume's mount or attach waits for it).
    CsiDriverNotRegistered,
    /// The kubelet has no DRA driver of this name registered (a pod's
    /// claims wait for it).
    DraDriverNotRegistered,
    /// The plugin's registration socket is in a registry no kubelet watches
    /// (a DaemonSet for another kubelet root).
    RegistryNotWatched,
    /// node-driver-registrar cannot reach its CSI driver's socket
    /// (`--csi-address`), so it never creates its registration socket.
    DriverSocketUnreachable,
    /// A socket's path is longer than a Unix socket address holds
    /// (`sun_path`, 107 bytes): binding it fails.
    SocketPathTooLong,
    /// The registrar's registration socket was removed while it runs (a
    /// preStop hook, a cleanup): the kubelet deregistered the driver.
    RegistrationSocketRemoved,
    /// A device plugin's `ListAndWatch` stream ended: the kubelet marks its
    /// devices unhealthy until it registers again.
    ListAndWatchEnded,
    /// The device manager admitted a pod before the device plugin of its
    /// resource registered again (after a kubelet restart or a reboot), or
    /// while it holds too few healthy devices of it: the pod is rejected.
    AdmittedBeforeRegisteredAgain,
    /// The kubelet's device-plugin socket (`device-plugins/kubelet.sock`)
    /// does not answer: the kubelet is down or restarting, and every device
    /// plugin must register again with the next one.
    KubeletSocketDown,
    /// The `kubelet.sock` a device plugin called `Register` on answers gRPC
    /// without the device manager's `Registration` service.
    NotTheDeviceManager,
    /// A socket's path is taken: another process serves it, or a file no
    /// one removed is there, so binding it fails.
    SocketInUse,
    /// The directory a socket is bound in does not exist where the plugin
    /// looks for it (a volume not mounted, or mounted elsewhere).
    SocketDirMissing,
    /// A DRA driver waited for the kubelet to register it, gave up and
    /// exited.
    RegistrationWaitExpired,
    /// A DRA driver refuses to prepare a claim because its own record holds
    /// a requested device for another claim.
    DevicePreparedForOtherClaim,
}

impl Cause {
    /// Every cause.
    pub fn all() -> impl Iterator<Item = Self> {
        <Self as strum::IntoEnumIterator>::iter()
    }

    /// Its name: `registration-path-wrong`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The verdict the doctor gives a socket failing for it.
    pub const fn verdict(self) -> Verdict {
        match self {
            Self::NothingListens => Verdict::Stale,
            Self::PermissionDenied | Self::Hung => Verdict::Unreachable,
            Self::ServiceSocketInRegistry | Self::NotTheDeviceManager => {
                Verdict::NotARegistrationServer
            }
            Self::SlowGetInfo => Verdict::SlowGetInfo,
            Self::GetInfoFails => Verdict::GetInfoFailed,
            Self::InvalidInfo | Self::NoHandlerForType | Self::HandlerRefused => Verdict::Rejected,
            Self::EndpointMissing | Self::RegistrationPathWrong => Verdict::EndpointUnreachable,
            Self::ServiceFails | Self::DevicePreparedForOtherClaim => Verdict::ServiceFailing,
            Self::CsiDriverNotRegistered | Self::DraDriverNotRegistered => Verdict::NotRegistered,
            Self::RegistryNotWatched => Verdict::UnwatchedRegistry,
            Self::DriverSocketUnreachable
            | Self::SocketPathTooLong
            | Self::SocketInUse
            | Self::SocketDirMissing
            | Self::RegistrationWaitExpired => Verdict::PodWithoutSocket,
            Self::RegistrationSocketRemoved => Verdict::DeletedButListening,
            Self::ListAndWatchEnded => Verdict::KubeletMismatch,
            Self::AdmittedBeforeRegisteredAgain | Self::KubeletSocketDown => {
                Verdict::NotRegisteredAgain
            }
        }
    }

    /// What fixes it.
    #[allow(clippy::too_many_lines, reason = "one table: each cause's fix, written once")]
    pub fn fix(self) -> String {
        match self {
            Self::NothingListens => "nothing listens on it: a leftover of a plugin that is gone \
                (a reboot, a registrar that crashed or was killed, a driver uninstalled). Remove it \
                if its plugin is not running: until then the kubelet keeps the plugin registered if \
                it registered it before it went, or else retries the socket with backoff up to \
                2m2s, logging an error each time"
                .into(),
            Self::PermissionDenied => {
                "permission denied: run kpm doctor as the user the kubelet runs as (root)".into()
            }
            Self::Hung => "the plugin accepts no connection in time: it may be hung".into(),
            Self::ServiceSocketInRegistry => "a plugin's own service socket is in the registry, \
                which holds registration sockets only (node-driver-registrar's <driver>-reg.sock): \
                move the driver's socket out of plugins_registry (its --endpoint or csi-address \
                and the DaemonSet's mounts)"
                .into(),
            Self::SlowGetInfo => "the kubelet waits 1 s for GetInfo, then backs off: the \
                registrar is blocked or starved (CPU limits, a slow start)"
                .into(),
            Self::GetInfoFails => "see the registrar's logs".into(),
            Self::InvalidInfo => "the plugin's GetInfo answer breaks the kubelet's bounds".into(),
            Self::NoHandlerForType => format!(
                "the kubelet has handlers for {} only (DRAPlugin only with the \
                 DynamicResourceAllocation feature on, the default since 1.34): enable the \
                 feature or fix the plugin's type",
                kubelet_types()
            ),
            Self::HandlerRefused => {
                "the handler's reason says what it requires (a supported version, a free name)"
                    .into()
            }
            Self::EndpointMissing => "the endpoint the plugin advertises is missing or refuses: \
                the driver is not running, or its socket is at another path on the host than the \
                one advertised (node-driver-registrar's --kubelet-registration-path)"
                .into(),
            Self::RegistrationPathWrong => "the registrar advertises a driver socket that does not \
                exist on the host, the kubelet refuses it and the registrar exits (then \
                CrashLoopBackOff, its socket left behind): set node-driver-registrar's \
                --kubelet-registration-path to the driver socket's path on the host (with the \
                kubelet's root: /var/lib/kubelet/plugins/<driver>/csi.sock by default), or fix the \
                hostPath the driver's socket directory is mounted from"
                .into(),
            Self::ServiceFails => "the plugin's own service fails: see its logs".into(),
            Self::CsiDriverNotRegistered | Self::DraDriverNotRegistered => "the driver's plugin \
                is not registered with this node's kubelet: run kpm doctor on the node (or kpm \
                doctor --cluster) to see why; often its DaemonSet has no running pod there (a \
                taint it does not tolerate, a nodeSelector, a pod crash-looping) or its \
                registrar fails"
                .into(),
            Self::RegistryNotWatched => "the plugin's DaemonSet mounts another kubelet root than \
                the node's kubelet uses (k0s: /var/lib/k0s/kubelet, MicroK8s: \
                /var/snap/microk8s/common/var/lib/kubelet): mount the kubelet's root instead \
                (node-driver-registrar's --kubelet-registration-path too); kpm doctor names the \
                root the kubelet uses"
                .into(),
            Self::DriverSocketUnreachable => "node-driver-registrar asks the driver for its name \
                before it creates its registration socket, and the driver's socket \
                (--csi-address) does not answer: the driver container is not running or not \
                ready yet, or the two containers do not mount the same socket directory"
                .into(),
            Self::SocketPathTooLong => "a Unix socket's path holds at most 107 bytes: shorten \
                the driver or resource name, or the directory it is created in (the kubelet's \
                root, the plugin's socket directory)"
                .into(),
            Self::RegistrationSocketRemoved => "something removed the registration socket while \
                its registrar runs (a preStop hook, a cleanup job, another instance starting): \
                the kubelet deregistered the plugin; restart the registrar's container and stop \
                whatever removes the socket"
                .into(),
            Self::ListAndWatchEnded => "the device plugin's ListAndWatch stream ended (it exited, \
                restarted or lost the kubelet): the kubelet keeps its devices unhealthy, \
                allocatable 0, until the plugin calls Register on kubelet.sock again; a plugin \
                must register again when its stream ends or kubelet.sock is created anew"
                .into(),
            Self::AdmittedBeforeRegisteredAgain => "the kubelet admits the pods it finds (after \
                its restart, or the node's boot) before their device plugins register again, and \
                rejects for good, UnexpectedAdmissionError, a pod whose resource has no healthy \
                device yet; a bare pod stays failed, a controller's pod is replaced. Make the \
                plugin register again at once (it must watch for a new kubelet.sock), then \
                delete the failed pods; run kpm doctor on the node: a plugin registered before \
                and not since is not-registered-again. When the plugin is registered and holds \
                the devices, the device manager's count is off (pods with devices in init \
                containers, kubernetes#124345; a pod force-deleted, kubernetes#130145): \
                recreate the pod, or restart the kubelet to count again"
                .into(),
            Self::KubeletSocketDown => "the kubelet's device-plugin socket does not answer: the \
                kubelet is down or restarting (its new instance removes every other socket of \
                device-plugins/ and serves a new kubelet.sock), or the plugin mounts another \
                device-plugins/ than the kubelet's root. Each device plugin must call Register on \
                the new kubelet.sock, serving a socket of its own again: one that watches for the \
                new kubelet.sock does it alone, any other needs its pod restarted; kpm doctor on \
                the node names those registered before and not since"
                .into(),
            Self::NotTheDeviceManager => "the socket the plugin called Register on is served, \
                but not by the kubelet's device manager: another program listens at \
                device-plugins/kubelet.sock (a second kubelet, a distribution's agent, a \
                device-plugin framework's own server), or the plugin dials another socket than \
                kubelet.sock (its --kubelet-socket, a pre-1.11 kubelet's deviceplugin API). \
                Point the plugin at the kubelet's <kubelet root>/device-plugins/kubelet.sock, \
                mounted from the host"
                .into(),
            Self::SocketInUse => "the socket's path is taken: two instances of the plugin bind \
                it (two DaemonSets for one driver, a rolling update with maxSurge, the old pod \
                still running), or a socket left there is not removed before the bind (each \
                plugin must remove its own stale socket first; node-driver-registrar does from \
                v1.1). Run one instance per node, or give each its own socket name, and remove \
                the file if no process serves it (kpm doctor names it stale)"
                .into(),
            Self::SocketDirMissing => "the directory the plugin binds its socket in does not \
                exist in its container: the DaemonSet does not mount the kubelet's \
                plugins_registry/, plugins/ or device-plugins/ there (or mounts them at another \
                path than the plugin's flags name). Mount each from the host at the path the \
                plugin uses, with the kubelet's root"
                .into(),
            Self::RegistrationWaitExpired => "the driver waited for the kubelet to register it \
                (dranet waits 30 s) and exited: the kubelet did not call its registration socket \
                in time. A kubelet retries a socket path that failed before with a backoff of up \
                to 2m2s, longer than the driver waits, so a driver that exits and restarts meets \
                the backoff again; a registry the kubelet does not watch never gets a call. Run \
                kpm doctor on the node (it names a stale socket of the driver, or the registry \
                no kubelet watches), remove the stale socket, and let the driver wait longer \
                than the kubelet's backoff or not exit while it waits"
                .into(),
            Self::DevicePreparedForOtherClaim => "the DRA driver's own record (its checkpoint) \
                says a device this claim was allocated is prepared for another claim: a claim \
                deleted while the driver was down was never unprepared, or two pools publish one \
                device. Find the claim named in the error (kubectl get resourceclaims -A); when \
                it is gone, the driver's checkpoint on the node is stale: clear the claim from \
                it as its documentation says, or restart the driver's pod on a node with no \
                prepared claims"
                .into(),
        }
    }
}

/// `CSIPlugin, DevicePlugin and DRAPlugin`.
pub(crate) fn kubelet_types() -> String {
    let types = PluginKind::ALL.map(PluginKind::plugin_type);
    match types.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => types.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_fails_and_says_a_fix() {
        for cause in Cause::all() {
            assert!(cause.verdict().fails(), "{}", cause.name());
            assert!(!cause.fix().is_empty(), "{}", cause.name());
        }
        assert_eq!(Cause::RegistrationPathWrong.name(), "registration-path-wrong");
    }
}
