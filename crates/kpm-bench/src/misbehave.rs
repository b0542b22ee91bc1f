//! The misbehaving plugins of `soak`: each breaks the registration protocol
//! one way, in the registry, for a few seconds, and is then cleaned up.
//!
//! Each runs like a plugin process: on a thread of its own with a
//! current-thread tokio runtime. When its lifetime ends, or when it "exits"
//! on purpose, the runtime is dropped, which closes its listener and every
//! connection it held whatever its calls were doing; the load generator then
//! removes what it left in the registry (its socket file, its directory). So
//! a call that hangs holds no file descriptor here beyond the plugin's
//! lifetime, and every misbehaviour ends with the registry as it was.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpm_api::constants::{DEVICE_HEALTHY, DEVICE_PLUGIN_VERSION};
use kpm_api::registration::v1::registration_server::{Registration, RegistrationServer};
use kpm_api::registration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use kpm_registrar::stub::StubDevicePlugin;
use kpm_registrar::{DEVICE_PLUGIN, Registrar};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt as _;
use tokio::net::UnixStream;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::Result;

/// How long the slow `GetInfo` takes: twice what kpm (like the kubelet) allows.
const SLOW_GET_INFO: Duration = Duration::from_secs(2);
/// The length of the huge plugin name.
const HUGE_NAME_LEN: usize = 1 << 20;
/// The number of versions of the plugin with many.
const MANY_VERSIONS: usize = 10_000;
/// The sockets in the directory that is deleted with them.
const DIRECTORY_SOCKETS: usize = 3;
/// How long the connection-dropping plugin waits for a request before it
/// gives up on a connection.
const READ_STALL: Duration = Duration::from_secs(1);

/// One way of misbehaving; `--misbehaviours` names them by their label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Misbehaviour {
    /// `GetInfo` never answers.
    HangingGetInfo,
    /// `GetInfo` answers after 2 s (kpm gives it 1 s).
    SlowGetInfo,
    /// `GetInfo` fails with `INTERNAL`.
    FailingGetInfo,
    /// A device plugin service without `Registration`: `UNIMPLEMENTED`.
    #[value(name = "unimplemented")]
    NotARegistrationSocket,
    /// Accepts a connection, reads the start of the `GetInfo` call, closes.
    DropsConnection,
    /// A valid device plugin whose `NotifyRegistrationStatus` fails.
    FailingNotify,
    /// A valid device plugin whose process exits when the notification
    /// arrives (after `GetInfo` and kpm's connection to its device plugin
    /// service), leaving its socket file behind.
    ExitsBeforeNotify,
    /// `GetInfo` says: a device plugin with an empty name.
    EmptyName,
    /// `GetInfo` says: a plugin type kpm has no handler for.
    UnhandledType,
    /// `GetInfo` says: a device plugin whose name is 1 MiB long.
    HugeName,
    /// `GetInfo` says: a device plugin with 10,000 versions, none supported.
    ManyVersions,
    /// A socket file nobody listens on: connections are refused.
    StaleSocket,
    /// A directory with three working plugins, deleted with their sockets in it.
    DeletedDirectory,
}

