//! `kpm check` on real plugins: each one's report must end with the tally
//! `docs/plugin-authors.md` gives for it, and its `JUnit` report must carry
//! every step. Where a real plugin warns or fails, the docs say why and
//! whether the rule or the plugin is wrong.

use std::fs;
use std::path::Path;

use super::{Env, NULL_DEVICES, Skip};
use crate::command::Result;

/// The CI job's script (`docs/plugin-authors.md`), which every scenario
/// here runs `kpm check` through, so that the job the docs give stays one
/// that works.
const SCRIPT: &str = "ci/kpm-check.sh";

/// generic-device-plugin: registers on `kubelet.sock`, and again only once
/// its own socket is removed; `squat.ai/null`, three `/dev/null`s.
pub(super) fn generic_device_plugin(env: &Env, _root: &Path) -> Result {
    check_alone(env, "generic-device-plugin", &generic_command(env), &[GENERIC_TALLY])
}

/// generic-device-plugin's tally, on the host and in kpm's image.
const GENERIC_TALLY: &str = "11 passed, 0 failed";

fn generic_command(env: &Env) -> [String; 5] {
    [
        bin(env, "generic-device-plugin"),
        "--plugin-directory={device-plugins}".to_owned(),
        "--domain=squat.ai".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        format!("--device={NULL_DEVICES}"),
    ]
}

/// The name kpm's image is imported under.
const IMAGE: &str = "ghcr.io/kpm-rs/kpm:interop";

/// `kpm check` run from kpm's image (the layout `cargo xtask image`
/// gives, around the kpm built here) by the CI job's script with `ctr`, on
/// generic-device-plugin (static) mounted in from DIR: the same tally as
/// on the host. It needs a containerd that `ctr` reaches (its socket in
/// `CONTAINERD_ADDRESS`), and is skipped, saying why, without one.
pub(super) fn image(env: &Env, _root: &Path) -> Result {
    let ctr = |args: &[&str]| std::process::Command::new("ctr").args(args).output();
    match ctr(&["version"]) {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.lines().last().unwrap_or_default();
            return Err(Skip(format!("no containerd answers ctr: {said}")).into());
        }
        Err(err) => return Err(Skip(format!("no ctr: {err}")).into()),
    }
    let image = crate::image::kpm_image_of(IMAGE, &env.kpm)?;
    let archive = crate::image::write_archive(&image, &env.out.join("check-image.oci.tar"))?;
    let imported = ctr(&["images", "import", &archive.path.display().to_string()])?;
    if !imported.status.success() {
        let said = String::from_utf8_lossy(&imported.stderr);
        return Err(format!("ctr images import {}: {said}", archive.path.display()).into());
    }
    let via = [("KPM_IMAGE", IMAGE), ("KPM_RUNTIME", "ctr")];
    run_check(env, "image", &[], &via, &[], &generic_command(env), &[GENERIC_TALLY]).map(drop)
}

/// Kubernetes' e2e sample device plugin, its socket in the registry
/// (`dp.<time>`: a name the kubelet takes, so a warning); the control file
/// keeps it off the host's own `kubelet.sock`.
pub(super) fn sample_device_plugin(env: &Env, _root: &Path) -> Result {
    let command = format!(
        "touch {{root}}/register-control && PLUGIN_SOCK_DIR={{registry}} \
         REGISTER_CONTROL_FILE={{root}}/register-control exec {}",
        bin(env, "sample-device-plugin")
    );
    check_alone(
        env,
        "sample-device-plugin",
        &["sh", "-c", &command],
        &["12 passed, 1 warned, 0 failed"],
    )
}

/// node-driver-registrar with hostpathplugin, as one command.
pub(super) fn node_driver_registrar(env: &Env, _root: &Path) -> Result {
    let driver = format!(
        "{} --endpoint=unix://{{plugins}}/csi.sock --nodeid=node-1 --drivername=hostpath.csi.k8s.io \
         --statedir={{root}}/state",
        bin(env, "hostpathplugin"),
    );
    let command = with_registrar(env, &driver);
    check_alone(env, "node-driver-registrar", &["sh", "-c", &command], &["11 passed, 0 failed"])
}

