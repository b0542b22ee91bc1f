//! The log lines of plugin registration that operators arrive with, the
//! kubelet's and the plugins' (node-driver-registrar, device plugins, DRA
//! drivers), each tied to its [`Cause`]: `kpm doctor explain` reads one,
//! and the doctor reads a plugin container's last run with the same table.
//! Each line's wording was read in the programs' source (the kubelet 1.31
//! to 1.36, node-driver-registrar v2.5 to v2.17, the DRA drivers and device
//! plugins each entry names) and, where it could be made to happen, in
//! their output.
//!
//! A line is known by fragments that every version of its program prints
//! (the stable words, never a path or a name), in any case (node-driver-
//! registrar v2.10 wrote `error connecting`, v2.11 `Error connecting`),
//! whatever the log format around them (klog's text, its structured
//! `key="value"` form with escaped quotes, JSON, an Event as `kubectl
//! describe` shows it). The first entry whose fragments are all in the line
//! is its entry, so a specific entry comes before a general one.
//!
//! gRPC's words for a failed connection ([`GRPC_WORDS`]) are not a line's
//! own: every gRPC caller prints them about any peer. A line with them is
//! known only by the [`Subject`] it names besides (a socket path in one of
//! the kubelet's directories, a device resource, a driver), and only when
//! no entry knows it by fragments; one that names none is [`Unplaced`],
//! never guessed at.

use std::fmt;

use crate::cause::Cause;

mod known;

pub use known::KNOWN_LINES;

/// A log line the doctor knows.
#[derive(Debug)]
#[non_exhaustive]
pub struct KnownLine {
    /// Who prints it.
    pub printed_by: &'static str,
    /// What it is known by.
    pub known_by: KnownBy,
    /// Why it is printed.
    pub cause: Cause,
    /// What it says, in plain words.
    pub means: &'static str,
}

/// What a [`KnownLine`] is known by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KnownBy {
    /// Fragments its program prints, all present in the line.
    Fragments(&'static [&'static str]),
    /// Any of gRPC's words for a connection that failed or ended
    /// ([`GRPC_WORDS`]) in a line that names this subject. Those words
    /// alone say nothing of whose connection it was: every gRPC client
    /// prints them about any server.
    GrpcWords(Subject),
}

/// gRPC's words for a connection that failed or ended, as grpc-go (every
/// kubelet, registrar and most plugins) prints them whatever the peer.
pub const GRPC_WORDS: &[&str] = &[
    "transport is closing",
    "connection refused",
    "context deadline exceeded",
    "error reading from server: EOF",
    "Error while dialing",
    "code = Unavailable",
];

/// What a line with [`GRPC_WORDS`] may name that says whose connection
/// failed; the first a line names, in this order, is its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::EnumIter)]
#[non_exhaustive]
pub enum Subject {
    /// The kubelet's device-plugin socket, `device-plugins/kubelet.sock`.
    KubeletSocket,
    /// A device plugin's own socket in `device-plugins/`.
    DevicePluginSocket,
    /// A registration socket in `plugins_registry/`.
    RegistrationSocket,
    /// A driver's service socket under `plugins/` (a CSI or DRA driver's
    /// endpoint).
    DriverSocket,
    /// A device plugin's resource (`resource="vendor.com/gpu"`).
    Resource,
    /// A driver by name (`driver="gpu.example.com"`).
    Driver,
}

impl Subject {
    /// Every subject, in the order a line's is chosen.
    pub fn all() -> impl Iterator<Item = Self> {
        <Self as strum::IntoEnumIterator>::iter()
    }

    /// What a line must name to have it, in words.
    pub const fn named_as(self) -> &'static str {
        match self {
            Self::KubeletSocket => {
                "the kubelet's device-plugin socket (device-plugins/kubelet.sock)"
            }
            Self::DevicePluginSocket => "a device plugin's socket (a path in device-plugins/)",
            Self::RegistrationSocket => "a registration socket (a path in plugins_registry/)",
            Self::DriverSocket => "a driver's socket (a path under plugins/)",
            Self::Resource => "a device plugin's resource (resource=\"vendor.com/gpu\")",
            Self::Driver => "a driver (driver=\"NAME\", DRA driver NAME)",
        }
    }
}

