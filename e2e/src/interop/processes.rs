//! Starting the programs of a scenario, each logging to `target/interop`,
//! and waiting on `kpm list`.

use std::path::Path;

use super::{Env, NULL_DEVICES, STEP_TIMEOUT};
use crate::command::Result;
use crate::scenario::{Process, RunningKpm, wait_for};

/// hostpathplugin serving driver `name` on `endpoint`, node id `node-1`.
pub(super) fn hostpath(
    env: &Env,
    scenario: &str,
    root: &Path,
    name: &str,
    endpoint: &Path,
    extra: &[&str],
) -> Result<Process> {
    let endpoint = format!("--endpoint=unix://{}", endpoint.display());
    let driver = format!("--drivername={name}");
    let state = format!("--statedir={}", root.join(format!("{name}-state")).display());
    let mut args = vec![endpoint.as_str(), "--nodeid=node-1", &driver, &state];
    args.extend_from_slice(extra);
    peer(env, scenario, "hostpathplugin", &args)
}

/// generic-device-plugin registering `squat.ai/null` (3 devices, all
/// `/dev/null`) on `root`'s `kubelet.sock`.
pub(super) fn null_devices(env: &Env, scenario: &str, root: &Path) -> Result<Process> {
    let dir = root.join("device-plugins").display().to_string();
    let args = [
        "--plugin-directory",
        &dir,
        "--domain",
        "squat.ai",
        "--listen",
        "127.0.0.1:0",
        "--device",
        NULL_DEVICES,
    ];
    peer(env, scenario, "generic-device-plugin", &args)
}

pub(super) fn start_kpm(env: &Env, root: &Path, scenario: &str) -> Result<RunningKpm> {
    start_kpm_with(env, root, scenario, &[])
}

pub(super) fn start_kpm_with(
    env: &Env,
    root: &Path,
    scenario: &str,
    args: &[&str],
) -> Result<RunningKpm> {
    RunningKpm::start(&env.kpm, root, args, &env.out.join(format!("{scenario}-kpm.log")))
}

/// Starts `program` from the bin dir.
pub(super) fn peer(env: &Env, scenario: &str, program: &str, args: &[&str]) -> Result<Process> {
    spawn(env, scenario, program, &env.bin_dir.join(program), args)
}

/// Starts `bin`, naming it `name` in messages and in its log files in `target/interop`.
pub(super) fn spawn(
    env: &Env,
    scenario: &str,
    name: &str,
    bin: &Path,
    args: &[&str],
) -> Result<Process> {
    spawn_command(env, scenario, name, std::process::Command::new(bin).args(args))
}

/// [`spawn`] for a command given its arguments and environment already.
pub(super) fn spawn_command(
    env: &Env,
    scenario: &str,
    name: &str,
    command: &mut std::process::Command,
) -> Result<Process> {
    let log = |suffix: &str| env.out.join(format!("{scenario}-{name}.{suffix}"));
    Process::spawn_command(name, command, &log("out"), &log("err"))
}

/// Waits until `kpm list -o json` shows what `found` looks for.
pub(super) fn wait_for_list<T>(
    kpm: &RunningKpm,
    what: &str,
    found: impl Fn(&serde_json::Value) -> Result<Option<T>>,
) -> Result<T> {
    wait_for(what, STEP_TIMEOUT, || found(&kpm.list()?))
}
