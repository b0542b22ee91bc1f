//! Every check's unit tests, through one helper: a scripted plugin in
//! (kpm-registrar's stubs, served in this process and misbehaving as told),
//! the report out, on paused time. `xtask tidy` wants each `Check` named
//! in a test here; the binary's end-to-end tests (`kpm-cli`'s
//! `tests/check.rs`) run real processes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod csi;
mod device;
mod dra;
mod lifecycle;

use std::sync::Arc;
use std::time::Duration;

use kpm_api::constants::{DRA_HEALTH_V1_SERVICE, DRA_HEALTH_V1ALPHA1_SERVICE};
use kpm_registrar::Registrar;
use kpm_registrar::stub::{
    DeviceList, DraDeviceHealth, Misbehaviour, StubCsiDriver, StubDevicePlugin, StubDraDriver,
};
use kpm_test_support::api_server::{self, Shared, State};
use parking_lot::Mutex;
use serde_json::json;

use crate::{Check, Config, Mark, PluginEnv, Report, Stop, Suite};

/// The device plugin's resource.
const GPU: &str = "vendor.com/gpu";
/// The CSI driver's name.
const CSI_DRIVER: &str = "csi.example.com";
/// The DRA driver's name, and the node (and pool) of its slice.
const DRA_DRIVER: &str = "gpu.example.com";
const NODE: &str = crate::DEFAULT_NODE;

/// What a scripted plugin is.
#[derive(Debug, Clone)]
enum Kind {
    /// A device plugin on a registration socket, three devices.
    Device,
    /// A device plugin registering on `kubelet.sock`.
    KubeletSock,
    /// A CSI driver with node id `node-1` and the topology `(key, value)`.
    Csi(&'static str, &'static str),
    /// A DRA driver offering `versions` (kpm-registrar's when empty).
    Dra(&'static [&'static str]),
}

/// A plugin for [`check`]: a stub of `kind`, breaking the rules it is told to.
#[derive(Debug, Clone)]
struct Scripted {
    kind: Kind,
    misbehaviours: Vec<Misbehaviour>,
    /// `GetInfo` answered this late.
    get_info_delay: Duration,
    /// How it behaves besides its services.
    quirks: Vec<Quirk>,
    /// Its registration socket renamed to this once served: off the
    /// naming convention.
    socket_name: Option<&'static str>,
    /// The DRA driver's API server: its ResourceSlice, its claims.
    api: Option<DraApi>,
    /// The DRA driver serves `DRAResourceHealth` (and advertises it, unless
    /// its versions are given).
    health: bool,
}

/// How a scripted plugin behaves besides its services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quirk {
    /// On stop, its registration socket is left behind, as a process that
    /// exits without cleaning up leaves it.
    NoCleanup,
    /// On `kubelet.sock`: registers once, never again.
    NoReregister,
    /// It has a health-change hook: a device goes unhealthy.
    HealthChange,
    /// A device plugin that turns every device unhealthy when the kubelet
    /// registers it a second time (its restart).
    UnhealthyAfterKubeletRestart,
    /// A device plugin whose registration socket carries its instance
    /// (`{instance}`), so that two run side by side.
    SocketPerInstance,
    /// A device plugin on a registration socket that takes the path over
    /// from a running instance, and removes the file there when it stops,
    /// whoever's it is (as Go plugins do: `os.Remove` before `Listen` and
    /// after `Stop`).
    StealsSocket,
}

/// The stand-in API server of a DRA check, and what the driver does with it.
#[derive(Debug, Clone)]
struct DraApi {
    state: Shared,
    /// The device of the ResourceSlice the driver publishes, if it does.
    publishes: Option<serde_json::Value>,
    /// Whether it publishes it again when it is gone, as the kubelet
    /// plugin helper's controller does.
    republishes: bool,
    /// Each claim the driver read, by name, with its allocation results,
    /// in order.
    read: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
}