/// A line explained: its entry, and what the line names.
#[derive(Debug)]
#[non_exhaustive]
pub struct Explained {
    /// The entry the line is.
    pub known: &'static KnownLine,
    /// The registration socket it names (`at socket PATH`, or a path in
    /// `plugins_registry/`).
    pub socket: Option<String>,
    /// The endpoint it names: a plugin's own socket (`dial unix PATH`, or a
    /// path in `device-plugins/` or under `plugins/`).
    pub endpoint: Option<String>,
    /// The kubelet's device-plugin socket it names
    /// (`device-plugins/kubelet.sock`).
    pub kubelet_socket: Option<String>,
    /// The plugin type it names (`plugin type: TYPE`).
    pub plugin_type: Option<String>,
    /// The driver it names (`driver name NAME not found`, `DRA driver NAME
    /// is not registered`, `driver="NAME"`).
    pub driver: Option<String>,
    /// The device plugin's resource it names (`resource="NAME"`, `… for
    /// NAME.`), an extended resource name.
    pub resource: Option<String>,
}

/// gRPC's words in a line that names nothing they could be about: what
/// failed cannot be told from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unplaced {
    /// The words of [`GRPC_WORDS`] found.
    pub words: &'static str,
}

/// What a log line is to the doctor.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reading {
    /// A line it knows.
    Known(Explained),
    /// gRPC's generic words, and no [`Subject`] that says whose connection.
    Unplaced(Unplaced),
    /// Not a line about plugin registration that the doctor knows.
    Unknown,
}

/// What `line` is: a known line, gRPC's words about nothing it names, or
/// neither. A line's own fragments come before gRPC's words wherever their
/// entries stand, so a line is never explained by the words every gRPC
/// caller prints when it has words of its own.
pub fn read_line(line: &str) -> Reading {
    let lower = line.to_lowercase();
    let has = |fragment: &str| lower.contains(&fragment.to_lowercase());
    let names = Names::of(line);
    let words = GRPC_WORDS.iter().copied().find(|words| has(words));
    let by_fragments = KNOWN_LINES.iter().find(|known| {
        matches!(known.known_by, KnownBy::Fragments(fragments) if fragments.iter().all(|f| has(f)))
    });
    let by_words = || {
        words?;
        let subject = names.subject()?;
        KNOWN_LINES.iter().find(|known| known.known_by == KnownBy::GrpcWords(subject))
    };
    match (by_fragments.or_else(by_words), words) {
        (Some(known), _) => Reading::Known(names.explained(known)),
        (None, Some(words)) => Reading::Unplaced(Unplaced { words }),
        (None, None) => Reading::Unknown,
    }
}

/// What `line` is, if it is a known one ([`read_line`]'s `Known`).
pub fn explain(line: &str) -> Option<Explained> {
    match read_line(line) {
        Reading::Known(explained) => Some(explained),
        Reading::Unplaced(_) | Reading::Unknown => None,
    }
}

/// What a line names, read once for both its subject and its explanation.
struct Names {
    socket: Option<String>,
    endpoint: Option<String>,
    kubelet_socket: Option<String>,
    plugin_type: Option<String>,
    driver: Option<String>,
    resource: Option<String>,
}

impl Names {
    fn of(line: &str) -> Self {
        let paths = socket_paths(line);
        let in_dir = |dir: &str| {
            paths.iter().find(|path| path.contains(dir) && !is_kubelet_socket(path)).cloned()
        };
        // What was dialled is the endpoint when it is a plugin's; a line may
        // name a registration socket beside it (`read unix @->…-reg.sock`).
        let dialled = value_after(line, "dial unix ")
            .filter(|path| !path.contains(REGISTRY_DIR) && !is_kubelet_socket(path));
        Self {
            socket: value_after(line, "at socket ").or_else(|| in_dir(REGISTRY_DIR)),
            endpoint: dialled
                .or_else(|| in_dir(DEVICE_PLUGINS_DIR))
                .or_else(|| in_dir(DRIVERS_DIR)),
            kubelet_socket: paths.iter().find(|path| is_kubelet_socket(path)).cloned(),
            plugin_type: value_after(line, "plugin type: "),
            driver: value_after(line, "driver name ")
                .or_else(|| value_after(line, "DRA driver "))
                .or_else(|| value_after(line, "plugin name "))
                .or_else(|| {
                    ["driver", "driverName", "pluginName"].iter().find_map(|key| keyed(line, key))
                }),
            resource: ["resource", "resourceName"]
                .iter()
                .find_map(|key| keyed(line, key))
                .or_else(|| {
                    value_after(line, "devices unavailable for ")
                        .map(|name| name.trim_end_matches('.').to_owned())
                })
                .or_else(|| value_after(line, "unhealthy devices "))
                .or_else(|| value_after(line, "unregistered device "))
                .filter(|name| kpm::device::is_extended_resource_name(name)),
        }
    }

