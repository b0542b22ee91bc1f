//! The stub DRA driver.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use kpm_api::dra::{v1 as dra_v1, v1beta1 as dra_v1beta1};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use super::dra_health::DraDeviceHealth;
use super::{Misbehaviour, Misbehaviours};

/// Tells whether the claim `(namespace, name)` is allocated to another
/// driver: what a real driver reads in the claim's allocation, which the
/// stub, reading no API server, must be told.
type ForeignClaims = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// A DRA driver that prepares every claim, on both DRA plugin services:
/// `v1.DRAPlugin`, which kubelets 1.34 and later call, and
/// `v1beta1.DRAPlugin`, the one kubelets 1.32 and 1.33 speak (they know no
/// v1, and fall back to an older API for a plugin without v1beta1). The two
/// services' messages are the same on the wire.
///
/// By default a claim is prepared with no devices. With [`cdi`](Self::cdi)
/// each claim gets one device, defined in a CDI spec file of its own.
#[derive(Clone, Default)]
pub struct StubDraDriver {
    misbehaviours: Misbehaviours,
    cdi: Option<CdiSpecs>,
    foreign: Option<ForeignClaims>,
    checkpoint: Option<PathBuf>,
    health: Option<DraDeviceHealth>,
}

impl std::fmt::Debug for StubDraDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StubDraDriver")
            .field("misbehaviours", &self.misbehaviours)
            .field("cdi", &self.cdi)
            .field("foreign", &self.foreign.is_some())
            .field("checkpoint", &self.checkpoint)
            .field("health", &self.health.is_some())
            .finish()
    }
}

/// Where the driver writes CDI specs, and the pool of its device.
#[derive(Debug, Clone)]
struct CdiSpecs {
    dir: PathBuf,
    pool: String,
}

/// The CDI kind of the stub's devices.
const CDI_KIND: &str = "stub.example.com/device";
/// The prefix of the stub's spec files (the kind's vendor, as CDI names them).
const CDI_FILE_PREFIX: &str = "stub.example.com-";
/// The device of the pool every claim is prepared with; the one a
/// [`Misbehaviour::PrepareAnswersDifferently`] driver answers the second time.
const DEVICE: &str = "dev-0";
const OTHER_DEVICE: &str = "dev-1";
/// The pool of the devices whose health a driver without CDI specs reports.
const HEALTH_POOL: &str = "stub";
/// The request a device is answered for. The kubelet does not send a
/// claim's requests and the stub reads no ResourceClaim, so it names the
/// one `kpm check`'s claims make.
const REQUEST: &str = "kpm-check";

impl StubDraDriver {
    /// A driver that keeps every rule.
    pub fn new() -> Self {
        Self::default()
    }

    /// Breaks the rules named, those for DRA drivers
    /// ([`Misbehaviour::UnprepareUnknownFails`],
    /// [`Misbehaviour::PrepareAnswersUnsentClaim`], and with
    /// [`cdi`](Self::cdi) [`Misbehaviour::CdiIdUnresolved`],
    /// [`Misbehaviour::CdiSpecInvalid`],
    /// [`Misbehaviour::PrepareAnswersDifferently`],
    /// [`Misbehaviour::UnprepareLeavesSpec`],
    /// [`Misbehaviour::PreparesForeignClaim`], [`Misbehaviour::SpecPerDevice`],
    /// [`Misbehaviour::LatePrepareFails`], and with a
    /// [`checkpoint`](Self::checkpoint) [`Misbehaviour::ReprepareWithoutSpec`]);
    /// the others are ignored.
    #[must_use]
    pub fn misbehave(mut self, misbehaviours: impl IntoIterator<Item = Misbehaviour>) -> Self {
        self.misbehaviours = Misbehaviours::of(misbehaviours);
        self
    }