impl Misbehaviour {
    /// Every misbehaviour, in the order `soak` starts them (mixed, so that
    /// different kinds overlap).
    pub(crate) const ALL: [Self; 13] = [
        Self::HangingGetInfo,
        Self::EmptyName,
        Self::StaleSocket,
        Self::SlowGetInfo,
        Self::UnhandledType,
        Self::DeletedDirectory,
        Self::FailingGetInfo,
        Self::HugeName,
        Self::NotARegistrationSocket,
        Self::DropsConnection,
        Self::ManyVersions,
        Self::FailingNotify,
        Self::ExitsBeforeNotify,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::HangingGetInfo => "hanging-get-info",
            Self::SlowGetInfo => "slow-get-info",
            Self::FailingGetInfo => "failing-get-info",
            Self::NotARegistrationSocket => "unimplemented",
            Self::DropsConnection => "drops-connection",
            Self::FailingNotify => "failing-notify",
            Self::ExitsBeforeNotify => "exits-before-notify",
            Self::EmptyName => "empty-name",
            Self::UnhandledType => "unhandled-type",
            Self::HugeName => "huge-name",
            Self::ManyVersions => "many-versions",
            Self::StaleSocket => "stale-socket",
            Self::DeletedDirectory => "deleted-directory",
        }
    }

    /// What the plugin does. Names are fixed per kind: kpm's device manager
    /// keeps a resource it has seen for 5 minutes, so a new name per instance
    /// would grow kpm by design rather than by a leak.
    fn plan(self) -> Plan {
        let device = |name: &str| PluginInfo {
            r#type: DEVICE_PLUGIN.to_owned(),
            name: name.to_owned(),
            endpoint: String::new(),
            supported_versions: vec![DEVICE_PLUGIN_VERSION.to_owned()],
        };
        let serve = |info, get_info, notify| Plan::Serve { info, get_info, notify };
        match self {
            Self::HangingGetInfo => {
                serve(device("soak.kpm/hanging"), OnGetInfo::Hang, OnNotify::Answer)
            }
            Self::SlowGetInfo => serve(device("soak.kpm/slow"), OnGetInfo::Slow, OnNotify::Answer),
            Self::FailingGetInfo => {
                serve(device("soak.kpm/failing"), OnGetInfo::Fail, OnNotify::Answer)
            }
            Self::FailingNotify => {
                serve(device("soak.kpm/failing-notify"), OnGetInfo::Answer, OnNotify::Fail)
            }
            Self::ExitsBeforeNotify => {
                serve(device("soak.kpm/exits"), OnGetInfo::Answer, OnNotify::Exit)
            }
            Self::EmptyName => serve(device(""), OnGetInfo::Answer, OnNotify::Answer),
            Self::UnhandledType => serve(
                PluginInfo {
                    r#type: "SoakUnhandledPlugin".to_owned(),
                    supported_versions: vec!["1.0.0".to_owned()],
                    ..device("soak-unhandled")
                },
                OnGetInfo::Answer,
                OnNotify::Answer,
            ),
            Self::HugeName => {
                serve(device(&"x".repeat(HUGE_NAME_LEN)), OnGetInfo::Answer, OnNotify::Answer)
            }
            Self::ManyVersions => serve(
                PluginInfo {
                    supported_versions: (0..MANY_VERSIONS).map(|i| format!("v0.{i}")).collect(),
                    ..device("soak.kpm/many-versions")
                },
                OnGetInfo::Answer,
                OnNotify::Answer,
            ),
            Self::NotARegistrationSocket => Plan::DevicePluginOnly,
            Self::DropsConnection => Plan::DropConnections,
            Self::StaleSocket => Plan::StaleSocket,
            Self::DeletedDirectory => Plan::DeletedDirectory,
        }
    }
}

/// How a misbehaving plugin is built.
enum Plan {
    /// A `Registration` server (with the stub device plugin service beside it).
    Serve {
        info: PluginInfo,
        get_info: OnGetInfo,
        notify: OnNotify,
    },
    DevicePluginOnly,
    DropConnections,
    StaleSocket,
    DeletedDirectory,
}

#[derive(Debug, Clone, Copy)]
enum OnGetInfo {
    Answer,
    Hang,
    Slow,
    Fail,
}

#[derive(Debug, Clone, Copy)]
enum OnNotify {
    Answer,
    Fail,
    Exit,
}

/// What the plugins of one kind saw.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    instances: AtomicU64,
    /// `GetInfo` calls received (answered or not).
    get_info_calls: AtomicU64,
    /// `NotifyRegistrationStatus` calls saying registered, and rejected.
    registered: AtomicU64,
    rejected: AtomicU64,
}

