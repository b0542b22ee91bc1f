//! The images the node's pods run, built without a registry by
//! `crate::image` (as `cargo xtask image` builds kpm's) and imported into
//! containerd: kpm's own, the registrar's example plugin, the drivers from
//! the folder of real programs, and a pause program of our own
//! (`pause.c`). Built before the node starts, outside the namespaces,
//! where cargo and gcc see the host as it is.

use std::path::{Path, PathBuf};

use super::Env;
use crate::Result;

/// kpm's image as the scenarios' overlays name it.
pub(super) const KPM: &str = "kpm.local/kpm:e2e";
/// `kpm-registrar`'s example plugin, a plugin written with kpm's SDK.
pub(super) const EXAMPLE_PLUGIN: &str = "kpm.local/example-plugin:e2e";

/// The Go programs of the folder of real programs that run in pods, each in
/// an image `kpm.local/<program>:e2e` holding only it (they are static).
pub(super) const DRIVERS: &[&str] = &["hostpathplugin", "node-driver-registrar", "generic-device-plugin"];

/// The image of a program of the folder of real programs.
pub(super) fn driver(program: &str) -> String {
    format!("kpm.local/{program}:e2e")
}

/// What the node needs from the host, and is not there: Debian's packages
/// `containerd`, `runc`, `containernetworking-plugins` and `gcc`, and
/// util-linux's `unshare`.
pub(super) fn missing_host_programs() -> Vec<String> {
    let on_path = |program: &str| {
        std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
        })
    };
    let mut missing: Vec<String> = ["containerd", "ctr", "runc", "gcc", "unshare", "ip"]
        .into_iter()
        .filter(|program| !on_path(program))
        .map(str::to_owned)
        .collect();
    missing.extend(
        ["bridge", "host-local", "portmap"]
            .into_iter()
            .map(|plugin| Path::new("/usr/lib/cni").join(plugin))
            .filter(|plugin| !plugin.is_file())
            .map(|plugin| plugin.display().to_string()),
    );
    missing
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
    let source = env.root.join("xtask/src/node_e2e/pause.c");
    super::host::run(
        "gcc",
        &["-Os", "-static", "-o", &pause.display().to_string(), &source.display().to_string()],
    )?;
    let mut pause = crate::image::program_image(super::node::PAUSE_IMAGE, &pause, "/pause")?;
    // The nobody of Kubernetes' own pause image.
    pause.user = Some("65535:65535".to_owned());
    let mut images = vec![pause, crate::image::kpm_image(&env.root, KPM)?];

    crate::cargo(
        &env.root,
        &["build", "--release", "-p", "kpm-registrar", "--features", "kpm-registrar/stub", "--example", "example_plugin"],
        &[],
    )?;
    let example = env.target.join("release/examples/example_plugin");
    images.push(crate::image::program_image(EXAMPLE_PLUGIN, &example, "/usr/local/bin/example_plugin")?);

    for program in DRIVERS {
        let bin = env.bin_dir.join(program);
        if bin.is_file() {
            let mut image =
                crate::image::program_image(&driver(program), &bin, &format!("/usr/local/bin/{program}"))?;
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
