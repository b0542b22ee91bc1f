//! An inspection: the register operation's steps run on a socket, timed,
//! without registering anything or telling the plugin anything. It is how
//! `kpm probe`, `kpm doctor` and `kpm check` judge a socket, with the code
//! `kpm run` registers with.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use kpm_api::registration::v1::PluginInfo as WirePluginInfo;
use kpm_cache::{PluginEndpoint, ServiceReport};
use tokio::time::Instant;

use crate::ExecutorError;

/// A step of the register operation, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Step {
    /// Connecting to the registration socket.
    Dial,
    /// The `GetInfo` call.
    GetInfo,
    /// The bounds of the `GetInfo` answer ([`check_info`](crate::check_info)).
    CheckInfo,
    /// Finding the handler of the plugin's type.
    Handler,
    /// The handler's [`validate`](kpm_cache::PluginHandler::validate).
    Validate,
    /// The handler's [`inspect`](kpm_cache::PluginHandler::inspect) of the
    /// plugin's own service (inspections only).
    Service,
}

impl Step {
    /// The step's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Dial => "dial",
            Self::GetInfo => "GetInfo",
            Self::CheckInfo => "check info",
            Self::Handler => "handler",
            Self::Validate => "validate",
            Self::Service => "service",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A step an inspection went through and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InspectedStep {
    /// Which step.
    pub step: Step,
    /// How long it took.
    pub took: Duration,
}

/// The steps an attempt went through, each timed, and who answered the dial.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    pub(crate) taken: Vec<InspectedStep>,
    pub(crate) server_pid: Option<u32>,
}

impl Steps {
    /// Runs `work` as `step`, recording how long it took.
    pub(crate) async fn time<T>(&mut self, step: Step, work: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let output = work.await;
        self.taken.push(InspectedStep { step, took: started.elapsed() });
        output
    }
}

/// What [`OperationExecutor::inspect`](crate::OperationExecutor::inspect)
/// found on a registration socket.
#[derive(Debug)]
#[non_exhaustive]
pub struct Inspection {
    /// The registration socket.
    pub socket: PathBuf,
    /// The steps taken, in order; the last one is where `outcome` failed.
    pub steps: Vec<InspectedStep>,
    /// What the plugin answered `GetInfo`, if it answered.
    pub info: Option<WirePluginInfo>,
    /// The endpoint its handler is given: the one it advertised in
    /// `GetInfo`, else the socket.
    pub endpoint: Option<PluginEndpoint>,
    /// The process serving the socket (`SO_PEERCRED`), if it answered and
    /// is visible from here.
    pub server_pid: Option<u32>,
    /// What the handler saw of the plugin's own service.
    pub service: Option<Box<dyn ServiceReport>>,
    /// `Ok` when the plugin would register; else the error the register
    /// operation would fail with.
    pub outcome: Result<(), ExecutorError>,
}

impl Inspection {
    /// How long `step` took, if it was taken.
    pub fn took(&self, step: Step) -> Option<Duration> {
        self.steps.iter().find(|taken| taken.step == step).map(|taken| taken.took)
    }

    /// The step `outcome` failed at, if it failed.
    pub fn failed_step(&self) -> Option<Step> {
        self.outcome.as_ref().err().and_then(|_| self.steps.last().map(|taken| taken.step))
    }
}
