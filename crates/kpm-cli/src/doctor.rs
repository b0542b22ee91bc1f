//! `kpm doctor`: why each plugin on a live node is or is not registered,
//! read-only, next to the real kubelet; a thin command on `kpm-doctor`.
//!
//! With an API server (`--kubeconfig`, or in a pod), it holds the plugins
//! against what the cluster shows of the node. It never notifies a plugin,
//! never creates, removes or renames anything, and closes every connection
//! when its call is done. Once, it never writes to the API server;
//! `--watch` keeps judging and publishes the node's condition and Events.
//!
//! With `--cluster` it judges no node itself: it reads back, read-only,
//! what every node's doctor published and what the API server shows of
//! each driver, and prints the fleet view (`kpm_fleet::read_fleet`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kpm_doctor::bounds::{CONFIRM, PERIOD};
use kpm_doctor::{
    ApiLink, Doctor, DoctorConfig, FlapConfig, Host, NodePublisher, PluginsCondition,
    PublishConfig, WatchConfig,
};
use kpm_fleet::{FleetConfig, PAGE_SIZE, STALE_AFTER};
use kpm_report::ConditionStatus;

use crate::error::CliError;
use crate::exit::Exit;
use crate::inspect::JudgeArgs;
use crate::output::OutputFormat;
use crate::setup::{self, LogFormat};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct DoctorArgs {
    #[command(subcommand)]
    explain: Option<ExplainCommand>,
    /// The kubelet's root directory, on the host [default: the `--root-dir`
    /// of a running kubelet (also inside MicroK8s' kubelite or k3s), else
    /// /var/lib/kubelet].
    #[arg(long, value_name = "DIR", env = "KPM_ROOT_DIR")]
    root_dir: Option<PathBuf>,
    /// Where the host's `/` is in this process's file system, in a pod that
    /// mounts it elsewhere (`kubectl debug node/NAME` puts it at /host):
    /// /proc, the kubelet root and the plugins' sockets are read under it;
    /// what it shows names the host's paths.
    #[arg(long, value_name = "DIR", default_value = "/", env = "KPM_HOST_ROOT")]
    host_root: PathBuf,
    /// Other kubelet roots to look for registries nobody watches; repeat for
    /// several [default: the well-known roots of kubeadm, k0s and microk8s].
    #[arg(long = "other-root", value_name = "DIR")]
    other_roots: Vec<PathBuf>,
    #[command(flatten)]
    judge: JudgeArgs,
    /// Hold the plugins against what this kubeconfig's API server shows of
    /// the node: CSINode and the CSI node-id annotation, device capacity,
    /// ResourceSlices. Inside a pod the service account is used without it.
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The node's name in the cluster [default: the hostname, lower-cased,
    /// as with the kubelet]. Of several kubelets on the host (kind, k3d, a
    /// kubelet in a container), the one that is this node is judged: by its
    /// --hostname-override or its config's hostnameOverride, else by its
    /// hostname. Without it and without an API server, the first whose
    /// registry can be read.
    #[arg(long, value_name = "NAME", env = "KPM_NODE_NAME")]
    node_name: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
    /// Judge no node here: read, from the API server, what every node's
    /// doctor (`kpm doctor --watch`) published in its KubeletPluginReport,
    /// and show for each driver the nodes it is registered on and why not
    /// on the others, and for each node its doctor's state. It reads the
    /// reports as a table (a row a node) and in full only where they fail;
    /// a Node, its CSINode and ResourceSlices only where no report speaks
    /// for them. Exits 1 when a node's doctor reports a failure or is
    /// silent. For a driver registered on some nodes and not others, names
    /// the DaemonSet serving it and why its pod does not work on each
    /// other node (a taint not tolerated, its nodeSelector, Pending,
    /// crash-looping). Reads only; needs `get` and `list` on
    /// kubeletpluginreports, nodes, csidrivers, csinodes, resourceslices
    /// and pods, and `get` on daemonsets. Uses --kubeconfig, else the
    /// service account in a pod, else ~/.kube/config.
    #[arg(long)]
    cluster: bool,
    /// With --cluster: only the nodes this label selector selects
    /// (`node-role.kubernetes.io/gpu`, `pool in (a,b)`).
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "cluster")]
    selector: Option<String>,
    /// With --cluster: how many objects each list request asks for (the
    /// reports' and the Nodes' tables come whole from the API server's
    /// watch cache; the cross-check's lists are paged).
    #[arg(
        long,
        value_name = "N",
        default_value_t = kpm_fleet::DEFAULT_PAGE_SIZE,
        value_parser = clap::value_parser!(u32).range(PAGE_SIZES),
        requires = "cluster"
    )]
    page_size: u32,
    /// With --cluster: a doctor whose last heartbeat is older than this
    /// many seconds is silent (two of its heartbeat periods by default).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = kpm_fleet::DEFAULT_STALE_AFTER.as_secs(),
        value_parser = clap::value_parser!(u64).range(STALE_AFTER_SECS),
        requires = "cluster"
    )]
    stale_after: u64,
    /// With --cluster: read every node's Node, CSINode and ResourceSlices
    /// too, and hold each report against them (a report that shows a
    /// plugin registered where they do not, or the other way round, fails
    /// the fleet). It costs what the cluster weighs: a real Node is 10-30
    /// KB, so at 20,000 nodes hundreds of MB from the API server. For
    /// when a report is doubted, not for every minute. A report is as of
    /// its doctor's last pass: a disagreement that stays across two runs
    /// is one to look into.
    #[arg(long, requires = "cluster")]
    cross_check: bool,
    #[command(flatten)]
    watch: WatchArgs,
}

