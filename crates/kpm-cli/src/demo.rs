//! `kpm demo`: a plugin manager on a temporary root with example plugins of
//! all three types, showing live what kpm does, then exiting cleanly.

use std::path::Path;
use std::time::Duration;

use kpm_registrar::stub::{StubCsiDriver, StubDevicePlugin, StubDraDriver};
use kpm_registrar::{Registrar, RegistrationStatus};

use kpm::KubeletHandle;

use kpm_status::{EventLine, PluginList};

use crate::error::CliError;
use crate::{list, watch};

/// How long any one step of the demo may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
const GPU: &str = "example.com/gpu";
const CSI: &str = "csi.example.com";
const DRA: &str = "gpu.example.com";

pub(crate) async fn demo() -> Result<(), CliError> {
    let root =
        tempfile::tempdir().map_err(|err| CliError::Demo(format!("create a temp dir: {err}")))?;
    say(&format!("kpm demo: a plugin manager on {}", root.path().display()));
    let kubelet = kpm::Kubelet::builder().root_dir(root.path()).build()?;
    let handle = kubelet.handle();

    // Print every event as `kpm watch` would.
    let mut events = handle.manager().subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if let Some(line) = EventLine::new(&event).as_ref().and_then(watch::text_line) {
                println!("    {line}");
            }
        }
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(kubelet.run(async { drop(stopped.await) }));

    let outcome = script(root.path(), &handle).await;

    drop(stop);
    let stopped = running.await.map_err(|err| CliError::Demo(err.to_string()))?;
    printer.abort();
    outcome?;
    stopped?;
    say("done: the manager stopped and every plugin socket is gone");
    Ok(())
}

/// The scenes of the demo, in order.
async fn script(root: &Path, kubelet: &KubeletHandle) -> Result<(), CliError> {
    let registry = root.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);

    say("1. a device plugin with two GPUs registers through the plugin watcher");
    let (gpu_plugin, gpu_devices) =
        StubDevicePlugin::new([("gpu-0", "Healthy"), ("gpu-1", "Healthy")]);
    let gpu = serve(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, GPU).routes(gpu_plugin.clone().routes()),
        &registry,
    )
    .await?;
    registered(&gpu).await?;
    devices_healthy(kubelet, 2).await?;

    say("2. a CSI driver registers the way node-driver-registrar does");
    let csi_dir = root.join("plugins").join(CSI);
    let csi_socket = csi_dir.join("csi.sock");
    let csi_service =
        serve_service(&csi_socket, StubCsiDriver::new(CSI, "demo-node").routes()).await?;
    let csi = serve(
        Registrar::builder(kpm::api::CSI_PLUGIN, CSI).versions(["1.0.0"]).endpoint(&csi_socket),
        &registry,
    )
    .await?;
    registered(&csi).await?;

    say("3. a DRA driver registers like the kubelet plugin helper (<driver>-<uid>-reg.sock)");
    let dra_socket = root.join("plugins").join(DRA).join("dra.sock");
    let dra_service = serve_service(&dra_socket, StubDraDriver::new().routes()).await?;
    let dra = serve(
        Registrar::builder(kpm::api::DRA_PLUGIN, DRA)
            .versions([kpm::api::DRA_V1_SERVICE])
            .endpoint(&dra_socket)
            .rolling_update_uid("pod-1"),
        &registry,
    )
    .await?;
    registered(&dra).await?;
    show(kubelet);

    say("4. the device plugin restarts: its socket is re-created and it registers again");
    gpu.shutdown().await.map_err(|err| CliError::Demo(err.to_string()))?;
    let gpu = serve(
        Registrar::builder(kpm::api::DEVICE_PLUGIN, GPU).routes(gpu_plugin.routes()),
        &registry,
    )
    .await?;
    registered(&gpu).await?;

    say("5. gpu-1 goes unhealthy: allocatable drops to 1 of 2");
    gpu_devices.set([("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")]);
    devices_healthy(kubelet, 1).await?;

    say("6. the CSI driver is removed: it is deregistered and its node entries go");
    csi.shutdown().await.map_err(|err| CliError::Demo(err.to_string()))?;
    wait(|| kubelet.csi_drivers().is_empty(), "the CSI driver is deregistered").await?;
    show(kubelet);

    say("7. everything stops");
    for plugin in [gpu, dra] {
        plugin.shutdown().await.map_err(|err| CliError::Demo(err.to_string()))?;
    }
    csi_service.abort();
    dra_service.abort();
    wait(|| kubelet.manager().status().is_empty(), "every plugin is deregistered").await
}

fn say(line: &str) {
    println!("\n==> {line}");
}

/// Prints what `kpm list` would show.
fn show(kubelet: &KubeletHandle) {
    for line in list::table(&PluginList::from(kubelet)).lines() {
        println!("    | {line}");
    }
}

async fn serve(
    builder: kpm_registrar::RegistrarBuilder,
    dir: &Path,
) -> Result<Registrar, CliError> {
    builder.socket_dir(dir).serve().await.map_err(|err| CliError::Demo(err.to_string()))
}

/// Serves a plugin's own service on `socket` in a task.
async fn serve_service(
    socket: &Path,
    routes: tonic::service::Routes,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|err| CliError::Demo(format!("create {}: {err}", dir.display())))?;
    }
    let incoming =
        kpm::transport::bind(socket).await.map_err(|err| CliError::Demo(err.to_string()))?;
    let server =
        tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming);
    Ok(tokio::spawn(async move {
        if let Err(err) = server.await {
            tracing::warn!(error = %err, "demo service stopped");
        }
    }))
}

/// Waits until the plugin is told it is registered.
async fn registered(plugin: &Registrar) -> Result<(), CliError> {
    let mut status = plugin.status();
    let told = tokio::time::timeout(
        STEP_TIMEOUT,
        status.wait_for(|s: &Option<RegistrationStatus>| {
            s.as_ref().is_some_and(|s| s.plugin_registered)
        }),
    )
    .await;
    match told {
        Ok(Ok(_)) => {
            println!("    plugin {} was told: registered", plugin.plugin_info().name);
            Ok(())
        }
        _ => Err(CliError::Demo(format!(
            "{} was not registered within {STEP_TIMEOUT:?}: {:?}",
            plugin.socket_path().display(),
            plugin.statuses()
        ))),
    }
}

async fn devices_healthy(kubelet: &KubeletHandle, healthy: usize) -> Result<(), CliError> {
    let resource = || kubelet.devices().resource(GPU);
    wait(|| resource().is_some_and(|r| r.healthy == healthy), "the devices are reported").await?;
    if let Some(r) = resource() {
        println!("    {GPU}: {}/{} devices healthy", r.healthy, r.healthy + r.unhealthy);
    }
    Ok(())
}

async fn wait(mut condition: impl FnMut() -> bool, what: &str) -> Result<(), CliError> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            return Err(CliError::Demo(format!("timed out waiting until {what}")));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