/// kubernetes-csi's NFS driver (`nfs.csi.k8s.io`) with node-driver-registrar;
/// it needs no NFS server until a volume is published, which the suite does
/// not do.
pub(super) fn nfsplugin(env: &Env, _root: &Path) -> Result {
    let driver =
        format!("{} -endpoint unix://{{plugins}}/csi.sock -nodeid node-1", bin(env, "nfsplugin"));
    let command = with_registrar(env, &driver);
    check_alone(env, "nfsplugin", &["sh", "-c", &command], &["11 passed, 0 failed"])
}

/// A shell command running a CSI driver's `driver` command (serving
/// `{plugins}/csi.sock`) in the background and node-driver-registrar in
/// its place: the suite's SIGTERM and restarts reach the registrar, as a
/// kubelet's reach the registrar's container, and the driver stays.
fn with_registrar(env: &Env, driver: &str) -> String {
    format!(
        "{driver} & exec {} --csi-address={{plugins}}/csi.sock \
         --kubelet-registration-path={{plugins}}/csi.sock --plugin-registration-path={{registry}}",
        bin(env, "node-driver-registrar"),
    )
}

/// Intel's GPU device plugin on eight fake DG1 cards made by its own
/// `gpu_fakedev` (device nodes: root only). It knows only
/// `/var/lib/kubelet/device-plugins`, so it runs in a mount namespace of
/// its own with the check's directory mounted there. Three warnings: its
/// default allocation policy ignores `must_include_deviceIDs`, it leaves
/// its socket on SIGTERM, and a second instance exits beside the first
/// (one socket name, `gpu.intel.com-i915.sock`, "already in use").
pub(super) fn intel_gpu_plugin(env: &Env, root: &Path) -> Result {
    if !is_root() {
        return Err(Skip("intel_gpu_fakedev makes device nodes: run as root".into()).into());
    }
    // gpu_fakedev's own format: eight 4 GiB DG1 cards.
    let spec = r#"{"Info": "8x 4 GiB DG1", "DevCount": 8, "DevMemSize": 4294967296,
                   "Capabilities": {"platform": "fake_DG1"}}"#;
    fs::write(root.join("8x-DG1.json"), spec)?;
    let made = std::process::Command::new(env.bin_dir.join("intel_gpu_fakedev"))
        .args(["-json", "8x-DG1.json"])
        .current_dir(root)
        .output()?;
    if !made.status.success() {
        return Err(format!(
            "intel_gpu_fakedev in {}: {}",
            root.display(),
            String::from_utf8_lossy(&made.stderr)
        )
        .into());
    }
    let plugin = format!("{} -prefix {}", bin(env, "intel_gpu_plugin"), root.display());
    let command = at_kubelet_device_plugins(&plugin);
    check_alone(env, "intel-gpu-plugin", &command, &["9 passed, 3 warned, 0 failed"])
}

/// thehonker's fork of k8s-hostdev-plugin (the fork that registers again
/// when `kubelet.sock` is made anew), on `/dev/null`: 64 devices of
/// `hostdev.k8s.io/dev_null`. It knows only `/var/lib/kubelet/device-plugins`.
/// Three warnings: its `Allocate` answers one container response whatever
/// it is asked, and allocates an id it never listed; and a second instance
/// takes the first's socket path over (`server.go`: "address already in
/// use", the file removed, bound again 5 s later), which the first's exit
/// then removes (NVIDIA/k8s-device-plugin#1792).
pub(super) fn hostdev_device_plugin(env: &Env, _root: &Path) -> Result {
    if !is_root() {
        return Err(Skip("mounts in a mount namespace of its own: run as root".into()).into());
    }
    let plugin = format!("{} --devs /dev/null:rwm", bin(env, "hostdev-device-plugin"));
    let command = at_kubelet_device_plugins(&plugin);
    check_alone(env, "hostdev-device-plugin", &command, &["8 passed, 3 warned, 0 failed"])
}

