//! An example plugin: serves a registration socket for one plugin, prints one
//! line per registration status the node agent sends, and removes its socket
//! on SIGINT or SIGTERM (which deregisters it).
//!
//! ```sh
//! cargo run -p kpm-registrar --features stub --example example_plugin -- --dir /tmp/x --name vendor.com/gpu
//! ```
//!
//! Without `--endpoint`, the plugin's own service is served on the
//! registration socket too, as a stub that lets a node agent complete the
//! registration: `DevicePlugin` (`--devices` healthy devices, two by
//! default) for `DevicePlugin`, CSI `Identity` and `Node` (`--node-id`,
//! `--topology`, `--max-volumes` or `--max-volumes-file`) for `CSIPlugin`, DRA v1 `DRAPlugin` for
//! `DRAPlugin` (with `--cdi-dir`, each claim prepared with device `dev-0`
//! of pool `--pool`, defined in a CDI spec it writes there; and
//! `DRAResourceHealth`, v1alpha1 and v1, advertised unless `--version` is
//! given, for its devices `dev-0` and `dev-1`). `--registration-only` leaves it out. SIGUSR1 turns the next
//! healthy device of the device-plugin or DRA stub unhealthy.
//!
//! Output: `serving <socket>`, then `registered: true` or
//! `registered: false: <reason>` per status, and `unhealthy: <device id>`
//! (`<pool>/<device>` for a DRA driver)
//! per SIGUSR1 that found a healthy device. Logs go to stderr (`RUST_LOG`).
//! Exit codes: 0 after a signal, 1 on failure (the message names the path),
//! 2 on usage errors.
//!
//! With `--kubelet-sock-dir DIR` it is a device plugin that registers
//! through `DIR/kubelet.sock` instead, as most device plugins do, and
//! registers again whenever `kubelet.sock` is created anew.
//!
//! The device-plugin stub offers `GetPreferredAllocation` with
//! `--preferred-allocation` and asks for `PreStartContainer` with
//! `--pre-start-required`.
//!
//! To see how a node agent treats a misbehaving plugin (`kpm check`'s
//! tests): `--get-info-delay-ms` answers `GetInfo` late, `--no-cleanup`
//! leaves the socket behind on SIGTERM, `--no-reregister` registers on
//! `kubelet.sock` only once, and `--misbehave NAME` (repeatable) breaks a
//! rule of the conversation that follows registration (the names are
//! kpm-registrar's `stub::Misbehaviour`, listed in `--help`).

use std::error::Error;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kpm_api::constants::{
    DEFAULT_ROOT_DIR, DEVICE_HEALTHY, DRA_HEALTH_V1_SERVICE, DRA_HEALTH_V1ALPHA1_SERVICE,
    KUBELET_SOCKET_NAME, PLUGINS_REGISTRY_DIR_NAME,
};
use kpm_registrar::stub::{
    DeviceList, Misbehaviour, StubCsiDriver, StubDevicePlugin, StubDraDriver,
};
use kpm_registrar::{CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN, Registrar, RegistrationStatus};
use tokio::signal::unix::{SignalKind, signal};

/// Serve a kubelet plugin registration socket and print the registration
/// statuses received.
// Field docs are `--help` text, where backticks would show; the flags are
// bools, as clap has them.
#[allow(clippy::doc_markdown, clippy::struct_excessive_bools)]
#[derive(Debug, Parser)]
#[command(name = "example_plugin")]
struct Args {
    /// Directory to create the registration socket in (the node agent's
    /// registry directory).
    #[arg(long, value_name = "DIR", default_value_t = default_dir())]
    dir: String,

    /// Plugin type: DevicePlugin, CSIPlugin, DRAPlugin, or anything else to
    /// see it rejected.
    #[arg(long = "type", value_name = "TYPE", default_value = DEVICE_PLUGIN)]
    plugin_type: String,

    /// Plugin name [default: example.com/demo for device plugins,
    /// demo.example.com otherwise].
    #[arg(long, value_name = "NAME")]
    name: Option<String>,

    /// A supported version to advertise; repeat for several [default:
    /// v1beta1 for DevicePlugin, 1.0.0 for CSIPlugin, v1.DRAPlugin,
    /// v1beta1.DRAPlugin, v1alpha1.DRAResourceHealth and v1.DRAResourceHealth
    /// for DRAPlugin].
    #[arg(long = "version", value_name = "V")]
    versions: Vec<String>,

    /// Socket of the plugin's own service, sent as the endpoint. Without it
    /// the endpoint is empty and a stub service runs on the registration
    /// socket.
    #[arg(long, value_name = "PATH")]
    endpoint: Option<PathBuf>,

    /// Rolling-update uid: names the socket <name>-<uid>-reg.sock (with
    /// --kubelet-sock-dir, the endpoint <name>-<uid>.sock).
    #[arg(long, value_name = "UID")]
    uid: Option<String>,

    /// Serve the registration service only, no stub of the plugin's service.
    #[arg(long)]
    registration_only: bool,

