//! `readiness-gate`: the real Node Readiness Controller
//! (kubernetes-sigs/node-readiness-controller, its CRD from the folder of
//! real programs) against the node's kube-apiserver, and the doctor with a
//! condition of one device plugin. Twice, the kubelet restarts while the
//! plugin (`--no-reregister`) comes back only when its pod is deleted and
//! created again, ~20 s later, and a pod asking for one of its devices is
//! created meanwhile: first without the rules (the doctor's overlay sets
//! `KPM_PLUGIN_CONDITIONS` alone), then with `deploy/readiness`'s rules,
//! where the pod must stay Pending with a `FailedScheduling` naming the
//! taint until the plugin is registered again, then run.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::super::node::Node;
use super::super::{Env, NODE_NAME, START_TIMEOUT};
use super::device::{DEVICE_PLUGINS, LastStatus};
use super::doctor::CONDITION;
use super::doctor::one_doctor_pod;
use super::timeline::{Follow, Timeline, offset};
use super::{doctor_with_plugin_conditions, namespace_and_image, overlay, secs};
use crate::command::Result;
use crate::scenario::{Process, wait_until};

const GATE_NAMESPACE: &str = "readiness-gate";
const PLUGIN_POD: &str = "gate-plugin";
const RESOURCE: &str = "example.com/gate";
/// `NAME=TYPE`, as `deploy/readiness`'s ConfigMap takes it.
const PLUGIN_CONDITION: &str = "example.com/gate=example.com/gate-PluginRegistered";
const CONDITION_TYPE: &str = "example.com/gate-PluginRegistered";
/// The rules' taints (`deploy/readiness/rules.yaml`).
const TAINT: &str = "readiness.k8s.io/kpm-plugin";
const BOOTSTRAP_TAINT: &str = "readiness.k8s.io/kpm-plugin-bootstrap";
/// The controller's CRD, beside its program.
const CRD: &str = "node-readiness-controller.crd.yaml";
/// Where the controller's health probe listens, in the node's network.
const PROBE: &str = "127.0.0.1:18081";
/// How long after the kubelet's restart the plugin's pod comes back.
const LATE: Duration = Duration::from_secs(20);
/// What the example plugin prints for each Register the kubelet accepted
/// (`registered with …/kubelet.sock`).
const REGISTERED: &str = "registered with ";
/// The doctor's `--flap-window`, and a second.
const FLAP_WINDOW: Duration = Duration::from_secs(121);

/// `readiness-gate`: see the module.
pub(super) fn readiness_gate(env: &Env, node: &mut Node) -> Result<String> {
    let crd = env.bin_dir.join(CRD);
    node.kubectl(&["apply", "-f", &crd.display().to_string()])?;
    node.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/nodereadinessrules.readiness.node.x-k8s.io",
    ])?;
    let kubeconfig = node.admin_kubeconfig.display().to_string();
    let _controller = Process::spawn(
        "node-readiness-controller",
        &env.bin_dir.join("node-readiness-controller"),
        &["--kubeconfig", &kubeconfig, &format!("--health-probe-bind-address={PROBE}")],
        &env.out.join("node-readiness-controller.out"),
        &env.out.join("node-readiness-controller.log"),
    )?;
    wait_until("node-readiness-controller healthy", START_TIMEOUT, || {
        Ok(ureq::get(&format!("http://{PROBE}/healthz")).call().is_ok())
    })?;
    node.apply(&plugin_manifest())?;

    let follow = Follow {
        conditions: vec![CONDITION.to_owned(), CONDITION_TYPE.to_owned()],
        resources: vec![RESOURCE.to_owned()],
        taints: vec![TAINT.to_owned(), BOOTSTRAP_TAINT.to_owned()],
        pods: Some(GATE_NAMESPACE.to_owned()),
        ..Follow::default()
    };
    let timeline = Timeline::start(
        &node.api,
        follow,
        SystemTime::now(),
        "readiness-gate (origin: the controller started)",
    );

    let control = doctor_with_plugin_conditions(env, "readiness-control", PLUGIN_CONDITION)?;
    node.kubectl(&["apply", "-k", &control.display().to_string()])?;
    let control = printed(&timeline, run(node, &timeline, "control", false))?;
    // The doctor counts a plugin that comes back to a state it was in
    // within its flap window (120 s) as flapping, held 60 s: the second
    // restart waits for the first to leave the window, so that what is
    // measured is the gate's, not the doctor's damping.
    let last = timeline.changes().last().map_or_else(SystemTime::now, |c| c.at);
    let quiet = FLAP_WINDOW.saturating_sub(last.elapsed().unwrap_or_default());
    eprintln!("readiness-gate: {} for the doctor's flap window", secs(quiet));
    std::thread::sleep(quiet);

    let gated = overlay(
        env,
        "readiness-gate",
        &format!(
            "resources:\n  - @DEPLOY@/doctor\n{}configMapGenerator:\n  - name: kpm-readiness\n    \
             literals:\n      - plugin-condition={PLUGIN_CONDITION}\n    options:\n      \
             annotations:\n        config.kubernetes.io/local-config: \"true\"\n\
             components:\n  - @DEPLOY@/readiness\n",
            namespace_and_image()?
        ),
    )?;
    node.kubectl(&["apply", "-k", &gated.display().to_string()])?;
    let gate = printed(&timeline, run(node, &timeline, "gate", true))?;

    // Gone before the next scenario: the rules (the controller removes
    // their taints as it drops its finalizer). The plugin stays, registered:
    // gone, the kubelet would keep its devices, unhealthy, for 5 min, which
    // the doctor names `orphaned-capacity`, and the next scenario would wait
    // for that to end.
    node.kubectl(&["delete", "nodereadinessrules", "--all", "--wait=true"])?;
    Ok(format!("control: {control}; with the rules: {gate}"))
}

