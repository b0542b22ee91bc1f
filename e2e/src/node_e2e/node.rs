//! The node: etcd, kube-apiserver with RBAC, kube-controller-manager and
//! kube-scheduler (so DaemonSets, service accounts and their tokens and the
//! garbage collector work as in a cluster), containerd with runc, and the
//! real kubelet, all in the namespaces of `host`. Started in that order,
//! stopped in the reverse one.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::host::{self, CGROUP_ROOT, NODE_IP, POD_SUBNET, SERVICE_IP, SERVICE_RANGE};
use super::kubelets::{self, Programs};
use super::{Env, NODE_NAME, START_TIMEOUT, STOP_TIMEOUT};
use crate::command::Result;
use crate::kube_e2e::api::Api;
use crate::kube_e2e::pki::Pki;
use crate::scenario::{Process, wait_for, wait_until};

/// The static tokens: loopback and namespace only, gone with the run.
const ADMIN_TOKEN: &str = "kpm-node-e2e-admin";
const TOKENS: &[(&str, &str, &str)] = &[
    (ADMIN_TOKEN, "admin", "system:masters"),
    ("kpm-node-e2e-kcm", "system:kube-controller-manager", ""),
    ("kpm-node-e2e-scheduler", "system:kube-scheduler", ""),
    ("kpm-node-e2e-kubelet", "system:node:kpm-node", "system:nodes"),
];

/// containerd's socket in the node's `/run`.
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// The pause image every pod sandbox runs (`images.rs` builds it).
pub(super) const PAUSE_IMAGE: &str = "kpm.local/pause:e2e";

