//! CDI spec files as `kpm check` judges them: the spec files a DRA driver
//! wrote for the devices it prepared, and the CDI device ids it answered,
//! held to the Container Device Interface specification.
//!
//! The referee is the CDI package the container runtimes load specs with
//! (containerd and CRI-O use `tags.cncf.io/container-device-interface`,
//! `pkg/cdi` and `pkg/parser`): what it refuses is a [`Severity::Breaks`],
//! since the runtime then cannot start a container asking for the device.
//! What the specification's text demands but the package lets through
//! (absolute paths, a hook's positive timeout, a kind's lengths) is a
//! [`Severity::Stricter`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The CDI versions the package knows, newest first, as `specs-go/version.go`
/// lists them (a leading `v` is allowed).
const VERSIONS: [&str; 10] =
    ["1.1.0", "1.0.0", "0.8.0", "0.7.0", "0.6.0", "0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0"];

/// The hook names the package accepts (`validHookNames`).
const HOOK_NAMES: [&str; 6] =
    ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

/// How much a problem weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// The CDI package refuses it: the runtime cannot inject the device.
    Breaks,
    /// The specification's text demands it, the package lets it through.
    Stricter,
}

/// One problem of a spec file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) severity: Severity,
    pub(crate) what: String,
}

impl Problem {
    fn breaks(what: impl Into<String>) -> Self {
        Self { severity: Severity::Breaks, what: what.into() }
    }

    fn stricter(what: impl Into<String>) -> Self {
        Self { severity: Severity::Stricter, what: what.into() }
    }
}

/// A spec file read and judged: its kind, its devices' names and its
/// problems (a file that does not parse has no kind and no devices).
#[derive(Debug)]
pub(crate) struct SpecFile {
    pub(crate) path: PathBuf,
    pub(crate) kind: String,
    pub(crate) devices: Vec<String>,
    pub(crate) problems: Vec<Problem>,
}

impl SpecFile {
    /// Whether it defines `vendor/class=name`.
    pub(crate) fn defines(&self, kind: &str, name: &str) -> bool {
        self.kind == kind && self.devices.iter().any(|device| device == name)
    }
}

