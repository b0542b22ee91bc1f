//! The kubelet axis: `--kubelet-dir MINOR=DIR`, once per kubelet minor an
//! operator runs. A node's programs come from DIR where it has them (its
//! kubelet at least; an older minor's control plane too, where the
//! version skew policy asks for one) and from `--bin-dir` otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::command::Result;

/// The kubelet minors kpm is checked against, oldest first: upstream's
/// three and the older ones providers' extended support keeps running.
pub(super) const MINORS: &[&str] = &["1.31", "1.32", "1.33", "1.34", "1.35", "1.36"];

/// How many minors older than kube-apiserver a kubelet may be (the version
/// skew policy, since 1.28).
const KUBELET_SKEW: u32 = 3;

/// One `--kubelet-dir MINOR=DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KubeletDir {
    /// `1.33`.
    pub(super) minor: String,
    pub(super) dir: PathBuf,
}

impl KubeletDir {
    /// `MINOR=DIR`, MINOR one of [`MINORS`].
    pub(super) fn parse(value: &str) -> Result<Self> {
        let (minor, dir) = value
            .split_once('=')
            .ok_or_else(|| format!("--kubelet-dir {value}: write MINOR=DIR, as 1.33=/tmp/k133"))?;
        if !MINORS.contains(&minor) {
            return Err(format!(
                "--kubelet-dir {value}: {minor} is not one of {}",
                MINORS.join(", ")
            )
            .into());
        }
        Ok(Self { minor: minor.to_owned(), dir: std::path::absolute(dir)? })
    }
}

/// The programs of a node, in the kubelet's folder (`--kubelet-dir`) or
/// the one given to `--bin-dir`.
pub(super) const PROGRAMS: &[&str] =
    &["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"];

/// Where a node's programs are.
#[derive(Debug, Clone)]
pub(super) struct Programs {
    /// The kubelet's folder, whose programs come first.
    pub(super) kubelet_dir: Option<PathBuf>,
    pub(super) bin_dir: PathBuf,
}

impl Programs {
    /// The node's program `name` ([`PROGRAMS`]): the kubelet's
    /// folder's, else `--bin-dir`'s.
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.kubelet_dir
            .as_ref()
            .map(|dir| dir.join(name))
            .filter(|path| path.is_file())
            .unwrap_or_else(|| self.bin_dir.join(name))
    }

    /// The node's programs found in neither folder.
    pub(super) fn missing(&self) -> Vec<&'static str> {
        PROGRAMS.iter().copied().filter(|name| !self.path(name).is_file()).collect()
    }

    /// Checks that the kubelet is `minor` and that kube-apiserver may serve
    /// it; returns both versions, as `kubelet v1.33.13, kube-apiserver
    /// v1.36.2`. A kube-apiserver of a development build (`v0.0.0-master`)
    /// is taken as the newest, its skew unchecked, and said so; so is a
    /// kubelet of a development build given as the newest minor.
    pub(super) fn check(&self, minor: &str) -> Result<String> {
        // A development build of the newest minor (`v0.0.0-master`, as a
        // tree's `go build` without `-ldflags` makes) stands for it: no
        // kube-apiserver is newer.
        if MINORS.last() == Some(&minor) && development_build(&self.path("kubelet")) {
            return Ok(format!("kubelet of a development build taken as {minor}"));
        }
        let (kubelet, kubelet_minor) = version(&self.path("kubelet"))?;
        if format!("1.{kubelet_minor}") != minor {
            return Err(format!(
                "the kubelet of --kubelet-dir {minor}={} is {kubelet}",
                self.kubelet_dir.as_deref().unwrap_or(Path::new("?")).display()
            )
            .into());
        }
        let Ok((apiserver, apiserver_minor)) = version(&self.path("kube-apiserver")) else {
            return Ok(format!(
                "kubelet {kubelet}, kube-apiserver of a development build (skew not checked)"
            ));
        };
        if kubelet_minor + KUBELET_SKEW < apiserver_minor {
            return Err(format!(
                "kube-apiserver {apiserver} serves kubelets down to 1.{} only: put a \
                 kube-apiserver of 1.{} (and its kube-controller-manager, kube-scheduler and \
                 kubectl) in the kubelet's folder",
                apiserver_minor - KUBELET_SKEW,
                kubelet_minor + KUBELET_SKEW
            )
            .into());
        }
        Ok(format!("kubelet {kubelet}, kube-apiserver {apiserver}"))
    }

    /// The minor of the node's program `name` by its `--version`; `None`
    /// for a development build (`v0.0.0-master`), which is taken as the
    /// newest.
    pub(super) fn minor(&self, name: &str) -> Option<u32> {
        version(&self.path(name)).ok().map(|(_, minor)| minor)
    }
}

/// The minor whose `DynamicResourceAllocation` is GA and on by default;
/// older components have it off (alpha in 1.31, beta off by default in
/// 1.32 and 1.33). It is locked on from 1.35, and a gate a component does
/// not know stops it: set it only where it is off.
const DRA_ON_BY_DEFAULT: u32 = 34;