    /// Prepares each claim with device `dev-0` of `pool`, its CDI device
    /// `stub.example.com/device=<uid>-0` defined in the spec file
    /// `stub.example.com-<uid>.json` the driver writes in `dir` (and
    /// removes when the claim is unprepared).
    #[must_use]
    pub fn cdi(mut self, dir: impl Into<PathBuf>, pool: impl Into<String>) -> Self {
        self.cdi = Some(CdiSpecs { dir: dir.into(), pool: pool.into() });
        self
    }

    /// Claims for which `foreign(namespace, name)` holds are another
    /// driver's: prepared with no devices (unless
    /// [`Misbehaviour::PreparesForeignClaim`]).
    #[must_use]
    pub fn foreign_claims(
        mut self,
        foreign: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.foreign = Some(Arc::new(foreign));
        self
    }

    /// Keeps the uids of the claims it prepared in the file `path`, one a
    /// line, across its restarts, as real drivers checkpoint them (see
    /// [`Misbehaviour::ReprepareWithoutSpec`]).
    #[must_use]
    pub fn checkpoint(mut self, path: impl Into<PathBuf>) -> Self {
        self.checkpoint = Some(path.into());
        self
    }

    /// Serves `DRAResourceHealth`, `v1alpha1` and `v1`, on the same socket:
    /// its devices (`dev-0` and `dev-1` of the [`cdi`](Self::cdi) pool,
    /// else of pool `stub`) healthy, whose health the [`DraDeviceHealth`]
    /// returned changes; advertise the services with the registrar's
    /// versions. Breaks the health rules named in
    /// [`misbehave`](Self::misbehave) ([`Misbehaviour::HealthStreamEnds`],
    /// [`Misbehaviour::HealthOmitsDevice`], [`Misbehaviour::HealthNotRenewed`],
    /// [`Misbehaviour::HealthChangeNotSent`],
    /// [`Misbehaviour::HealthPartialUpdates`]).
    #[must_use]
    pub fn health(mut self) -> (Self, DraDeviceHealth) {
        let health = DraDeviceHealth::new();
        self.health = Some(health.clone());
        (self, health)
    }

    /// The `DRAPlugin` services, v1 and v1beta1, to serve on the driver's
    /// socket, and with [`health`](Self::health) `DRAResourceHealth`.
    pub fn routes(self) -> Routes {
        let checkpointed = self.checkpoint.as_deref().map(read_checkpoint).unwrap_or_default();
        if let Some(health) = &self.health {
            let pool = self.cdi.as_ref().map_or(HEALTH_POOL, |cdi| cdi.pool.as_str());
            health.report_healthy(pool, &[DEVICE, OTHER_DEVICE]);
        }
        let omitted = self.misbehaviours.has(Misbehaviour::HealthOmitsDevice).then_some(DEVICE);
        let (health, misbehaviours) = (self.health, self.misbehaviours.clone());
        let driver = Driver {
            misbehaviours: Arc::new(self.misbehaviours),
            cdi: self.cdi.map(Arc::new),
            foreign: self.foreign,
            prepared: Arc::new(Mutex::new(checkpointed.clone())),
            checkpointed: Arc::new(checkpointed),
            checkpoint: self.checkpoint.map(Arc::new),
            unprepared: Arc::default(),
        };
        let routes = Routes::new(dra_v1::dra_plugin_server::DraPluginServer::new(driver.clone()))
            .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(driver));
        match health {
            Some(health) => health.add_to(routes, &misbehaviours, omitted),
            None => routes,
        }
    }
}

/// The driver behind both services: what it was told to break, where its
/// CDI specs go, and the uids of the claims it prepared (to tell a claim
/// it never prepared, and one prepared again).
#[derive(Clone)]
struct Driver {
    misbehaviours: Arc<Misbehaviours>,
    cdi: Option<Arc<CdiSpecs>>,
    foreign: Option<ForeignClaims>,
    prepared: Arc<Mutex<HashSet<String>>>,
    /// The claims its checkpoint held when it started.
    checkpointed: Arc<HashSet<String>>,
    /// Where its checkpoint is, when it keeps one.
    checkpoint: Option<Arc<PathBuf>>,
    /// The claims it unprepared.
    unprepared: Arc<Mutex<HashSet<String>>>,
}

