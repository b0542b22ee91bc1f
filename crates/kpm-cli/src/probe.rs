//! `kpm probe SOCKET`: what would happen if this socket appeared in the
//! registry, without registering it. Dials, asks `GetInfo`, runs the
//! validation of the handler for the plugin's type, then checks the plugin's
//! own service read-only (CSI: `GetPluginInfo`, `NodeGetInfo`; device plugin:
//! `GetDevicePluginOptions` and the first `ListAndWatch` list; DRA: the
//! negotiated service answers). Exit 0 when it would register, 1 otherwise.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpm::Kubelet;
use kpm_api::constants::{MAX_PLUGIN_MESSAGE_BYTES, MAX_REGISTRATION_MESSAGE_BYTES};
use kpm_api::csi::v1::GetPluginInfoRequest;
use kpm_api::csi::v1::identity_client::IdentityClient;
use kpm_api::deviceplugin::v1beta1::Empty;
use kpm_api::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use kpm_api::dra::v1::dra_plugin_client::DraPluginClient as DraV1Client;
use kpm_api::dra::v1beta1::dra_plugin_client::DraPluginClient as DraV1beta1Client;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_api::registration::v1::{InfoRequest, PluginInfo};

use crate::CliError;
use crate::run::PluginKind;

#[derive(Debug, clap::Args)]
pub(crate) struct ProbeArgs {
    /// The registration socket to diagnose.
    socket: PathBuf,
    /// The kubelet root directory of the `kpm run` to judge by (DRA
    /// endpoints must be inside it).
    #[arg(long, value_name = "DIR", default_value = kpm::api::DEFAULT_ROOT_DIR, env = "KPM_ROOT_DIR")]
    root_dir: PathBuf,
    /// Plugin types that `kpm run` runs without a handler, comma-separated.
    #[arg(long, value_enum, value_name = "TYPES", value_delimiter = ',', env = "KPM_DISABLE")]
    disable: Vec<PluginKind>,
    /// How long each step may take, in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..=crate::MAX_PERIOD_SECS)
    )]
    timeout: u64,
}

/// One line of the report.
struct Step {
    name: &'static str,
    took: Duration,
    outcome: Result<String, String>,
}

pub(crate) async fn probe(args: ProbeArgs) -> Result<bool, CliError> {
    let timeout = Duration::from_secs(args.timeout);
    let mut steps = Vec::new();
    // The handlers `kpm run` would use, with nothing registered.
    let kubelet = crate::run::kubelet(&args.root_dir, &args.disable).liveness(None).build()?;
    let verdict = run_steps(&args.socket, &kubelet, timeout, &mut steps).await;
    let mut report = format!("probe {}\n", args.socket.display());
    for step in &steps {
        let (mark, detail) = match &step.outcome {
            Ok(detail) => ("ok  ", detail),
            Err(reason) => ("FAIL", reason),
        };
        let ms = step.took.as_secs_f64() * 1000.0;
        let _ = writeln!(report, "  {:<22} {mark} {ms:>8.1} ms  {detail}", step.name);
    }
    match &verdict {
        Ok(()) => report.push_str("verdict: would register\n"),
        Err(reason) => {
            let _ = writeln!(report, "verdict: would not register: {reason}");
        }
    }
    std::io::stdout().lock().write_all(report.as_bytes()).map_err(CliError::Output)?;
    Ok(verdict.is_ok())
}

/// Runs the steps in order, recording each; stops at the first failure.
async fn run_steps(
    socket: &Path,
    kubelet: &Kubelet,
    timeout: Duration,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let channel =
        step(steps, "dial", async { Ok((dial(socket, timeout).await?, String::new())) }).await?;

    let info = step(steps, "GetInfo", async {
        let mut client = RegistrationClient::new(channel)
            .max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
        let call = tokio::time::timeout(timeout, client.get_info(InfoRequest {})).await;
        let info = match call {
            Err(_) => return Err(format!("no answer within {timeout:?}")),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                return Err(format!(
                    "not a registration socket (pluginregistration.Registration is not served): {}",
                    status.message()
                ));
            }
            Ok(Err(status)) => return Err(status.to_string()),
            Ok(Ok(response)) => response.into_inner(),
        };
        kpm::check_info(&info).map_err(|reason| format!("invalid plugin info: {reason}"))?;
        let detail = format!(
            "type={} name={} endpoint={:?} versions={:?}",
            info.r#type, info.name, info.endpoint, info.supported_versions
        );
        Ok((info, detail))
    })
    .await?;

    let endpoint = kpm::plugin_endpoint(&info, socket);
    let started = Instant::now();
    let validated = kubelet.validate(socket, &info).await;
    let took = started.elapsed();
    let reason = match validated {
        Ok(()) => {
            let detail = format!("{} handler", info.r#type);
            steps.push(Step { name: "validate", took, outcome: Ok(detail) });
            return check_service(&info, &endpoint, timeout, steps).await;
        }
        // Nothing to validate with: the executor's refusal, in its words.
        Err(err @ kpm::Error::NoHandler { .. }) => {
            let reason = err.to_string();
            steps.push(Step { name: "handler", took, outcome: Err(reason.clone()) });
            return Err(reason);
        }
        Err(kpm::Error::Validate { source, .. }) => source.to_string(),
        Err(err) => err.to_string(),
    };
    steps.push(Step { name: "validate", took, outcome: Err(reason.clone()) });
    Err(format!("validate: {reason}"))
}

