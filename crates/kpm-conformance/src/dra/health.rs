//! `DRAResourceHealth`: the suite watches each health service the driver
//! advertises as a kubelet does (`pkg/kubelet/cm/dra/manager.go`,
//! `HandleWatchResourcesStream`), on a stream of its own, while a claim is
//! prepared.
//!
//! The 1.36 kubelet always opens `v1alpha1`, advertised or not
//! (`dra_plugin.go`), and retries every 5 s; later kubelets open what is
//! advertised (`pickHealthService`). Health feeds only the pods'
//! `allocatedResourcesStatus`: the kubelet fails no pod over it, so what
//! hides a device's health is a warning.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use kpm::dra::{DEFAULT_HEALTH_TIMEOUT, HealthService, health_timeout};
use kpm_api::dra_health::{v1, v1alpha1};
use tokio::time::Instant;
use tonic::Streaming;

use crate::dial::dial;
use crate::hook::HookCall;
use crate::outcome::{Evidence, Mark, Outcome, Subject};

/// A device as health reports name it: `(pool, device)`.
pub(super) type DeviceId = (String, String);

/// What the health check watches for.
pub(super) struct Watched<'a> {
    /// The driver's endpoint.
    pub(super) endpoint: &'a str,
    /// GetInfo's supported versions.
    pub(super) services: &'a [String],
    /// The devices of a claim prepared for the check, or why there is none.
    pub(super) prepared: Result<Vec<DeviceId>, String>,
    /// What changes a device's health (`--health-change`).
    pub(super) hook: Option<&'a HookCall>,
    pub(super) bound: Duration,
}

/// The order the services are watched in: the one 1.36 kubelets open first.
const SERVICES: [HealthService; 2] = [HealthService::V1alpha1, HealthService::V1];

/// The `DRAResourceHealth` check.
pub(super) async fn resource_health(watched: &Watched<'_>) -> Outcome {
    let advertised: Vec<HealthService> = SERVICES
        .into_iter()
        .filter(|service| watched.services.iter().any(|name| name == service.as_str()))
        .collect();
    let mut findings = Evidence::default();
    if !advertised.contains(&HealthService::V1alpha1) {
        // What a 1.36 kubelet opens whatever the driver says.
        match open(watched.endpoint, HealthService::V1alpha1, watched.bound).await {
            Ok(_) => findings.warn(
                "serves v1alpha1.DRAResourceHealth without advertising it: 1.36 kubelets read \
                 it, later ones open only an advertised service (pickHealthService)",
            ),
            Err(_) if advertised.is_empty() => {
                return Outcome::skipped(
                    "it advertises no DRAResourceHealth and serves no v1alpha1: pods' \
                     allocatedResourcesStatus gets no health for its devices (1.36 kubelets \
                     try v1alpha1 every 5 s and log the error)",
                );
            }
            Err(why) => findings.warn(format!(
                "advertises v1.DRAResourceHealth only, and v1alpha1 {why}: 1.36 kubelets open \
                 v1alpha1 alone (dra_plugin.go), so on them its devices' health stays Unknown"
            )),
        }
    }
    if let Err(why) = &watched.prepared {
        findings.add(Mark::Skip, format!("no claim prepared ({why}): its devices not looked for"));
    }
    // Each service on a stream of its own, watched together: each waits
    // out a timeout.
    let opened = advertised.iter().map(|service| Watch::open(*service, watched));
    let mut streams: Vec<Watch<'_>> = join_all(opened).await;
    join_all(streams.iter_mut().map(Watch::first_messages)).await;
    // One change for every stream.
    match watched.hook {
        None => {
            findings.add(
                Mark::Skip,
                "no --health-change COMMAND to provoke a change (for kpm-registrar's example \
                 plugin: 'kill -USR1 $KPM_CHECK_PID')",
            );
        }
        Some(_) if streams.iter().all(|stream| stream.ended) => {}
        Some(hook) => {
            for stream in &mut streams {
                stream.before = stream.last.clone();
            }
            match hook.run().await {
                Err(why) => findings.warn(format!("the hook {why}")),
                Ok(()) => {
                    join_all(streams.iter_mut().map(Watch::changed)).await;
                }
            }
        }
    }
    for stream in streams {
        findings.append(stream.findings);
    }
    findings.outcome("")
}

/// A health stream, whichever the version.
enum Messages {
    V1(Streaming<v1::NodeWatchResourcesResponse>),
    V1alpha1(Streaming<v1alpha1::NodeWatchResourcesResponse>),
}

impl Messages {
    /// The next message's devices; `None` when the driver ended the stream.
    async fn next(&mut self) -> Result<Option<Vec<v1::DeviceHealth>>, tonic::Status> {
        match self {
            Self::V1(stream) => Ok(stream.message().await?.map(|message| message.devices)),
            Self::V1alpha1(stream) => Ok(stream
                .message()
                .await?
                .map(|message| message.devices.into_iter().map(Into::into).collect())),
        }
    }
}

