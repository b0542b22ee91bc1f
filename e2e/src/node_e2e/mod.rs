//! `cargo xtask node-e2e --bin-dir DIR [--kubelet-dir MINOR=DIR]... [--only
//! SCENARIO[,SCENARIO...]]`: kpm as operators
//! run it, on a real node: kpm's image built here (`cargo xtask image`), its
//! kustomize bases applied with `kubectl apply -k` as a user applies them,
//! real drivers in pods, the real kubelet with containerd and runc, and the
//! control plane that makes DaemonSets work (etcd, kube-apiserver with RBAC,
//! kube-controller-manager, kube-scheduler). Not part of `ci`: CI has no
//! kubelet.
//!
//! DIR holds the Kubernetes programs and the drivers, built from public
//! source (`docs/operations.md` says how); containerd, runc, the CNI plugins,
//! gcc and Prometheus come from Debian, installed when missing
//! (`crate::debian`). A
//! scenario whose program is missing is skipped and named as skipped. The
//! logs of every process are in `target/node-e2e`.
//!
//! Each `--kubelet-dir MINOR=DIR` runs the scenarios again on a node whose
//! kubelet is DIR's (`kubelets.rs`): one line per scenario and minor in the
//! summary, and a line for each minor of `kubelets::MINORS` not given. DIR
//! may hold the rest of that node's programs too (an older kubelet needs a
//! kube-apiserver at most three minors newer); what it lacks comes from
//! `--bin-dir`. Without `--kubelet-dir`, the node runs `--bin-dir`'s kubelet.
//!
//! The node runs in a private mount and network namespace and a cgroup of
//! its own (`host.rs`), which are emptied and removed at the end: the host is
//! left as it was found.
//!
//! The scenarios (`scenarios/`, in the order they run, each on what the
//! earlier ones deployed) are described in `docs/operations.md` ("A real
//! node"): `csi-driver`, `doctor`, `registrar-killed`, `driver-pod-deleted`,
//! `alert`, `device-plugin`, `kubelet-restart`, `cluster`,
//! `wrong-registration-path`, `csi-socket-in-registry`, `driver-never-starts`,
//! `leftover-after-uninstall` (the field guide's pod failures), `kpm-run`,
//! `footprint`, `dra`, `restart-window` (device plugins that never
//! register again after a kubelet restart), `readiness-gate` (the Node
//! Readiness Controller's taint while a plugin is not back),
//! `containerd-restart`, `reboot` (simulated), `registrar-plugins` and
//! `kubelet-upgrade` (1.35 to 1.36 in place, on a `--kubelet-dir 1.35`
//! node) on a kubelet rooted at `/var/lib/kubelet`, then `kubelet-root` on
//! a second node whose kubelet's root is `/var/lib/k0s/kubelet`.
//!
//! Before each scenario the runner waits for the node to settle from the
//! ones before (`scenarios/settle.rs`): a scenario that broke something
//! leaves the kubelet backing off, which the next would take for its own
//! failure. It says after how long, and what it waited for.
//!
//! The runner (this file: options, programs, images, the table of
//! scenarios, the summary) sits on `host` (namespaces, cgroups), `node` (the
//! daemons), `kubelets` (the kubelet axis), `images` (the images the pods
//! run) and `scenarios`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{Misused, Result};

mod host;
mod images;
mod kubelets;
mod node;
mod scenarios;

use kubelets::{KubeletDir, Programs};
use node::Node;
use scenarios::SCENARIOS;

/// The Node's name, as the kubelet registers it.
const NODE_NAME: &str = "kpm-node";
/// How long the daemons and a pod may take to start on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a daemon may take to exit on SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The kubelet's root of most scenarios, as on most nodes.
const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
/// Another kubelet root, as k0s has.
const OTHER_KUBELET_ROOT: &str = "/var/lib/k0s/kubelet";

/// What the scenarios share.
struct Env {
    root: PathBuf,
    /// The drivers, and the node's programs the kubelet's folder lacks.
    bin_dir: PathBuf,
    /// The node's programs.
    programs: Programs,
    /// The cargo target directory.
    target: PathBuf,
    /// `target/node-e2e`: logs, images, overlays.
    out: PathBuf,
}

/// The usage `--help` prints: the synopsis `cargo xtask node-e2e …`, then what
/// its words stand for.
pub fn usage() -> String {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    format!(
        "cargo xtask node-e2e --bin-dir DIR [--kubelet-dir MINOR=DIR]... \
         [--only SCENARIO[,SCENARIO...]]\n  MINOR: {}\n  SCENARIO: {}",
        kubelets::MINORS.join(", "),
        names.join(", ")
    )
}