impl Scripted {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            misbehaviours: Vec::new(),
            get_info_delay: Duration::ZERO,
            quirks: Vec::new(),
            socket_name: None,
            api: None,
            health: false,
        }
    }

    fn device() -> Self {
        Self::new(Kind::Device)
    }

    fn csi() -> Self {
        Self::new(Kind::Csi("topology.example.com/node", "node-1"))
    }

    fn dra() -> Self {
        Self::new(Kind::Dra(&[]))
    }

    /// A DRA driver with an API server holding `slices` besides its own,
    /// which it publishes with `device` when there is one.
    fn dra_with_api(slices: Vec<serde_json::Value>, device: Option<serde_json::Value>) -> Self {
        let state = Arc::new(Mutex::new(State { slices, ..State::default() }));
        let api = DraApi { state, publishes: device, republishes: true, read: Arc::default() };
        Self { api: Some(api), ..Self::dra() }
    }

    /// A DRA driver publishing its slice with device `dev-0`.
    fn dra_publishing() -> Self {
        Self::dra_with_api(Vec::new(), Some(json!({"name": "dev-0"})))
    }

    /// Serving `DRAResourceHealth`.
    fn serving_health(mut self) -> Self {
        self.health = true;
        self
    }

    fn with(mut self, quirk: Quirk) -> Self {
        self.quirks.push(quirk);
        self
    }

    fn has(&self, quirk: Quirk) -> bool {
        self.quirks.contains(&quirk)
    }

    fn misbehave(mut self, misbehaviour: Misbehaviour) -> Self {
        self.misbehaviours.push(misbehaviour);
        self
    }

    /// The stand-in API server's state, when it has one.
    fn api_state(&self) -> Option<Shared> {
        self.api.as_ref().map(|api| Arc::clone(&api.state))
    }
}

/// What a scripted plugin's health-change hook acts on, once it serves.
#[derive(Debug, Default)]
struct Health {
    devices: Option<DeviceList>,
    dra: Option<DraDeviceHealth>,
}

impl Health {
    /// Turns the next healthy device unhealthy.
    fn fail_next(&self) -> Result<String, String> {
        let failed = match (&self.devices, &self.dra) {
            (Some(list), _) => list.fail_next(),
            (None, Some(dra)) => dra.fail_next(),
            (None, None) => return Err("no devices yet".into()),
        };
        failed.ok_or_else(|| "no healthy device left".into())
    }
}

/// Runs the suite on `scripted`, served in this process: its report.
async fn check(scripted: Scripted) -> Report {
    let devices: Arc<Mutex<Health>> = Arc::default();
    let serving = scripted.clone();
    let lists = Arc::clone(&devices);
    let serve: crate::Serve = Arc::new(move |env, stop| {
        let (scripted, lists) = (serving.clone(), Arc::clone(&lists));
        Box::pin(async move { serve(scripted, env, stop, &lists).await })
    });
    let mut config = Config::in_process("scripted", serve).bound(Duration::from_secs(5));
    if scripted.has(Quirk::HealthChange) {
        config = config.health_change_with(Arc::new(move || {
            let devices = Arc::clone(&devices);
            Box::pin(async move { devices.lock().fail_next().map(drop) })
        }));
    }
    if let Some(state) = scripted.api_state() {
        config = config.api_client(kube::Client::new(api_server::service(state), "default"));
    }
    Suite::try_new(config).unwrap().run().await.unwrap()
}