/// `kpm doctor explain`.
#[derive(Debug, clap::Subcommand)]
enum ExplainCommand {
    /// Say what a log line about plugin registration means: the kubelet's
    /// (`RegisterPlugin error -- …`, `… not found in the list of
    /// registered CSI drivers`, the device and DRA managers') or a
    /// plugin's (node-driver-registrar's, a device plugin's, a DRA
    /// driver's), or a pod's Event (`UnexpectedAdmissionError`, `Failed to
    /// prepare dynamic resources`): the doctor's verdict for it, its cause
    /// and its fix. gRPC's generic words (`connection refused`, `transport
    /// is closing`, …) are explained by the socket, resource or driver the
    /// line names; a line that names none is not explained, with what it
    /// would need. Without LINE, reads lines from stdin (a log piped in) and
    /// explains each it knows. Exits 0 when every LINE given (or at least
    /// one line read) is known, 1 otherwise.
    Explain {
        /// The log lines, each one argument (quote it).
        lines: Vec<String>,
    },
}

/// --page-size, as the fleet reader takes it ([`PAGE_SIZE`]).
const PAGE_SIZES: std::ops::RangeInclusive<i64> = PAGE_SIZE.min as i64..=PAGE_SIZE.max as i64;

/// --stale-after in seconds, as the fleet reader takes it ([`STALE_AFTER`]).
const STALE_AFTER_SECS: std::ops::RangeInclusive<u64> =
    STALE_AFTER.min.as_secs()..=STALE_AFTER.max.as_secs();

/// --confirm-ms's longest, as [`CONFIRM`] takes it.
#[allow(clippy::cast_possible_truncation, reason = "a minute in milliseconds")]
const CONFIRM_MS: u64 = CONFIRM.max.as_millis() as u64;

/// --period, --heartbeat, --flap-window and --flap-hold in seconds, as the
/// doctor's configs take them ([`PERIOD`]), so that clap refuses the others
/// at once.
const PERIOD_SECS: std::ops::RangeInclusive<u64> = PERIOD.min.as_secs()..=PERIOD.max.as_secs();