/// Read-only calls on the plugin's own service.
async fn check_service(
    info: &PluginInfo,
    endpoint: &str,
    timeout: Duration,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    match info.r#type.as_str() {
        kpm::api::CSI_PLUGIN => check_csi(endpoint, timeout, steps).await,
        kpm::api::DEVICE_PLUGIN => check_device_plugin(endpoint, timeout, steps).await,
        kpm::api::DRA_PLUGIN => check_dra(info, endpoint, timeout, steps).await,
        _ => Ok(()),
    }
}

async fn check_csi(endpoint: &str, timeout: Duration, steps: &mut Vec<Step>) -> Result<(), String> {
    step(steps, "csi GetPluginInfo", async {
        let channel = dial(kpm::csi::socket_path(endpoint), timeout).await?;
        let mut client =
            IdentityClient::new(channel).max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
        let response = answer(timeout, client.get_plugin_info(GetPluginInfoRequest {})).await?;
        Ok(((), format!("name={} vendor_version={}", response.name, response.vendor_version)))
    })
    .await?;
    step(steps, "csi NodeGetInfo", async {
        let node = kpm::csi::node_get_info(endpoint, timeout, kpm::transport::fd::budget())
            .await
            .map_err(|e| e.to_string())?;
        if node.node_id.is_empty() {
            return Err("the driver reports an empty node id".to_owned());
        }
        let detail = format!(
            "node_id={} max_volumes={} topology={:?}",
            node.node_id, node.max_volumes_per_node, node.topology
        );
        Ok(((), detail))
    })
    .await
}

async fn check_device_plugin(
    endpoint: &str,
    timeout: Duration,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let channel = step(steps, "device dial", async {
        Ok((dial(Path::new(endpoint), timeout).await?, String::new()))
    })
    .await?;
    let mut client =
        DevicePluginClient::new(channel).max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
    step(steps, "GetDevicePluginOptions", async {
        let options = answer(timeout, client.get_device_plugin_options(Empty {})).await?;
        let detail = format!(
            "pre_start_required={} get_preferred_allocation_available={}",
            options.pre_start_required, options.get_preferred_allocation_available
        );
        Ok(((), detail))
    })
    .await?;
    step(steps, "ListAndWatch (first)", async {
        let mut stream = answer(timeout, client.list_and_watch(Empty {})).await?;
        let first = tokio::time::timeout(timeout, stream.message())
            .await
            .map_err(|_| format!("no device list within {timeout:?}"))?
            .map_err(|status| status.to_string())?
            .ok_or("the stream ended before the first device list")?;
        let healthy = first.devices.iter().filter(|d| d.health == kpm::api::DEVICE_HEALTHY).count();
        Ok(((), format!("{} devices, {healthy} healthy", first.devices.len())))
    })
    .await
}

async fn check_dra(
    info: &PluginInfo,
    endpoint: &str,
    timeout: Duration,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let service = kpm::dra::choose_service(&info.supported_versions).map_err(|e| e.to_string())?;
    step(steps, "DRA service answers", async {
        let channel = dial(Path::new(endpoint), timeout).await?;
        // Preparing no claims changes nothing and proves the service is served.
        match service {
            kpm::dra::DraService::V1 => {
                let mut client =
                    DraV1Client::new(channel).max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
                let request = kpm_api::dra::v1::NodePrepareResourcesRequest { claims: Vec::new() };
                answer(timeout, client.node_prepare_resources(request)).await?;
            }
            kpm::dra::DraService::V1beta1 => {
                let mut client = DraV1beta1Client::new(channel)
                    .max_decoding_message_size(MAX_PLUGIN_MESSAGE_BYTES);
                let request =
                    kpm_api::dra::v1beta1::NodePrepareResourcesRequest { claims: Vec::new() };
                answer(timeout, client.node_prepare_resources(request)).await?;
            }
        }
        Ok(((), format!("{service} NodePrepareResources with no claims")))
    })
    .await
}

async fn dial(socket: &Path, timeout: Duration) -> Result<tonic::transport::Channel, String> {
    kpm::transport::dial(socket, timeout).await.map_err(|e| e.to_string())
}

/// Awaits a unary or streaming call within `timeout`.
async fn answer<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map(tonic::Response::into_inner)
        .map_err(|status| status.to_string())
}

/// Times `work`, records it as a step, and passes its value on.
async fn step<T>(
    steps: &mut Vec<Step>,
    name: &'static str,
    work: impl Future<Output = Result<(T, String), String>>,
) -> Result<T, String> {
    let started = Instant::now();
    let result = work.await;
    let took = started.elapsed();
    match result {
        Ok((value, detail)) => {
            steps.push(Step { name, took, outcome: Ok(detail) });
            Ok(value)
        }
        Err(reason) => {
            steps.push(Step { name, took, outcome: Err(reason.clone()) });
            if reason.starts_with(name) { Err(reason) } else { Err(format!("{name}: {reason}")) }
        }
    }
}
