//! The images the node's pods run, built without a registry by
//! `crate::image` (as `cargo xtask image` builds kpm's) and imported into
//! containerd: kpm's own, the registrar's example plugin, the drivers from
//! the folder of real programs, and a pause program of our own
//! (`pause.c`). Built before the node starts, outside the namespaces,
//! where cargo and gcc see the host as it is.

use std::path::{Path, PathBuf};

use super::Env;
use crate::command::Result;

/// kpm's image as the scenarios' overlays name it.
pub(super) const KPM: &str = "kpm.local/kpm:e2e";
/// `kpm-registrar`'s example plugin, a plugin written with kpm's SDK.
pub(super) const EXAMPLE_PLUGIN: &str = "kpm.local/example-plugin:e2e";

/// The Go programs of the folder of real programs that run in pods, each in
/// an image `kpm.local/<program>:e2e` holding only it (they are static).
pub(super) const DRIVERS: &[&str] = &[
    "hostpathplugin",
    "node-driver-registrar",
    "generic-device-plugin",
    "dra-test-driver",
    "hostdev-plugin-noreregister",
];

/// The image of a program of the folder of real programs.
pub(super) fn driver(program: &str) -> String {
    format!("kpm.local/{program}:e2e")
}

/// What the node needs from the host: each program, and the Debian
/// package that has it.
const HOST_PACKAGES: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/portmap", "containernetworking-plugins"),
    // The pause program, linked statically.
    ("/usr/bin/gcc", "gcc"),
    ("/usr/lib/x86_64-linux-gnu/libc.a", "libc6-dev"),
    // The `alert` scenario's.
    ("/usr/bin/prometheus", "prometheus"),
];

/// Installs the Debian packages of [`HOST_PACKAGES`] whose programs are
/// missing.
pub(super) fn install_host_packages() -> Result {
    let mut missing: Vec<&str> = HOST_PACKAGES
        .iter()
        .filter(|(program, _)| !Path::new(program).exists())
        .map(|(_, package)| *package)
        .collect();
    missing.dedup();
    if missing.is_empty() { Ok(()) } else { crate::debian::install(&missing, "node-e2e") }
}

/// Where the images' archives are written.
fn dir(env: &Env) -> PathBuf {
    env.out.join("images")
}

/// Builds every image whose program is there; the archives go to
/// `target/node-e2e/images`, replacing those of an earlier run.
pub(super) fn build(env: &Env) -> Result {
    let dir = dir(env);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;

    let pause = dir.join("pause");
    let source = env.root.join("e2e/src/node_e2e/pause.c");
    super::host::run(
        "gcc",
        &["-Os", "-static", "-o", &pause.display().to_string(), &source.display().to_string()],
    )?;
    let mut pause = crate::image::program_image(super::node::PAUSE_IMAGE, &pause, "/pause")?;
    // The nobody of Kubernetes' own pause image.
    pause.user = Some("65535:65535".to_owned());
    let mut images = vec![pause, crate::image::kpm_image(&env.root, KPM)?];

    let mut build = vec!["build", "--release"];
    build.extend(crate::scenario::EXAMPLE_PLUGIN);
    crate::command::cargo(&env.root, &build, &[])?;
    let example = env.target.join("release/examples/example_plugin");
    images.push(crate::image::program_image(
        EXAMPLE_PLUGIN,
        &example,
        "/usr/local/bin/example_plugin",
    )?);

    for program in DRIVERS {
        let bin = env.bin_dir.join(program);
        if bin.is_file() {
            let mut image = crate::image::program_image(
                &driver(program),
                &bin,
                &format!("/usr/local/bin/{program}"),
            )?;
            // hostpathplugin keeps temporary files.
            image.tmp_dir = true;
            images.push(image);
        }
    }
    for image in &images {
        let file = dir.join(format!("{}.tar", archive_name(&image.name)));
        crate::image::write_archive(image, &file)?;
    }
    Ok(())
}

/// The archives [`build`] wrote.
pub(super) fn archives(env: &Env) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir(env)) else { return Vec::new() };
    let mut archives: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "tar"))
        .collect();
    archives.sort();
    archives
}

/// A file name for an image's archive: its name without registry and tag.
fn archive_name(image: &str) -> &str {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split(':').next().unwrap_or(name)
}
