//! The scenarios, in the order they run on one node: each leaves what it
//! deployed for the next (the doctor judges the CSI driver deployed before
//! it), and says in one line what it measured.

use std::path::{Path, PathBuf};

use super::node::Node;
use super::{DEFAULT_KUBELET_ROOT, Env, OTHER_KUBELET_ROOT};
use crate::command::Result;

mod alert;
mod breakage;
mod containerd_restart;
mod csi;
mod device;
mod doctor;
mod dra;
mod fleet;
mod kubelet_upgrade;
mod node_events;
mod pods;
mod readiness_gate;
mod reboot;
mod registrar;
mod restart_window;
mod run;
mod settle;
mod timeline;

pub(super) use settle::settle;

pub(super) struct Scenario {
    pub(super) name: &'static str,
    /// The programs it needs in the folder of real programs, besides the node's.
    pub(super) programs: &'static [&'static str],
    /// The scenarios whose deployments it works on: `--only` runs them first.
    pub(super) builds_on: &'static [&'static str],
    /// The kubelet's root directory: one node runs per root.
    pub(super) kubelet_root: &'static str,
    /// Whether it first waits for the node to settle from the scenarios
    /// before it ([`settle()`]): all but one that takes the node as the one
    /// before left it.
    pub(super) waits_to_settle: bool,
    /// Runs it; the summary line on success, [`Skipped`] when the node's
    /// kubelet cannot do what it checks.
    pub(super) run: fn(&Env, &mut Node) -> Result<String>,
}

/// A scenario's error when this node's kubelet cannot do what it checks
/// (a minor without the feature), and why: the outcome is `skipped: WHY`,
/// not a failure.
#[derive(Debug)]
pub(super) struct Skipped(pub(super) String);

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skipped {}

