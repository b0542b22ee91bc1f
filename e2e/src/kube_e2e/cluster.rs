//! A cluster of one scenario: etcd and kube-apiserver in a temp dir, the
//! static tokens, the audit policy, RBAC from the manifests, Nodes, and a
//! `kpm run` with a kubeconfig for kpm's token.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize as _;
use serde_json::{Value, json};

use super::api::Api;
use super::pki::Pki;
use super::{
    ADMIN_TOKEN, DEVICE_GRACE_SECS, DOCTOR_TOKEN, DOCTOR_USER, DRA_GRACE_SECS, Env, KPM_GROUPS,
    KPM_TOKEN, KPM_USER, READER_TOKEN, READER_USER, START_TIMEOUT, STEP_TIMEOUT, STOP_TIMEOUT,
};
use crate::command::Result;
use crate::scenario::{Process, RunningKpm, wait_for, wait_until};

/// The static tokens: admin, kpm's service account, the doctor's, a fleet
/// reader's.
fn tokens_csv() -> String {
    format!(
        "{ADMIN_TOKEN},admin,admin,\"system:masters\"\n{KPM_TOKEN},{KPM_USER},kpm,\"{KPM_GROUPS}\"\n\
         {DOCTOR_TOKEN},{DOCTOR_USER},kpm-doctor,\"{KPM_GROUPS}\"\n\
         {READER_TOKEN},{READER_USER},kpm-fleet-reader,\"system:authenticated\"\n"
    )
}

/// Every write, by whom and when, in the audit log: the fleet scenario
/// counts the doctors'.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n\
    - level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n- level: None\n";

/// A write in the audit log.
#[derive(Debug)]
pub(super) struct Write {
    /// `verb resource[/subresource]`.
    pub(super) what: String,
    /// The object's name; empty for a collection.
    pub(super) name: String,
    /// When it completed, in seconds since the epoch.
    pub(super) at: f64,
    /// The HTTP status code of the answer.
    pub(super) code: u64,
}

/// Seconds since the epoch of an RFC 3339 time, as the audit log writes
/// it (microseconds, `Z`).
fn seconds_of(time: &str) -> f64 {
    humantime::parse_rfc3339_weak(time)
        .ok()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |since| since.as_secs_f64())
}

/// etcd and kube-apiserver of one scenario, in a temp dir under `/tmp`.
// Fields drop in order: kube-apiserver, then etcd, then the dir.
pub(super) struct Cluster {
    apiserver: Option<Process>,
    /// How many times kube-apiserver was started: each start logs to files of its own.
    apiserver_starts: u32,
    etcd: Process,
    scenario: &'static str,
    apiserver_args: Vec<String>,
    ca_pem: String,
    pub(super) api: Api,
    pub(super) dir: tempfile::TempDir,
}