    /// The first [`Subject`] it names.
    fn subject(&self) -> Option<Subject> {
        Subject::all().find(|subject| match subject {
            Subject::KubeletSocket => self.kubelet_socket.is_some(),
            Subject::DevicePluginSocket => self.endpoint_in(DEVICE_PLUGINS_DIR),
            Subject::RegistrationSocket => self.socket.is_some(),
            Subject::DriverSocket => self.endpoint_in(DRIVERS_DIR),
            Subject::Resource => self.resource.is_some(),
            Subject::Driver => self.driver.is_some(),
        })
    }

    fn endpoint_in(&self, dir: &str) -> bool {
        self.endpoint.as_deref().is_some_and(|endpoint| endpoint.contains(dir))
    }

    fn explained(self, known: &'static KnownLine) -> Explained {
        let Self { socket, endpoint, kubelet_socket, plugin_type, driver, resource } = self;
        Explained { known, socket, endpoint, kubelet_socket, plugin_type, driver, resource }
    }
}

/// The kubelet's directories as a path in a line names them.
const REGISTRY_DIR: &str = "/plugins_registry/";
const DEVICE_PLUGINS_DIR: &str = "/device-plugins/";
const DRIVERS_DIR: &str = "/plugins/";

fn is_kubelet_socket(path: &str) -> bool {
    path.ends_with("/device-plugins/kubelet.sock")
}

/// The absolute paths of sockets (`….sock`) in `line`, in order, with a
/// `unix://` scheme left out.
fn socket_paths(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || "\"'\\,;=(){}[]<>@".contains(c))
        .map(|token| token.strip_prefix("unix://").unwrap_or(token).trim_end_matches([':', '.']))
        .filter(|token| {
            token.starts_with('/')
                && std::path::Path::new(token).extension().is_some_and(|ext| ext == "sock")
        })
        .map(str::to_owned)
        .collect()
}

/// The value of `key` in klog's structured form (`key="value"`, `key=value`,
/// with escaped quotes too) or JSON (`"key":"value"`).
fn keyed(line: &str, key: &str) -> Option<String> {
    [format!(" {key}="), format!("\"{key}\":")].iter().find_map(|marker| {
        let rest = &line[line.find(marker.as_str())? + marker.len()..];
        value_after(rest.trim_start_matches(['"', '\\']), "")
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
            ("kubelet", &self.kubelet_socket),
            ("type", &self.plugin_type),
            ("driver", &self.driver),
            ("resource", &self.resource),
        ] {
            if let Some(value) = value {
                writeln!(f, "{what:<11} {value}")?;
            }
        }
        write!(f, "fix:        {}", cause.fix())
    }
}