/// `NodeWatchResources` of `service` at `endpoint`, opened within `bound`;
/// `Err` says what failed.
async fn open(endpoint: &str, service: HealthService, bound: Duration) -> Result<Messages, String> {
    let channel = dial(endpoint, bound).await?;
    let opened = tokio::time::timeout(bound, async {
        match service {
            HealthService::V1 => {
                let mut client =
                    v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
                let stream = client.node_watch_resources(v1::NodeWatchResourcesRequest {}).await?;
                Ok(Messages::V1(stream.into_inner()))
            }
            HealthService::V1alpha1 => {
                let mut client =
                    v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
                let request = v1alpha1::NodeWatchResourcesRequest {};
                let stream = client.node_watch_resources(request).await?;
                Ok(Messages::V1alpha1(stream.into_inner()))
            }
        }
    });
    match opened.await {
        Err(_) => Err(format!("did not answer NodeWatchResources within {bound:?}")),
        Ok(Err(status)) => {
            Err(format!("answered NodeWatchResources with {}", status_text(&status)))
        }
        Ok(Ok(messages)) => Ok(messages),
    }
}

fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {:?}", status.code(), status.message())
}

/// A device's last report: its health and how long the kubelet trusts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Last {
    health: i32,
    timeout: Duration,
}

/// The devices of a message, by id.
fn by_id(devices: Vec<v1::DeviceHealth>) -> BTreeMap<DeviceId, Last> {
    devices
        .into_iter()
        .map(|health| {
            let id = health.device.unwrap_or_default();
            let timeout = health_timeout(health.health_check_timeout_seconds);
            ((id.pool_name, id.device_name), Last { health: health.health, timeout })
        })
        .collect()
}

/// One service's stream, read as the kubelet reads it.
struct Watch<'a> {
    service: HealthService,
    /// `None` when it did not open.
    messages: Option<Messages>,
    /// Whether it ended (or never opened): nothing more to judge.
    ended: bool,
    findings: Evidence,
    /// Every device's last report, and when it came.
    seen: BTreeMap<DeviceId, (Last, Instant)>,
    /// The devices of the last message.
    last: BTreeMap<DeviceId, Last>,
    /// Those of the last message before the hook ran.
    before: BTreeMap<DeviceId, Last>,
    /// When the stream opened.
    opened: Instant,
    watched: &'a Watched<'a>,
}

/// Why a watch stopped early: the stream ended or failed (already said).
struct Ended;

impl<'a> Watch<'a> {
    /// `service`'s stream, opened; a stream that did not open is said.
    async fn open(service: HealthService, watched: &'a Watched<'a>) -> Self {
        let opened = Instant::now();
        let mut findings = Evidence::default();
        let messages = match open(watched.endpoint, service, watched.bound).await {
            Ok(messages) => Some(messages),
            Err(why) => {
                findings.warn(format!(
                    "{service} is advertised, but {why}: the kubelet shows its devices' health \
                     Unknown"
                ));
                None
            }
        };
        Self {
            service,
            ended: messages.is_none(),
            messages,
            findings,
            seen: BTreeMap::new(),
            last: BTreeMap::new(),
            before: BTreeMap::new(),
            opened,
            watched,
        }
    }

    /// The first message, the prepared devices in it, and each device
    /// renewed within its timeout.
    async fn first_messages(&mut self) {
        if !self.ended {
            self.ended = self.judge_first().await.is_err();
        }
    }

    /// A device's health changed by the hook, in the whole list.
    async fn changed(&mut self) {
        if !self.ended {
            self.ended = self.judge_change().await.is_err();
        }
    }

    /// The next message, waited for until `deadline`: `Ok(None)` at the
    /// deadline; `Err` once the stream ended or failed, which is said.
    async fn next(&mut self, deadline: Instant) -> Result<Option<()>, Ended> {
        let Some(messages) = self.messages.as_mut() else { return Err(Ended) };
        let next = tokio::time::timeout_at(deadline, messages.next()).await;
        let devices = match next {
            Err(_) => return Ok(None),
            Ok(Ok(Some(devices))) => devices,
            Ok(Ok(None)) => return Err(self.ended("the driver ended the stream")),
            Ok(Err(status)) => {
                return Err(self.ended(&format!("the stream failed: {}", status_text(&status))));
            }
        };
        let now = Instant::now();
        self.last = by_id(devices);
        for (id, last) in &self.last {
            self.seen.insert(id.clone(), (last.clone(), now));
        }
        Ok(Some(()))
    }

    fn ended(&mut self, how: &str) -> Ended {
        self.findings.warn(format!(
            "{}: {how}: the kubelet marks every device of the driver Unknown until it opens \
             the stream again, 5 s later (clearDriver)",
            self.service
        ));
        Ended
    }

    /// A finding of this stream, about `device` when it is about one.
    fn say(&mut self, mark: Mark, said: &str, device: Option<&DeviceId>) {
        let service = self.service;
        match device {
            Some((pool, device)) => {
                let said = format!("{service}: {pool}/{device} {said}");
                self.findings.add(mark, said).about(Subject::Device(format!("{pool}/{device}")));
            }
            None => {
                self.findings.add(mark, format!("{service}: {said}"));
            }
        }
    }