impl Cluster {
    pub(super) fn start(env: &Env, scenario: &'static str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("kpm-kube-").tempdir_in("/tmp")?;
        let pki = Pki::generate(&[])?;
        let path = |name: &str| dir.path().join(name).display().to_string();
        for (name, contents) in [
            ("ca.crt", &pki.ca),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("sa.key", &pki.sa_key),
            ("sa.pub", &pki.sa_public_key),
            ("tokens.csv", &tokens_csv()),
            ("audit-policy.yaml", &AUDIT_POLICY.to_owned()),
        ] {
            fs::write(path(name), contents)?;
        }

        let [client_port, peer_port, secure_port] = [(); 3].map(|()| kpm_test_support::free_port());
        let etcd_log = env.out.join(format!("{scenario}-etcd.log"));
        let etcd = Process::spawn(
            "etcd",
            &env.etcd,
            &[
                "--data-dir",
                &path("etcd"),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
            ],
            &env.out.join(format!("{scenario}-etcd.out")),
            &etcd_log,
        )?;
        // Ready when its health endpoint says so, as a stock etcd tells.
        let health = format!("http://127.0.0.1:{client_port}/health");
        wait_until("etcd ready", START_TIMEOUT, || {
            let body = ureq::get(&health)
                .call()
                .ok()
                .and_then(|mut response| response.body_mut().read_to_string().ok());
            Ok(body.is_some_and(|body| body.contains(r#""health":"true""#)))
        })?;

        let apiserver_args = [
            "--etcd-servers",
            &format!("http://127.0.0.1:{client_port}"),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &secure_port.to_string(),
            "--tls-cert-file",
            &path("apiserver.crt"),
            "--tls-private-key-file",
            &path("apiserver.key"),
            "--token-auth-file",
            &path("tokens.csv"),
            "--authorization-mode",
            "RBAC",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &path("sa.pub"),
            "--service-account-signing-key-file",
            &path("sa.key"),
            "--service-cluster-ip-range",
            "10.0.0.0/24",
            "--endpoint-reconciler-type",
            "none",
            "--disable-admission-plugins",
            "ServiceAccount",
            "--audit-policy-file",
            &path("audit-policy.yaml"),
            "--audit-log-path",
            &path("audit.log"),
        ]
        .map(str::to_owned)
        .to_vec();
        let api = Api::new(&format!("https://127.0.0.1:{secure_port}"), &pki.ca, ADMIN_TOKEN)?;
        let mut cluster = Self {
            apiserver: None,
            apiserver_starts: 0,
            etcd,
            scenario,
            apiserver_args,
            ca_pem: pki.ca,
            api,
            dir,
        };
        cluster.start_apiserver(env)?;
        cluster.apply_rbac(&env.manifest)?;
        cluster.apply_rbac(&env.doctor_manifest)?;
        cluster.apply_crd(&env.doctor_crd)?;
        for node in ["node1", "node2"] {
            cluster.create_node(node)?;
        }
        eprintln!("cluster ready: {} (etcd pid {})", cluster.api.server, cluster.etcd.child.id());
        Ok(cluster)
    }

    /// Creates Node `node` as the kubelet creates its Node, with labels: the
    /// API server tracks field owners from a create that sets some field,
    /// and never from updates to an object it tracks none on.
    pub(super) fn create_node(&self, node: &str) -> Result {
        self.api.post(
            "/api/v1/nodes?fieldManager=kubelet",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {
                "kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}}}),
        )?;
        Ok(())
    }

    /// The API server's audit log: the writes made, by whom.
    pub(super) fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// How long the audit log is now: where [`writes_by`](Self::writes_by)
    /// starts to count from.
    pub(super) fn audit_offset(&self) -> u64 {
        fs::metadata(self.audit_log()).map_or(0, |meta| meta.len())
    }

    /// The writes `user` made, from byte `from` of the audit log (a
    /// restarted kube-apiserver appends to it).
    pub(super) fn writes_by(&self, user: &str, from: u64) -> Result<Vec<Write>> {
        let text = fs::read(self.audit_log())?;
        let text =
            String::from_utf8_lossy(&text[usize::try_from(from)?.min(text.len())..]).into_owned();
        let mut writes = Vec::new();
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<Value>(line) else { continue };
            if entry["stage"] != "ResponseComplete" || entry["user"]["username"] != user {
                continue;
            }
            let verb = entry["verb"].as_str().unwrap_or_default();
            if !matches!(verb, "create" | "update" | "patch" | "delete" | "deletecollection") {
                continue;
            }
            let object = &entry["objectRef"];
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", object["resource"].as_str().unwrap_or_default()),
                None => object["resource"].as_str().unwrap_or_default().to_owned(),
            };
            writes.push(Write {
                what: format!("{verb} {resource}"),
                name: object["name"].as_str().unwrap_or_default().to_owned(),
                at: entry["stageTimestamp"].as_str().map_or(0.0, seconds_of),
                code: entry["responseStatus"]["code"].as_u64().unwrap_or_default(),
            });
        }
        Ok(writes)
    }

    /// Starts kube-apiserver (again) and waits for `/readyz`; a restart logs
    /// to `<scenario>-kube-apiserver-2.log` and so on. Returns when `/readyz`
    /// first answered 200.
    pub(super) fn start_apiserver(&mut self, env: &Env) -> Result<Instant> {
        let started = Instant::now();
        let args: Vec<&str> = self.apiserver_args.iter().map(String::as_str).collect();
        self.apiserver_starts += 1;
        let run = match self.apiserver_starts {
            1 => String::new(),
            n => format!("-{n}"),
        };
        let log =
            |suffix: &str| env.out.join(format!("{}-kube-apiserver{run}.{suffix}", self.scenario));
        let mut apiserver =
            Process::spawn("kube-apiserver", &env.apiserver, &args, &log("out"), &log("log"))?;
        let ready = wait_for("kube-apiserver /readyz", START_TIMEOUT, || {
            if let Some(status) = apiserver.child.try_wait()? {
                return Err(format!(
                    "kube-apiserver exited ({status}), see {}",
                    log("log").display()
                )
                .into());
            }
            let ready = self.api.request("GET", "/readyz", None).is_ok_and(|(code, _)| code == 200);
            Ok(ready.then(Instant::now))
        })?;
        eprintln!("kube-apiserver ready in {:?}", ready - started);
        self.apiserver = Some(apiserver);
        Ok(ready)
    }

    /// SIGKILL to kube-apiserver: a crash, and an end that does not wait
    /// for its many clients' watches to drain.
    pub(super) fn kill_apiserver(&mut self) -> Result {
        self.apiserver.take().ok_or("kube-apiserver is not running")?.kill();
        Ok(())
    }

    /// SIGTERM to kube-apiserver, and waits for it to exit.
    pub(super) fn stop_apiserver(&mut self) -> Result {
        self.apiserver.take().ok_or("kube-apiserver is not running")?.stop(STOP_TIMEOUT)
    }

    /// POSTs the `CustomResourceDefinition` of `manifest` as admin, and
    /// waits until its resource is served.
    fn apply_crd(&self, manifest: &Path) -> Result {
        let text = fs::read_to_string(manifest)
            .map_err(|err| format!("cannot read {}: {err}", manifest.display()))?;
        let crd: Value = serde_norway::from_str(&text)
            .map_err(|err| format!("{}: {err}", manifest.display()))?;
        self.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd)?;
        let collection = super::api::collection(&crd)?;
        wait_until(&format!("{collection} served"), STEP_TIMEOUT, || {
            Ok(self.api.request("GET", &collection, None)?.0 == 200)
        })
    }

    /// POSTs the `ServiceAccount`, `ClusterRole` and `ClusterRoleBinding` documents
    /// of `manifest` as admin; other kinds are left out.
    fn apply_rbac(&self, manifest: &Path) -> Result {
        let text = fs::read_to_string(manifest)
            .map_err(|err| format!("cannot read {}: {err}", manifest.display()))?;
        let mut applied = BTreeSet::new();
        for document in serde_norway::Deserializer::from_str(&text) {
            let object = Value::deserialize(document)
                .map_err(|err| format!("{}: {err}", manifest.display()))?;
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let collection = match kind.as_str() {
                "ServiceAccount" => "serviceaccounts",
                "ClusterRole" => "clusterroles",
                "ClusterRoleBinding" => "clusterrolebindings",
                _ => continue,
            };
            let group = match object["apiVersion"].as_str() {
                Some("v1") => "/api/v1".to_owned(),
                Some(version) => format!("/apis/{version}"),
                None => {
                    return Err(
                        format!("{kind} without apiVersion in {}", manifest.display()).into()
                    );
                }
            };
            let path = match object["metadata"]["namespace"].as_str() {
                Some(namespace) => format!("{group}/namespaces/{namespace}/{collection}"),
                None => format!("{group}/{collection}"),
            };
            // kube-system is created by the API server itself, soon after /readyz.
            wait_until(
                &format!("{kind} {} applied", object["metadata"]["name"]),
                STEP_TIMEOUT,
                || {
                    let (code, body) = self.api.request("POST", &path, Some(&object))?;
                    match code {
                        200..300 => Ok(true),
                        404 => Ok(false),
                        _ => Err(format!("POST {path}: {code} {}", body["message"]).into()),
                    }
                },
            )?;
            applied.insert(kind);
        }
        for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
            if !applied.contains(kind) {
                return Err(format!("{} has no {kind} for kpm", manifest.display()).into());
            }
        }
        Ok(())
    }