/// `--watch`: judge on every change and publish, until SIGINT or SIGTERM.
#[derive(Debug, clap::Args)]
struct WatchArgs {
    /// Keep judging the node (on every change of the registry,
    /// device-plugins/ or the device manager's checkpoint, on a plugin's
    /// exit, and every --period) and, with an API server, publish its
    /// condition KubeletPluginsHealthy and Events on its Node; until SIGINT
    /// or SIGTERM. Read-only on the node, as without.
    #[arg(long, conflicts_with = "cluster")]
    watch: bool,
    /// With --watch: a full pass at least this often, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, requires = "watch",
          value_parser = clap::value_parser!(u64).range(PERIOD_SECS))]
    period: u64,
    /// With --watch: the condition is written again after this many seconds
    /// without a change, to show that the doctor runs.
    #[arg(long, value_name = "SECONDS", default_value_t = 1800, requires = "watch",
          value_parser = clap::value_parser!(u64).range(PERIOD_SECS))]
    heartbeat: u64,
    /// With --watch: a change of the failures is published once a second
    /// pass this many milliseconds later agrees.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 3000, requires = "watch",
          value_parser = clap::value_parser!(u64).range(0..=CONFIRM_MS))]
    confirm_ms: u64,
    /// With --watch: a plugin that comes back to a state it was in (ok,
    /// stale, gone, ...) this many times within --flap-window is flapping,
    /// a failure, until it holds still for --flap-hold; a restart counts 2
    /// at most; 0 turns damping off.
    #[arg(long, value_name = "CHANGES", default_value_t = 3, requires = "watch")]
    flap_changes: u32,
    /// With --watch: how far back a plugin's changes count, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120, requires = "watch",
          value_parser = clap::value_parser!(u64).range(PERIOD_SECS))]
    flap_window: u64,
    /// With --watch: how long a flapping plugin must hold still before it is
    /// judged as it is again, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "watch",
          value_parser = clap::value_parser!(u64).range(PERIOD_SECS))]
    flap_hold: u64,
    /// With --watch: every this many seconds, send each plugin socket found
    /// ok a PING on a connection of its own, and judge at once when one
    /// does not answer (a plugin alive but hung); 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, requires = "watch",
          value_parser = clap::value_parser!(u64).range(0..=PERIOD.max.as_secs()))]
    look_every: u64,
    /// With --watch and an API server: also publish a condition of this one
    /// plugin (a CSI or DRA driver's name, a device plugin's resource),
    /// True while it is registered, for a gate on it such as a
    /// NodeReadinessRule: NAME gives the type NAME/PluginRegistered
    /// (DOMAIN/RESOURCE-PluginRegistered for a resource), NAME=TYPE another.
    /// Repeatable, or comma-separated. Ignored without --watch: the
    /// DaemonSet's environment reaches a `kubectl exec … kpm doctor` too.
    #[arg(long = "plugin-condition", value_name = "NAME[=TYPE]",
          value_delimiter = ',', env = "KPM_PLUGIN_CONDITIONS",
          value_parser = |spec: &str| kpm_doctor::PluginConditionType::parse(spec))]
    plugin_conditions: Vec<kpm_doctor::PluginConditionType>,
    /// With --watch: the doctor's own pod, as NAMESPACE/NAME (the
    /// DaemonSet sets it): when the doctor stops and its pod is not being
    /// deleted, the node is going down, and its conditions are left
    /// Unknown; a pod being deleted (a rollout) leaves them to its
    /// successor. Without it, every stop leaves them Unknown. Ignored
    /// without --watch, as --plugin-condition is.
    #[arg(long, value_name = "NAMESPACE/NAME", env = "KPM_POD",
          value_parser = |pod: &str| match pod.split_once('/') {
              Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                  Ok((namespace.to_owned(), name.to_owned()))
              }
              _ => Err(format!("{pod}: not NAMESPACE/NAME")),
          })]
    pod: Option<(String, String)>,
    /// With --watch: serve Prometheus metrics (and /healthz) on this address.
    #[arg(long, value_name = "HOST:PORT", requires = "watch")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// With --watch: the log format; the level comes from RUST_LOG.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "KPM_LOG_FORMAT")]
    log_format: LogFormat,
}

impl DoctorArgs {
    /// The doctor these flags describe, for node `node` when it is known.
    fn config(&self, node: Option<&str>) -> Result<DoctorConfig, CliError> {
        let mut config = DoctorConfig::builder()
            .host(Host::under(&self.host_root))
            .disabled(self.judge.disable.clone())
            .timeout(self.judge.timeout());
        if let Some(root) = &self.root_dir {
            config = config.root_dir(root);
        }
        if !self.other_roots.is_empty() {
            config = config.other_roots(self.other_roots.clone());
        }
        if let Some(node) = node {
            config = config.node_name(node);
        }
        Ok(config.build()?)
    }

    /// The node judged: `--node-name`, else, with an API server to ask
    /// about it, the hostname, as the kubelet names its Node.
    fn node(&self, client: Option<&kpm::kube::Client>) -> Result<Option<String>, CliError> {
        match (client, &self.node_name) {
            (_, Some(name)) => Ok(Some(name.clone())),
            (Some(_), None) => setup::node_name(None).map(Some),
            (None, None) => Ok(None),
        }
    }
}