    /// DevicePlugin stub: the number of devices, dev-0 to dev-<N-1>, all
    /// healthy at the start.
    #[arg(long, value_name = "N", default_value_t = 2)]
    devices: usize,

    /// CSIPlugin stub: the node id reported by NodeGetInfo.
    #[arg(long, value_name = "ID", default_value = "example-node")]
    node_id: String,

    /// CSIPlugin stub: a segment of the accessible topology reported by
    /// NodeGetInfo; repeat for several.
    #[arg(long = "topology", value_name = "KEY=VALUE", value_parser = parse_segment)]
    topology: Vec<(String, String)>,

    /// CSIPlugin stub: max_volumes_per_node reported by NodeGetInfo (0: no
    /// limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_volumes: i64,

    /// CSIPlugin stub: report the number in this file as max_volumes_per_node,
    /// read at every NodeGetInfo (instead of --max-volumes): change the file
    /// to see kpm refresh the allocatable count.
    #[arg(long, value_name = "PATH", conflicts_with = "max_volumes")]
    max_volumes_file: Option<std::path::PathBuf>,

    /// Misbehave: answer GetInfo only after this many milliseconds (the
    /// kubelet waits 1000).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    get_info_delay_ms: u64,

    /// Misbehave: on SIGTERM, exit without removing the socket, as a
    /// plugin that is killed does.
    #[arg(long)]
    no_cleanup: bool,

    /// DevicePlugin: register through DIR/kubelet.sock, as most device
    /// plugins do, instead of a registration socket: serve the stub on
    /// DIR/<name>.sock, call Register on DIR/kubelet.sock, and register
    /// again each time kubelet.sock is created anew.
    #[arg(long, value_name = "DIR")]
    kubelet_sock_dir: Option<PathBuf>,

    /// Misbehave, with --kubelet-sock-dir: register once, never again when
    /// kubelet.sock is created anew (the kubelet restarted).
    #[arg(long)]
    no_reregister: bool,

    /// DevicePlugin stub: offer GetPreferredAllocation.
    #[arg(long)]
    preferred_allocation: bool,

    /// DevicePlugin stub: ask for PreStartContainer before each container.
    #[arg(long)]
    pre_start_required: bool,

    /// DRAPlugin stub: prepare each claim with a device, writing its CDI
    /// spec in this directory (as `kpm check`'s `{cdi}`); without it, claims
    /// are prepared with no devices.
    #[arg(long, value_name = "DIR")]
    cdi_dir: Option<PathBuf>,

    /// DRAPlugin stub with --cdi-dir: the pool of its device `dev-0`, as the
    /// driver's ResourceSlice names it.
    #[arg(long, value_name = "NAME", default_value = "kpm-check-node")]
    pool: String,

    /// Misbehave in the plugin's own service; repeat for several.
    #[arg(long = "misbehave", value_name = "NAME", value_parser = parse_misbehaviour)]
    misbehaviours: Vec<Misbehaviour>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("example_plugin: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn Error>> {
    let name = args.name.clone().unwrap_or_else(|| {
        if args.plugin_type == DEVICE_PLUGIN { "example.com/demo" } else { "demo.example.com" }
            .to_owned()
    });
    if let Some(dir) = &args.kubelet_sock_dir {
        return kubelet_sock_plugin(&args, &name, dir).await;
    }
    let mut builder = Registrar::builder(&args.plugin_type, &name).socket_dir(&args.dir);
    if !args.versions.is_empty() {
        builder = builder.versions(args.versions.clone());
    } else if args.plugin_type == DRA_PLUGIN && args.endpoint.is_none() && !args.registration_only {
        // The stub serves health too: say so, as the kubelet plugin helper
        // does for a driver that implements it.
        let health = [DRA_HEALTH_V1ALPHA1_SERVICE, DRA_HEALTH_V1_SERVICE];
        let versions = kpm_registrar::default_versions(DRA_PLUGIN).iter().chain(&health);
        builder = builder.versions(versions.map(|version| (*version).to_owned()));
    }
    if let Some(uid) = args.uid.clone() {
        builder = builder.rolling_update_uid(uid);
    }
    builder = builder.get_info_delay(Duration::from_millis(args.get_info_delay_ms));
    // What turns the stub's next healthy device unhealthy, for SIGUSR1.
    let mut fail_next: Option<Box<dyn Fn() -> Option<String>>> = None;
    if let Some(endpoint) = args.endpoint.clone() {
        builder = builder.endpoint(endpoint);
    } else if !args.registration_only {
        let routes = match args.plugin_type.as_str() {
            DEVICE_PLUGIN => {
                let (plugin, list) = device_plugin(&args);
                fail_next = Some(Box::new(move || list.fail_next()));
                plugin.routes()
            }
            CSI_PLUGIN => {
                let driver = args
                    .topology
                    .into_iter()
                    .fold(StubCsiDriver::new(&name, args.node_id), |driver, (key, value)| {
                        driver.topology(key, value)
                    })
                    .misbehave(args.misbehaviours.iter().copied());
                match args.max_volumes_file {
                    Some(path) => driver.max_volumes_file(path),
                    None => driver.max_volumes(args.max_volumes),
                }
                .routes()
            }
            DRA_PLUGIN => {
                let (driver, health) =
                    StubDraDriver::new().misbehave(args.misbehaviours.iter().copied()).health();
                fail_next = Some(Box::new(move || health.fail_next()));
                match args.cdi_dir {
                    Some(dir) => driver.cdi(dir, args.pool),
                    None => driver,
                }
                .routes()
            }
            _ => kpm_registrar::stub::routes(&args.plugin_type, &name),
        };
        builder = builder.routes(routes);
    }
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|err| format!("install SIGTERM handler: {err}"))?;
    let mut user1 = signal(SignalKind::user_defined1())
        .map_err(|err| format!("install SIGUSR1 handler: {err}"))?;