/// Serves `scripted` in `env` until `stop`.
async fn serve(scripted: Scripted, env: PluginEnv, stop: Stop, devices: &Mutex<Health>) {
    // What runs beside its services until it stops.
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let registrar = |kind: &str, name: &str| {
        let builder = Registrar::builder(kind, name)
            .socket_dir(&env.registry)
            .get_info_delay(scripted.get_info_delay);
        if scripted.has(Quirk::SocketPerInstance) {
            builder.rolling_update_uid(env.instance.clone())
        } else {
            builder
        }
    };
    // A Go plugin's `os.Remove` of its path before it listens.
    let stolen = env.registry.join("vendor.com_gpu-reg.sock");
    if scripted.has(Quirk::StealsSocket) {
        let _ = std::fs::remove_file(&stolen);
    }
    let served = match scripted.kind {
        Kind::Device | Kind::KubeletSock => {
            let (plugin, list) = StubDevicePlugin::new([
                ("gpu-0", "Healthy"),
                ("gpu-1", "Healthy"),
                ("gpu-2", "Healthy"),
            ]);
            devices.lock().devices = Some(list);
            let plugin = plugin
                .preferred_allocation()
                .pre_start_required()
                .misbehave(scripted.misbehaviours.iter().copied());
            if matches!(scripted.kind, Kind::KubeletSock) {
                return on_kubelet_sock(&scripted, &env, plugin, stop).await;
            }
            registrar(kpm::api::DEVICE_PLUGIN, GPU).routes(plugin.routes()).serve().await
        }
        Kind::Csi(key, value) => {
            let driver = StubCsiDriver::new(CSI_DRIVER, "node-1")
                .topology(key, value)
                .misbehave(scripted.misbehaviours.iter().copied());
            registrar(kpm::api::CSI_PLUGIN, CSI_DRIVER).routes(driver.routes()).serve().await
        }
        Kind::Dra(versions) => {
            let mut driver = StubDraDriver::new().misbehave(scripted.misbehaviours.iter().copied());
            // Kept in its plugins directory, which a reboot keeps.
            driver = driver.checkpoint(env.plugins.join("stub-dra.checkpoint"));
            let mut versions: Vec<String> = versions.iter().map(|v| (*v).to_owned()).collect();
            if scripted.health {
                let health;
                (driver, health) = driver.health();
                devices.lock().dra = Some(health);
                if versions.is_empty() {
                    let defaults = kpm_registrar::default_versions(kpm::api::DRA_PLUGIN);
                    let health = [DRA_HEALTH_V1ALPHA1_SERVICE, DRA_HEALTH_V1_SERVICE];
                    versions = defaults.iter().chain(&health).map(|v| (*v).to_owned()).collect();
                }
            }
            if let Some(api) = &scripted.api {
                if let Some(device) = &api.publishes {
                    publish_slice(&api.state, device);
                    if api.republishes {
                        let (state, device) = (Arc::clone(&api.state), device.clone());
                        tasks.push(tokio::spawn(republish(state, device)));
                    }
                }
                let (state, read) = (Arc::clone(&api.state), Arc::clone(&api.read));
                driver = driver
                    .cdi(&env.cdi, NODE)
                    .foreign_claims(move |namespace, name| !ours(&state, &read, namespace, name));
            }
            let builder = registrar(kpm::api::DRA_PLUGIN, DRA_DRIVER).routes(driver.routes());
            let builder = if versions.is_empty() { builder } else { builder.versions(versions) };
            builder.serve().await
        }
    };
    // A second instance that cannot bind beside the first exits, as a
    // process does.
    let Ok(registrar) = served else { return };
    if scripted.has(Quirk::UnhealthyAfterKubeletRestart)
        && let Some(list) = devices.lock().devices.clone()
    {
        tasks.push(tokio::spawn(unhealthy_at_second_registration(registrar.status(), list)));
    }
    let _tasks = AbortOnDrop(tasks);
    if let Some(name) = scripted.socket_name {
        // The registrar then leaves the renamed file alone: it is gone
        // from the path it bound.
        let renamed = env.registry.join(name);
        std::fs::rename(registrar.socket_path(), &renamed).unwrap();
        stop.requested().await;
        std::fs::remove_file(&renamed).unwrap();
        registrar.shutdown().await.unwrap();
        return;
    }
    stop.requested().await;
    if scripted.has(Quirk::NoCleanup) {
        leave_socket_behind(registrar).await;
    } else {
        registrar.shutdown().await.unwrap();
    }
    if scripted.has(Quirk::StealsSocket) {
        let _ = std::fs::remove_file(&stolen);
    }
}

/// Tasks aborted when the plugin stops.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Publishes the driver's slice again whenever it is gone.
async fn republish(state: Shared, device: serde_json::Value) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let gone = state.lock().slices.iter().all(|slice| slice["spec"]["driver"] != DRA_DRIVER);
        if gone {
            publish_slice(&state, &device);
        }
    }
}