/// The command running `plugin` (a shell command) in a mount namespace of
/// its own where the check's device-plugins directory is
/// `/var/lib/kubelet/device-plugins`, for plugins that know no other: a
/// tmpfs on `/var/lib` keeps the host's kubelet out of sight.
fn at_kubelet_device_plugins(plugin: &str) -> [String; 5] {
    let command = format!(
        "mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/kubelet/device-plugins && \
         mount --bind \"$KPM_CHECK_DEVICE_PLUGINS\" /var/lib/kubelet/device-plugins && \
         exec {plugin}"
    );
    ["unshare", "-m", "sh", "-c", &command].map(str::to_owned)
}

/// cert-manager's CSI driver (`csi.cert-manager.io`: certificates as
/// ephemeral volumes), node only, with node-driver-registrar. It watches
/// its `CertificateRequest`s, so the API server gets their CRD (a minimal
/// one: no controller issues them here). It reads `--data-root` relative
/// to `/` (csi-lib lists it through `os.DirFS("/")`) and mounts a tmpfs
/// there at start: `/` is its cwd, and it runs in a mount namespace of
/// its own.
pub(super) fn cert_manager_csi_driver(env: &Env, root: &Path) -> Result {
    if !is_root() {
        return Err(Skip("mounts in a mount namespace of its own: run as root".into()).into());
    }
    let crd = root.join("certificaterequests.yaml");
    fs::write(&crd, CERTIFICATE_REQUESTS)?;
    let driver = format!(
        "cd / && exec {} --kubeconfig {{kubeconfig}} --node-id {{node}} \
         --endpoint unix://{{plugins}}/csi.sock --data-root \"${{KPM_CHECK_ROOT#/}}/csi-data\"",
        bin(env, "cert-manager-csi-driver")
    );
    let command = with_registrar(env, &driver);
    let command = ["unshare", "-m", "--propagation", "private", "sh", "-c", &command];
    let command = command.map(str::to_owned);
    let expected = ["11 passed, 0 failed"];
    check_with_cluster(env, "cert-manager-csi-driver", &[&crd], &command, &expected, &[])
}

/// cert-manager's `CertificateRequest`, as little of its CRD as the CSI
/// driver's informer needs: the kind served and stored, any fields.
const CERTIFICATE_REQUESTS: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: certificaterequests.cert-manager.io
spec:
  group: cert-manager.io
  names:
    kind: CertificateRequest
    listKind: CertificateRequestList
    plural: certificaterequests
    singular: certificaterequest
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

/// Whether this process runs as root (`Uid:`'s effective id in
/// `/proc/self/status`).
fn is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|line| line.strip_prefix("Uid:"));
    uid.and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
}

/// Kubernetes' e2e DRA test driver, against an API server of its own.
pub(super) fn dra_test_driver(env: &Env, _root: &Path) -> Result {
    let command = format!(
        "mkdir -p {{plugins}}/test-driver.cdi.k8s.io && exec {} --kubeconfig {{kubeconfig}} \
         --drivername test-driver.cdi.k8s.io kubelet-plugin --node-name {{node}} \
         --plugin-registration-path {{registry}} --datadir {{plugins}} --cdi-dir {{cdi}} \
         --num-devices 2",
        bin(env, "dra-test-driver")
    );
    // Its DRAResourceHealth reports no device until its test tells it to
    // (`kubeletplugin.go`: `deviceHealth` starts empty): a warning.
    let tally = Tally { passed: 23, warned: 1 };
    check_dra(env, "dra-test-driver", &command, tally, &[], &[WIPED_SLICES_STAY_GONE])
}

/// What drivers on the kubelet plugin helper of Kubernetes v1.36.2 fail:
/// its slice controller reads its slices through a mutation cache that
/// keeps a slice it wrote for a minute (`DefaultMutationCacheTTL`, with
/// `includeAdds`, `resourceslice/resourceslicecontroller.go`), so the
/// sync a deletion schedules finds the wiped slices still there and
/// writes nothing: they stay gone. Once the cache forgot the slices, a
/// minute after the driver wrote them, the sync writes them again: a wipe
/// that comes about then (the test driver's health check waits out its
/// bound first) passes or fails by a few milliseconds.
const WIPED_SLICES_STAY_GONE: &str = "ResourceSlices after a wipe";