    /// Writes a kubeconfig for `token` to `file` in the cluster's dir.
    pub(super) fn kubeconfig(&self, file: &str, token: &str) -> Result<PathBuf> {
        let kubeconfig = self.dir.path().join(file);
        super::api::write_kubeconfig(&kubeconfig, &self.api.server, &self.ca_pem, token)?;
        Ok(kubeconfig)
    }

    /// Writes the kubeconfig for kpm's token and starts `kpm run` on a root
    /// in the cluster's dir.
    pub(super) fn start_kpm(&self, env: &Env, scenario: &str) -> Result<RunningKpm> {
        self.start_kpm_with_device_grace(env, scenario, DEVICE_GRACE_SECS)
    }

    /// [`start_kpm`](Self::start_kpm) with `--device-cleanup-grace
    /// device_grace_secs`.
    pub(super) fn start_kpm_with_device_grace(
        &self,
        env: &Env,
        scenario: &str,
        device_grace_secs: u64,
    ) -> Result<RunningKpm> {
        let kubeconfig = self.kubeconfig("kubeconfig", KPM_TOKEN)?;
        let root = self.dir.path().join("kpm");
        fs::create_dir_all(root.join("plugins_registry"))?;
        let log = env.out.join(format!("{scenario}-kpm.log"));
        RunningKpm::start(
            &env.kpm,
            &root,
            &[
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--node-name",
                "node1",
                "--dra-cleanup-grace",
                &DRA_GRACE_SECS.to_string(),
                "--device-cleanup-grace",
                &device_grace_secs.to_string(),
                // A killed plugin's socket refuses the next probe: it is
                // noticed within a second, not within the default 10.
                "--liveness-period",
                "1",
            ],
            &log,
        )
    }
}