impl fmt::Display for Unplaced {
    /// What `kpm doctor explain` says of it: why the line cannot be
    /// explained, and what it would need to name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needs: Vec<&str> = Subject::all().map(Subject::named_as).collect();
        write!(
            f,
            "`{}` is what gRPC says of any connection that failed or ended, whoever was at \
             the other end, and this line names nothing that says whose: kpm does not guess. \
             To be explained, a line must name {}; quote the whole line (the error wraps what \
             was dialled), or run kpm doctor on the node",
            self.words,
            needs.join(", or ")
        )
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
        (
            "Warning  UnexpectedAdmissionError  84s  kubelet  Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
            Cause::AdmittedBeforeRegisteredAgain,
        ),
        (
            r#"I1128 10:00:05.000000    2841 allocation_manager.go:619] "Pod admission denied" podUID="6f1c0d6e-2b0a-4d7e-9a51-0c6f2b1e9d41" pod="default/gpu-pod" reason="UnexpectedAdmissionError" message="Allocate failed due to no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu, which is unexpected" operation="add""#,
            Cause::AdmittedBeforeRegisteredAgain,
        ),
        (
            "Pod was rejected: Allocate failed due to cannot allocate unregistered device example.com/fpga, which is unexpected",
            Cause::AdmittedBeforeRegisteredAgain,
        ),
        (
            "F1128 10:00:00.000000       1 node_register.go:55] failed to listen on socket: /registration/csi.example.com-reg.sock with error: listen unix /registration/csi.example.com-reg.sock: bind: address already in use",
            Cause::SocketInUse,
        ),
        (
            "Could not register device plugin: rpc error: code = Unimplemented desc = unknown service v1beta1.Registration",
            Cause::NotTheDeviceManager,
        ),
        (
            r#"E1128 10:00:00.000000    2841 pod_workers.go:1301] "Error syncing pod, skipping" err="failed to \"StartContainer\" ... prepare dynamic resources: plugin name gpu.example.com not found in the list of registered DRA plugins""#,
            Cause::DraDriverNotRegistered,
        ),
        (
            "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for ResourceClaim gpu-claim: error preparing devices for claim default/gpu-claim: requested device gpu-0 is already allocated to different claim 3f2c",
            Cause::DevicePreparedForOtherClaim,
        ),
        (
            "F0105 21:06:32.088382  877319 app.go:169] driver failed to start: context deadline exceeded",
            Cause::RegistrationWaitExpired,
        ),
        (
            r#"W0701 16:40:16.920794    1974 logging.go:55] [core] [Channel #17 SubChannel #18]grpc: addrConn.createTransport failed to connect to {Addr: "/var/lib/kubelet/plugins/gpu.example.com/dra-dc56a2e0.sock", ServerName: "localhost", }. Err: connection error: desc = "transport: Error while dialing: dial unix /var/lib/kubelet/plugins/gpu.example.com/dra-dc56a2e0.sock: connect: no such file or directory""#,
            Cause::EndpointMissing,
        ),
        (
            r#"rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial unix /var/lib/kubelet/device-plugins/kubelet.sock: connect: connection refused""#,
            Cause::KubeletSocketDown,
        ),
        (
            r#"W1010 12:57:13.690383   47511 logging.go:55] [core] [Channel #75 SubChannel #77]grpc: addrConn.createTransport failed to connect to {Addr: "/var/lib/kubelet/plugins_registry/driver.longhorn.io-reg.sock", ServerName: "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdriver.longhorn.io-reg.sock", }. Err: connection error: desc = "transport: Error while dialing: dial unix /var/lib/kubelet/plugins_registry/driver.longhorn.io-reg.sock: connect: connection refused""#,
            Cause::NothingListens,
        ),
        (
            r#"E1128 10:00:00.000000    2841 manager.go:1038] "Error receiving from WatchResources stream" err="rpc error: code = Unavailable desc = error reading from server: EOF" driverName="gpu.example.com""#,
            Cause::EndpointMissing,
        ),
        (
            // A plugin's line in JSON (the words are this test's own).
            r#"{"level":"error","msg":"stream ended","resource":"example.com/gpu","error":"rpc error: code = Unavailable desc = transport is closing"}"#,
            Cause::ListAndWatchEnded,
        ),
    ];

    /// What a line names, by the line's index in [`LINES`].
    #[test]
    fn each_line_is_its_cause_with_what_it_names() {
        for (line, cause) in LINES {
            let explained = explain(line).unwrap_or_else(|| panic!("not known: {line}"));
            assert_eq!(explained.known.cause, *cause, "{line}");
        }
        let names = |at: usize| explain(LINES[at].0).unwrap();
        assert_eq!(names(0).socket.as_deref(), Some("/var/lib/kubelet/plugins_registry/csi.sock"));
        assert_eq!(names(2).endpoint.as_deref(), Some("/var/lib/kubelet/plugins/wrong/csi.sock"));
        assert_eq!(names(1).plugin_type.as_deref(), Some("DRAPlugin"));
        assert_eq!(names(3).driver.as_deref(), Some("hostpath.csi.k8s.io"));
        assert_eq!(
            names(4).socket.as_deref(),
            Some("/var/lib/kubelet/plugins_registry/old-reg.sock")
        );
        assert_eq!(names(5).driver.as_deref(), Some("gpu.example.com"));
        assert_eq!(names(6).resource.as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(names(7).resource.as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(names(8).resource.as_deref(), Some("example.com/fpga"));
        assert_eq!(names(11).driver.as_deref(), Some("gpu.example.com"));
        assert_eq!(
            names(14).endpoint.as_deref(),
            Some("/var/lib/kubelet/plugins/gpu.example.com/dra-dc56a2e0.sock")
        );
        let kubelet = names(15);
        assert_eq!(
            kubelet.kubelet_socket.as_deref(),
            Some("/var/lib/kubelet/device-plugins/kubelet.sock")
        );
        // The kubelet's socket is no plugin's endpoint.
        assert_eq!(kubelet.endpoint, None);
        assert_eq!(
            names(16).socket.as_deref(),
            Some("/var/lib/kubelet/plugins_registry/driver.longhorn.io-reg.sock")
        );
        assert_eq!(names(17).driver.as_deref(), Some("gpu.example.com"));
        assert_eq!(names(18).resource.as_deref(), Some("example.com/gpu"));
        assert!(explain("I1128 everything is fine").is_none());
    }

    #[test]
    fn grpc_words_alone_are_unplaced_and_say_what_the_line_would_need() {
        for words in GRPC_WORDS {
            let line = format!("E1128 10:00:00.000000 1 main.go:10] failed: {words}");
            let Reading::Unplaced(unplaced) = read_line(&line) else {
                panic!("not unplaced: {line}")
            };
            let said = unplaced.to_string();
            assert!(said.contains("device-plugins/kubelet.sock"), "{said}");
            assert!(said.contains("resource="), "{said}");
            assert!(said.contains("driver="), "{said}");
        }
        // A resource that is no device plugin's, a path no kubelet directory
        // holds: still nothing that says whose connection.
        for line in [
            r#""Eviction manager: failed" err="transport is closing" resource="memory""#,
            "Could not register device plugin: context deadline exceeded",
            r#"Lost connection to "unix:///csi/csi.sock": connection refused"#,
        ] {
            assert!(matches!(read_line(line), Reading::Unplaced(_)), "{line}");
        }
        assert!(matches!(read_line("I1128 everything is fine"), Reading::Unknown));
    }

    /// A line naming `subject`, for an entry known by gRPC's words.
    fn naming(subject: Subject) -> &'static str {
        match subject {
            Subject::KubeletSocket => {
                "dial unix /var/lib/kubelet/device-plugins/kubelet.sock: connect"
            }
            Subject::DevicePluginSocket => {
                "dial unix /var/lib/kubelet/device-plugins/gpu.sock: connect"
            }
            Subject::RegistrationSocket => {
                "read unix @->/var/lib/kubelet/plugins_registry/x-reg.sock"
            }
            Subject::DriverSocket => "dial unix /var/lib/kubelet/plugins/x.example.com/dra.sock: x",
            Subject::Resource => r#"resource="vendor.com/gpu""#,
            Subject::Driver => r#"driver="gpu.example.com""#,
        }
    }

    #[test]
    fn every_cause_of_a_line_is_reachable_by_its_own_words() {
        // An entry shadowed by an earlier, more general one is never chosen.
        for (at, known) in KNOWN_LINES.iter().enumerate() {
            let line = match known.known_by {
                KnownBy::Fragments(fragments) => fragments.join(" "),
                KnownBy::GrpcWords(subject) => format!("{} {}", GRPC_WORDS[0], naming(subject)),
            };
            let chosen = explain(&line).unwrap_or_else(|| panic!("entry {at} is not known"));
            assert!(std::ptr::eq(chosen.known, known), "entry {at} is shadowed");
        }
    }

    #[test]
    fn every_subject_has_one_entry_of_grpc_words() {
        for subject in Subject::all() {
            let entries = KNOWN_LINES
                .iter()
                .filter(|known| known.known_by == KnownBy::GrpcWords(subject))
                .count();
            assert_eq!(entries, 1, "{subject:?}");
        }
    }

    #[test]
    fn a_lines_own_words_come_before_grpcs() {
        // gRPC's words and a registration socket, but the kubelet's own
        // words for a GetInfo that did not answer in time.
        let line = "failed to get plugin info using RPC GetInfo at socket \
                    /var/lib/kubelet/plugins_registry/x-reg.sock, err: rpc error: code = \
                    DeadlineExceeded desc = context deadline exceeded";
        assert_eq!(explain(line).unwrap().known.cause, Cause::SlowGetInfo);
    }
}
