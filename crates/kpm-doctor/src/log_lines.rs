//! The log lines of plugin registration that operators arrive with, the
//! kubelet's and the plugins' (node-driver-registrar, device plugins, DRA
//! drivers), each tied to its [`Cause`]: `kpm doctor explain` reads one,
//! and the doctor reads a plugin container's last run with the same table.
//! Each line's wording was read in the programs' source (the kubelet 1.31
//! to 1.36, node-driver-registrar v2.5 to v2.17) and, where it could be
//! made to happen, in their output.
//!
//! A line is known by fragments that every version of its program prints
//! (the stable words, never a path or a name), in any case (node-driver-
//! registrar v2.10 wrote `error connecting`, v2.11 `Error connecting`),
//! whatever the log format around them (klog's text, its structured
//! `key="value"` form with escaped quotes, JSON). The first entry whose fragments are all in the
//! line is its entry, so a specific entry comes before a general one.

use std::fmt;

use crate::cause::Cause;

/// A log line the doctor knows.
#[derive(Debug)]
#[non_exhaustive]
pub struct KnownLine {
    /// Who prints it.
    pub printed_by: &'static str,
    /// What it is known by: all present in the line.
    pub fragments: &'static [&'static str],
    /// Why it is printed.
    pub cause: Cause,
    /// What it says, in plain words.
    pub means: &'static str,
}

const KUBELET: &str = "the kubelet";
const REGISTRAR: &str = "node-driver-registrar";
/// The kubelet's refusal, which a plugin is told and logs too.
const KUBELET_AND_PLUGIN: &str = "the kubelet, and the plugin it tells (NotifyRegistrationStatus)";

