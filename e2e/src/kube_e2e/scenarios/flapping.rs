//! The `flapping` scenario: a CSI driver that comes and goes, beside `kpm
//! doctor --watch` on the real kube-apiserver, with flap damping off and on.
//!
//! Three simulated nodes, each with `kpm run` as its kubelet and a doctor:
//! - `flap-before`: the driver present 4 s and gone 1 s, for 2 min, its
//!   doctor with `--flap-changes 0` (damping off, as before);
//! - `flap-after`: the same, its doctor as shipped;
//! - `flap-fast`: present 1 s, gone 1 s, its doctor as shipped.
//!
//! Checked through the API server and its audit log: the writes of each
//! doctor over the 2 min (condition, report, Events) are printed, the
//! damped one's condition writes are a handful; `flap-fast` shows
//! `Flapping` within the flap window; once the drivers stop, the damped
//! doctors publish the node healthy a hold later, with a `PluginStable`
//! Event.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::Cluster;
use super::fleet::{condition, events, start_doctor, start_kubelet};
use crate::command::Result;
use crate::kube_e2e::api::Api;
use crate::kube_e2e::cluster::Write;
use crate::kube_e2e::{DOCTOR_TOKEN, DOCTOR_USER, Env, KPM_TOKEN, STEP_TIMEOUT};
use crate::scenario::{Process, wait_until};

/// How long the drivers flap.
const FLAPPING: Duration = Duration::from_secs(120);
/// The shipped flap window and hold (`kpm doctor --flap-window`, `--flap-hold`).
const WINDOW: Duration = Duration::from_secs(120);
const HOLD: Duration = Duration::from_secs(60);
/// The driver that flaps.
const DRIVER: &str = "flap.example.com";

/// One node: its name, how its driver flaps, and its doctor's flags.
struct Flapper {
    node: &'static str,
    present: Duration,
    gone: Duration,
    doctor: &'static [&'static str],
}

const FLAPPERS: [Flapper; 3] = [
    Flapper {
        node: "flap-before",
        present: Duration::from_secs(4),
        gone: Duration::from_secs(1),
        doctor: &["--flap-changes", "0"],
    },
    Flapper {
        node: "flap-after",
        present: Duration::from_secs(4),
        gone: Duration::from_secs(1),
        doctor: &[],
    },
    Flapper {
        node: "flap-fast",
        present: Duration::from_secs(1),
        gone: Duration::from_secs(1),
        doctor: &[],
    },
];