/// Every write, and every refused request, in the audit log.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
    rules:\n- level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n\
    - level: Metadata\n  users: [\"system:serviceaccount:kpm-system:kpm-doctor\", \"system:serviceaccount:kpm-system:kpm\"]\n\
    - level: None\n";

/// A running node. Fields drop in order: the kubelet first, etcd last.
pub(super) struct Node {
    kubelet: Option<Process>,
    kubelet_starts: u32,
    containerd: Option<Process>,
    containerd_starts: u32,
    _scheduler: Process,
    _controller_manager: Process,
    _apiserver: Process,
    _etcd: Process,
    /// As admin.
    pub(super) api: Api,
    pub(super) admin_kubeconfig: PathBuf,
    pub(super) audit_log: PathBuf,
    /// The kubelet's `--root-dir`, a host path of the node.
    pub(super) kubelet_root: PathBuf,
    state: PathBuf,
    programs: Programs,
    /// The kubelet's minor; `None` for a development build, the newest.
    pub(super) kubelet_minor: Option<u32>,
    out: PathBuf,
}

impl Node {
    /// Starts every daemon, imports `images` into containerd, and waits
    /// until the Node is Ready.
    pub(super) fn start(env: &Env, kubelet_root: &Path, images: &[PathBuf]) -> Result<Self> {
        let started = Instant::now();
        let state = host::state_dir()?;
        let pki = Pki::generate(&[SERVICE_IP, NODE_IP, "kubernetes.default.svc"])?;
        let tokens: Vec<String> = TOKENS
            .iter()
            .map(|(token, user, groups)| format!("{token},{user},{user},\"{groups}\"\n"))
            .collect();
        let tokens = tokens.concat();
        for (name, contents) in [
            ("ca.crt", pki.ca.as_str()),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_public_key),
            ("tokens.csv", &tokens),
            ("audit-policy.yaml", AUDIT_POLICY),
        ] {
            fs::write(state.join(name), contents)?;
        }
        let kubelet_minor = env.programs.minor("kubelet");
        let launcher = Launcher { env, state: &state, kubelet_minor };
        let server = format!("https://{SERVICE_IP}:443");
        let api = Api::new(&server, &pki.ca, ADMIN_TOKEN)?;
        let etcd = launcher.etcd()?;
        let apiserver = launcher.apiserver(&api)?;
        let kubeconfig = |name: &str, user: &str| -> Result<PathBuf> {
            let token =
                TOKENS.iter().find(|(_, u, _)| *u == user).map_or(ADMIN_TOKEN, |(t, ..)| *t);
            let file = state.join(format!("{name}.kubeconfig"));
            crate::kube_e2e::api::write_kubeconfig(&file, &server, &pki.ca, token)?;
            Ok(file)
        };
        let admin_kubeconfig = kubeconfig("admin", "admin")?;
        let controller_manager =
            launcher.controller_manager(&kubeconfig("kcm", "system:kube-controller-manager")?)?;
        let scheduler = launcher.scheduler(&kubeconfig("scheduler", "system:kube-scheduler")?)?;

        let containerd = start_containerd(&state, &env.out, 1)?;
        for image in images {
            let image = image.display().to_string();
            host::run(
                "ctr",
                &["--address", CONTAINERD_SOCKET, "-n", "k8s.io", "images", "import", &image],
            )?;
        }

        let kubelet_kubeconfig = kubeconfig("kubelet", "system:node:kpm-node")?;
        let config = state.join("kubelet-config.json");
        fs::write(&config, serde_json::to_string_pretty(&kubelet_config(kubelet_minor))?)?;
        let mut node = Self {
            kubelet: None,
            kubelet_starts: 0,
            containerd: Some(containerd),
            containerd_starts: 1,
            _scheduler: scheduler,
            _controller_manager: controller_manager,
            _apiserver: apiserver,
            _etcd: etcd,
            api,
            admin_kubeconfig,
            audit_log: state.join("audit.log"),
            kubelet_root: kubelet_root.to_path_buf(),
            state: state.clone(),
            programs: env.programs.clone(),
            kubelet_minor,
            out: env.out.clone(),
        };
        node.start_kubelet(&kubelet_kubeconfig, &config)?;
        node.wait_ready()?;
        eprintln!("node {NODE_NAME} Ready {:.1?} after the start", started.elapsed());
        Ok(node)
    }

    fn start_kubelet(&mut self, kubeconfig: &Path, config: &Path) -> Result {
        fs::create_dir_all(&self.kubelet_root)?;
        self.kubelet_starts += 1;
        let (out, log) = (self.kubelet_file("out"), self.kubelet_log());
        let name =
            log.file_stem().map_or_else(String::new, |stem| stem.to_string_lossy().into_owned());
        let args = [
            "--config",
            &config.display().to_string(),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--root-dir",
            &self.kubelet_root.display().to_string(),
            "--hostname-override",
            NODE_NAME,
            "--node-ip",
            NODE_IP,
            "-v",
            "2",
        ];
        self.kubelet =
            Some(Process::spawn(&name, &self.programs.path("kubelet"), &args, &out, &log)?);
        Ok(())
    }

    /// Stops the kubelet (SIGTERM) and starts it again with the same
    /// arguments, as a node's service manager restarts it; its pods run on.
    pub(super) fn restart_kubelet(&mut self) -> Result {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(STOP_TIMEOUT)?;
        }
        let (kubeconfig, config) =
            (self.state.join("kubelet.kubeconfig"), self.state.join("kubelet-config.json"));
        self.start_kubelet(&kubeconfig, &config)
    }

    /// Stops containerd (SIGTERM) as its service manager does (systemd's
    /// `KillMode=process`): its shims, and the pods' containers, run on.
    pub(super) fn stop_containerd(&mut self) -> Result {
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop(STOP_TIMEOUT)?;
        }
        Ok(())
    }

    /// Starts containerd again, on what it left in its root and state.
    pub(super) fn start_containerd(&mut self) -> Result {
        self.containerd_starts += 1;
        self.containerd = Some(start_containerd(&self.state, &self.out, self.containerd_starts)?);
        Ok(())
    }

    /// Upgrades the kubelet in place: the one of `--kubelet-dir` stopped,
    /// the one of `--bin-dir` started on the same root with the same
    /// configuration, as a package upgrade restarts it; the new kubelet's
    /// minor (`None`: a development build, the newest).
    pub(super) fn upgrade_kubelet(&mut self) -> Result<Option<u32>> {
        self.programs.kubelet_dir = None;
        self.kubelet_minor = self.programs.minor("kubelet");
        self.restart_kubelet()?;
        Ok(self.kubelet_minor)
    }

    /// The first half of a simulated reboot: the node shut down as systemd
    /// shuts it down. The kubelet and containerd are stopped as services
    /// (SIGTERM); then every process left of the pods gets SIGTERM, and
    /// SIGKILL after `grace`; containerd's shims go last. The pods' cgroups
    /// and the mounts a boot does not keep are undone, and `/run` and
    /// containerd's state (a tmpfs on a real node) emptied; `/var/lib` keeps its files, the plugins'
    /// sockets among them. The control plane, another machine's, runs on.
    pub(super) fn shut_down(&mut self, grace: Duration) -> Result {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(STOP_TIMEOUT)?;
        }
        self.stop_containerd()?;
        host::end_pods(grace)?;
        host::forget_pod_cgroups()?;
        let containerd_state = self.state.join("containerd").join("state");
        let kubelet_root = self.kubelet_root.clone();
        host::forget_mounts(&[Path::new("/run"), &containerd_state, &kubelet_root])?;
        host::empty_dir(Path::new("/run"))?;
        host::empty_dir(&containerd_state)
    }

    /// The second half of a simulated reboot ([`shut_down`](Self::shut_down)):
    /// containerd and the kubelet started again, as at a boot. Returns once
    /// the kubelet runs; the Node is not Ready yet.
    pub(super) fn boot(&mut self) -> Result {
        self.start_containerd()?;
        let (kubeconfig, config) =
            (self.state.join("kubelet.kubeconfig"), self.state.join("kubelet-config.json"));
        self.start_kubelet(&kubeconfig, &config)
    }

    /// Waits until the Node's `Ready` condition is `True`.
    pub(super) fn wait_ready(&mut self) -> Result {
        let kubelet = self.kubelet.as_mut().ok_or("the kubelet is not running")?;
        let api = &self.api;
        wait_serving(kubelet, || {
            let (code, node) = api.request("GET", &format!("/api/v1/nodes/{NODE_NAME}"), None)?;
            Ok(code == 200 && condition(&node, "Ready") == Some("True"))
        })
    }

    /// `kubectl ARGS` as admin; its stdout.
    pub(super) fn kubectl(&self, args: &[&str]) -> Result<String> {
        let output = self.kubectl_output(args)?;
        if output.status.success() {
            Ok(String::from_utf8(output.stdout)?)
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into())
        }
    }

    /// `kubectl ARGS` as admin: its stdout whatever its exit status (`kpm
    /// doctor` exits 1 when a plugin fails, and prints its report all the
    /// same).
    pub(super) fn kubectl_stdout(&self, args: &[&str]) -> Result<String> {
        Ok(String::from_utf8(self.kubectl_output(args)?.stdout)?)
    }

    /// `kubectl ARGS` as admin: its exit code (`kubectl exec` gives the
    /// command's) and its stdout.
    pub(super) fn kubectl_exit(&self, args: &[&str]) -> Result<(i32, String)> {
        let output = self.kubectl_output(args)?;
        Ok((output.status.code().unwrap_or(-1), String::from_utf8(output.stdout)?))
    }

    /// `kubectl ARGS` as admin, run to its end.
    fn kubectl_output(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(std::process::Command::new(self.programs.path("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args)
            .output()?)
    }

    /// `kubectl apply -f -` of `manifest` as admin.
    pub(super) fn apply(&self, manifest: &str) -> Result {
        use std::io::Write as _;
        let mut kubectl = std::process::Command::new(self.programs.path("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        kubectl.stdin.take().ok_or("kubectl: no stdin")?.write_all(manifest.as_bytes())?;
        let output = kubectl.wait_with_output()?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!("kubectl apply: {}", String::from_utf8_lossy(&output.stderr).trim()).into())
        }
    }

    /// The log of the kubelet running now (`kubelet.log`, then
    /// `kubelet-2.log` once it restarted, ...), in `target/node-e2e`.
    pub(super) fn kubelet_log(&self) -> PathBuf {
        self.kubelet_file("log")
    }

    fn kubelet_file(&self, extension: &str) -> PathBuf {
        match self.kubelet_starts {
            0 | 1 => self.out.join(format!("kubelet.{extension}")),
            n => self.out.join(format!("kubelet-{n}.{extension}")),
        }
    }

    /// Every pod's logs, all containers and their previous runs, to
    /// `target/node-e2e/pods/NAMESPACE_POD.log`: what is left to read once
    /// the node is gone.
    pub(super) fn save_pod_logs(&self) -> Result {
        let dir = self.out.join("pods");
        std::fs::create_dir_all(&dir)?;
        let pods = self.get(&["pods", "--all-namespaces"])?;
        for pod in pods["items"].as_array().into_iter().flatten() {
            let (namespace, name) = (
                pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                pod["metadata"]["name"].as_str().unwrap_or_default(),
            );
            let mut text = String::new();
            for previous in [true, false] {
                let mut args = vec![
                    "logs",
                    "-n",
                    namespace,
                    name,
                    "--all-containers",
                    "--prefix",
                    "--timestamps",
                ];
                if previous {
                    args.push("--previous");
                }
                // A container that never restarted has no previous logs.
                if let Ok(logs) = self.kubectl(&args) {
                    text.push_str(&logs);
                }
            }
            std::fs::write(dir.join(format!("{namespace}_{name}.log")), text)?;
        }
        Ok(())
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub(super) fn get(&self, args: &[&str]) -> Result<Value> {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let mut get = vec!["get"];
        get.extend(args);
        Ok(serde_json::from_str(&self.kubectl(&get)?)?)
    }

    /// The pods matching `selector` in `namespace` on this node.
    pub(super) fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Value>> {
        let on_node = format!("spec.nodeName={NODE_NAME}");
        let pods =
            self.get(&["pods", "-n", namespace, "-l", selector, "--field-selector", &on_node])?;
        Ok(pods["items"].as_array().cloned().unwrap_or_default())
    }

    /// The one pod matching `selector` in `namespace` on this node (a
    /// DaemonSet's).
    pub(super) fn pod(&self, namespace: &str, selector: &str) -> Result<Value> {
        self.pods(namespace, selector)?
            .into_iter()
            .next()
            .ok_or_else(|| format!("no pod {selector} in {namespace} on {NODE_NAME}").into())
    }

    /// Waits until every pod matching `selector` in `namespace` on this
    /// node is Running with all its containers ready (a DaemonSet's pods for
    /// Nodes without a kubelet stay Pending); returns when.
    pub(super) fn wait_pods_ready(&self, namespace: &str, selector: &str) -> Result<Instant> {
        wait_for(&format!("pods {selector} in {namespace} ready"), START_TIMEOUT, || {
            let items = self.pods(namespace, selector)?;
            let ready = !items.is_empty()
                && items.iter().all(|pod| condition(pod, "Ready") == Some("True"));
            Ok(ready.then(Instant::now))
        })
    }
}

/// Starts the control plane's daemons of a node, each logging to
/// `target/node-e2e/NAME.log`, its files in the state folder.
struct Launcher<'a> {
    env: &'a Env,
    state: &'a Path,
    /// The kubelet's minor, whose DRA the control plane must serve.
    kubelet_minor: Option<u32>,
}

/// etcd's client URL, on the node's loopback.
const ETCD_URL: &str = "http://127.0.0.1:2379";

impl Launcher<'_> {
    fn path(&self, name: &str) -> String {
        self.state.join(name).display().to_string()
    }

    fn spawn(&self, name: &str, args: &[&str]) -> Result<Process> {
        let log = |ext: &str| self.env.out.join(format!("{name}.{ext}"));
        let programs = &self.env.programs;
        let dra = kubelets::dra_flags(name, programs.minor(name), self.kubelet_minor);
        let mut args = args.to_vec();
        args.extend(dra.iter().map(String::as_str));
        Process::spawn(name, &programs.path(name), &args, &log("out"), &log("log"))
    }

    /// A control plane component with `kubeconfig` for its client, and for
    /// delegating its own endpoints' authentication and authorization.
    fn spawn_as(&self, name: &str, kubeconfig: &Path, args: &[&str]) -> Result<Process> {
        let kubeconfig = kubeconfig.display().to_string();
        let mut all = vec![
            "--kubeconfig",
            &kubeconfig,
            "--authentication-kubeconfig",
            &kubeconfig,
            "--authorization-kubeconfig",
            &kubeconfig,
        ];
        all.extend(args);
        self.spawn(name, &all)
    }

    fn etcd(&self) -> Result<Process> {
        let data = self.path("etcd");
        let mut etcd = self.spawn(
            "etcd",
            &[
                "--data-dir",
                &data,
                "--listen-client-urls",
                ETCD_URL,
                "--advertise-client-urls",
                ETCD_URL,
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
            ],
        )?;
        wait_serving(&mut etcd, || {
            let health = ureq::get(&format!("{ETCD_URL}/health")).call();
            Ok(health.is_ok_and(|mut response| {
                response
                    .body_mut()
                    .read_to_string()
                    .is_ok_and(|body| body.contains(r#""health":"true""#))
            }))
        })?;
        Ok(etcd)
    }

    fn apiserver(&self, api: &Api) -> Result<Process> {
        let path = |name: &str| self.path(name);
        let mut apiserver = self.spawn(
            "kube-apiserver",
            &[
                "--etcd-servers",
                ETCD_URL,
                // On every address of the node: 10.0.0.1:443 is where a
                // pod's in-cluster config points.
                "--bind-address",
                "0.0.0.0",
                "--secure-port",
                "443",
                "--advertise-address",
                NODE_IP,
                "--tls-cert-file",
                &path("apiserver.crt"),
                "--tls-private-key-file",
                &path("apiserver.key"),
                "--client-ca-file",
                &path("ca.crt"),
                "--token-auth-file",
                &path("tokens.csv"),
                "--authorization-mode",
                "Node,RBAC",
                "--allow-privileged=true",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                &path("sa.pub"),
                "--service-account-signing-key-file",
                &path("sa.key"),
                "--service-cluster-ip-range",
                SERVICE_RANGE,
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--audit-policy-file",
                &path("audit-policy.yaml"),
                "--audit-log-path",
                &path("audit.log"),
            ],
        )?;
        wait_serving(&mut apiserver, || {
            Ok(api.request("GET", "/readyz", None).is_ok_and(|(code, _)| code == 200))
        })?;
        Ok(apiserver)
    }

    fn controller_manager(&self, kubeconfig: &Path) -> Result<Process> {
        let (key, ca) = (self.path("sa.key"), self.path("ca.crt"));
        self.spawn_as(
            "kube-controller-manager",
            kubeconfig,
            &[
                // Each controller with a token of its own service account,
                // so their RBAC is the cluster's.
                "--use-service-account-credentials",
                "--service-account-private-key-file",
                &key,
                "--root-ca-file",
                &ca,
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
            ],
        )
    }

    fn scheduler(&self, kubeconfig: &Path) -> Result<Process> {
        self.spawn_as(
            "kube-scheduler",
            kubeconfig,
            &["--leader-elect=false", "--bind-address", "127.0.0.1"],
        )
    }
}

/// Waits until `ready` holds; fails at once, naming its log, if `process`
/// exits first.
fn wait_serving(process: &mut Process, mut ready: impl FnMut() -> Result<bool>) -> Result {
    wait_until(&format!("{} ready", process.name), START_TIMEOUT, || {
        if let Some(status) = process.child.try_wait()? {
            return Err(format!(
                "{} exited ({status}), see target/node-e2e/{}.log",
                process.name, process.name
            )
            .into());
        }
        ready()
    })
}

/// The status of condition `kind` of an object (a Node, a Pod).
pub(super) fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a str> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|condition| condition["type"] == kind)?["status"]
        .as_str()
}