/// `outcome`, once the timeline is printed (when it failed too).
fn printed(timeline: &Timeline, outcome: Result<String>) -> Result<String> {
    eprintln!("{}", timeline.print());
    outcome
}

/// One kubelet restart with the plugin late and a pod created meanwhile:
/// what happened, in a line; with the rules, checked.
fn run(node: &mut Node, timeline: &Timeline, label: &str, gated: bool) -> Result<String> {
    let condition = format!("condition {CONDITION_TYPE}");
    let taint = format!("taint {TAINT}");
    let since = SystemTime::now();
    one_doctor_pod(node)?;
    timeline.wait(&condition, since, START_TIMEOUT, |v| v.starts_with("True"))?;
    if gated {
        timeline.wait(&taint, since, START_TIMEOUT, |v| v == "-")?;
    }
    let status_before = LastStatus::read(node)?;
    let restarted = SystemTime::now();
    node.restart_kubelet()?;
    let started = SystemTime::now();
    let failed = timeline.wait(&condition, started, START_TIMEOUT, |v| v.starts_with("False"))?;
    let tainted = if gated {
        Some(timeline.wait(&taint, started, START_TIMEOUT, |v| v == "NoSchedule")?)
    } else {
        None
    };
    let pod = format!("consumer-{label}");
    let created = SystemTime::now();
    node.api.post(&format!("/api/v1/namespaces/{GATE_NAMESPACE}/pods"), &consumer(&pod))?;
    node.wait_ready()?;
    let returned = status_before.wait_anew(node)?;

    // The plugin back late: its pod deleted and created again.
    std::thread::sleep(LATE.saturating_sub(restarted.elapsed().unwrap_or_default()));
    node.kubectl(&["delete", "pod", "-n", GATE_NAMESPACE, PLUGIN_POD, "--wait=true"])?;
    let recreated = SystemTime::now();
    node.apply(&plugin_manifest())?;
    let healthy = timeline.wait(&condition, recreated, START_TIMEOUT, |v| v.starts_with("True"))?;
    let registered = registered_at(node).unwrap_or(healthy);
    let untainted = if gated {
        Some(timeline.wait(&taint, recreated, START_TIMEOUT, |v| v == "-")?)
    } else {
        None
    };
    let what = format!("pod {pod}");
    let ended = timeline.wait(&what, created, START_TIMEOUT, |v| {
        v.starts_with("Running") || v.starts_with("Failed")
    })?;
    let outcome = timeline.current(&what).unwrap_or_default();
    let events = pod_events(node, &pod)?;
    eprintln!("readiness-gate {label}: {pod}'s events:");
    for event in &events {
        eprintln!("  {event}");
    }
    // Where the pod was bound, and when, from the timeline.
    let bound = timeline
        .changes()
        .into_iter()
        .find(|c| c.what == what && c.value.contains(" on "))
        .map(|c| c.at);
    let at = |t: SystemTime| format!("{:+.1} s", offset(started, t));
    let mut said = format!(
        "kubelet started; {CONDITION_TYPE} False {}; pod created {}",
        at(failed),
        at(created)
    );
    if let Some(tainted) = tainted {
        let _ = write!(said, ", taint {TAINT} {}", at(tainted));
    }
    let _ = write!(
        said,
        "; plugin pod again {}, registered {}, condition True {}",
        at(recreated),
        at(registered),
        at(healthy)
    );
    if let Some(untainted) = untainted {
        let _ = write!(
            said,
            ", taint removed {} ({:.1} s after the registration)",
            at(untainted),
            offset(registered, untainted)
        );
    }
    let _ = write!(
        said,
        "; pod bound {}, {outcome} {}; events: {}",
        bound.map_or_else(|| "never".to_owned(), at),
        at(ended),
        events.join(" | ")
    );
    node.kubectl(&["delete", "pod", "-n", GATE_NAMESPACE, &pod, "--wait=false"])?;
    no_true_while_lost(timeline, returned, registered, &said)?;
    if gated {
        // The 1.36 scheduler says `untolerated taint(s)`, without the key:
        // the taint is the one on the Node then (the timeline).
        let named = events.iter().any(|e| {
            e.contains("FailedScheduling") && (e.contains(TAINT) || e.contains("untolerated taint"))
        });
        let early = bound.is_none_or(|bound| bound < registered);
        if !named || early || !outcome.starts_with("Running") {
            return Err(format!(
                "with the rules, the pod must stay Pending with a FailedScheduling naming {TAINT} \
                 until the plugin registers, then run: {said}"
            )
            .into());
        }
    }
    eprintln!("readiness-gate {label}: {said}");
    Ok(said)
}

