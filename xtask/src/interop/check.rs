//! `kpm check` on real plugins: each one's report must end with the tally
//! `docs/plugin-authors.md` gives for it, and its `JUnit` report must carry
//! every step. Where a real plugin warns or fails, the docs say why and
//! whether the rule or the plugin is wrong.

use std::fs;
use std::path::Path;

use super::{Env, NULL_DEVICES, Skip};
use crate::Result;

/// generic-device-plugin: registers on `kubelet.sock`, and again only once
/// its own socket is removed; `squat.ai/null`, three `/dev/null`s.
pub(super) fn generic_device_plugin(env: &Env, _root: &Path) -> Result {
    let generic = bin(env, "generic-device-plugin");
    let device = format!("--device={NULL_DEVICES}");
    let command = [
        generic.as_str(),
        "--plugin-directory={device-plugins}",
        "--domain=squat.ai",
        "--listen=127.0.0.1:0",
        &device,
    ];
    run_check(env, "generic-device-plugin", &[], &command, &["10 passed, 0 failed"])
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
    run_check(
        env,
        "sample-device-plugin",
        &[],
        &["sh", "-c", &command],
        &["11 passed, 1 warned, 0 failed"],
    )
}

/// node-driver-registrar with hostpathplugin, as one command.
pub(super) fn node_driver_registrar(env: &Env, _root: &Path) -> Result {
    let command = format!(
        "{} --endpoint=unix://{{plugins}}/csi.sock --nodeid=node-1 --drivername=hostpath.csi.k8s.io \
         --statedir={{root}}/state & exec {} --csi-address={{plugins}}/csi.sock \
         --kubelet-registration-path={{plugins}}/csi.sock --plugin-registration-path={{registry}}",
        bin(env, "hostpathplugin"),
        bin(env, "node-driver-registrar"),
    );
    run_check(env, "node-driver-registrar", &[], &["sh", "-c", &command], &["11 passed, 0 failed"])
}

/// Intel's GPU device plugin on eight fake DG1 cards made by its own
/// `gpu_fakedev` (device nodes: root only). It knows only
/// `/var/lib/kubelet/device-plugins`, so it runs in a mount namespace of
/// its own with the check's directory mounted there. Two warnings: its
/// default allocation policy ignores `must_include_deviceIDs`, and it
/// leaves its socket on SIGTERM.
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
    let command = format!(
        "mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/kubelet/device-plugins && \
         mount --bind \"$KPM_CHECK_DEVICE_PLUGINS\" /var/lib/kubelet/device-plugins && \
         exec {} -prefix {}",
        bin(env, "intel_gpu_plugin"),
        root.display()
    );
    let command = ["unshare", "-m", "sh", "-c", &command];
    run_check(env, "intel-gpu-plugin", &[], &command, &["9 passed, 2 warned, 0 failed"])
}

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
    check_dra(env, "dra-test-driver", &command, 22, &[WIPED_SLICES_STAY_GONE])
}

/// What drivers on the kubelet plugin helper of Kubernetes v1.36.2 fail:
/// its slice controller reads its slices through a mutation cache that
/// keeps a slice it wrote for a minute (`DefaultMutationCacheTTL`, with
/// `includeAdds`, `resourceslice/resourceslicecontroller.go`), so the
/// sync a deletion schedules finds the wiped slices still there and
/// writes nothing: they stay gone.
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
    check_dra(env, "dra-example-driver", &dra_example_command(env, ""), 21, &known)
}

/// The same with its shareable GPUs (`--gpu-allow-multiple-allocations`:
/// memory and compute capacities with request policies): each claim
/// checks also a second share of its GPU.
pub(super) fn dra_example_driver_shared(env: &Env, _root: &Path) -> Result {
    let command = dra_example_command(env, " --gpu-allow-multiple-allocations");
    let known = [WIPED_SLICES_STAY_GONE, REPREPARE_WITHOUT_SPEC];
    check_dra(env, "dra-example-driver-shared", &command, 23, &known)
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

/// `kpm check --kubeconfig` of a DRA driver's `command` on node `node1` of
/// a cluster of its own: `passed` checks pass and the `known` failures of
/// the driver fail, no other. Both drivers, on the kubelet-plugin helper,
/// now and then exit on SIGTERM before removing their registration
/// socket: that check fails too then.
fn check_dra(
    env: &Env,
    name: &'static str,
    command: &str,
    passed: usize,
    known: &[&str],
) -> Result {
    let node = "node1";
    crate::kube_e2e::with_cluster(&env.root, &env.bin_dir, &env.out, name, |admin| {
        let admin = admin.display().to_string();
        let options = ["--kubeconfig", &admin, "--node-name", node, "--timeout", "20"];
        let failed = known.len();
        let expected = [
            format!("{passed} passed, {failed} failed"),
            format!("{} passed, {} failed", passed - 1, failed + 1),
        ];
        let expected = expected.each_ref().map(String::as_str);
        run_check(env, name, &options, &["sh", "-c", command], &expected)?;
        let report = fs::read_to_string(env.out.join(format!("check-{name}.out")))?;
        let unknown = report.lines().filter(|line| line.starts_with("FAIL ")).find(|line| {
            let check = line.trim_start_matches("FAIL ");
            !check.starts_with("SIGTERM") && !known.iter().any(|known| check.starts_with(known))
        });
        match unknown {
            Some(failed) => Err(format!("kpm check of {name}: {failed}").into()),
            None => Ok(()),
        }
    })
}

fn bin(env: &Env, name: &str) -> String {
    env.bin_dir.join(name).display().to_string()
}

/// Runs `kpm check --junit FILE OPTIONS -- COMMAND`, shows and keeps its
/// report, and fails unless it ends with one of the `expected` tallies
/// (exit 0 unless a step failed) and the `JUnit` report has a test case per step.
fn run_check(
    env: &Env,
    name: &str,
    options: &[&str],
    command: &[&str],
    expected: &[&str],
) -> Result {
    let junit = env.out.join(format!("check-{name}.xml"));
    let out = std::process::Command::new(&env.kpm)
        .arg("check")
        .arg("--junit")
        .arg(&junit)
        .args(options)
        .arg("--")
        .args(command)
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    fs::write(env.out.join(format!("check-{name}.out")), report.as_bytes())?;
    let steps = report.lines().filter(|line| is_step(line)).count();
    let failed = report.lines().filter(|line| line.starts_with("FAIL ")).count();
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
    if out.status.success() == (failed == 0) && expected.contains(&tally) {
        Ok(())
    } else {
        Err(format!(
            "kpm check of {name}: {} ({}), expected {}",
            report.trim_end(),
            out.status,
            expected.join(" or ")
        )
        .into())
    }
}

/// A step's line: `PASS `, `WARN `, `FAIL ` or `SKIP ` and the step.
fn is_step(line: &str) -> bool {
    ["PASS ", "WARN ", "FAIL ", "SKIP "].iter().any(|mark| line.starts_with(mark))
}