impl Counters {
    pub(crate) fn json(&self, kind: Misbehaviour) -> Value {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        json!({
            "kind": kind.label(),
            "instances": read(&self.instances),
            "get_info_calls": read(&self.get_info_calls),
            "notified_registered": read(&self.registered),
            "notified_rejected": read(&self.rejected),
        })
    }

    fn status(&self, registered: bool) {
        bump(if registered { &self.registered } else { &self.rejected });
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Runs misbehaving plugin number `seq` of `kind` in `registry` for
/// `lifetime`, then removes what it left there. An error means the plugin
/// could not be set up as intended (a problem of the load generator).
pub(crate) async fn run(
    kind: Misbehaviour,
    registry: PathBuf,
    seq: u64,
    lifetime: Duration,
    counters: Arc<Counters>,
) -> Result {
    bump(&counters.instances);
    let deadline = Instant::now() + lifetime;
    let path = match kind {
        Misbehaviour::DeletedDirectory => registry.join(format!("soak-{}-{seq}", kind.label())),
        _ => registry.join(format!("soak-{}-{seq}.sock", kind.label())),
    };
    let socket = path.clone();
    let outcome = match kind.plan() {
        Plan::Serve { info, get_info, notify } => {
            island(deadline, move || {
                let exit = Arc::new(Notify::new());
                let service =
                    BadRegistration { info, get_info, notify, counters, exit: Arc::clone(&exit) };
                let (stub, _devices) = StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY)]);
                let routes = stub.routes().add_service(RegistrationServer::new(service));
                serve(socket, routes, exit)
            })
            .await
        }
        Plan::DevicePluginOnly => {
            island(deadline, move || {
                let (stub, _devices) = StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY)]);
                serve(socket, stub.routes(), Arc::new(Notify::new()))
            })
            .await
        }
        Plan::DropConnections => island(deadline, move || drop_connections(socket, counters)).await,
        Plan::StaleSocket => std::os::unix::net::UnixListener::bind(&socket)
            .map(drop)
            .map_err(|err| format!("bind {}: {err}", socket.display()).into()),
        Plan::DeletedDirectory => {
            island(deadline, move || deleted_directory(socket, lifetime, counters)).await
        }
    };
    // Whatever a plugin leaves behind (the socket file of one that exited, a
    // stale socket) stays until the end of its lifetime, as after a crash.
    tokio::time::sleep_until(deadline).await;
    let removed = remove(&path).map_err(|err| format!("remove {}: {err}", path.display()).into());
    outcome.and(removed)
}

/// Removes a file or a directory tree; one already gone is fine.
fn remove(path: &std::path::Path) -> io::Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(err) => Err(err),
    };
    match removed {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Runs `plugin` like a process of its own: on a new thread, in a
/// current-thread runtime that is dropped when `plugin` returns or
/// `deadline` passes, taking every task, listener and connection with it.
async fn island<F, Fut>(deadline: Instant, plugin: F) -> Result
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result>,
{
    let (done, outcome) = oneshot::channel();
    std::thread::Builder::new().name("soak-plugin".to_owned()).spawn(move || {
        let outcome = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(crate::Error::from)
            .and_then(|runtime| {
                let outcome = runtime
                    .block_on(async { tokio::time::timeout_at(deadline, plugin()).await })
                    .unwrap_or(Ok(()));
                drop(runtime);
                outcome
            });
        let _ = done.send(outcome);
    })?;
    outcome.await.map_err(|_| "a misbehaving plugin's thread panicked")?
}

/// Serves `routes` on `socket` until `exit` is notified.
async fn serve(socket: PathBuf, routes: Routes, exit: Arc<Notify>) -> Result {
    let incoming = kpm_transport::bind(&socket).await?;
    tokio::select! {
        served = tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(incoming) => served?,
        () = exit.notified() => {}
    }
    Ok(())
}

/// The `Registration` service of a misbehaving plugin.
struct BadRegistration {
    info: PluginInfo,
    get_info: OnGetInfo,
    notify: OnNotify,
    counters: Arc<Counters>,
    /// Notified to make the plugin's process exit.
    exit: Arc<Notify>,
}

#[tonic::async_trait]
impl Registration for BadRegistration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        bump(&self.counters.get_info_calls);
        match self.get_info {
            OnGetInfo::Answer => {}
            OnGetInfo::Hang => std::future::pending::<()>().await,
            OnGetInfo::Slow => tokio::time::sleep(SLOW_GET_INFO).await,
            OnGetInfo::Fail => return Err(Status::internal("soak: GetInfo fails on purpose")),
        }
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.counters.status(request.into_inner().plugin_registered);
        match self.notify {
            OnNotify::Answer => Ok(Response::new(RegistrationStatusResponse {})),
            OnNotify::Fail => {
                Err(Status::internal("soak: NotifyRegistrationStatus fails on purpose"))
            }
            OnNotify::Exit => {
                self.exit.notify_one();
                std::future::pending().await
            }
        }
    }
}