/// The kubelet's configuration for this machine (`real-node.md`), for a
/// kubelet of `minor`: DRA switched on where it is off by default.
fn kubelet_config(minor: Option<u32>) -> Value {
    let mut config = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // kube-apiserver reaches logs and exec anonymously, in the
        // namespace only.
        "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{CGROUP_ROOT}"),
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{CONTAINERD_SOCKET}"),
        // Images are imported, never pulled: keep them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        // A shared build machine's disk: no eviction of the test's pods.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "clusterDomain": "cluster.local",
        "readOnlyPort": 0,
    });
    if kubelets::needs_dra_gate(minor) {
        config["featureGates"] = json!({"DynamicResourceAllocation": true});
    }
    config
}

/// containerd's configuration (`real-node.md`), the CNI bridge, and the
/// daemon started and answering, its `start`th time (`containerd.log`,
/// then `containerd-2.log`, ...).
fn start_containerd(state: &Path, out: &Path, start: u32) -> Result<Process> {
    let dir = state.join("containerd");
    let cni = state.join("cni");
    fs::create_dir_all(&cni)?;
    fs::write(
        cni.join("10-kpm-node.conflist"),
        serde_json::to_string_pretty(&json!({
            "cniVersion": "0.4.0",
            "name": "kpm-node",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        }))?,
    )?;
    fs::create_dir_all(&dir)?;
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  # No CAP_SYS_RESOURCE in this VM: runc cannot raise oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        runc = dir.join("runc").display(),
        cni = cni.display(),
    );
    let file = dir.join("config.toml");
    fs::write(&file, config)?;
    let name = if start == 1 { "containerd".to_owned() } else { format!("containerd-{start}") };
    let containerd = Process::spawn(
        "containerd",
        Path::new("containerd"),
        &["--config", &file.display().to_string()],
        &out.join(format!("{name}.out")),
        &out.join(format!("{name}.log")),
    )?;
    let mut containerd = containerd;
    wait_serving(&mut containerd, || {
        Ok(host::run("ctr", &["--address", CONTAINERD_SOCKET, "version"]).is_ok())
    })?;
    Ok(containerd)
}