/// Runs `cargo xtask node-e2e` in the workspace at `root` with `options`, the
/// words after its name; wrong ones are a [`Misused`].
pub fn run(root: &Path, options: &[&str]) -> Result {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    let (mut bin_dir, mut only, mut kubelet_dirs) = (None, None, Vec::new());
    let mut options = options.iter().copied();
    while let Some(option) = options.next() {
        match (option, options.next()) {
            ("--bin-dir", Some(dir)) => bin_dir = Some(std::path::absolute(dir)?),
            ("--kubelet-dir", Some(value)) => {
                kubelet_dirs
                    .push(KubeletDir::parse(value).map_err(|err| Misused(err.to_string()))?);
            }
            ("--only", Some(list)) if list.split(',').all(|name| names.contains(&name)) => {
                only = Some(list.split(',').collect::<Vec<_>>());
            }
            (option, value) => return Err(Misused::refused(option, value).into()),
        }
    }
    let bin_dir = bin_dir.ok_or_else(|| Misused::missing("--bin-dir DIR"))?;
    kubelet_dirs.sort_by(|a, b| a.minor.cmp(&b.minor));
    kubelet_dirs.dedup_by(|a, b| a.minor == b.minor);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    let programs = Programs { kubelet_dir: host::kubelet_dir(), bin_dir: bin_dir.clone() };
    let env =
        Env { root: root.to_path_buf(), bin_dir, programs, out: target.join("node-e2e"), target };

    // `--only` runs the scenarios named and those whose deployments they
    // work on.
    let wanted: Vec<&str> = match only {
        Some(only) => SCENARIOS
            .iter()
            .filter(|s| only.contains(&s.name))
            .flat_map(|s| s.builds_on.iter().copied().chain([s.name]))
            .collect(),
        None => names.clone(),
    };
    let selected: Vec<_> = SCENARIOS.iter().filter(|s| wanted.contains(&s.name)).collect();
    let missing = |programs: &[&str]| -> Vec<String> {
        programs
            .iter()
            .filter(|program| !env.bin_dir.join(program).is_file())
            .map(|program| (*program).to_owned())
            .collect()
    };

    if host::inside() {
        return inside(&env, &selected, &missing);
    }
    // One node per kubelet: `--bin-dir`'s, or each `--kubelet-dir`'s.
    let kubelets: Vec<Option<&KubeletDir>> =
        if kubelet_dirs.is_empty() { vec![None] } else { kubelet_dirs.iter().map(Some).collect() };
    let mut outcomes: Vec<(String, String)> = Vec::new();
    let mut prepared = false;
    for kubelet in kubelets {
        let programs =
            Programs { kubelet_dir: kubelet.map(|k| k.dir.clone()), bin_dir: env.bin_dir.clone() };
        let label = kubelet.map(|k| format!(" @{}", k.minor)).unwrap_or_default();
        let not_run = |why: String| -> Vec<(String, String)> {
            selected.iter().map(|s| (format!("{}{label}", s.name), why.clone())).collect()
        };
        let node_missing = programs.missing();
        if !node_missing.is_empty() {
            let folders = match &programs.kubelet_dir {
                Some(dir) => format!("{} or {}", dir.display(), env.bin_dir.display()),
                None => env.bin_dir.display().to_string(),
            };
            outcomes.extend(not_run(format!(
                "skipped: no node without {} in {folders}",
                node_missing.join(", ")
            )));
            continue;
        }
        if let Some(kubelet) = kubelet {
            match programs.check(&kubelet.minor) {
                Ok(versions) => eprintln!("\n=== node-e2e on {versions}"),
                Err(err) => {
                    outcomes.extend(not_run(format!("FAILED: {err}")));
                    continue;
                }
            }
        }
        if !prepared {
            images::install_host_packages()?;
            std::fs::create_dir_all(&env.out)?;
            // What an interrupted run left: its node's processes and cgroups.
            host::clean_up_cgroups()?;
            images::build(&env)?;
            prepared = true;
        }
        for (name, outcome) in nodes(&env, &selected, kubelet)? {
            outcomes.push((format!("{name}{label}"), outcome));
        }
    }
    if !kubelet_dirs.is_empty() {
        for minor in kubelets::MINORS.iter().filter(|m| kubelet_dirs.iter().all(|k| k.minor != **m))
        {
            outcomes.push((
                format!("kubelet {minor}"),
                format!("skipped: no --kubelet-dir {minor}=DIR"),
            ));
        }
    }
    crate::harness::report_outcomes("node-e2e", &env.bin_dir, &outcomes, &env.out)
}