/// Accepts connections on `socket` and closes each once the first call has
/// arrived on it, without answering.
async fn drop_connections(socket: PathBuf, counters: Arc<Counters>) -> Result {
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|err| format!("bind {}: {err}", socket.display()))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let counters = Arc::clone(&counters);
        tokio::spawn(async move {
            if read_first_call(stream).await {
                bump(&counters.get_info_calls);
            }
            // The stream is dropped here: the connection closes mid-call.
        });
    }
}

/// Reads from a new HTTP/2 connection until the client's first HEADERS
/// frame (the start of its first call) is in; false if the connection ended
/// or stalled before.
async fn read_first_call(mut stream: UnixStream) -> bool {
    let mut received = Vec::new();
    let mut chunk = [0; 4096];
    while !has_headers_frame(&received) {
        match tokio::time::timeout(READ_STALL, stream.read(&mut chunk)).await {
            Ok(Ok(read)) if read > 0 => received.extend_from_slice(&chunk[..read]),
            _ => return false,
        }
    }
    true
}

/// The client connection preface that precedes the first frame (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
/// A frame header: payload length (24 bits), type, flags, stream id (32 bits).
const FRAME_HEADER_LEN: usize = 9;
const HEADERS_FRAME: u8 = 1;

/// Whether `bytes`, the start of an HTTP/2 client connection, hold a whole
/// HEADERS frame.
fn has_headers_frame(bytes: &[u8]) -> bool {
    let mut at = PREFACE_LEN;
    while let Some(&[l0, l1, l2, kind, ..]) = bytes.get(at..at + FRAME_HEADER_LEN) {
        let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        let end = at + FRAME_HEADER_LEN + len;
        if end > bytes.len() {
            return false;
        }
        if kind == HEADERS_FRAME {
            return true;
        }
        at = end;
    }
    false
}