// The spec's document, as `specs-go/config.go` has it. Unknown fields are
// refused, as the package's strict decoding refuses them; a `null` list is
// an empty one, as Go decodes it.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    #[serde(rename = "cdiVersion")]
    version: String,
    kind: String,
    #[serde(default, deserialize_with = "nullable")]
    annotations: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    devices: Vec<Device>,
    #[serde(default, rename = "containerEdits")]
    edits: Edits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Device {
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    annotations: BTreeMap<String, String>,
    #[serde(default, rename = "containerEdits")]
    edits: Edits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Edits {
    #[serde(default, deserialize_with = "nullable")]
    env: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    device_nodes: Vec<DeviceNode>,
    #[serde(default, deserialize_with = "nullable")]
    net_devices: Vec<NetDevice>,
    #[serde(default, deserialize_with = "nullable")]
    hooks: Vec<Hook>,
    #[serde(default, deserialize_with = "nullable")]
    mounts: Vec<Mount>,
    #[serde(default)]
    intel_rdt: Option<IntelRdt>,
    #[serde(default, deserialize_with = "nullable")]
    additional_gids: Vec<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    #[serde(default)]
    host_path: String,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    major: i64,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    minor: i64,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    file_mode: Option<u32>,
    #[serde(default)]
    permissions: String,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    uid: Option<u32>,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    gid: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NetDevice {
    host_interface_name: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Hook {
    #[serde(rename = "hookName")]
    name: String,
    path: String,
    #[serde(default, deserialize_with = "nullable")]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    args: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    env: Vec<String>,
    #[serde(default)]
    timeout: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    #[serde(default, deserialize_with = "nullable")]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    options: Vec<String>,
    #[serde(default, rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IntelRdt {
    #[serde(default, rename = "closID")]
    clos_id: String,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    l3_cache_schema: String,
    #[serde(default)]
    #[allow(dead_code, reason = "declared for the strict decoding; nothing to judge")]
    mem_bw_schema: String,
    #[serde(default)]
    schemata: Option<Vec<String>>,
    #[serde(default)]
    enable_monitoring: bool,
}

/// `null` as the default, as Go's decoding leaves a nil list or map.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Reads every spec file of `dir` (`*.json` and `*.yaml`, the files the
/// package's cache loads), each judged. A directory that cannot be read is
/// an error naming it.
pub(crate) fn read_dir(dir: &Path) -> Result<Vec<SpecFile>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|err| format!("read the CDI directory {}: {err}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json" || ext == "yaml"))
        .collect();
    paths.sort();
    Ok(paths.into_iter().map(|path| read_file(&path)).collect())
}

/// Reads and judges one spec file.
pub(crate) fn read_file(path: &Path) -> SpecFile {
    let yaml = path.extension().is_some_and(|ext| ext == "yaml");
    match std::fs::read_to_string(path) {
        Ok(text) => judge(path, &text, yaml),
        Err(err) => SpecFile {
            path: path.to_path_buf(),
            kind: String::new(),
            devices: Vec::new(),
            problems: vec![Problem::breaks(format!("cannot be read: {err}"))],
        },
    }
}

/// Judges a spec file's `text` (YAML when `yaml`, else JSON).
pub(crate) fn judge(path: &Path, text: &str, yaml: bool) -> SpecFile {
    let parsed: Result<Spec, String> = if yaml {
        serde_norway::from_str(text).map_err(|err| err.to_string())
    } else {
        serde_json::from_str(text).map_err(|err| err.to_string())
    };
    match parsed {
        Ok(spec) => SpecFile {
            path: path.to_path_buf(),
            kind: spec.kind.clone(),
            devices: spec.devices.iter().map(|device| device.name.clone()).collect(),
            problems: problems(&spec),
        },
        Err(err) => SpecFile {
            path: path.to_path_buf(),
            kind: String::new(),
            devices: Vec::new(),
            problems: vec![Problem::breaks(format!("does not parse as a CDI spec: {err}"))],
        },
    }
}

/// What is wrong with `spec`, in the order the package checks it.
fn problems(spec: &Spec) -> Vec<Problem> {
    let mut problems = Vec::new();
    let declared = spec.version.strip_prefix('v').unwrap_or(&spec.version);
    match VERSIONS.iter().position(|known| *known == declared) {
        None => problems.push(Problem::breaks(format!(
            "cdiVersion {:?} is no CDI version (known: {})",
            spec.version,
            VERSIONS.join(", ")
        ))),
        Some(index) => {
            let (needed, why) = required_version(spec);
            let needed_index = VERSIONS.iter().position(|known| *known == needed).unwrap_or(index);
            // Newest first: a smaller index is a newer version.
            if needed_index < index {
                problems.push(Problem::breaks(format!(
                    "cdiVersion {declared} but {why} needs at least {needed}"
                )));
            }
        }
    }
    match parse_kind(&spec.kind) {
        Ok(()) => problems.extend(kind_lengths(&spec.kind)),
        Err(err) => problems.push(Problem::breaks(format!("kind {:?}: {err}", spec.kind))),
    }
    edits(&spec.edits, "the spec's containerEdits", &mut problems);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for device in &spec.devices {
        *seen.entry(&device.name).or_default() += 1;
        if let Err(err) = device_name(&device.name) {
            problems.push(Problem::breaks(format!("device {:?}: {err}", device.name)));
        }
        if device.edits.is_empty() {
            problems.push(Problem::breaks(format!(
                "device {:?} has no containerEdits: the package refuses a device that edits nothing",
                device.name
            )));
        }
        edits(&device.edits, &format!("device {:?}", device.name), &mut problems);
    }
    let mut twice: Vec<&str> =
        seen.into_iter().filter(|(_, n)| *n > 1).map(|(name, _)| name).collect();
    twice.sort_unstable();
    for name in twice {
        problems.push(Problem::breaks(format!("device {name:?} is defined more than once")));
    }
    if spec.devices.is_empty() {
        problems.push(Problem::breaks("no devices: a spec must define at least one"));
    }
    problems
}

impl Edits {
    fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.additional_gids.is_empty()
            && self.intel_rdt.is_none()
            && self.net_devices.is_empty()
    }

    fn all(spec: &Spec) -> impl Iterator<Item = &Edits> {
        std::iter::once(&spec.edits).chain(spec.devices.iter().map(|device| &device.edits))
    }
}