/// The lines, specific before general. The kubelet logs a failed
/// registration through its retry loop: `Operation for "SOCKET" failed. No
/// retries permitted until … Error: RegisterPlugin error -- …` (1.31 to
/// 1.36 alike); the fragments are in the error it carries.
pub static KNOWN_LINES: &[KnownLine] = &[
    KnownLine {
        printed_by: KUBELET,
        fragments: &[
            "failed to get plugin info using RPC GetInfo",
            "unknown service pluginregistration.Registration",
        ],
        cause: Cause::ServiceSocketInRegistry,
        means: "the kubelet called GetInfo on a socket of its registry and the server there does \
                not serve the registration service: a driver's own socket",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["failed to get plugin info using RPC GetInfo", "DeadlineExceeded"],
        cause: Cause::SlowGetInfo,
        means: "the registration socket accepted the connection and GetInfo did not answer \
                within the kubelet's 1 s",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["failed to get plugin info using RPC GetInfo", "connection refused"],
        cause: Cause::NothingListens,
        means: "nothing listens on a registration socket of the kubelet's registry",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["failed to get plugin info using RPC GetInfo"],
        cause: Cause::GetInfoFails,
        means: "a registration socket's GetInfo failed",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["RegisterPlugin error -- dial failed at socket"],
        cause: Cause::NothingListens,
        means: "the kubelet could not connect to a registration socket of its registry (it \
                tries for 10 s)",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        fragments: &["no handler registered for plugin type"],
        cause: Cause::NoHandlerForType,
        means: "the plugin told a type this kubelet has no handler for, and was refused",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        fragments: &["plugin validation failed with err"],
        cause: Cause::HandlerRefused,
        means: "the handler of the plugin's type refused what GetInfo told (a version it does \
                not support, a name already registered with a higher version)",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &[
            "Registration process failed with error",
            "plugin registration failed with err",
            "no such file or directory",
        ],
        cause: Cause::RegistrationPathWrong,
        means: "the kubelet refused the registration: the driver socket the registrar \
                advertises (its --kubelet-registration-path) does not exist on the host; the \
                registrar exits",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        fragments: &["plugin registration failed with err", "no such file or directory"],
        cause: Cause::EndpointMissing,
        means: "the handler dialed the endpoint the plugin advertised and no socket is there",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        fragments: &["plugin registration failed with err", "connection refused"],
        cause: Cause::EndpointMissing,
        means: "the handler dialed the endpoint the plugin advertised and nothing listens there",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Registration process failed with error"],
        cause: Cause::ServiceFails,
        means: "the kubelet refused the registration for the reason the line carries (often the \
                driver's NodeGetInfo, or the CSINode update); the registrar exits",
    },
    KnownLine {
        printed_by: KUBELET_AND_PLUGIN,
        fragments: &["plugin registration failed with err"],
        cause: Cause::ServiceFails,
        means: "the handler of the plugin's type failed to register it, for the reason the line \
                carries (for CSI, NodeGetInfo or the CSINode update)",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["Error calling CSI NodeGetInfo()", "no such file or directory"],
        cause: Cause::EndpointMissing,
        means: "the kubelet called NodeGetInfo on the endpoint a CSI driver advertised and no \
                socket is there",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["Error calling CSI NodeGetInfo()"],
        cause: Cause::ServiceFails,
        means: "the CSI driver's NodeGetInfo failed while the kubelet registered it",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["error updating CSINode object with CSI driver node info"],
        cause: Cause::ServiceFails,
        means: "the kubelet could not write the driver into the node's CSINode (the API server, \
                or the node's rights)",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["not found in the list of registered CSI drivers"],
        cause: Cause::CsiDriverNotRegistered,
        means: "a volume of a pod on this node needs a CSI driver the kubelet has not \
                registered",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["DRA driver", "is not registered"],
        cause: Cause::DraDriverNotRegistered,
        means: "a pod's resource claim on this node needs a DRA driver the kubelet has not \
                registered",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["Bad registration request from device plugin"],
        cause: Cause::HandlerRefused,
        means: "the device manager refused a device plugin's Register call (an API version it \
                does not support, an invalid resource name, an endpoint outside device-plugins/)",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["failed to dial device plugin"],
        cause: Cause::EndpointMissing,
        means: "the device manager could not connect to the socket a device plugin registered \
                (a plugin must serve it before it calls Register)",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Kubelet plugin registration hasn't succeeded yet"],
        cause: Cause::RegistryNotWatched,
        means: "the registrar's probe (v2.3 to v2.8) found no sign that the kubelet ever \
                registered it: the kubelet never called it",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Error connecting to CSI driver"],
        cause: Cause::DriverSocketUnreachable,
        means: "the registrar gave up connecting to the driver's socket (v2.9 and later wait \
                30 s) and exits before it creates its registration socket",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Still connecting"],
        cause: Cause::DriverSocketUnreachable,
        means: "the registrar is waiting for the driver's socket to answer",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Error retreiving CSI driver name"],
        cause: Cause::DriverSocketUnreachable,
        means: "the driver's socket did not answer GetPluginInfo, so the registrar cannot name \
                its registration socket",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["hostPath type check failed", "plugins_registry is not a directory"],
        cause: Cause::RegistryNotWatched,
        means: "a plugin's pod mounts a registry directory that does not exist on the node: its \
                DaemonSet was written for another kubelet root",
    },
    KnownLine {
        printed_by: REGISTRAR,
        fragments: &["Health check failed", "registration socket does not exist"],
        cause: Cause::RegistrationSocketRemoved,
        means: "the registrar's health check found its registration socket gone while it runs",
    },
    KnownLine {
        printed_by: KUBELET,
        fragments: &["ListAndWatch ended unexpectedly for device plugin"],
        cause: Cause::ListAndWatchEnded,
        means: "a device plugin's ListAndWatch stream to the kubelet ended",
    },
    KnownLine {
        printed_by: "a device plugin, told by the kubelet",
        fragments: &["the ResourceName", "is invalid"],
        cause: Cause::HandlerRefused,
        means: "the device manager refused the resource name a device plugin registered: it is \
                not an extended resource name (DOMAIN/NAME, each part a valid name)",
    },
    KnownLine {
        printed_by: "node-driver-registrar, a device plugin or a DRA driver",
        fragments: &["bind: invalid argument"],
        cause: Cause::SocketPathTooLong,
        means: "binding a Unix socket failed: its path is longer than 107 bytes",
    },
];

/// A line explained: its entry, and what the line names.
#[derive(Debug)]
#[non_exhaustive]
pub struct Explained {
    /// The entry the line is.
    pub known: &'static KnownLine,
    /// The registration socket it names (`at socket PATH`).
    pub socket: Option<String>,
    /// The endpoint it names (`dial unix PATH`).
    pub endpoint: Option<String>,
    /// The plugin type it names (`plugin type: TYPE`).
    pub plugin_type: Option<String>,
    /// The driver it names (`driver name NAME not found`, `DRA driver NAME
    /// is not registered`).
    pub driver: Option<String>,
}

/// What `line` is, if it is a known one.
pub fn explain(line: &str) -> Option<Explained> {
    let lower = line.to_lowercase();
    let known = KNOWN_LINES
        .iter()
        .find(|known| known.fragments.iter().all(|f| lower.contains(&f.to_lowercase())))?;
    Some(Explained {
        known,
        socket: value_after(line, "at socket "),
        endpoint: value_after(line, "dial unix "),
        plugin_type: value_after(line, "plugin type: "),
        driver: value_after(line, "driver name ").or_else(|| value_after(line, "DRA driver ")),
    })
}

/// The word after `marker` in `line`: up to a space, a comma, a colon or a
/// quote (escaped or not).
fn value_after(line: &str, marker: &str) -> Option<String> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let end = rest.find(|c: char| c.is_whitespace() || ",:\"'\\".contains(c)).unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_owned())
}

