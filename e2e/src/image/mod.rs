//! `cargo xtask image [--out FILE] [--name NAME:TAG]`: kpm's image, built
//! from the workspace without Docker or a registry, as one archive that
//! `ctr images import`, `podman load` and `docker load` take (`archive.rs`).
//!
//! The image holds the release `kpm` and what it needs at run time, nothing
//! else (no shell, no package manager): the dynamic loader and the shared
//! libraries the binary names (`elf.rs`), at their host paths, and an empty
//! `/tmp` for `kpm check`'s temporary kubelet root. No CA
//! certificates: kube-rs (rustls) trusts, in a pod, only the service
//! account's `ca.crt`, and with `--kubeconfig` only its
//! `certificate-authority`; the system roots, which it reads only for a
//! kubeconfig naming no CA, would not have signed a cluster's API server.
//! No `/etc` files either: kpm runs as uid 0 and looks no user up, reads
//! the hostname from `/proc`, and the container runtime mounts
//! `/etc/hosts` and `/etc/resolv.conf`, which glibc's built-in `files` and
//! `dns` lookups read (no NSS module to load).
//!
//! The builder, `Image` and `write_archive`, serves other images too
//! (the node tests' drivers), which is why it takes any files.

mod archive;
mod elf;

use std::path::{Path, PathBuf};

pub(crate) use archive::{Image, ImageFile, write_archive};
pub(crate) use elf::runtime_files;

use crate::command::{Misused, Result};

/// Where deploy/*.yaml take kpm's image from, tagged with the workspace version.
const REPOSITORY: &str = "ghcr.io/kpm-rs/kpm";
/// Where the Dockerfile puts the binary.
const KPM_IN_IMAGE: &str = "/usr/local/bin/kpm";

/// The usage `--help` prints: the synopsis `cargo xtask image …`, then what
/// its words stand for.
pub fn usage() -> String {
    "cargo xtask image [--out FILE] [--name NAME:TAG]".to_owned()
}

/// Builds the release `kpm`, writes its image archive and prints a summary
/// and then, as its last line, the archive's path.
pub fn run(root: &Path, options: &[&str]) -> Result {
    let options = Options::parse(options)?;
    let metadata = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()?;
    let version = metadata
        .workspace_packages()
        .into_iter()
        .find(|package| package.name.as_str() == "kpm-cli")
        .map(|package| package.version.to_string())
        .ok_or("the workspace has no kpm-cli package")?;
    let target = metadata.target_directory.as_std_path();
    let image =
        kpm_image(root, &options.name.unwrap_or_else(|| format!("{REPOSITORY}:{version}")))?;

    let out =
        options.out.unwrap_or_else(|| target.join("image").join(format!("kpm-{version}.oci.tar")));
    let out = std::path::absolute(&out)?;
    let archive = write_archive(&image, &out)?;
    println!("image {}: {} files", image.name, image.files.len());
    for file in &image.files {
        println!("  {:o} {} (from {})", file.mode, file.path, file.source.display());
    }
    println!("manifest {}, archive {} bytes", archive.manifest_digest, archive.size);
    println!("{}", archive.path.display());
    Ok(())
}

/// kpm's image named `name`: the release `kpm` (built here), what it
/// needs at run time, and the Dockerfile's entrypoint and command.
pub(crate) fn kpm_image(root: &Path, name: &str) -> Result<Image> {
    crate::command::cargo(root, &["build", "--release", "--locked", "-p", "kpm-cli"], &[])?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    kpm_image_of(name, &target.join("release/kpm"))
}

/// kpm's image of the kpm binary `kpm` (interop's `check-image` takes
/// the debug build it has).
pub(crate) fn kpm_image_of(name: &str, kpm: &Path) -> Result<Image> {
    let mut image = program_image(name, kpm, KPM_IN_IMAGE)?;
    image.cmd = vec!["run".to_owned()];
    // So that `kubectl exec … -- kpm list` finds it by name.
    image.env = vec!["PATH=/usr/local/bin".to_owned()];
    // `kpm check` makes its kubelet's root in $TMPDIR or /tmp (a CI job
    // runs it from this image, with the driver's binary mounted in).
    image.tmp_dir = true;
    Ok(image)
}

/// An image named `name` of one program: `binary` at `path`, its
/// entrypoint, with the loader and libraries it links (none for a static
/// one): the node tests' images of the drivers and of pause.
pub(crate) fn program_image(name: &str, binary: &Path, path: &str) -> Result<Image> {
    let mut image = Image::new(name)?;
    image.files.push(ImageFile {
        source: binary.to_path_buf(),
        path: path.to_owned(),
        mode: 0o755,
    });
    image.files.extend(runtime_files(binary)?);
    image.entrypoint = vec![path.to_owned()];
    Ok(image)
}

/// The command line of `cargo xtask image`.
#[derive(Debug, Default, PartialEq)]
struct Options {
    out: Option<PathBuf>,
    name: Option<String>,
}

impl Options {
    fn parse(args: &[&str]) -> Result<Self> {
        let mut options = Self::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or_else(|| Misused(format!("{arg} needs a value")));
            match *arg {
                "--out" => options.out = Some(PathBuf::from(value()?)),
                "--name" => options.name = Some((*value()?).to_owned()),
                other => return Err(Misused::refused(other, None).into()),
            }
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_out_and_name_and_refuse_others() {
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        assert_eq!(
            Options::parse(&["--name", "kpm:dev", "--out", "x.tar"]).unwrap(),
            Options { out: Some("x.tar".into()), name: Some("kpm:dev".to_owned()) }
        );
        assert!(Options::parse(&["--out"]).is_err());
        assert!(Options::parse(&["--tag", "x"]).is_err());
    }

    #[test]
    fn kpm_image_runs_kpm_with_a_tmp_dir_for_kpm_check() {
        // Any ELF binary of the host stands for kpm: this test's own.
        let binary = std::env::current_exe().unwrap();
        let image = kpm_image_of("kpm:test", &binary).unwrap();
        assert_eq!(image.entrypoint, [KPM_IN_IMAGE]);
        assert_eq!(image.cmd, ["run"]);
        assert!(image.tmp_dir);
        assert!(image.files.iter().any(|file| file.path == KPM_IN_IMAGE));
    }
}