/// The oldest version whose fields `spec` uses, and which field, as the
/// package's `requiresV…` functions decide.
fn required_version(spec: &Spec) -> (&'static str, &'static str) {
    let edits = || Edits::all(spec);
    if edits().any(|e| {
        !e.net_devices.is_empty()
            || e.intel_rdt
                .as_ref()
                .is_some_and(|rdt| rdt.schemata.is_some() || rdt.enable_monitoring)
    }) {
        return ("1.1.0", "netDevices or intelRdt's schemata/enableMonitoring");
    }
    if edits().any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty()) {
        return ("0.7.0", "intelRdt or additionalGids");
    }
    let class_dotted = spec.kind.split_once('/').is_some_and(|(_, class)| class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|device| !device.annotations.is_empty())
        || class_dotted
    {
        return ("0.6.0", "annotations or a class with a dot");
    }
    if spec.devices.iter().any(|device| device.name.starts_with(|c: char| c.is_ascii_digit()))
        || edits().any(|e| e.device_nodes.iter().any(|node| !node.host_path.is_empty()))
    {
        return ("0.5.0", "a device name starting with a digit or a deviceNode's hostPath");
    }
    if edits().any(|e| e.mounts.iter().any(|mount| !mount.kind.is_empty())) {
        return ("0.4.0", "a mount's type");
    }
    ("0.3.0", "")
}

/// The container edits' rules (`ContainerEdits.Validate`), `whose` naming
/// them in the problems.
fn edits(edits: &Edits, whose: &str, problems: &mut Vec<Problem>) {
    for env in &edits.env {
        if let Err(err) = env_var(env) {
            problems.push(Problem::breaks(format!("{whose}: {err}")));
        }
    }
    for node in &edits.device_nodes {
        if node.path.is_empty() {
            problems.push(Problem::breaks(format!("{whose}: a deviceNode with no path")));
        } else if !node.path.starts_with('/') {
            problems.push(Problem::stricter(format!(
                "{whose}: deviceNode path {:?} is not absolute: the OCI spec's device path is the full path in the container",
                node.path
            )));
        }
        if !["", "b", "c", "u", "p"].contains(&node.kind.as_str()) {
            problems.push(Problem::breaks(format!(
                "{whose}: deviceNode {:?} has type {:?} (b, c, u, p or none)",
                node.path, node.kind
            )));
        }
        let permissions = node.permissions.as_str();
        if permissions != "none" && !permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            problems.push(Problem::breaks(format!(
                "{whose}: deviceNode {:?} has permissions {permissions:?} (r, w, m or none)",
                node.path
            )));
        }
    }
    for hook in &edits.hooks {
        if !HOOK_NAMES.contains(&hook.name.as_str()) {
            problems.push(Problem::breaks(format!(
                "{whose}: hook name {:?} is none of {}",
                hook.name,
                HOOK_NAMES.join(", ")
            )));
        }
        if hook.path.is_empty() {
            problems.push(Problem::breaks(format!("{whose}: hook {:?} has no path", hook.name)));
        } else if !hook.path.starts_with('/') {
            problems.push(Problem::stricter(format!(
                "{whose}: hook {:?} path {:?} is not absolute, which the CDI spec demands",
                hook.name, hook.path
            )));
        }
        for env in &hook.env {
            if let Err(err) = env_var(env) {
                problems.push(Problem::breaks(format!("{whose}: hook {:?}: {err}", hook.name)));
            }
        }
        if hook.timeout.is_some_and(|timeout| timeout <= 0) {
            problems.push(Problem::stricter(format!(
                "{whose}: hook {:?} has timeout {:?}: the CDI spec wants it greater than zero",
                hook.name, hook.timeout
            )));
        }
    }
    for mount in &edits.mounts {
        if mount.host_path.is_empty() {
            problems.push(Problem::breaks(format!("{whose}: a mount with no hostPath")));
        }
        if mount.container_path.is_empty() {
            problems.push(Problem::breaks(format!("{whose}: a mount with no containerPath")));
        } else if !mount.container_path.starts_with('/') {
            problems.push(Problem::stricter(format!(
                "{whose}: mount containerPath {:?} is not absolute: the OCI spec's mount destination is",
                mount.container_path
            )));
        }
    }
    if let Some(rdt) = &edits.intel_rdt {
        let clos = rdt.clos_id.as_str();
        if clos != "/"
            && (clos.len() >= 4096 || clos == "." || clos == ".." || clos.contains(['/', '\n']))
        {
            problems.push(Problem::breaks(format!("{whose}: intelRdt closID {clos:?} is invalid")));
        }
    }
    let mut hosts = Vec::new();
    let mut names = Vec::new();
    for net in &edits.net_devices {
        if net.host_interface_name.is_empty() || net.name.is_empty() {
            problems.push(Problem::breaks(format!(
                "{whose}: a netDevice with an empty hostInterfaceName or name"
            )));
        }
        if hosts.contains(&&net.host_interface_name) || names.contains(&&net.name) {
            problems.push(Problem::breaks(format!(
                "{whose}: netDevice {:?} ({:?}) repeats a hostInterfaceName or name",
                net.name, net.host_interface_name
            )));
        }
        hosts.push(&net.host_interface_name);
        names.push(&net.name);
    }
}