/// A claim as both services send it.
struct SentClaim {
    namespace: String,
    name: String,
    uid: String,
}

/// A claim's answer, as both services answer it.
#[derive(Default)]
struct Answer {
    /// `(pool, device, CDI device id)`.
    device: Option<(String, String, String)>,
    error: String,
}

impl Driver {
    /// The uid a [`Misbehaviour::PrepareAnswersUnsentClaim`] driver answers too.
    const UNSENT: &'static str = "never-sent";

    fn prepared(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        lock(&self.prepared)
    }

    /// Prepares `claims`: each uid with its answer.
    fn prepare(&self, claims: Vec<SentClaim>) -> Vec<(String, Answer)> {
        let mut answers: Vec<(String, Answer)> = claims
            .into_iter()
            .map(|claim| {
                let unprepared = lock(&self.unprepared).contains(&claim.uid);
                if unprepared && self.misbehaviours.has(Misbehaviour::LatePrepareFails) {
                    let error = format!("claim {} was unprepared", claim.uid);
                    return (claim.uid, Answer { device: None, error });
                }
                let again = !self.prepared().insert(claim.uid.clone());
                let answer = self.prepare_one(&claim, again);
                (claim.uid, answer)
            })
            .collect();
        self.write_checkpoint();
        if self.misbehaviours.has(Misbehaviour::PrepareAnswersUnsentClaim) {
            answers.push((Self::UNSENT.into(), Answer::default()));
        }
        answers
    }

    /// One claim's device and spec file, when the driver has CDI specs and
    /// the claim is its own; `again` when it was prepared before.
    fn prepare_one(&self, claim: &SentClaim, again: bool) -> Answer {
        let Some(cdi) = &self.cdi else { return Answer::default() };
        let foreign =
            self.foreign.as_ref().is_some_and(|foreign| foreign(&claim.namespace, &claim.name));
        if foreign && !self.misbehaviours.has(Misbehaviour::PreparesForeignClaim) {
            return Answer::default();
        }
        let (device, index) =
            if again && self.misbehaviours.has(Misbehaviour::PrepareAnswersDifferently) {
                (OTHER_DEVICE, 1)
            } else {
                (DEVICE, 0)
            };
        let cdi_name = format!("{}-{index}", self.spec_key(&claim.uid));
        let from_checkpoint = self.checkpointed.contains(&claim.uid)
            && self.misbehaviours.has(Misbehaviour::ReprepareWithoutSpec);
        let written = from_checkpoint
            || std::fs::write(
                spec_file(&cdi.dir, &self.spec_key(&claim.uid)),
                self.spec(&claim.uid, &cdi_name),
            )
            .is_ok();
        if !written {
            let error = format!("write the CDI spec in {}", cdi.dir.display());
            return Answer { device: None, error };
        }
        let answered = if self.misbehaviours.has(Misbehaviour::CdiIdUnresolved) {
            format!("{}-unresolved", claim.uid)
        } else {
            cdi_name
        };
        Answer {
            device: Some((cdi.pool.clone(), device.into(), format!("{CDI_KIND}={answered}"))),
            error: String::new(),
        }
    }

    /// What names claim `uid`'s CDI device and spec file: the uid, or the
    /// device for a [`Misbehaviour::SpecPerDevice`] driver.
    fn spec_key(&self, uid: &str) -> String {
        if self.misbehaviours.has(Misbehaviour::SpecPerDevice) {
            DEVICE.to_owned()
        } else {
            uid.to_owned()
        }
    }

