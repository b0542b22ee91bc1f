//! `kpm check` on real plugins.

use std::fs;
use std::path::Path;

use super::{Env, NULL_DEVICES};
use crate::Result;

/// `kpm check` on real plugins: generic-device-plugin (registers on
/// `kubelet.sock`, and again only once its own socket is removed), and
/// node-driver-registrar with hostpathplugin as one command. Both pass
/// every step that applies.
pub(super) fn check_real_plugins(env: &Env, _root: &Path) -> Result {
    let bin = |name: &str| env.bin_dir.join(name).display().to_string();
    let plugin_dir = "--plugin-directory={device-plugins}";
    let device = format!("--device={NULL_DEVICES}");
    let generic = bin("generic-device-plugin");
    let args = [generic.as_str(), plugin_dir, "--domain=squat.ai", "--listen=127.0.0.1:0", &device];
    run_check(env, "generic-device-plugin", &args, "4 passed, 0 failed")?;
    let csi = format!(
        "{} --endpoint=unix://{{plugins}}/csi.sock --nodeid=node-1 --drivername=hostpath.csi.k8s.io \
         --statedir={{root}}/state & exec {} --csi-address={{plugins}}/csi.sock \
         --kubelet-registration-path={{plugins}}/csi.sock --plugin-registration-path={{registry}}",
        bin("hostpathplugin"),
        bin("node-driver-registrar"),
    );
    run_check(env, "node-driver-registrar", &["sh", "-c", &csi], "6 passed, 0 failed")
}

/// Runs `kpm check --junit FILE -- COMMAND`, shows and keeps its report,
/// and fails unless it succeeds with `expected` as its last line and a
/// `--junit` report of its seven steps, none failed.
fn run_check(env: &Env, name: &str, command: &[&str], expected: &str) -> Result {
    let junit = env.out.join(format!("check-{name}.xml"));
    let out = std::process::Command::new(&env.kpm)
        .arg("check")
        .arg("--junit")
        .arg(&junit)
        .arg("--")
        .args(command)
        .output()?;
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    fs::write(env.out.join(format!("check-{name}.out")), report.as_bytes())?;
    let xml = fs::read_to_string(&junit).unwrap_or_default();
    let suites = xml.lines().find(|line| line.starts_with("<testsuites ")).unwrap_or_default();
    if !(suites.contains(r#" tests="7""#) && suites.contains(r#" failures="0""#)) {
        return Err(format!(
            "kpm check of {name}: the JUnit report {} begins {suites:?}",
            junit.display()
        )
        .into());
    }
    if out.status.success() && report.trim_end().ends_with(expected) {
        Ok(())
    } else {
        Err(format!(
            "kpm check of {name}: {} ({}), expected {expected}",
            report.trim_end(),
            out.status
        )
        .into())
    }
}