/// Whether a component of `minor` (`None`: the newest) needs
/// `DynamicResourceAllocation=true`.
pub(super) fn needs_dra_gate(minor: Option<u32>) -> bool {
    minor.is_some_and(|minor| minor < DRA_ON_BY_DEFAULT)
}

/// The `resource.k8s.io` version a kubelet of `minor` reads `ResourceClaims`
/// and wipes `ResourceSlices` with (`docs/kubelet-minors.md`).
pub(super) fn dra_api_version(minor: Option<u32>) -> &'static str {
    match minor {
        Some(..=31) => "v1alpha3",
        Some(32 | 33) => "v1beta1",
        _ => "v1",
    }
}

/// The flags control plane component `name` of `minor` needs to serve DRA
/// to a kubelet of `kubelet`: the feature gate where DRA is off by
/// default, and for kube-apiserver the kubelet's `resource.k8s.io/v1beta1`,
/// which no kube-apiserver from 1.34 on serves by default. A 1.31
/// kubelet's `v1alpha3` has no ResourceSlices in a 1.34 kube-apiserver:
/// nothing makes it serve them.
pub(super) fn dra_flags(name: &str, minor: Option<u32>, kubelet: Option<u32>) -> Vec<String> {
    let mut flags = Vec::new();
    if needs_dra_gate(minor) {
        flags.push("--feature-gates=DynamicResourceAllocation=true".to_owned());
    }
    if name == "kube-apiserver" && dra_api_version(kubelet) == "v1beta1" {
        flags.push("--runtime-config=resource.k8s.io/v1beta1=true".to_owned());
    }
    flags
}

/// `program --version` (`Kubernetes v1.33.13`): the version and its minor.
fn version(program: &Path) -> Result<(String, u32)> {
    let output = Command::new(program)
        .arg("--version")
        .output()
        .map_err(|err| format!("{} --version: {err}", program.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_whitespace().last().unwrap_or_default().to_owned();
    let minor = parse_minor(&version).ok_or_else(|| {
        format!(
            "{} --version said {:?}, not a release: build it with -ldflags \
             '-X k8s.io/component-base/version.gitVersion=v1.N.P' (docs/operations.md)",
            program.display(),
            text.trim()
        )
    })?;
    Ok((version, minor))
}

/// Whether `program --version` says `v0.0.0-…`, a development build.
fn development_build(program: &Path) -> bool {
    Command::new(program).arg("--version").output().is_ok_and(|output| {
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .last()
            .is_some_and(|version| version.starts_with("v0.0.0"))
    })
}

/// The minor of `v1.33.13` (or `v1.33.13-rc.1+abc`).
fn parse_minor(version: &str) -> Option<u32> {
    let mut parts = version.strip_prefix("v1.")?.split(['.', '-', '+']);
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_dir_names_a_known_minor_and_a_folder() {
        let dir = KubeletDir::parse("1.33=/tmp/k133").unwrap();
        assert_eq!((dir.minor.as_str(), dir.dir.as_path()), ("1.33", Path::new("/tmp/k133")));
        for bad in ["1.33", "1.30=/tmp/x", "v1.33=/tmp/x", "=/tmp/x"] {
            assert!(KubeletDir::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn versions_give_their_minor() {
        assert_eq!(parse_minor("v1.33.13"), Some(33));
        assert_eq!(parse_minor("v1.31.14-rc.0+abc"), Some(31));
        assert_eq!(parse_minor("1.33.1"), None);
        assert_eq!(parse_minor("v2.0.0"), None);
    }

    #[test]
    fn dra_is_switched_on_where_it_is_off_and_served_in_the_kubelets_version() {
        assert!(needs_dra_gate(Some(33)) && !needs_dra_gate(Some(34)) && !needs_dra_gate(None));
        assert_eq!(
            dra_flags("kube-apiserver", Some(34), Some(32)),
            ["--runtime-config=resource.k8s.io/v1beta1=true"]
        );
        assert_eq!(
            dra_flags("kube-scheduler", Some(33), Some(33)),
            ["--feature-gates=DynamicResourceAllocation=true"]
        );
        assert!(dra_flags("kube-apiserver", None, Some(35)).is_empty());
        assert!(dra_flags("kube-apiserver", Some(34), Some(31)).is_empty());
    }

    #[test]
    fn the_kubelets_folder_comes_first_program_by_program() {
        let (kubelet, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(kubelet.path().join("kubelet"), "").unwrap();
        std::fs::write(bin.path().join("kubelet"), "").unwrap();
        std::fs::write(bin.path().join("kubectl"), "").unwrap();
        let programs = Programs {
            kubelet_dir: Some(kubelet.path().to_path_buf()),
            bin_dir: bin.path().to_path_buf(),
        };
        assert_eq!(programs.path("kubelet"), kubelet.path().join("kubelet"));
        assert_eq!(programs.path("kubectl"), bin.path().join("kubectl"));
        assert_eq!(
            programs.missing(),
            ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
        );
    }
}