/// What dra-example-driver fails: a claim its checkpoint holds is answered
/// from there without writing its CDI spec again (`state.go`,
/// `DeviceState.Prepare`: `restoreClaimFromCheckpoint` returns before
/// `CreateClaimSpecFile`), so after a reboot emptied `/var/run/cdi` the
/// claim's CDI id resolves nowhere (kubernetes#141433).
const REPREPARE_WITHOUT_SPEC: &str = "prepare after reboot";

/// kubernetes-sigs' example DRA driver (simulated GPUs), against an API
/// server of its own; its common CDI spec reads the node's name from
/// `NODE_NAME`.
pub(super) fn dra_example_driver(env: &Env, _root: &Path) -> Result {
    let known = [WIPED_SLICES_STAY_GONE, REPREPARE_WITHOUT_SPEC];
    let command = dra_example_command(env, "");
    check_dra(env, "dra-example-driver", &command, Tally { passed: 21, warned: 0 }, &known, &[])
}

/// The same with its shareable GPUs (`--gpu-allow-multiple-allocations`:
/// memory and compute capacities with request policies): each claim
/// checks also a second share of its GPU.
pub(super) fn dra_example_driver_shared(env: &Env, _root: &Path) -> Result {
    let command = dra_example_command(env, " --gpu-allow-multiple-allocations");
    let known = [WIPED_SLICES_STAY_GONE, REPREPARE_WITHOUT_SPEC];
    let tally = Tally { passed: 23, warned: 0 };
    check_dra(env, "dra-example-driver-shared", &command, tally, &known, &[])
}

/// dra-example-driver's command, four GPUs, with `options`.
fn dra_example_command(env: &Env, options: &str) -> String {
    format!(
        "NODE_NAME={{node}} exec {} --node-name {{node}} --kubeconfig {{kubeconfig}} \
         --kubelet-registrar-directory-path {{registry}} --kubelet-plugins-directory-path \
         {{plugins}} --cdi-root {{cdi}} --num-devices 4{options}",
        bin(env, "dra-example-kubeletplugin")
    )
}

/// How many checks of a report pass and warn, besides those that fail.
#[derive(Clone, Copy)]
struct Tally {
    passed: usize,
    warned: usize,
}

impl Tally {
    /// The report's last line, with `failed` checks failing and passing no
    /// more.
    fn line(self, failed: usize) -> String {
        let passed = self.passed - failed;
        match self.warned {
            0 => format!("{passed} passed, {failed} failed"),
            warned => format!("{passed} passed, {warned} warned, {failed} failed"),
        }
    }
}

/// `kpm check --kubeconfig` of a DRA driver's `command` on node `node1` of
/// a cluster of its own: besides the `known` failures of the driver, the
/// checks pass and warn as `tally` says, except the `timing` failures,
/// which fail or pass by when they come. Both drivers, on the
/// kubelet-plugin helper, now and then exit on SIGTERM before removing
/// their registration socket: that check fails too then.
fn check_dra(
    env: &Env,
    name: &'static str,
    command: &str,
    tally: Tally,
    known: &[&str],
    timing: &[&str],
) -> Result {
    let tally = Tally { passed: tally.passed + known.len(), ..tally };
    let failing = known.len()..=known.len() + timing.len() + 1;
    let expected: Vec<String> = failing.map(|failed| tally.line(failed)).collect();
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    let known: Vec<&str> = known.iter().chain(timing).copied().collect();
    let command = ["sh", "-c", command].map(str::to_owned);
    check_with_cluster(env, name, &[], &command, &expected, &known)
}