/// Turns every device of `list` unhealthy once the plugin is told
/// `registered: true` a second time: by the kubelet started anew.
async fn unhealthy_at_second_registration(
    mut status: tokio::sync::watch::Receiver<Option<kpm_registrar::RegistrationStatus>>,
    list: DeviceList,
) {
    let mut registrations = 0;
    loop {
        let told = status.borrow_and_update().as_ref().is_some_and(|told| told.plugin_registered);
        registrations += usize::from(told);
        if registrations == 2 {
            list.set([("gpu-0", "Unhealthy"), ("gpu-1", "Unhealthy"), ("gpu-2", "Unhealthy")]);
            return;
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Stops `registrar`'s server and leaves its socket file, as a process
/// that exits without cleaning up does: a hard link keeps the file while
/// the registrar removes its name.
async fn leave_socket_behind(registrar: Registrar) {
    let socket = registrar.socket_path().to_path_buf();
    let kept = socket.with_extension("kept");
    std::fs::hard_link(&socket, &kept).unwrap();
    registrar.shutdown().await.unwrap();
    std::fs::rename(&kept, &socket).unwrap();
}

/// A device plugin on `kubelet.sock`, serving in `device-plugins/` and
/// registering whenever `kubelet.sock` is new; or, when `no_reregister`,
/// registering once.
async fn on_kubelet_sock(
    scripted: &Scripted,
    env: &PluginEnv,
    plugin: StubDevicePlugin,
    stop: Stop,
) {
    let dir = &env.device_plugins;
    let endpoint = "gpu.sock";
    if !scripted.has(Quirk::NoReregister) {
        // A second instance on the same endpoint cannot bind: it exits.
        let _ = kpm_registrar::serve_device_plugin(
            dir,
            endpoint,
            GPU,
            plugin.routes(),
            stop.requested(),
        )
        .await;
        return;
    }
    while !dir.join(kpm::api::KUBELET_SOCKET_NAME).exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let incoming = kpm::transport::bind(&dir.join("gpu.sock")).await.unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(plugin.routes())
            .serve_with_incoming(incoming),
    );
    kpm_registrar::register_device_plugin(dir, "gpu.sock", GPU, Duration::from_secs(5))
        .await
        .unwrap();
    stop.requested().await;
    server.abort();
    let _ = std::fs::remove_file(dir.join("gpu.sock"));
}

/// The DRA driver's ResourceSlice of pool [`NODE`] with `device`.
fn resource_slice(created: Option<&str>, device: &serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-{DRA_DRIVER}"), "creationTimestamp": created},
        "spec": {"driver": DRA_DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [device]},
    })
}

/// Publishes the driver's slice with `device`, written now.
fn publish_slice(state: &Shared, device: &serde_json::Value) {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    state.lock().slices.push(resource_slice(Some(&now), device));
}

/// Whether the claim `namespace/name` is allocated to the DRA driver, as
/// the driver reads it from the API server; its results go to `read`.
fn ours(
    state: &Shared,
    read: &Mutex<Vec<(String, serde_json::Value)>>,
    namespace: &str,
    name: &str,
) -> bool {
    let state = state.lock();
    let Some(claim) = state.claims.get(&format!("{namespace}/{name}")) else { return false };
    let results = &claim["status"]["allocation"]["devices"]["results"];
    read.lock().push((name.to_owned(), results.clone()));
    results.as_array().into_iter().flatten().any(|result| result["driver"] == DRA_DRIVER)
}

/// Asserts that `check` ended `mark` with evidence saying `said`.
#[track_caller]
fn assert_check(report: &Report, check: Check, mark: Mark, said: &str) {
    let outcome = report.outcome(check).unwrap_or_else(|| panic!("no {check}: {}", report.text()));
    let evidence = outcome.evidence().said();
    assert!(
        outcome.mark() == mark && evidence.contains(said),
        "{check}: {:?} {evidence:?}, not {mark:?} with {said:?}:\n{}",
        outcome.mark(),
        report.text()
    );
}

/// Asserts that no check of `checks` failed.
#[track_caller]
fn assert_none_failed(report: &Report, checks: &[Check]) {
    for check in checks {
        let outcome = report.outcome(*check).unwrap_or_else(|| panic!("no {check}"));
        assert_ne!(outcome.mark(), Mark::Fail, "{check}:\n{}", report.text());
    }
}

/// The time an RFC 3339 string says, an hour ago.
fn an_hour_ago() -> String {
    let then = std::time::SystemTime::now() - Duration::from_secs(3600);
    humantime::format_rfc3339_seconds(then).to_string()
}