    /// [`first_messages`](Self::first_messages)'s judgement.
    async fn judge_first(&mut self) -> Result<(), Ended> {
        let bound = self.watched.bound;
        let deadline = self.opened + bound;
        if self.next(deadline).await?.is_none() {
            let said = format!(
                "no message within {bound:?}: the kubelet shows its devices' health Unknown"
            );
            self.say(Mark::Warn, &said, None);
            return Ok(());
        }
        let first = self.opened.elapsed();
        let said = format!(
            "first message {} ms after the stream opened, {} devices",
            first.as_millis(),
            self.last.len()
        );
        self.say(Mark::Pass, &said, None);
        // The prepared claim's devices, which the kubelet matches to the
        // pod by pool and name (`HandleWatchResourcesStream`).
        let prepared = self.watched.prepared.clone().unwrap_or_default();
        while prepared.iter().any(|id| !self.seen.contains_key(id)) {
            if self.next(deadline).await?.is_none() {
                break;
            }
        }
        for id in &prepared {
            if self.seen.contains_key(id) {
                self.say(Mark::Pass, "(prepared) is reported", Some(id));
            } else {
                let said = format!(
                    "(prepared) is not reported within {bound:?}: the pod's \
                     allocatedResourcesStatus shows it Unknown"
                );
                self.say(Mark::Warn, &said, Some(id));
            }
        }
        self.renewed().await
    }

    /// Each device reported again within its timeout, which the kubelet
    /// counts from its last report (`getHealthInfo`, `healthinfo.go`): an
    /// Unhealthy device not renewed turns Unknown. Timeouts beyond the
    /// default are not waited out.
    async fn renewed(&mut self) -> Result<(), Ended> {
        let first = self.seen.clone();
        let waited = |last: &Last| last.timeout <= DEFAULT_HEALTH_TIMEOUT;
        let deadlines = first.values().filter(|(last, _)| waited(last));
        let Some(deadline) = deadlines.map(|(last, at)| *at + last.timeout).max() else {
            return Ok(());
        };
        let again = |seen: &BTreeMap<DeviceId, (Last, Instant)>, id: &DeviceId, at: Instant| {
            seen.get(id).map(|(_, again)| *again).filter(|again| *again > at)
        };
        while first
            .iter()
            .any(|(id, (last, at))| waited(last) && again(&self.seen, id, *at).is_none())
        {
            if self.next(deadline).await?.is_none() {
                break;
            }
        }
        for (id, (last, at)) in &first {
            let said = match again(&self.seen, id, *at) {
                _ if !waited(last) => {
                    (Mark::Pass, format!("timeout {:?}: its renewal not waited for", last.timeout))
                }
                Some(again) if again - *at <= last.timeout => (
                    Mark::Pass,
                    format!(
                        "renewed {} ms after its report (timeout {:?})",
                        (again - *at).as_millis(),
                        last.timeout
                    ),
                ),
                _ => (
                    Mark::Warn,
                    format!(
                        "not reported again within its timeout {:?}: the kubelet shows it \
                         Unknown from then on, an Unhealthy one too (healthinfo.go)",
                        last.timeout
                    ),
                ),
            };
            self.say(said.0, &said.1, Some(id));
        }
        Ok(())
    }

    /// [`changed`](Self::changed)'s judgement: the hook has run.
    async fn judge_change(&mut self) -> Result<(), Ended> {
        let bound = self.watched.bound;
        let ran = Instant::now();
        let differs = |watch: &Self| {
            let before = &watch.before;
            watch
                .last
                .iter()
                .any(|(id, last)| before.get(id).is_some_and(|was| was.health != last.health))
        };
        while !differs(self) {
            if self.next(ran + bound).await?.is_none() {
                let said = format!(
                    "no health change within {bound:?} of the hook: a device that fails stays \
                     Healthy in the pods' status"
                );
                self.say(Mark::Warn, &said, None);
                return Ok(());
            }
        }
        let name = |health: i32| {
            v1::HealthStatus::try_from(health).map_or("UNKNOWN", |health| health.as_str_name())
        };
        let flipped: Vec<String> = self
            .last
            .iter()
            .filter_map(|((pool, device), last)| {
                let was = self.before.get(&(pool.clone(), device.clone()))?;
                (was.health != last.health)
                    .then(|| format!("{pool}/{device} {}→{}", name(was.health), name(last.health)))
            })
            .collect();
        let left_out: Vec<String> = self
            .before
            .keys()
            .filter(|id| !self.last.contains_key(*id))
            .map(|(pool, device)| format!("{pool}/{device}"))
            .collect();
        let took = ran.elapsed().as_millis();
        let flipped = flipped.join(", ");
        if left_out.is_empty() {
            let said = format!("{flipped} {took} ms after the hook, in the whole list");
            self.say(Mark::Pass, &said, None);
        } else {
            let said = format!(
                "the change ({flipped}) came in a message without {left_out:?}: each message is \
                 the whole list, so the kubelet shows those Unknown once their timeout passes"
            );
            self.say(Mark::Warn, &said, None);
        }
        Ok(())
    }
}