/// `K=V` with a non-empty `K` (`ValidateEnv`).
fn env_var(env: &str) -> Result<(), String> {
    match env.find('=') {
        Some(at) if at > 0 => Ok(()),
        _ => Err(format!("env {env:?} is not NAME=VALUE")),
    }
}

/// A kind `vendor/class`, each part valid (`ParseQualifier`, then
/// `ValidateVendorName` and `ValidateClassName`).
fn parse_kind(kind: &str) -> Result<(), String> {
    let (vendor, class) = kind
        .split_once('/')
        .filter(|(vendor, class)| !vendor.is_empty() && !class.is_empty())
        .ok_or("not vendor/class")?;
    vendor_or_class(vendor).map_err(|err| format!("vendor {err}"))?;
    vendor_or_class(class).map_err(|err| format!("class {err}"))
}

/// The specification's lengths, which the package does not check: the
/// class at most 63 characters, the vendor a DNS subdomain of at most 253.
fn kind_lengths(kind: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some((vendor, class)) = kind.split_once('/') {
        if class.len() > 63 {
            problems.push(Problem::stricter(format!(
                "kind {kind:?}: its class is longer than the CDI spec's 63 characters"
            )));
        }
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if vendor.len() > 253 || !vendor.split('.').all(label_ok) {
            problems.push(Problem::stricter(format!(
                "kind {kind:?}: its vendor is no DNS subdomain, which the CDI spec asks for"
            )));
        }
    }
    problems
}

/// A letter, then letters, digits, `_`, `-`, `.`, ending in a letter or a
/// digit (`validateVendorOrClassName`).
fn vendor_or_class(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let Some((&first, rest)) = bytes.split_first() else {
        return Err("is empty".into());
    };
    if !first.is_ascii_alphabetic() {
        return Err(format!("{name:?} should start with a letter"));
    }
    inner_and_last(name, rest, b"_-.")
}

/// A letter or a digit, then letters, digits, `_`, `-`, `.`, `:`, ending in
/// a letter or a digit (`ValidateDeviceName`).
fn device_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let Some((&first, rest)) = bytes.split_first() else {
        return Err("an empty device name".into());
    };
    if !first.is_ascii_alphanumeric() {
        return Err(format!("{name:?} should start with a letter or a digit"));
    }
    inner_and_last(name, rest, b"_-.:")
}