pub(super) fn flapping(env: &Env, cluster: &mut Cluster) -> Result {
    let kpm_config = cluster.kubeconfig("kubeconfig", KPM_TOKEN)?;
    let doctor_config = cluster.kubeconfig("doctor-kubeconfig", DOCTOR_TOKEN)?;
    let mut running = Vec::new();
    for flapper in &FLAPPERS {
        cluster.create_node(flapper.node)?;
        let root = cluster.dir.path().join(flapper.node);
        fs::create_dir_all(root.join("plugins_registry"))?;
        let kubelet = start_kubelet(env, &root, flapper.node, &kpm_config)?;
        // The shipped heartbeat: every write counted is one the flapping made.
        let heartbeat = Duration::from_secs(30 * 60);
        let doctor = start_doctor(
            env,
            cluster,
            &root,
            flapper.node,
            &doctor_config,
            heartbeat,
            flapper.doctor,
        )?;
        running.push((kubelet, doctor, root));
    }
    let api = &cluster.api;
    wait_until("every flapping node's condition True", Duration::from_secs(60), || {
        Ok(FLAPPERS.iter().all(|f| condition(api, f.node).is_ok_and(|c| c["status"] == "True")))
    })?;
    let from = cluster.audit_offset();
    let started = Instant::now();
    let fast_flapping = std::thread::scope(|scope| -> Result<Option<Duration>> {
        let flappers: Vec<_> = FLAPPERS
            .iter()
            .zip(&running)
            .map(|(flapper, (_, _, root))| {
                let registry = root.join("plugins_registry");
                scope.spawn(move || flap(env, flapper, &registry).map_err(|err| err.to_string()))
            })
            .collect();
        // flap-fast shows as failing, Flapping, within the window.
        let mut fast = None;
        while started.elapsed() < FLAPPING && fast.is_none() {
            if condition(api, "flap-fast").is_ok_and(|c| c["reason"] == "Flapping") {
                fast = Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for flapper in flappers {
            flapper.join().map_err(|_| "a flapper panicked")??;
        }
        Ok(fast)
    })?;
    let counts = print_writes(&cluster.writes_by(DOCTOR_USER, from)?);
    let condition_writes =
        |node| counts.get(node).and_then(|c| c.get("condition")).copied().unwrap_or(0);
    if condition_writes("flap-after") > 6 {
        return Err(format!(
            "the damped doctor wrote its condition {} times in {FLAPPING:?}",
            condition_writes("flap-after")
        )
        .into());
    }
    if condition_writes("flap-before") < 20 {
        return Err("without damping, the doctor should have written on every cycle".into());
    }
    let fast = fast_flapping.ok_or("flap-fast never showed Flapping")?;
    if fast > WINDOW {
        return Err(format!("flap-fast showed Flapping after {fast:?}, past the window").into());
    }
    eprintln!("flap-fast: Flapping after {fast:?}");

    stable_again(api)?;
    drop(running);
    Ok(())
}

/// Counts each flapping node's doctor's writes by kind (condition, report,
/// event), and prints them.
fn print_writes(writes: &[Write]) -> BTreeMap<&'static str, BTreeMap<&'static str, usize>> {
    let mut counts: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for write in writes {
        let Some(flapper) = FLAPPERS
            .iter()
            .find(|f| write.name == f.node || write.name.starts_with(&format!("{}.", f.node)))
        else {
            continue;
        };
        let kind = match write.what.as_str() {
            "patch nodes/status" => "condition",
            "patch kubeletpluginreports/status" | "patch kubeletpluginreports" => "report",
            _ => "event",
        };
        *counts.entry(flapper.node).or_default().entry(kind).or_default() += 1;
    }
    eprintln!("writes of each doctor over {FLAPPING:?} of flapping (condition, report, Events):");
    for flapper in &FLAPPERS {
        let of = |kind| counts.get(flapper.node).and_then(|c| c.get(kind)).copied().unwrap_or(0);
        eprintln!(
            "  {:<12} {:?} present / {:?} gone, doctor {:<20} condition {:>3}, report {:>3}, events {:>3}",
            flapper.node,
            flapper.present,
            flapper.gone,
            if flapper.doctor.is_empty() {
                "as shipped".to_owned()
            } else {
                flapper.doctor.join(" ")
            },
            of("condition"),
            of("report"),
            of("event"),
        );
    }
    counts
}

/// The drivers are gone for good: a hold later, the damped nodes are
/// healthy again, with the story in their Events.
fn stable_again(api: &Api) -> Result {
    let stopped = Instant::now();
    for node in ["flap-after", "flap-fast"] {
        wait_until(
            &format!("{node} healthy a hold after the flapping"),
            HOLD + STEP_TIMEOUT,
            || Ok(condition(api, node).is_ok_and(|c| c["status"] == "True")),
        )?;
        let took = stopped.elapsed();
        let reasons: Vec<String> = events(api, node)?
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect();
        if !(reasons.iter().any(|r| r == "Flapping") && reasons.iter().any(|r| r == "PluginStable"))
        {
            return Err(format!("{node}'s Events do not tell the flapping: {reasons:?}").into());
        }
        eprintln!("{node}: healthy {took:?} after the flapping stopped; its Events: {reasons:?}");
    }
    Ok(())
}

/// Runs `flapper`'s driver in `registry`: started, stopped (it removes its
/// socket), started again, for [`FLAPPING`].
fn flap(env: &Env, flapper: &Flapper, registry: &std::path::Path) -> Result {
    let started = Instant::now();
    let registry = registry.display().to_string();
    let node_id = format!("{}-id", flapper.node);
    let args = ["--dir", &registry, "--type", "CSIPlugin", "--name", DRIVER, "--node-id", &node_id];
    let log = |suffix: &str| -> PathBuf {
        env.out.join(format!("flapping-{}-{DRIVER}.{suffix}", flapper.node))
    };
    while started.elapsed() < FLAPPING {
        let mut driver =
            Process::spawn(DRIVER, &env.example_plugin, &args, &log("out"), &log("err"))?;
        driver.wait_for_line("its socket served", STEP_TIMEOUT, |line| {
            line.starts_with("serving ")
        })?;
        // The pattern itself: these sleeps are the driver's life, not a wait
        // for an event.
        std::thread::sleep(flapper.present);
        driver.stop(STEP_TIMEOUT)?;
        std::thread::sleep(flapper.gone);
    }
    Ok(())
}