/// Three working device plugins in a directory of their own under the
/// registry; once kpm has registered them (or half the lifetime is over),
/// the directory is deleted with their sockets in it. They keep serving
/// their unlinked sockets until the end of their lifetime.
async fn deleted_directory(dir: PathBuf, lifetime: Duration, counters: Arc<Counters>) -> Result {
    let mut registrars = Vec::with_capacity(DIRECTORY_SOCKETS);
    for index in 0..DIRECTORY_SOCKETS {
        let (stub, _devices) = StubDevicePlugin::new([("dev-0", DEVICE_HEALTHY)]);
        let builder = Registrar::builder(DEVICE_PLUGIN, format!("soak.kpm/deleted-dir-{index}"));
        registrars.push(builder.socket_dir(&dir).routes(stub.routes()).serve().await?);
    }
    let by = Instant::now() + lifetime / 2;
    for registrar in &registrars {
        let left = by.saturating_duration_since(Instant::now());
        if let Ok(status) = registrar.wait_for_status(left).await {
            counters.status(status.plugin_registered);
        }
    }
    std::fs::remove_dir_all(&dir).map_err(|err| format!("remove {}: {err}", dir.display()))?;
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use kpm_api::registration::v1::registration_client::RegistrationClient;
    use tonic::Code;

    use super::*;

    /// The answer to `GetInfo` on `socket`, as a gRPC code, within 500 ms.
    async fn get_info(socket: &std::path::Path) -> Option<Code> {
        let timeout = Duration::from_millis(500);
        let dialer = kpm_transport::Dialer::new(kpm_transport::fd::budget().clone(), timeout);
        let channel = dialer.grpc(socket).await.ok()?.channel;
        let mut client = RegistrationClient::new(channel);
        match tokio::time::timeout(timeout, client.get_info(InfoRequest {})).await {
            Ok(Ok(_)) => Some(Code::Ok),
            Ok(Err(status)) => Some(status.code()),
            Err(_) => Some(Code::DeadlineExceeded),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_kind_misbehaves_and_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("kpm-misbehave-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fds_before = crate::procfs::sample("self").unwrap().fds;
        let lifetime = Duration::from_millis(1500);
        let plugins: Vec<_> = Misbehaviour::ALL
            .iter()
            .zip(0..)
            .map(|(&kind, seq)| {
                let counters = Arc::new(Counters::default());
                (kind, tokio::spawn(run(kind, dir.clone(), seq, lifetime, counters)))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let socket =
            |kind: Misbehaviour, seq: usize| dir.join(format!("soak-{}-{seq}.sock", kind.label()));
        let answers = [
            (Misbehaviour::HangingGetInfo, &[Code::DeadlineExceeded][..]),
            (Misbehaviour::FailingGetInfo, &[Code::Internal]),
            (Misbehaviour::NotARegistrationSocket, &[Code::Unimplemented]),
            // A connection closed under a call: h2 reports it either way.
            (Misbehaviour::DropsConnection, &[Code::Unknown, Code::Unavailable]),
            (Misbehaviour::EmptyName, &[Code::Ok]),
        ];
        let seq = |kind| Misbehaviour::ALL.iter().position(|k| *k == kind).unwrap();
        for (kind, expected) in answers {
            let answer = get_info(&socket(kind, seq(kind))).await;
            assert!(answer.is_some_and(|code| expected.contains(&code)), "{kind:?}: {answer:?}");
        }
        let stale = socket(Misbehaviour::StaleSocket, seq(Misbehaviour::StaleSocket));
        assert!(stale.exists() && get_info(&stale).await.is_none());
        for (kind, plugin) in plugins {
            plugin.await.unwrap().unwrap_or_else(|err| panic!("{}: {err}", kind.label()));
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
        assert!(left.is_empty(), "{left:?}");
        // The plugins' threads, listeners and connections are gone too.
        let fds_after = crate::procfs::sample("self").unwrap().fds;
        assert!(fds_after <= fds_before + 2, "{fds_before} fds before, {fds_after} after");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_the_first_headers_frame() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        assert!(!has_headers_frame(&bytes));
        // SETTINGS, 6 bytes of payload.
        bytes.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert!(!has_headers_frame(&bytes));
        // HEADERS on stream 1, 3 bytes of payload, the last not in yet.
        bytes.extend_from_slice(&[0, 0, 3, 1, 4, 0, 0, 0, 1, 0x82, 0x86]);
        assert!(!has_headers_frame(&bytes));
        bytes.push(0x84);
        assert!(has_headers_frame(&bytes));
    }

    #[test]
    fn every_kind_has_its_own_label_its_command_line_name() {
        use clap::ValueEnum as _;
        let mut labels: Vec<_> = Misbehaviour::ALL.iter().map(|kind| kind.label()).collect();
        for kind in Misbehaviour::ALL {
            assert_eq!(kind.to_possible_value().unwrap().get_name(), kind.label());
        }
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Misbehaviour::value_variants().len());
        assert_eq!(labels.len(), Misbehaviour::ALL.len());
    }
}