/// From the kubelet's `returned` until the plugin `registered` again, no
/// condition of the doctor's says True.
fn no_true_while_lost(
    timeline: &Timeline,
    returned: SystemTime,
    registered: SystemTime,
    said: &str,
) -> Result {
    for kind in [CONDITION, CONDITION_TYPE] {
        let what = format!("condition {kind}");
        let true_at = timeline.first(&what, returned, |v| v.starts_with("True"));
        if true_at.is_some_and(|at| at < registered) {
            return Err(format!("{kind} True while the plugin was not back: {said}").into());
        }
    }
    Ok(())
}

/// The plugin's pod, as the manifest has it for this node.
fn plugin_manifest() -> String {
    include_str!("../manifests/readiness-gate.yaml")
        .replace("@DEVICE_PLUGINS@", DEVICE_PLUGINS)
        .replace("@NODE@", NODE_NAME)
}

/// A pod asking for one of the plugin's devices, for the scheduler to place.
fn consumer(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": GATE_NAMESPACE},
        "spec": {"containers": [{
            "name": "app", "image": super::super::node::PAUSE_IMAGE, "imagePullPolicy": "Never",
            "resources": {"limits": {RESOURCE: "1"}},
        }]},
    })
}

/// When the plugin's pod logged the kubelet's acceptance of its Register
/// (its log's own timestamps), if it did.
fn registered_at(node: &Node) -> Option<SystemTime> {
    let log = node
        .kubectl(&["logs", "-n", GATE_NAMESPACE, PLUGIN_POD, "--timestamps"])
        .unwrap_or_default();
    log.lines()
        .filter(|line| line.contains(REGISTERED))
        .filter_map(|line| line.split_whitespace().next())
        .find_map(|time| humantime::parse_rfc3339_weak(time).ok())
}

/// The Events about pod `name`: `TYPE REASON: MESSAGE`, oldest first.
fn pod_events(node: &Node, name: &str) -> Result<Vec<String>> {
    let selector = format!("involvedObject.name={name}");
    let list = node.get(&["events", "-n", GATE_NAMESPACE, "--field-selector", &selector])?;
    let mut events: Vec<(String, String)> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let at = e["lastTimestamp"].as_str().or(e["eventTime"].as_str()).unwrap_or_default();
            (
                at.to_owned(),
                format!(
                    "{at} {} {}: {} (x{})",
                    e["type"].as_str().unwrap_or_default(),
                    e["reason"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default(),
                    e["count"].as_u64().unwrap_or(1)
                ),
            )
        })
        .collect();
    events.sort();
    Ok(events.into_iter().map(|(_, e)| e).collect())
}
