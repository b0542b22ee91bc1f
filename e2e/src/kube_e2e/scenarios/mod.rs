//! The scenarios, one file per subject, and the table that names them.
//!
//! Each runs on a fresh [`Cluster`] and checks through the API server (as
//! admin), never through kpm, except for the request count kpm reports.

use crate::command::Result;
use crate::kube_e2e::Env;
use crate::kube_e2e::cluster::Cluster;
use crate::scenario::{Process, RunningKpm};

mod access;
mod csi;
mod device;
mod doctor;
mod dra;
mod flapping;
mod fleet;
mod fleet_daemon_set;
mod fleet_scale;
mod hang;
mod outage;

/// A scenario: its name for `--only`, and what it runs on a fresh cluster.
pub(super) struct Scenario {
    pub(super) name: &'static str,
    /// Whether it runs `kpm`: the `cluster` scenario checks the cluster alone.
    pub(super) needs_kpm: bool,
    pub(super) run: fn(&Env, &mut Cluster) -> Result,
}

/// Every scenario, in the order they run.
pub(super) const SCENARIOS: &[Scenario] = &[
    Scenario { name: "cluster", needs_kpm: false, run: access::cluster },
    Scenario { name: "csi", needs_kpm: true, run: csi::csi },
    Scenario { name: "csi-allocatable", needs_kpm: true, run: csi::csi_allocatable },
    Scenario { name: "device-plugin", needs_kpm: true, run: device::device_plugin },
    Scenario { name: "device-leftovers", needs_kpm: true, run: device::device_leftovers },
    Scenario { name: "dra", needs_kpm: true, run: dra::dra },
    Scenario { name: "dra-test-driver", needs_kpm: true, run: dra::dra_test_driver },
    Scenario { name: "apiserver-down", needs_kpm: true, run: outage::apiserver_down },
    Scenario { name: "outage", needs_kpm: true, run: outage::outage },
    Scenario { name: "doctor", needs_kpm: true, run: doctor::doctor },
    Scenario { name: "fleet", needs_kpm: true, run: fleet::fleet },
    Scenario { name: "fleet-scale", needs_kpm: true, run: fleet_scale::fleet_scale },
    Scenario { name: "flapping", needs_kpm: true, run: flapping::flapping },
    Scenario { name: "hang", needs_kpm: true, run: hang::hang },
];

/// The API requests kpm has made so far: the sum of `kubernetes.requests[].count`
/// in `kpm list -o json`.
fn requests(kpm: &RunningKpm) -> Result<u64> {
    let list = kpm.list()?;
    let requests = list["kubernetes"]["requests"]
        .as_array()
        .ok_or("kpm list -o json has no kubernetes.requests")?;
    requests
        .iter()
        .map(|r| {
            r["count"]
                .as_u64()
                .ok_or_else(|| format!("a request count that is not a number: {r}").into())
        })
        .sum()
}

/// An example plugin registering with `kpm`, `name` in its log files.
fn plugin(kpm: &RunningKpm, env: &Env, name: &str, args: &[&str]) -> Result<Process> {
    let registry = kpm.root.join("plugins_registry").display().to_string();
    let mut all = vec!["--dir", &registry];
    all.extend_from_slice(args);
    let log = |suffix: &str| env.out.join(format!("{name}-plugin.{suffix}"));
    Process::spawn(name, &env.example_plugin, &all, &log("out"), &log("err"))
}