/// `kpm check --kubeconfig` of a driver that reads the API server: the
/// script starts etcd and kube-apiserver from `--bin-dir` with Node
/// `node1` and the `crds`, and the report must end with one of the
/// `expected` tallies, with no failure but the `known` ones (and SIGTERM's).
fn check_with_cluster(
    env: &Env,
    name: &str,
    crds: &[&Path],
    command: &[String],
    expected: &[&str],
    known: &[&str],
) -> Result {
    let mut setup = vec!["--cluster".to_owned(), env.bin_dir.display().to_string()];
    for crd in crds {
        setup.extend(["--crd".to_owned(), crd.display().to_string()]);
    }
    let report = run_check(env, name, &setup, &[], &["--timeout", "20"], command, expected)?;
    let unknown = report.lines().filter(|line| line.starts_with("FAIL ")).find(|line| {
        let check = line.trim_start_matches("FAIL ");
        !check.starts_with("SIGTERM") && !known.iter().any(|known| check.starts_with(known))
    });
    match unknown {
        Some(failed) => Err(format!("kpm check of {name}: {failed}").into()),
        None => Ok(()),
    }
}

/// `kpm check` of a plugin that needs no API server: the report must end
/// with one of the `expected` tallies.
fn check_alone<S: AsRef<std::ffi::OsStr>>(
    env: &Env,
    name: &str,
    command: &[S],
    expected: &[&str],
) -> Result {
    run_check(env, name, &[], &[], &[], command, expected).map(drop)
}

fn bin(env: &Env, name: &str) -> String {
    env.bin_dir.join(name).display().to_string()
}

/// Runs `kpm check` on `command` through the CI job's script ([`SCRIPT`],
/// `--junit`, `options`), its own `setup` options first and `via` in its
/// environment (kpm's image), so that every
/// real driver here runs the job the docs give; keeps the script's output
/// in `target/interop/check-NAME/` and fails unless the report ends with
/// one of the `expected` tallies (exit 0 unless a step failed) and the
/// `JUnit` report has a test case per step. Returns the report.
fn run_check<S: AsRef<std::ffi::OsStr>>(
    env: &Env,
    name: &str,
    setup: &[String],
    via: &[(&str, &str)],
    options: &[&str],
    command: &[S],
    expected: &[&str],
) -> Result<String> {
    let out = env.out.join(format!("check-{name}"));
    let [etcd, peer, apiserver] = [(); 3].map(|()| kpm_test_support::free_port().to_string());
    let run = std::process::Command::new(env.root.join(SCRIPT))
        .env("KPM", &env.kpm)
        .envs([("ETCD_PORT", etcd), ("ETCD_PEER_PORT", peer), ("APISERVER_PORT", apiserver)])
        .envs(via.iter().copied())
        .args(setup)
        .arg(&out)
        .args(options)
        .arg("--")
        .args(command)
        .output()?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    // The script's own failures name their step, on its last line.
    if let Some(failed) = stderr.lines().rev().find(|line| line.contains("kpm-check.sh: ")) {
        return Err(format!("{SCRIPT} for {name}: {failed}").into());
    }
    let report = String::from_utf8_lossy(&run.stdout).into_owned();
    eprintln!("{report}");
    let steps = report.lines().filter(|line| is_step(line)).count();
    let failed = report.lines().filter(|line| line.starts_with("FAIL ")).count();
    let junit = out.join("kpm-check.xml");
    let xml = fs::read_to_string(&junit).unwrap_or_default();
    let suites = xml.lines().find(|line| line.starts_with("<testsuites ")).unwrap_or_default();
    let cases = format!(r#" tests="{steps}""#);
    let failures = format!(r#" failures="{failed}""#);
    if !(suites.contains(&cases) && suites.contains(&failures)) {
        return Err(format!(
            "kpm check of {name}: the JUnit report {} begins {suites:?}, the report has {steps} \
             steps, {failed} failed",
            junit.display()
        )
        .into());
    }
    let tally = report.trim_end().lines().last().unwrap_or_default();
    if run.status.success() == (failed == 0) && expected.contains(&tally) {
        Ok(report)
    } else {
        Err(format!(
            "kpm check of {name}: {} ({}), expected {}",
            report.trim_end(),
            run.status,
            expected.join(" or ")
        )
        .into())
    }
}

/// A step's line: `PASS `, `WARN `, `FAIL ` or `SKIP ` and the step.
fn is_step(line: &str) -> bool {
    ["PASS ", "WARN ", "FAIL ", "SKIP "].iter().any(|mark| line.starts_with(mark))
}