/// Moves the logs of the node just run (its daemons' and its pods') to
/// `target/node-e2e/kubelet-MINOR`: the next minor's node writes the same
/// names.
fn keep_logs(out: &Path, minor: &str) -> Result {
    let dir = out.join(format!("kubelet-{minor}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        let log = path.extension().is_some_and(|ext| ext == "log" || ext == "out");
        if log || path.file_name().is_some_and(|name| name == "pods") {
            let name = path.file_name().ok_or("a log without a name")?;
            std::fs::rename(&path, dir.join(name))
                .map_err(|err| format!("keeping {}: {err}", path.display()))?;
        }
    }
    Ok(())
}

/// One node per kubelet root of the `selected` scenarios, each in
/// namespaces of its own, with the kubelet of `kubelet`'s folder (else
/// `--bin-dir`'s): each scenario's outcome. The logs of a `kubelet`'s
/// nodes are then kept apart ([`keep_logs`]).
fn nodes(
    env: &Env,
    selected: &[&scenarios::Scenario],
    kubelet: Option<&KubeletDir>,
) -> Result<Vec<(&'static str, String)>> {
    let kubelet_dir = kubelet.map(|kubelet| kubelet.dir.as_path());
    let mut roots: Vec<&str> = selected.iter().map(|s| s.kubelet_root).collect();
    roots.dedup();
    let mut outcomes = Vec::new();
    for kubelet_root in roots {
        let group: Vec<&'static str> =
            selected.iter().filter(|s| s.kubelet_root == kubelet_root).map(|s| s.name).collect();
        let state = tempfile::Builder::new().prefix("kpm-node-").tempdir_in("/tmp")?.keep();
        let outcomes_file = state.join(OUTCOMES);
        let node_outcomes = host::reexec_in_namespaces(&state, kubelet_root, kubelet_dir, || {
            Ok(std::fs::read_to_string(&outcomes_file).ok())
        });
        let node_outcomes: Vec<(String, String)> = match node_outcomes {
            Ok((_, Some(text))) => serde_json::from_str(&text)?,
            Ok((status, None)) => group
                .iter()
                .map(|name| {
                    (
                        (*name).to_owned(),
                        format!("FAILED: the node on {kubelet_root} ended ({status}) before it"),
                    )
                })
                .collect(),
            Err(err) => {
                group.iter().map(|name| ((*name).to_owned(), format!("FAILED: {err}"))).collect()
            }
        };
        for (name, outcome) in node_outcomes {
            let name = group.iter().find(|n| **n == name).copied().unwrap_or("?");
            outcomes.push((name, outcome));
        }
    }
    if let Some(kubelet) = kubelet {
        keep_logs(&env.out, &kubelet.minor)?;
    }
    Ok(outcomes)
}

/// Runs `scenario` on `node` once the node settled from the scenarios
/// before it, if it waits for that ([`scenarios::settle`]).
fn run_settled(env: &Env, node: &mut Node, scenario: &scenarios::Scenario) -> Result<String> {
    if scenario.waits_to_settle {
        eprintln!("{}", scenarios::settle(node)?);
    } else {
        eprintln!("settle: none waited for, {} takes the node as left", scenario.name);
    }
    (scenario.run)(env, node)
}

/// The file, in the state folder, where the node inside the namespaces
/// writes its scenarios' outcomes for the runner outside.
const OUTCOMES: &str = "outcomes.json";

/// Inside the namespaces: the node on the kubelet root it was given, then
/// each scenario of that root on it; their outcomes go to the state
/// folder's [`OUTCOMES`].
fn inside(
    env: &Env,
    selected: &[&scenarios::Scenario],
    missing: &dyn Fn(&[&str]) -> Vec<String>,
) -> Result {
    let state = host::state_dir()?;
    let kubelet_root = host::kubelet_root()?;
    host::prepare(&state)?;
    let mut node = Node::start(env, &kubelet_root, &images::archives(env))?;
    let mut outcomes = Vec::new();
    for scenario in selected.iter().filter(|s| Path::new(s.kubelet_root) == kubelet_root) {
        let absent = missing(scenario.programs);
        let outcome = if absent.is_empty() {
            eprintln!("\n== {}", scenario.name);
            match run_settled(env, &mut node, scenario) {
                Ok(summary) => format!("passed: {summary}"),
                // What this node's kubelet cannot do is not a failure.
                Err(err) => match err.downcast_ref::<scenarios::Skipped>() {
                    Some(skipped) => format!("skipped: {skipped}"),
                    None => format!("FAILED: {err}"),
                },
            }
        } else {
            format!("skipped: {} not in {}", absent.join(", "), env.bin_dir.display())
        };
        eprintln!("{}: {outcome}", scenario.name);
        outcomes.push((scenario.name, outcome));
    }
    if let Err(err) = node.save_pod_logs() {
        eprintln!("node-e2e: the pods' logs not saved: {err}");
    }
    drop(node);
    std::fs::write(state.join(OUTCOMES), serde_json::to_string(&outcomes)?)?;
    Ok(())
}