impl fmt::Display for Explained {
    /// The explanation as `kpm doctor explain` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = self.known.cause;
        writeln!(f, "printed by: {}", self.known.printed_by)?;
        writeln!(f, "verdict:    {} ({})", cause.verdict().name(), cause.name())?;
        writeln!(f, "means:      {}", self.known.means)?;
        for (what, value) in [
            ("socket", &self.socket),
            ("endpoint", &self.endpoint),
            ("type", &self.plugin_type),
            ("driver", &self.driver),
        ] {
            if let Some(value) = value {
                writeln!(f, "{what:<11} {value}")?;
            }
        }
        write!(f, "fix:        {}", cause.fix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as the kubelet v1.36 and node-driver-registrar v2.17 print
    /// them, in klog's structured text form.
    const LINES: &[(&str, Cause)] = &[
        (
            r#"E1128 10:00:00.000000    1234 reconciler.go:149] "OperationExecutor.RegisterPlugin failed" err="RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket /var/lib/kubelet/plugins_registry/csi.sock, err: rpc error: code = Unimplemented desc = unknown service pluginregistration.Registration" plugin={"SocketPath":"/var/lib/kubelet/plugins_registry/csi.sock"}"#,
            Cause::ServiceSocketInRegistry,
        ),
        (
            r#"E1128 10:00:00.000000    1234 reconciler.go:149] "OperationExecutor.RegisterPlugin failed" err="RegisterPlugin error -- no handler registered for plugin type: DRAPlugin at socket /var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock""#,
            Cause::NoHandlerForType,
        ),
        (
            r#"E1128 10:00:00.000000       1 main.go:104] "Registration process failed with error, restarting registration container" err="RegisterPlugin error -- plugin registration failed with err: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix /var/lib/kubelet/plugins/wrong/csi.sock: connect: no such file or directory\"""#,
            Cause::RegistrationPathWrong,
        ),
        (
            "E1128 10:00:00.000000    1234 csi_attacher.go:380] kubernetes.io/csi: attacher.MountDevice failed to create newCsiDriverClient: driver name hostpath.csi.k8s.io not found in the list of registered CSI drivers",
            Cause::CsiDriverNotRegistered,
        ),
        (
            r#"E1128 14:09:04.508225   14173 goroutinemap.go:150] Operation for "/var/lib/kubelet/plugins_registry/old-reg.sock" failed. No retries permitted until 2026-11-28 14:09:15.508225 +0000 UTC m=+12.1 (durationBeforeRetry 500ms). Error: RegisterPlugin error -- dial failed at socket /var/lib/kubelet/plugins_registry/old-reg.sock, err: failed to dial socket /var/lib/kubelet/plugins_registry/old-reg.sock, err: context deadline exceeded"#,
            Cause::NothingListens,
        ),
        (
            r#"E1128 10:00:00.000000    1234 pod_workers.go:1301] "Error syncing pod, skipping" err="failed to \"StartContainer\" ... prepare dynamic resources: DRA driver gpu.example.com is not registered""#,
            Cause::DraDriverNotRegistered,
        ),
    ];

    #[test]
    fn each_line_is_its_cause_with_what_it_names() {
        for (line, cause) in LINES {
            let explained = explain(line).unwrap_or_else(|| panic!("not known: {line}"));
            assert_eq!(explained.known.cause, *cause, "{line}");
        }
        let socket = explain(LINES[0].0).unwrap().socket;
        assert_eq!(socket.as_deref(), Some("/var/lib/kubelet/plugins_registry/csi.sock"));
        let endpoint = explain(LINES[2].0).unwrap().endpoint;
        assert_eq!(endpoint.as_deref(), Some("/var/lib/kubelet/plugins/wrong/csi.sock"));
        let kind = explain(LINES[1].0).unwrap().plugin_type;
        assert_eq!(kind.as_deref(), Some("DRAPlugin"));
        let driver = explain(LINES[3].0).unwrap().driver;
        assert_eq!(driver.as_deref(), Some("hostpath.csi.k8s.io"));
        let socket = explain(LINES[4].0).unwrap().socket;
        assert_eq!(socket.as_deref(), Some("/var/lib/kubelet/plugins_registry/old-reg.sock"));
        let driver = explain(LINES[5].0).unwrap().driver;
        assert_eq!(driver.as_deref(), Some("gpu.example.com"));
        assert!(explain("I1128 everything is fine").is_none());
    }

    #[test]
    fn every_cause_of_a_line_is_reachable_by_its_own_fragments() {
        // An entry shadowed by an earlier, more general one is never chosen.
        for (at, known) in KNOWN_LINES.iter().enumerate() {
            let line = known.fragments.join(" ");
            let chosen = explain(&line).unwrap();
            assert!(std::ptr::eq(chosen.known, known), "entry {at} is shadowed");
        }
    }
}
