//! The table of known lines: who prints each, what it is known by, its
//! cause and what it means, specific before general.

use super::{KnownBy, KnownLine, Subject};
use crate::cause::Cause;

const KUBELET: &str = "the kubelet";
const REGISTRAR: &str = "node-driver-registrar";
/// The kubelet's refusal, which a plugin is told and logs too.
const KUBELET_AND_PLUGIN: &str = "the kubelet, and the plugin it tells (NotifyRegistrationStatus)";
/// The kubelet's refusal to admit a pod, in its Event (`Warning
/// UnexpectedAdmissionError`) and its log: `Allocate failed due to …, which
/// is unexpected`.
const ADMISSION: &str = "the kubelet, rejecting a pod (Event UnexpectedAdmissionError)";
/// Whoever binds a socket of its own.
const BINDERS: &str = "node-driver-registrar, a device plugin or a DRA driver";
/// Any gRPC client or server.
const GRPC: &str = "any gRPC client or server: the kubelet, a registrar, a plugin";

/// The lines, specific before general. The kubelet logs a failed
/// registration through its retry loop: `Operation for "SOCKET" failed. No
/// retries permitted until … Error: RegisterPlugin error -- …` (1.31 to
/// 1.36 alike); the fragments are in the error it carries.
pub static KNOWN_LINES: &[KnownLine] = &[
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&[
            "failed to get plugin info using RPC GetInfo",
            "unknown service pluginregistration.Registration",
        ]),
        cause: Cause::ServiceSocketInRegistry,
        means: "the kubelet called GetInfo on a socket of its registry and the server there does \
                not serve the registration service: a driver's own socket",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&[
            "failed to get plugin info using RPC GetInfo",
            "DeadlineExceeded",
        ]),
        cause: Cause::SlowGetInfo,
        means: "the registration socket accepted the connection and GetInfo did not answer \
                within the kubelet's 1 s",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&[
            "failed to get plugin info using RPC GetInfo",
            "connection refused",
        ]),
        cause: Cause::NothingListens,
        means: "nothing listens on a registration socket of the kubelet's registry",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["failed to get plugin info using RPC GetInfo"]),
        cause: Cause::GetInfoFails,
        means: "a registration socket's GetInfo failed",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["RegisterPlugin error -- dial failed at socket"]),
        cause: Cause::NothingListens,
        means: "the kubelet could not connect to a registration socket of its registry (it \
                tries for 10 s)",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        known_by: KnownBy::Fragments(&["no handler registered for plugin type"]),
        cause: Cause::NoHandlerForType,
        means: "the plugin told a type this kubelet has no handler for, and was refused",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        known_by: KnownBy::Fragments(&["plugin validation failed with err"]),
        cause: Cause::HandlerRefused,
        means: "the handler of the plugin's type refused what GetInfo told (a version it does \
                not support, a name already registered with a higher version)",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&[
            "Registration process failed with error",
            "plugin registration failed with err",
            "no such file or directory",
        ]),
        cause: Cause::RegistrationPathWrong,
        means: "the kubelet refused the registration: the driver socket the registrar \
                advertises (its --kubelet-registration-path) does not exist on the host; the \
                registrar exits",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        known_by: KnownBy::Fragments(&[
            "plugin registration failed with err",
            "no such file or directory",
        ]),
        cause: Cause::EndpointMissing,
        means: "the handler dialed the endpoint the plugin advertised and no socket is there",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        known_by: KnownBy::Fragments(&[
            "plugin registration failed with err",
            "connection refused",
        ]),
        cause: Cause::EndpointMissing,
        means: "the handler dialed the endpoint the plugin advertised and nothing listens there",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&["Registration process failed with error"]),
        cause: Cause::ServiceFails,
        means: "the kubelet refused the registration for the reason the line carries (often the \
                driver's NodeGetInfo, or the CSINode update); the registrar exits",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        known_by: KnownBy::Fragments(&["plugin registration failed with err"]),
        cause: Cause::ServiceFails,
        means: "the handler of the plugin's type failed to register it, for the reason the line \
                carries (for CSI, NodeGetInfo or the CSINode update)",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&[
            "Error calling CSI NodeGetInfo()",
            "no such file or directory",
        ]),
        cause: Cause::EndpointMissing,
        means: "the kubelet called NodeGetInfo on the endpoint a CSI driver advertised and no \
                socket is there",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["Error calling CSI NodeGetInfo()"]),
        cause: Cause::ServiceFails,
        means: "the CSI driver's NodeGetInfo failed while the kubelet registered it",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["error updating CSINode object with CSI driver node info"]),
        cause: Cause::ServiceFails,
        means: "the kubelet could not write the driver into the node's CSINode (the API server, \
                or the node's rights)",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["not found in the list of registered CSI drivers"]),
        cause: Cause::CsiDriverNotRegistered,
        means: "a volume of a pod on this node needs a CSI driver the kubelet has not \
                registered",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["DRA driver", "is not registered"]),
        cause: Cause::DraDriverNotRegistered,
        means: "a pod's resource claim on this node needs a DRA driver the kubelet has not \
                registered",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["not found in the list of registered DRA plugins"]),
        cause: Cause::DraDriverNotRegistered,
        means: "a pod's resource claim on this node needs a DRA driver the kubelet has not \
                registered (the words of kubelets before 1.34; later ones say `DRA driver NAME \
                is not registered`)",
    },
    KnownLine {
        printed_by: "a DRA driver (NVIDIA's), and the kubelet it answers",
        known_by: KnownBy::Fragments(&["is already allocated to different claim"]),
        cause: Cause::DevicePreparedForOtherClaim,
        means: "the DRA driver refused to prepare a claim: its own record holds a device the \
                claim was allocated for another claim",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["NodePrepareResources failed for"]),
        cause: Cause::ServiceFails,
        means: "the DRA driver's NodePrepareResources returned an error for a pod's claim, the \
                one the line carries; the pod waits in ContainerCreating and the kubelet retries",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["Bad registration request from device plugin"]),
        cause: Cause::HandlerRefused,
        means: "the device manager refused a device plugin's Register call (an API version it \
                does not support, an invalid resource name, an endpoint outside device-plugins/)",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["failed to dial device plugin"]),
        cause: Cause::EndpointMissing,
        means: "the device manager could not connect to the socket a device plugin registered \
                (a plugin must serve it before it calls Register)",
    },
    KnownLine {
        printed_by: ADMISSION,
        known_by: KnownBy::Fragments(&[
            "no healthy devices present; cannot allocate unhealthy devices",
        ]),
        cause: Cause::AdmittedBeforeRegisteredAgain,
        means: "the device manager knows the resource (from its checkpoint, or a plugin that \
                registered) but holds no healthy device of it: after a kubelet restart or a \
                reboot, its plugin has not registered again yet, or its devices went unhealthy. \
                The line alone cannot tell whether the plugin will come back",
    },
    KnownLine {
        printed_by: ADMISSION,
        known_by: KnownBy::Fragments(&["cannot allocate unregistered device"]),
        cause: Cause::AdmittedBeforeRegisteredAgain,
        means: "no device plugin of the resource has registered with this kubelet since it \
                started (a reboot, a checkpoint lost): the pod came before its plugin",
    },
    KnownLine {
        printed_by: ADMISSION,
        known_by: KnownBy::Fragments(&["previously allocated devices are no longer healthy"]),
        cause: Cause::AdmittedBeforeRegisteredAgain,
        means: "the devices the pod held before the kubelet restarted are not healthy now: \
                their plugin has not registered again, or lists them unhealthy",
    },
    KnownLine {
        printed_by: ADMISSION,
        known_by: KnownBy::Fragments(&["requested number of devices unavailable for"]),
        cause: Cause::AdmittedBeforeRegisteredAgain,
        means: "the device manager holds fewer free healthy devices of the resource than the \
                pod asks for: its plugin has not registered all of them again since the \
                kubelet's restart or the node's boot, or the manager counts devices of pods \
                that no longer hold them. The line alone cannot tell which: kpm doctor on the \
                node shows whether the plugin is registered and its devices",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["device plugin GetPreferredAllocation rpc failed"]),
        cause: Cause::ServiceFails,
        means: "the device manager asked the plugin which devices to allocate and the call \
                failed (the plugin's reason follows): the pod is rejected",
    },
    KnownLine {
        printed_by: "a device plugin, told by the server on kubelet.sock",
        known_by: KnownBy::Fragments(&["unknown service v1beta1.Registration"]),
        cause: Cause::NotTheDeviceManager,
        means: "the device plugin called Register on its kubelet.sock and the server there does \
                not serve the device manager's Registration service",
    },
    KnownLine {
        printed_by: "a device plugin, told by the server on kubelet.sock",
        known_by: KnownBy::Fragments(&["unknown service deviceplugin.Registration"]),
        cause: Cause::NotTheDeviceManager,
        means: "the device plugin called Register of the pre-1.11 API (deviceplugin, v1alpha) \
                and the server on its kubelet.sock does not serve it: kubelets since 1.11 serve \
                v1beta1 only",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&["Kubelet plugin registration hasn't succeeded yet"]),
        cause: Cause::RegistryNotWatched,
        means: "the registrar's probe (v2.3 to v2.8) found no sign that the kubelet ever \
                registered it: the kubelet never called it",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&["Error connecting to CSI driver"]),
        cause: Cause::DriverSocketUnreachable,
        means: "the registrar gave up connecting to the driver's socket (v2.9 and later wait \
                30 s) and exits before it creates its registration socket",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&["Still connecting"]),
        cause: Cause::DriverSocketUnreachable,
        means: "the registrar is waiting for the driver's socket to answer",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&["Error retreiving CSI driver name"]),
        cause: Cause::DriverSocketUnreachable,
        means: "the driver's socket did not answer GetPluginInfo, so the registrar cannot name \
                its registration socket",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&[
            "hostPath type check failed",
            "plugins_registry is not a directory",
        ]),
        cause: Cause::RegistryNotWatched,
        means: "a plugin's pod mounts a registry directory that does not exist on the node: its \
                DaemonSet was written for another kubelet root",
    },
    KnownLine {
        printed_by: REGISTRAR,
        known_by: KnownBy::Fragments(&[
            "Health check failed",
            "registration socket does not exist",
        ]),
        cause: Cause::RegistrationSocketRemoved,
        means: "the registrar's health check found its registration socket gone while it runs",
    },
    KnownLine {
        printed_by: KUBELET,
        known_by: KnownBy::Fragments(&["ListAndWatch ended unexpectedly for device plugin"]),
        cause: Cause::ListAndWatchEnded,
        means: "a device plugin's ListAndWatch stream to the kubelet ended",
    },
    KnownLine {
        printed_by: "a device plugin, told by the kubelet",
        known_by: KnownBy::Fragments(&["the ResourceName", "is invalid"]),
        cause: Cause::HandlerRefused,
        means: "the device manager refused the resource name a device plugin registered: it is \
                not an extended resource name (DOMAIN/NAME, each part a valid name)",
    },
    KnownLine {
        printed_by: BINDERS,
        known_by: KnownBy::Fragments(&["bind: invalid argument"]),
        cause: Cause::SocketPathTooLong,
        means: "binding a Unix socket failed: its path is longer than 107 bytes",
    },
    KnownLine {
        printed_by: BINDERS,
        known_by: KnownBy::Fragments(&["bind: address already in use"]),
        cause: Cause::SocketInUse,
        means: "binding a Unix socket failed: a file is at its path, another instance's or one \
                left behind; the program exits without serving",
    },
    KnownLine {
        printed_by: BINDERS,
        known_by: KnownBy::Fragments(&["bind: no such file or directory"]),
        cause: Cause::SocketDirMissing,
        means: "binding a Unix socket failed: the directory it is in does not exist in the \
                container",
    },
    KnownLine {
        printed_by: "dranet (a DRA driver)",
        known_by: KnownBy::Fragments(&["driver failed to start", "context deadline exceeded"]),
        cause: Cause::RegistrationWaitExpired,
        means: "the driver served its sockets, waited 30 s for the kubelet to register it and \
                exited: the kubelet did not call it",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::KubeletSocket),
        cause: Cause::KubeletSocketDown,
        means: "a device plugin's connection to the kubelet's device-plugin socket failed or \
                ended: the kubelet is down or restarting, and the plugin must register again \
                once it is back",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::DevicePluginSocket),
        cause: Cause::EndpointMissing,
        means: "a connection to a device plugin's socket failed or ended: the plugin exited or \
                restarted, or its socket is left behind with nothing serving it",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::RegistrationSocket),
        cause: Cause::NothingListens,
        means: "a connection to a registration socket of the registry failed: nothing serves \
                it, a socket left behind by a plugin that is gone",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::DriverSocket),
        cause: Cause::EndpointMissing,
        means: "a connection to a driver's own socket (the endpoint it registered) failed or \
                ended: the driver exited or restarted, or the kubelet still dials the endpoint \
                of an instance that is gone",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::Resource),
        cause: Cause::ListAndWatchEnded,
        means: "the connection between the kubelet and the device plugin of the resource failed \
                or ended: the plugin or the kubelet went away, and the resource's devices stay \
                unhealthy until the plugin registers again",
    },
    KnownLine {
        printed_by: GRPC,
        known_by: KnownBy::GrpcWords(Subject::Driver),
        cause: Cause::EndpointMissing,
        means: "a connection to the named driver's service failed or ended: the driver is not \
                running, is restarting, or does not answer on the endpoint it registered",
    },
];