/// `rest` (the name after its first character): the characters between
/// alphanumeric or in `extra`, the last alphanumeric.
fn inner_and_last(name: &str, rest: &[u8], extra: &[u8]) -> Result<(), String> {
    let Some((&last, inner)) = rest.split_last() else {
        return Ok(());
    };
    if let Some(bad) = inner.iter().find(|c| !c.is_ascii_alphanumeric() && !extra.contains(c)) {
        return Err(format!("{name:?} has the character {:?}", char::from(*bad)));
    }
    if !last.is_ascii_alphanumeric() {
        return Err(format!("{name:?} should end with a letter or a digit"));
    }
    Ok(())
}

/// A qualified CDI device id `vendor/class=name` split as `(kind, name)`,
/// each part valid (`ParseQualifiedName`).
pub(crate) fn parse_device_id(id: &str) -> Result<(&str, &str), String> {
    let (kind, name) = id
        .split_once('=')
        .filter(|(kind, name)| !kind.is_empty() && !name.is_empty() && !id.starts_with('/'))
        .ok_or_else(|| format!("CDI device id {id:?} is not vendor/class=name"))?;
    parse_kind(kind).map_err(|err| format!("CDI device id {id:?}: {err}"))?;
    device_name(name).map_err(|err| format!("CDI device id {id:?}: {err}"))?;
    Ok((kind, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec whose first device's `containerEdits` is `edits`.
    fn with_edits(edits: &str) -> String {
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"example.com/gpu","devices":[{{"name":"gpu0","containerEdits":{edits}}}]}}"#
        )
    }

    /// `(what, spec, worst severity expected: None when valid)`.
    fn table() -> Vec<(&'static str, String, Option<Severity>)> {
        use Severity::{Breaks, Stricter};
        let good_edits = r#"{"env":["A=1"],"deviceNodes":[{"path":"/dev/gpu0","type":"c","permissions":"rw"}],
            "mounts":[{"hostPath":"/opt/lib","containerPath":"/usr/lib/gpu","options":["ro","bind"]}],
            "hooks":[{"hookName":"createContainer","path":"/usr/bin/hook","args":["hook"],"env":["X=1"],"timeout":5}]}"#;
        vec![
            ("a full valid spec", with_edits(good_edits), None),
            (
                "the test driver's spec",
                r#"{"cdiVersion":"0.3.0","kind":"test-driver.cdi.k8s.io/test","devices":[{"name":"claim-1f0c-req","containerEdits":{"env":["claim_x_req=true"]}}]}"#.into(),
                None,
            ),
            ("a leading v", r#"{"cdiVersion":"v1.1.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["A="]}}]}"#.into(), None),
            ("null lists", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"],"mounts":null}}]}"#.into(), None),
            ("an unknown version", r#"{"cdiVersion":"0.9.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a version too old for hostPath", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x","hostPath":"/dev/y"}]}}]}"#.into(), Some(Breaks)),
            ("a version too old for a dotted class", r#"{"cdiVersion":"0.5.0","kind":"a.com/b.c","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("no kind class", r#"{"cdiVersion":"0.3.0","kind":"a.com","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a kind of three parts", r#"{"cdiVersion":"0.3.0","kind":"a.com/b/c","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a vendor starting with a digit", r#"{"cdiVersion":"0.3.0","kind":"1a.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("an upper-case vendor", r#"{"cdiVersion":"0.3.0","kind":"Vendor.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Stricter)),
            ("no devices", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[]}"#.into(), Some(Breaks)),
            ("a device twice", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"]}},{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a device name with a slash", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d/e","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a device name ending in a dash", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d-","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
            ("a device that edits nothing", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{}}]}"#.into(), Some(Breaks)),
            ("an unknown field", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["A=1"],"envs":[]}}]}"#.into(), Some(Breaks)),
            ("not JSON", "{".into(), Some(Breaks)),
            ("env without =", with_edits(r#"{"env":["A"]}"#), Some(Breaks)),
            ("env with an empty name", with_edits(r#"{"env":["=1"]}"#), Some(Breaks)),
            ("a deviceNode with no path", with_edits(r#"{"deviceNodes":[{"path":""}]}"#), Some(Breaks)),
            ("a relative deviceNode", with_edits(r#"{"deviceNodes":[{"path":"dev/gpu0"}]}"#), Some(Stricter)),
            ("a deviceNode type x", with_edits(r#"{"deviceNodes":[{"path":"/dev/gpu0","type":"x"}]}"#), Some(Breaks)),
            ("deviceNode permissions rx", with_edits(r#"{"deviceNodes":[{"path":"/dev/gpu0","permissions":"rx"}]}"#), Some(Breaks)),
            ("deviceNode permissions none", with_edits(r#"{"deviceNodes":[{"path":"/dev/gpu0","permissions":"none"}]}"#), None),
            ("a mount with no hostPath", with_edits(r#"{"mounts":[{"hostPath":"","containerPath":"/x"}]}"#), Some(Breaks)),
            ("a relative mount", with_edits(r#"{"mounts":[{"hostPath":"/x","containerPath":"x"}]}"#), Some(Stricter)),
            ("an unknown hook", with_edits(r#"{"hooks":[{"hookName":"prestop","path":"/bin/h"}]}"#), Some(Breaks)),
            ("a hook with no path", with_edits(r#"{"hooks":[{"hookName":"poststop","path":""}]}"#), Some(Breaks)),
            ("a relative hook", with_edits(r#"{"hooks":[{"hookName":"poststop","path":"bin/h"}]}"#), Some(Stricter)),
            ("a hook's bad env", with_edits(r#"{"hooks":[{"hookName":"poststop","path":"/bin/h","env":["X"]}]}"#), Some(Breaks)),
            ("a hook's zero timeout", with_edits(r#"{"hooks":[{"hookName":"poststop","path":"/bin/h","timeout":0}]}"#), Some(Stricter)),
            ("intelRdt before 0.7.0", with_edits(r#"{"intelRdt":{"closID":"c"}}"#), Some(Breaks)),
            ("netDevices before 1.1.0", with_edits(r#"{"netDevices":[{"hostInterfaceName":"eth1","name":"net1"}]}"#), Some(Breaks)),
            (
                "netDevices in 1.1.0",
                r#"{"cdiVersion":"1.1.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"netDevices":[{"hostInterfaceName":"eth1","name":"net1"}]}}]}"#.into(),
                None,
            ),
            ("a spec-level bad env", r#"{"cdiVersion":"0.3.0","kind":"a.com/b","containerEdits":{"env":["A"]},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#.into(), Some(Breaks)),
        ]
    }

    fn worst(problems: &[Problem]) -> Option<Severity> {
        if problems.iter().any(|p| p.severity == Severity::Breaks) {
            Some(Severity::Breaks)
        } else if problems.is_empty() {
            None
        } else {
            Some(Severity::Stricter)
        }
    }

    #[test]
    fn spec_files_are_judged_as_the_cdi_package_and_spec_say() {
        for (what, text, expected) in table() {
            let judged = judge(Path::new("x.json"), &text, false);
            assert_eq!(worst(&judged.problems), expected, "{what}: {:?}", judged.problems);
        }
    }

    #[test]
    fn a_yaml_spec_is_read_too() {
        let text = "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [A=1]\n";
        let judged = judge(Path::new("x.yaml"), text, true);
        assert_eq!(judged.problems, []);
        assert!(judged.defines("example.com/gpu", "gpu0"));
    }

    #[test]
    fn device_ids_are_vendor_class_name() {
        for (id, ok) in [
            ("test-driver.cdi.k8s.io/test=claim-1-req", true),
            ("example.com/gpu=0", true),
            ("example.com/gpu=a:b.c_d", true),
            ("example.com/gpu", false),
            ("gpu=0", false),
            ("/dev/gpu=0", false),
            ("example.com/gpu=", false),
            ("example.com/=x", false),
            ("example.com/gpu=x/y", false),
        ] {
            assert_eq!(parse_device_id(id).is_ok(), ok, "{id}");
        }
    }
}