    let registrar = builder.serve().await?;
    println!("serving {}", registrar.socket_path().display());
    let mut status = registrar.status();
    let mut printed = 0;
    loop {
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    break;
                }
                // `status` keeps only the latest; the history has every one.
                let statuses = registrar.statuses();
                for received in &statuses[printed..] {
                    println!("{}", describe(received));
                }
                printed = statuses.len();
            }
            _ = user1.recv() => match &fail_next {
                Some(fail_next) => match fail_next() {
                    Some(id) => println!("unhealthy: {id}"),
                    None => eprintln!("example_plugin: SIGUSR1: no healthy device left"),
                },
                None => eprintln!("example_plugin: SIGUSR1: no device-plugin or DRA stub"),
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    if args.no_cleanup {
        // Leaves the socket file behind: nothing runs after this.
        std::process::exit(0);
    }
    registrar.shutdown().await?;
    Ok(())
}

/// A device plugin registering through `dir/kubelet.sock`: serves the stub
/// on `dir/<name>.sock` (`<name>-<uid>.sock` with `--uid`) and registers whenever `kubelet.sock` is new (once
/// only with `--no-reregister`), until SIGINT or SIGTERM.
async fn kubelet_sock_plugin(args: &Args, name: &str, dir: &Path) -> Result<(), Box<dyn Error>> {
    // Per instance with `--uid`, so that two run side by side.
    let file = match &args.uid {
        Some(uid) => format!("{}-{uid}.sock", name.replace('/', "_")),
        None => format!("{}.sock", name.replace('/', "_")),
    };
    let (plugin, _list) = device_plugin(args);
    println!("serving {}", dir.join(&file).display());
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|err| format!("install SIGTERM handler: {err}"))?;
    let stop = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    if !args.no_reregister {
        kpm_registrar::serve_device_plugin(dir, &file, name, plugin.routes(), stop).await?;
        return Ok(());
    }
    // Misbehaving: served and registered once, the way a plugin that
    // ignores the kubelet's restarts is.
    let endpoint = dir.join(&file);
    let incoming = kpm_transport::bind(&endpoint).await?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(plugin.routes())
            .serve_with_incoming(incoming),
    );
    let kubelet_sock = dir.join(KUBELET_SOCKET_NAME);
    while !kubelet_sock.exists() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kpm_registrar::register_device_plugin(dir, &file, name, Duration::from_secs(5)).await?;
    println!("registered with {}", kubelet_sock.display());
    stop.await;
    if !args.no_cleanup {
        let _ = std::fs::remove_file(&endpoint);
    }
    Ok(())
}

/// The device-plugin stub as the arguments ask: `--devices` healthy
/// devices `dev-0`…, its options and its misbehaviours.
fn device_plugin(args: &Args) -> (StubDevicePlugin, DeviceList) {
    let ids: Vec<String> = (0..args.devices).map(|i| format!("dev-{i}")).collect();
    let (mut plugin, list) =
        StubDevicePlugin::new(ids.iter().map(|id| (id.as_str(), DEVICE_HEALTHY)));
    if args.preferred_allocation {
        plugin = plugin.preferred_allocation();
    }
    if args.pre_start_required {
        plugin = plugin.pre_start_required();
    }
    (plugin.misbehave(args.misbehaviours.iter().copied()), list)
}

/// A name of `kpm_registrar::stub::Misbehaviour`, for `--misbehave`.
fn parse_misbehaviour(name: &str) -> Result<Misbehaviour, String> {
    name.parse().map_err(|err: kpm_registrar::stub::UnknownMisbehaviour| err.to_string())
}

/// `KEY=VALUE`, for `--topology`.
fn parse_segment(segment: &str) -> Result<(String, String), String> {
    match segment.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{segment:?} is not KEY=VALUE")),
    }
}

fn default_dir() -> String {
    format!("{DEFAULT_ROOT_DIR}/{PLUGINS_REGISTRY_DIR_NAME}")
}

fn describe(status: &RegistrationStatus) -> String {
    if status.error.is_empty() {
        format!("registered: {}", status.plugin_registered)
    } else {
        format!("registered: {}: {}", status.plugin_registered, status.error)
    }
}