pub(super) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "csi-driver",
        builds_on: &[],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: csi::hostpath_driver,
    },
    Scenario {
        name: "doctor",
        builds_on: &[],
        programs: &[],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: doctor::doctor_daemonset,
    },
    Scenario {
        name: "registrar-killed",
        builds_on: &["csi-driver", "doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: breakage::registrar_killed,
    },
    Scenario {
        name: "driver-pod-deleted",
        builds_on: &["csi-driver", "doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: breakage::driver_pod_deleted,
    },
    Scenario {
        name: "alert",
        builds_on: &["csi-driver", "doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: alert::alert_fires,
    },
    Scenario {
        name: "device-plugin",
        builds_on: &["doctor"],
        programs: &["generic-device-plugin"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: device::device_plugin_socket_lost,
    },
    Scenario {
        name: "kubelet-restart",
        builds_on: &["doctor", "device-plugin"],
        programs: &["generic-device-plugin"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        // `device-plugin` may leave the doctor's `False/ClusterMismatch`,
        // which only the restart ends.
        waits_to_settle: false,
        run: device::kubelet_restart,
    },
    Scenario {
        name: "cluster",
        builds_on: &["doctor"],
        programs: &[],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: fleet::doctor_cluster,
    },
    Scenario {
        name: "wrong-registration-path",
        builds_on: &["doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: pods::wrong_registration_path,
    },
    Scenario {
        name: "csi-socket-in-registry",
        builds_on: &["doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: pods::csi_socket_in_registry,
    },
    Scenario {
        name: "driver-never-starts",
        builds_on: &["doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: pods::driver_never_starts,
    },
    Scenario {
        name: "leftover-after-uninstall",
        builds_on: &["doctor"],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: pods::leftover_after_uninstall,
    },
    Scenario {
        name: "kpm-run",
        builds_on: &[],
        programs: &[],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: run::kpm_run_daemonset,
    },
    Scenario {
        name: "footprint",
        builds_on: &["doctor"],
        programs: &[],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: fleet::doctor_footprint,
    },
    Scenario {
        name: "dra",
        builds_on: &["doctor"],
        programs: &["dra-test-driver"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: dra::dra_driver,
    },
    Scenario {
        name: "restart-window",
        builds_on: &["doctor"],
        programs: &["generic-device-plugin", "hostdev-plugin-noreregister"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: restart_window::restart_window,
    },
    Scenario {
        name: "readiness-gate",
        builds_on: &["doctor"],
        programs: &["node-readiness-controller", "node-readiness-controller.crd.yaml"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: readiness_gate::readiness_gate,
    },
    Scenario {
        name: "containerd-restart",
        builds_on: &["csi-driver", "doctor", "kpm-run"],
        programs: &["generic-device-plugin", "hostpathplugin", "node-driver-registrar"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: containerd_restart::containerd_restart,
    },
    Scenario {
        name: "reboot",
        builds_on: &["doctor", "kpm-run"],
        programs: &["generic-device-plugin", "dra-test-driver"],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: reboot::reboot,
    },
    // The table's scenarios of one root must be together (one node per
    // run of them); these two restart the kubelet.
    Scenario {
        name: "registrar-plugins",
        builds_on: &[],
        programs: &[],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: registrar::registrar_plugins,
    },
    // Last on this root: the node runs the newer kubelet from then on.
    Scenario {
        name: "kubelet-upgrade",
        builds_on: &["csi-driver", "doctor"],
        programs: &[
            "generic-device-plugin",
            "dra-test-driver",
            "hostpathplugin",
            "node-driver-registrar",
        ],
        kubelet_root: DEFAULT_KUBELET_ROOT,
        waits_to_settle: true,
        run: kubelet_upgrade::kubelet_upgrade,
    },
    Scenario {
        name: "kubelet-root",
        builds_on: &[],
        programs: &["hostpathplugin", "node-driver-registrar"],
        kubelet_root: OTHER_KUBELET_ROOT,
        waits_to_settle: true,
        run: other_kubelet_root,
    },
];

/// `kubelet-root`: on a kubelet whose root is not `/var/lib/kubelet`, the
/// CSI driver deployed for that root, and the doctor's DaemonSet applied as
/// on any other node: it runs and judges the node healthy.
fn other_kubelet_root(env: &Env, node: &mut Node) -> Result<String> {
    let csi = csi::hostpath_driver(env, node)?;
    let doctor = doctor::doctor_daemonset(env, node)?;
    Ok(format!("{}: {csi}; doctor: {doctor}", node.kubelet_root.display()))
}

/// A kustomize overlay in `target/node-e2e/overlays/NAME`, as a user writes
/// one: `kustomization` is its body, with `@DEPLOY@` standing for the
/// relative path to the repository's `deploy/`.
pub(super) fn overlay(env: &Env, name: &str, kustomization: &str) -> Result<PathBuf> {
    let dir = env.out.join("overlays").join(name);
    std::fs::create_dir_all(&dir)?;
    let deploy = relative(&dir, &env.root.join("deploy"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n{}",
            kustomization.replace("@DEPLOY@", &deploy.display().to_string())
        ),
    )?;
    Ok(dir)
}

/// The overlay `name` of `deploy/doctor` whose doctor writes the
/// conditions of `plugins` (`KPM_PLUGIN_CONDITIONS`, comma-separated
/// `NAME[=TYPE]`): its directory. It keeps the doctor off `kpm-run`'s
/// Node, which no kubelet runs: a pod Pending there would hold up the
/// rollout.
pub(super) fn doctor_with_plugin_conditions(
    env: &Env,
    name: &str,
    plugins: &str,
) -> Result<PathBuf> {
    overlay(
        env,
        name,
        &format!(
            "resources:\n  - @DEPLOY@/doctor\n{}patches:\n  - target: {{kind: DaemonSet, name: kpm-doctor}}\n    \
             patch: |-\n      - op: add\n        path: /spec/template/spec/containers/0/env/-\n        \
             value: {{name: KPM_PLUGIN_CONDITIONS, value: \"{plugins}\"}}\n      \
             - op: add\n        path: /spec/template/spec/affinity\n        \
             value: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: \
             {{nodeSelectorTerms: [{{matchExpressions: [{{key: {}, operator: DoesNotExist}}]}}]}}}}}}\n",
            namespace_and_image()?,
            run::NO_KUBELET_LABEL,
        ),
    )
}

/// The part of an overlay that sets the namespace and kpm's image.
pub(super) fn namespace_and_image() -> Result<String> {
    let (name, tag) = super::images::KPM.rsplit_once(':').ok_or("image without a tag")?;
    Ok(format!(
        "namespace: {}\nimages:\n  - name: ghcr.io/kpm-rs/kpm\n    newName: {name}\n    newTag: {tag}\n",
        doctor::NAMESPACE
    ))
}

/// `to` as a path relative to `from` (both absolute): kustomize takes bases
/// by relative path.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = std::iter::repeat_n("..", from.len() - common).collect();
    path.extend(&to[common..]);
    path
}

/// Seconds, for the summary lines.
pub(super) fn secs(duration: std::time::Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_names_deploy_by_a_path_relative_to_itself() {
        let overlay = Path::new("/work/kpm/target/node-e2e/overlays/doctor");
        assert_eq!(
            relative(overlay, Path::new("/work/kpm/deploy")),
            Path::new("../../../../deploy")
        );
        // A target directory outside the repository.
        assert_eq!(
            relative(Path::new("/tmp/t/node-e2e/overlays/run"), Path::new("/work/kpm/deploy")),
            Path::new("../../../../../work/kpm/deploy")
        );
    }
}