pub(crate) async fn doctor(args: DoctorArgs) -> Result<Exit, CliError> {
    if let Some(ExplainCommand::Explain { lines }) = args.explain {
        return explain(&lines);
    }
    if args.watch.watch {
        return Box::pin(watch(args)).await.map(|()| Exit::Ok);
    }
    if args.cluster {
        return fleet(&args).await.map(Exit::from);
    }
    let client = setup::api_client(args.kubeconfig.as_deref()).await?;
    let node = args.node(client.as_ref())?;
    let doctor = Doctor::new(args.config(node.as_deref())?)?;
    let objects = match (client, node) {
        (Some(client), Some(name)) => {
            let timeout = args.judge.timeout();
            let config = kpm::kube::KubeConfig::default().request_timeout(timeout);
            // What the node's doctor published before says what a node
            // event may have lost since.
            let (objects, last) = tokio::join!(
                kpm::kube::observe_node(client.clone(), &name, config),
                kpm_doctor::last_report(client, &name, timeout)
            );
            match last {
                Ok(last) => doctor.remember(last.as_ref()),
                Err(err) => doctor.cannot_remember(kpm::api::error_chain(&err)),
            }
            Some(objects)
        }
        _ => None,
    };
    let report = doctor.examine(objects.as_ref()).await;
    crate::output::print(&args.output.render(&report, kpm_doctor::render_table)?)?;
    // The exit status is the condition `--watch` would publish, built the
    // same way, so that the two cannot disagree.
    match PluginsCondition::of(&report).status {
        ConditionStatus::True => Ok(Exit::Ok),
        ConditionStatus::False => Ok(Exit::Failing),
        // `Unknown`, and whatever a later kpm-doctor adds: never read as healthy.
        _ => {
            // The table ends with it; a script reading JSON finds it in its log too.
            if let (Some(blind), OutputFormat::Json) = (&report.blind, args.output) {
                eprintln!("kpm doctor: cannot judge this node: {}; try: {}", blind.why, blind.hint);
            }
            Ok(Exit::CannotJudge)
        }
    }
}

/// `kpm doctor --watch`: judges and publishes until SIGINT or SIGTERM.
async fn watch(args: DoctorArgs) -> Result<(), CliError> {
    setup::init_logging(args.watch.log_format)?;
    // Each pass dials every plugin and frees it all again: returned at once,
    // none of it stays with an idle doctor.
    crate::heap::return_freed_pages_at_once();
    let budget = setup::init_fd_budget().clone();
    let shutdown = setup::shutdown_signal()?;
    let timeout = args.judge.timeout();
    let client = setup::api_client(args.kubeconfig.as_deref()).await?;
    let node = args.node(client.as_ref())?;
    let doctor = Doctor::new(args.config(node.as_deref())?)?;
    tracing::info!(root = %doctor.root_dir().display(), "judging the node's plugins");
    let api = match (client, node) {
        (Some(client), Some(node)) => {
            tracing::info!(node, "publishing to the Kubernetes API");
            let config = PublishConfig::builder()
                .heartbeat(Duration::from_secs(args.watch.heartbeat))
                .request_timeout(timeout)
                .plugin_conditions(args.watch.plugin_conditions.clone())
                .build()?;
            let publisher = NodePublisher::new(client.clone(), node.clone(), config);
            let link = ApiLink::new(client, node, publisher);
            Some(match args.watch.pod.clone() {
                Some((namespace, name)) => link.own_pod(namespace, name),
                None => link,
            })
        }
        _ => None,
    };
    let metrics = kpm_doctor::DoctorMetrics::default();
    let serving = match args.watch.metrics_addr {
        Some(addr) => {
            let mut registry = prometheus_client::registry::Registry::default();
            metrics.register(&mut registry);
            let render = move || {
                let mut text = String::new();
                if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &registry) {
                    tracing::error!(error = %err, "cannot encode metrics");
                }
                text
            };
            let handshake = kpm::transport::DEFAULT_HANDSHAKE_TIMEOUT;
            Some(kpm_status::metrics::serve_registry(addr, render, budget, handshake).await?)
        }
        None => None,
    };
    let flaps = FlapConfig::try_new(
        Duration::from_secs(args.watch.flap_window),
        args.watch.flap_changes,
        Duration::from_secs(args.watch.flap_hold),
    )?;
    let config = WatchConfig::builder()
        .period(Duration::from_secs(args.watch.period))
        .confirm(Duration::from_millis(args.watch.confirm_ms))
        .flaps(flaps)
        .look((args.watch.look_every > 0).then(|| Duration::from_secs(args.watch.look_every)))
        .build()?;
    // Boxed: the watch holds its publisher's whole state across awaits.
    let result =
        Box::pin(kpm_doctor::NodeWatch::new(doctor, api, config, metrics).run(shutdown)).await;
    if let Some(serving) = serving {
        serving.abort();
    }
    Ok(result?)
}

