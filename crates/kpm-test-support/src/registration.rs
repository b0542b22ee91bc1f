//! A fake registration plugin (feature `registration`):
//! `pluginregistration.Registration` served by tonic on a real Unix socket,
//! the one every crate's tests use.
//!
//! What a test can set: the [`PluginInfo`] the plugin answers `GetInfo`
//! with; how it answers each `GetInfo` call, and each
//! `NotifyRegistrationStatus` that tells it it is registered ([`Reply`]: an
//! answer, a failure, no answer, or any of these late), call by call, then a
//! fallback that the test may change while the plugin runs. What it can
//! read: the `GetInfo` calls so far, every status the plugin was sent, and
//! the connections a plugin served here has accepted, which the test can
//! also freeze as a stopped process's.
//!
//! [`serve`] serves it on the current runtime, so that its delays follow a
//! paused clock; a test that serves it as a process would, on an
//! [`OwnRuntime`](crate::OwnRuntime) and next to other services, serves its
//! [`service`](FakePlugin::service).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kpm_api::registration::v1::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};
use parking_lot::Mutex;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::server::Server;

/// How the fake plugin answers one call.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answers: `GetInfo` with the plugin's info, `NotifyRegistrationStatus`
    /// with an acknowledgement.
    Answer,
    /// Fails with this status.
    Fail(Status),
    /// Never answers; only the caller's deadline ends the call.
    Hang,
    /// Waits this long, on tokio time (so paused time moves through it),
    /// then replies.
    After(Duration, Box<Reply>),
}

impl Reply {
    async fn send<T>(mut self, answer: T) -> Result<Response<T>, Status> {
        loop {
            match self {
                Self::Answer => return Ok(Response::new(answer)),
                Self::Fail(status) => return Err(status),
                Self::Hang => std::future::pending::<()>().await,
                Self::After(delay, then) => {
                    tokio::time::sleep(delay).await;
                    self = *then;
                }
            }
        }
    }
}

/// A [`PluginInfo`] of `plugin_type` called `name`, with no endpoint of its
/// own (it serves on its registration socket), supporting `versions`.
pub fn info(plugin_type: &str, name: &str, versions: &[&str]) -> PluginInfo {
    PluginInfo {
        r#type: plugin_type.into(),
        name: name.into(),
        endpoint: String::new(),
        supported_versions: versions.iter().map(|&version| version.into()).collect(),
    }
}

/// The replies to one call: scripted ones in order, then the fallback.
#[derive(Debug)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Reply>,
}

impl Script {
    fn new(replies: impl IntoIterator<Item = Reply>, fallback: Reply) -> Self {
        Self { replies: Mutex::new(replies.into_iter().collect()), fallback: Mutex::new(fallback) }
    }

    fn next(&self) -> Reply {
        let scripted = self.replies.lock().pop_front();
        scripted.unwrap_or_else(|| self.fallback.lock().clone())
    }
}

/// The plugin: answers `GetInfo` and `NotifyRegistrationStatus` as its
/// scripts say, recording every status it is sent.
#[derive(Debug)]
pub struct FakePlugin {
    info: PluginInfo,
    get_info: Script,
    /// For the statuses that say the plugin is registered: refusing one
    /// makes kpm undo the registration, while a refused failure notice is
    /// only logged, so the latter are always acknowledged and never use up
    /// a scripted reply.
    notify: Script,
    get_info_calls: AtomicUsize,
    statuses: Mutex<Vec<RegistrationStatus>>,
}

impl FakePlugin {
    /// A plugin that answers every `GetInfo` with `info` and acknowledges
    /// every status.
    pub fn new(info: PluginInfo) -> Self {
        Self {
            info,
            get_info: Script::new([], Reply::Answer),
            notify: Script::new([], Reply::Answer),
            get_info_calls: AtomicUsize::new(0),
            statuses: Mutex::new(Vec::new()),
        }
    }

    /// `GetInfo` answers `script` in order, then `fallback`.
    #[must_use]
    pub fn get_info(mut self, script: impl IntoIterator<Item = Reply>, fallback: Reply) -> Self {
        self.get_info = Script::new(script, fallback);
        self
    }

    /// A `NotifyRegistrationStatus` that tells the plugin it is registered
    /// is answered `script` in order, then `fallback`; one that tells it it
    /// is not is always acknowledged.
    #[must_use]
    pub fn notify(mut self, script: impl IntoIterator<Item = Reply>, fallback: Reply) -> Self {
        self.notify = Script::new(script, fallback);
        self
    }

    /// From now on, `GetInfo` answers `reply` once its script is done: a
    /// plugin whose answer changes while it runs.
    pub fn set_get_info(&self, reply: Reply) {
        *self.get_info.fallback.lock() = reply;
    }

    /// From now on, a status that says the plugin is registered is
    /// answered `reply` once its script is done.
    pub fn set_notify(&self, reply: Reply) {
        *self.notify.fallback.lock() = reply;
    }

    /// The plugin's name, as `GetInfo` says it.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The number of `GetInfo` calls so far, answered or not.
    pub fn get_info_calls(&self) -> usize {
        self.get_info_calls.load(Ordering::SeqCst)
    }

    /// Every status the plugin was sent, in order, refused or not.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.statuses.lock().clone()
    }

    /// Blocks the calling thread until the plugin has been sent `n`
    /// statuses; returns the `n`th (from 1). For the synchronous tests that
    /// drive `kpm` as a process ([`blocking`](crate::blocking)); an async
    /// test looks at [`statuses`](Self::statuses) in a wait of its own.
    pub fn wait_for_status(&self, n: usize) -> RegistrationStatus {
        let what = format!("{} is sent status #{n}", self.name());
        crate::blocking::wait_until(&what, || self.statuses.lock().len() >= n);
        self.statuses.lock()[n - 1].clone()
    }

    /// The plugin's Registration service, to serve next to others (a CSI
    /// driver on the same socket) or on a runtime of the test's own.
    pub fn service(self: Arc<Self>) -> RegistrationServer<Self> {
        RegistrationServer::from_arc(self)
    }
}

#[tonic::async_trait]
impl Registration for FakePlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.get_info_calls.fetch_add(1, Ordering::SeqCst);
        self.get_info.next().send(self.info.clone()).await
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let registered = status.plugin_registered;
        self.statuses.lock().push(status);
        let reply = if registered { self.notify.next() } else { Reply::Answer };
        reply.send(RegistrationStatusResponse {}).await
    }
}

/// A served fake plugin; the server stops when this is dropped (its socket
/// file stays).
#[derive(Debug)]
pub struct Served {
    /// The plugin, to read its calls or change its answers.
    pub plugin: Arc<FakePlugin>,
    /// Where it is served.
    pub socket: PathBuf,
    server: Server,
}

impl Served {
    /// The number of connections accepted so far, closed or not.
    pub fn accepted_connections(&self) -> usize {
        self.server.connections.accepted.load(Ordering::SeqCst)
    }

    /// From now on, no connection to the plugin reads what it is sent, as
    /// if its process were stopped: the kernel takes what is sent, and
    /// calls and HTTP/2 PINGs go unanswered, on connections accepted later
    /// too.
    pub fn freeze(&self) {
        self.server.connections.frozen.store(true, Ordering::SeqCst);
    }
}

/// Serves `plugin` on `socket` (bound on return), on the current runtime.
pub async fn serve(socket: &Path, plugin: FakePlugin) -> Served {
    let plugin = Arc::new(plugin);
    let server = Server::start(socket, Routes::new(Arc::clone(&plugin).service())).await;
    Served { plugin, socket: socket.to_path_buf(), server }
}