    /// The CDI spec of claim `uid`: one device, `cdi_name`, setting
    /// `STUB_CLAIM=<uid>` (an entry without `=` for a
    /// [`Misbehaviour::CdiSpecInvalid`] driver).
    fn spec(&self, uid: &str, cdi_name: &str) -> String {
        let env = if self.misbehaviours.has(Misbehaviour::CdiSpecInvalid) {
            "STUB_CLAIM".to_owned()
        } else {
            format!("STUB_CLAIM={uid}")
        };
        let spec = serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": CDI_KIND,
            "devices": [{"name": cdi_name, "containerEdits": {"env": [env]}}],
        });
        spec.to_string()
    }

    /// Forgets `uids` and removes their spec files: each with its error,
    /// empty when none.
    fn unprepare(&self, uids: Vec<String>) -> Vec<(String, String)> {
        let fails = self.misbehaviours.has(Misbehaviour::UnprepareUnknownFails);
        let leaves_spec = self.misbehaviours.has(Misbehaviour::UnprepareLeavesSpec);
        let answers = self.unprepare_each(uids, fails, leaves_spec);
        self.write_checkpoint();
        answers
    }

    /// [`unprepare`](Self::unprepare)'s answers.
    fn unprepare_each(
        &self,
        uids: Vec<String>,
        fails: bool,
        leaves_spec: bool,
    ) -> Vec<(String, String)> {
        let mut prepared = self.prepared();
        lock(&self.unprepared).extend(uids.iter().cloned());
        uids.into_iter()
            .map(|uid| {
                let known = prepared.remove(&uid);
                let mut error = if fails && !known {
                    format!("claim {uid} is not prepared")
                } else {
                    String::new()
                };
                let cdi = self.cdi.as_ref().filter(|_| !leaves_spec);
                if let Some(removing) =
                    cdi.and_then(|cdi| remove_spec(&cdi.dir, &self.spec_key(&uid)))
                {
                    error = removing;
                }
                (uid, error)
            })
            .collect()
    }
}

impl Driver {
    /// Writes the prepared claims to the checkpoint, when it keeps one;
    /// a failure is only logged, as a real driver would retry.
    fn write_checkpoint(&self) {
        let Some(path) = &self.checkpoint else { return };
        let mut uids: Vec<String> = self.prepared().iter().cloned().collect();
        uids.sort();
        if let Err(err) = std::fs::write(path.as_path(), uids.join("\n")) {
            tracing::warn!(checkpoint = %path.display(), %err, "cannot write the checkpoint");
        }
    }
}

/// The claims a checkpoint file holds; none when it cannot be read.
fn read_checkpoint(path: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter(|line| !line.is_empty()).map(str::to_owned).collect()
}

/// `mutex` locked, whether or not a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The spec file named `key` (a claim's uid) in `dir`.
fn spec_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{CDI_FILE_PREFIX}{key}.json"))
}

/// Removes the spec file named `key`; an error other than its absence (a
/// claim never prepared, or already unprepared, has none).
fn remove_spec(dir: &Path, key: &str) -> Option<String> {
    match std::fs::remove_file(spec_file(dir, key)) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Some(format!("remove the CDI spec: {err}"))
        }
        _ => None,
    }
}

/// `DRAPlugin` of one API version: every claim prepared and unprepared.
macro_rules! prepare_every_claim {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for Driver {
            #[allow(clippy::needless_update, reason = "v1's Device has a share_id, v1beta1's not")]
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let sent = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| SentClaim {
                        namespace: claim.namespace,
                        name: claim.name,
                        uid: claim.uid,
                    })
                    .collect();
                let claims = self
                    .prepare(sent)
                    .into_iter()
                    .map(|(uid, answer)| {
                        let devices = answer
                            .device
                            .into_iter()
                            .map(|(pool_name, device_name, cdi_id)| $api::Device {
                                request_names: vec![REQUEST.into()],
                                pool_name,
                                device_name,
                                cdi_device_ids: vec![cdi_id],
                                ..$api::Device::default()
                            })
                            .collect();
                        (uid, $api::NodePrepareResourceResponse { devices, error: answer.error })
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let uids = request.into_inner().claims.into_iter().map(|claim| claim.uid).collect();
                let claims = self
                    .unprepare(uids)
                    .into_iter()
                    .map(|(uid, error)| (uid, $api::NodeUnprepareResourceResponse { error }))
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

prepare_every_claim!(dra_v1);
prepare_every_claim!(dra_v1beta1);