/// `kpm doctor --cluster`: the fleet view; `Ok(false)` when a node's doctor
/// reports a failure or is silent.
async fn fleet(args: &DoctorArgs) -> Result<bool, CliError> {
    let client = match setup::api_client(args.kubeconfig.as_deref()).await? {
        Some(client) => client,
        // As kubectl does, for `kubectl kpm doctor --cluster`.
        None => match home_kubeconfig() {
            Some(path) => kpm::kube::client_from_kubeconfig(&path).await?,
            None => return Err(CliError::NoApiServer),
        },
    };
    let mut config = FleetConfig::builder()
        .page_size(args.page_size)
        .request_timeout(args.judge.timeout())
        .stale_after(Duration::from_secs(args.stale_after))
        .cross_check(args.cross_check);
    if let Some(selector) = &args.selector {
        config = config.label_selector(selector);
    }
    let config = config.build()?;
    let objects = kpm_fleet::read_fleet(&client, &config).await?;
    tracing::debug!(
        nodes = objects.nodes.len(),
        requests = objects.requests,
        bytes = objects.bytes,
        "read the fleet"
    );
    let fleet = kpm_fleet::judge_fleet(&objects, SystemTime::now(), config.stale_after());
    drop(objects);
    crate::output::print(&args.output.render(&fleet, kpm_fleet::render_fleet_table)?)?;
    Ok(fleet.ok())
}

/// `~/.kube/config`, when it exists.
fn home_kubeconfig() -> Option<PathBuf> {
    let path = Path::new(&std::env::var_os("HOME")?).join(".kube/config");
    path.is_file().then_some(path)
}

/// `kpm doctor explain`: each line given, or each line of stdin, read by
/// the doctor's table of known lines. A line with only gRPC's generic words
/// is not known: it is answered with what it would need to name.
fn explain(lines: &[String]) -> Result<Exit, CliError> {
    use kpm_doctor::Reading;
    let mut text = String::new();
    let known = if lines.is_empty() {
        let mut known = 0;
        // A log piped in holds many such lines: one sentence for them all.
        let mut unplaced = None;
        let mut unplaced_lines = 0;
        for (number, line) in std::io::stdin().lines().enumerate() {
            let line = line.map_err(CliError::ReadStdin)?;
            match kpm_doctor::read_line(&line) {
                Reading::Known(explained) => {
                    known += 1;
                    let _ =
                        writeln!(text, "line {}: {}\n{explained}\n", number + 1, excerpt(&line));
                }
                Reading::Unplaced(words) => {
                    unplaced_lines += 1;
                    unplaced.get_or_insert(words);
                }
                _ => {}
            }
        }
        if let Some(words) = unplaced {
            let _ = writeln!(text, "{unplaced_lines} line(s) not explained: {words}\n");
        }
        if known == 0 {
            text.push_str("no line about plugin registration that kpm knows\n");
        }
        known > 0
    } else {
        let mut all = true;
        for line in lines {
            match kpm_doctor::read_line(line) {
                Reading::Known(explained) => {
                    let _ = writeln!(text, "{}\n{explained}\n", excerpt(line));
                }
                Reading::Unplaced(words) => {
                    all = false;
                    let _ = writeln!(text, "{}\nnot explained: {words}\n", excerpt(line));
                }
                _ => {
                    all = false;
                    let _ = writeln!(
                        text,
                        "{}\nnot a line about plugin registration that kpm knows: run `kpm \
                         doctor` on the node to judge its plugins\n",
                        excerpt(line)
                    );
                }
            }
        }
        all
    };
    crate::output::print(&format!("{}\n", text.trim_end()))?;
    Ok(if known { Exit::Ok } else { Exit::Failing })
}

/// The start of a log line, for a heading.
fn excerpt(line: &str) -> String {
    const SHOWN: usize = 160;
    match line.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}
