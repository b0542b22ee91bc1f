//! Which kubelet a [`Doctor`](crate::Doctor) judges: chosen among those
//! running on the host (by root, by the node asked about, by a registry
//! that can be read), where its files are read, and the *referee*: the
//! kubelet `kpm run` would run on its root, not running, whose manager's
//! inspection judges its plugins and registers nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpm::{ExecutorConfig, Kubelet};

use crate::host::{self, View};
use crate::kubelets::{KubeletProcess, NodeNameFrom, ReadThrough};
use crate::{Blind, DoctorConfig, DoctorError};

/// The kubelet a pass judges, and the referee that judges its plugins.
#[derive(Debug)]
pub(crate) struct Judged {
    pub(crate) choice: Choice,
    /// The kubelet `kpm run` would run on that root, not running: its
    /// manager's inspection judges the registry's sockets.
    pub(crate) referee: Arc<Kubelet>,
}

/// Which kubelet is judged, and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The kubelet root, as the kubelet sees it.
    pub(crate) root_dir: PathBuf,
    /// How the root was found.
    pub(crate) root_from: String,
    /// The running kubelet judged, when one has that root.
    pub(crate) kubelet: Option<KubeletProcess>,
    /// Where the root is read.
    pub(crate) view: View,
    /// Which was judged among several, the others, and how to pick one.
    pub(crate) note: Option<String>,
}

impl Judged {
    /// The referee for `choice`.
    pub(crate) fn new(config: &DoctorConfig, choice: Choice) -> Result<Self, DoctorError> {
        // The kubelet `kpm run --root-dir` would run with the disabled kinds
        // off, given the kubelet's paths, which it opens, and the endpoints
        // plugins advertise, where this process sees the kubelet's files.
        let get_info = ExecutorConfig::default().get_info_timeout;
        let host = choice.view.host_root().clone();
        let referee = Kubelet::builder()
            .root_dir(&choice.root_dir)
            .disable_all(config.disabled.iter().copied())
            .inspect_only(config.timeout, get_info, host)
            .build()
            .map_err(|source| DoctorError::BuildReferee {
                root: choice.root_dir.clone(),
                source: Box::new(source),
            })?;
        Ok(Self { choice, referee: Arc::new(referee) })
    }
}

/// The kubelet `config` asks to judge among `kubelets` (the rule is
/// [`Doctor`](crate::Doctor)'s), a registry readable when it can be listed.
pub(crate) fn choose(config: &DoctorConfig, kubelets: &[KubeletProcess]) -> Choice {
    choose_among(config, kubelets, |kubelet| {
        let registry = kubelet.root_dir.join(kpm::api::PLUGINS_REGISTRY_DIR_NAME);
        std::fs::read_dir(kubelet.view().path(&registry)).is_ok()
    })
}

/// [`choose`], with `readable` telling whether a kubelet's registry can be
/// listed.
fn choose_among(
    config: &DoctorConfig,
    kubelets: &[KubeletProcess],
    readable: impl Fn(&KubeletProcess) -> bool,
) -> Choice {
    let given = config.root_dir.as_deref();
    let candidates: Vec<&KubeletProcess> = kubelets
        .iter()
        .filter(|kubelet| given.is_none_or(|root| kubelet.root_dir == root))
        .collect();
    let asked = config.node_name.as_deref().map(|name| name.trim().to_lowercase());
    // The node's own kubelet: by what its settings name it, else by its
    // hostname, the name a kubelet without an override takes.
    let of_node = |by_hostname: bool| -> Vec<&KubeletProcess> {
        let Some(asked) = &asked else { return Vec::new() };
        candidates
            .iter()
            .copied()
            .filter(|kubelet| {
                kubelet.node_name.as_ref() == Some(asked)
                    && (kubelet.node_name_from == Some(NodeNameFrom::Hostname)) == by_hostname
            })
            .collect()
    };
    let named = [of_node(false), of_node(true)].into_iter().find(|found| !found.is_empty());
    let pool = named.as_ref().unwrap_or(&candidates);
    let chosen = pool.iter().copied().find(|kubelet| readable(kubelet)).or(pool.first().copied());
    let Some(chosen) = chosen else {
        let (root_dir, root_from) = match given {
            Some(root) => (root.to_path_buf(), "--root-dir".to_owned()),
            None => (PathBuf::from(host::DEFAULT_ROOT), "the default".to_owned()),
        };
        return Choice {
            root_dir,
            root_from,
            kubelet: None,
            view: config.host.view().clone(),
            note: None,
        };
    };
    let others: Vec<String> = kubelets
        .iter()
        .filter(|kubelet| kubelet.pid != chosen.pid)
        .map(KubeletProcess::summary)
        .collect();
    let by_node = named.is_some();
    let unknown_node = match (&asked, by_node) {
        (Some(node), false) => Some(format!("no kubelet on this host is node {node}: ")),
        _ => None,
    };
    let choice_note = (!others.is_empty() || unknown_node.is_some()).then(|| {
        let how = match (&asked, by_node, given.is_some()) {
            (Some(node), true, _) => format!("judged as node {node}"),
            (_, _, true) => "judged as the kubelet with that root".to_owned(),
            _ if readable(chosen) => "judged as the first whose registry can be read".to_owned(),
            _ => "judged as the first (no registry can be read)".to_owned(),
        };
        let mut text = format!("{}{how}: {}", unknown_node.unwrap_or_default(), chosen.summary());
        if !others.is_empty() {
            text.push_str("; other kubelets on this host: ");
            text.push_str(&others.join(", "));
            text.push_str("; pick one with --node-name or --root-dir");
        }
        text
    });
    Choice {
        root_dir: chosen.root_dir.clone(),
        root_from: if given.is_some() { "--root-dir".to_owned() } else { chosen.describe() },
        kubelet: Some(chosen.clone()),
        view: chosen.view().clone(),
        note: choice_note,
    }
}

/// Why a registry that cannot be listed leaves nothing to judge, and where
/// to look instead.
pub(crate) fn cannot_list_registry(
    choice: &Choice,
    registry: &Path,
    err: &std::io::Error,
    kubelets: &[KubeletProcess],
) -> Blind {
    let why = format!("{}: cannot be listed: {err}", registry.display());
    let elsewhere = kubelets.iter().find(|kubelet| kubelet.root_dir != choice.root_dir);
    let hint = match (err.kind(), &choice.kubelet, elsewhere) {
        (std::io::ErrorKind::PermissionDenied, _, _) => {
            "run kpm doctor as the user the kubelet runs as (root)".to_owned()
        }
        (_, Some(kubelet), _) if kubelet.files == ReadThrough::HostFallback => format!(
            "{} runs where its files cannot be read (its /proc/{}/root): run kpm doctor as \
             root, in a pod with hostPID",
            kubelet.describe(),
            kubelet.pid
        ),
        (_, None, Some(kubelet)) => format!(
            "{} has root {}: give that to --root-dir, or leave --root-dir out",
            kubelet.describe(),
            kubelet.root_dir.display()
        ),
        (_, Some(_), _) => "the kubelet creates it when it starts: is it running, and does kpm \
                         doctor see the host's file system (--host-root)?"
            .to_owned(),
        (_, None, None) => "no running kubelet was found to take its root from: pass the \
                      kubelet's --root-dir as --root-dir; in a pod that mounts the host's / \
                      elsewhere, pass --host-root too (kubectl debug node/NAME mounts it at \
                      /host)"
            .to_owned(),
    };
    Blind { why, hint }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::FakeHost;
    use crate::{Doctor, DoctorConfig};

    /// A host with two kubelets on the default root: pid 10 in the host's
    /// mount namespace, node `node-a`, whose registry is not there; pid 20
    /// in a container (kind), node `kind-worker` by its hostname, whose
    /// registry is there, under its `/proc/20/root` only.
    fn two_kubelets() -> (FakeHost, tempfile::TempDir) {
        let fake = FakeHost::new();
        fake.process(10, &["/usr/bin/kubelet", "--hostname-override=node-a"], None);
        let kind = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(kind.path().join("var/lib/kubelet/plugins_registry")).unwrap();
        std::fs::create_dir_all(kind.path().join("etc")).unwrap();
        std::fs::write(kind.path().join("etc/hostname"), "kind-worker\n").unwrap();
        fake.process(20, &["/usr/bin/kubelet"], Some(kind.path()));
        (fake, kind)
    }

    fn chosen(config: &DoctorConfig) -> Choice {
        choose(config, &config.host.kubelets())
    }

    #[test]
    fn without_a_node_name_the_kubelet_whose_registry_can_be_read_is_judged() {
        let (fake, _kind) = two_kubelets();
        let choice = chosen(&DoctorConfig::builder().host(fake.host()).build().unwrap());
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        assert_eq!(choice.root_from, "the running kubelet, pid 20");
        assert_eq!(choice.view.root(), fake.at("/proc/20/root"));
        let note = choice.note.unwrap();
        assert!(
            note.starts_with("judged as the first whose registry can be read: pid 20"),
            "{note}"
        );
        assert!(
            note.contains(
                "other kubelets on this host: pid 10 (kubelet) root /var/lib/kubelet node node-a"
            ),
            "{note}"
        );
        assert!(note.ends_with("pick one with --node-name or --root-dir"), "{note}");
    }

    #[test]
    fn with_a_node_name_that_nodes_kubelet_is_judged() {
        let (fake, _kind) = two_kubelets();
        let config = DoctorConfig::builder().host(fake.host());
        // By its override, even though its registry cannot be read: it is
        // the node asked about.
        let choice = chosen(&config.clone().node_name("Node-A").build().unwrap());
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(10));
        assert_eq!(choice.view.root(), fake.dir.path());
        assert!(choice.note.unwrap().starts_with("judged as node node-a: pid 10"));
        // By its hostname.
        let choice = chosen(&config.clone().node_name("kind-worker").build().unwrap());
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        // No such node here: as without a name, and said.
        let choice = chosen(&config.node_name("elsewhere").build().unwrap());
        assert_eq!(choice.kubelet.as_ref().map(|k| k.pid), Some(20));
        let note = choice.note.unwrap();
        assert!(note.starts_with("no kubelet on this host is node elsewhere: judged as"), "{note}");
    }

    #[test]
    fn a_root_dir_given_is_read_as_the_kubelet_with_that_root_sees_it() {
        let (fake, _kind) = two_kubelets();
        let config = DoctorConfig::builder().host(fake.host());
        let choice = chosen(&config.clone().root_dir("/var/lib/kubelet").build().unwrap());
        assert_eq!(
            (choice.root_from.as_str(), choice.kubelet.map(|k| k.pid)),
            ("--root-dir", Some(20))
        );
        // A root no kubelet has: at its path on the host, no other named.
        let choice = chosen(&config.root_dir("/data/kubelet").build().unwrap());
        assert_eq!(choice.kubelet, None);
        assert_eq!(choice.view.root(), fake.dir.path());
        assert_eq!(choice.note, None);
    }

    #[tokio::test]
    async fn a_kubelet_that_restarts_in_a_new_container_is_followed() {
        let (fake, _kind) = two_kubelets();
        let config =
            DoctorConfig::builder().host(fake.host()).node_name("kind-worker").build().unwrap();
        let doctor = Doctor::new(config).unwrap();
        assert_eq!(doctor.root().as_ref(), fake.at("/proc/20/root/var/lib/kubelet"));
        // Its container restarted: another pid, another `/`.
        std::fs::remove_dir_all(fake.at("/proc/20")).unwrap();
        let restarted = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(restarted.path().join("var/lib/kubelet/plugins_registry")).unwrap();
        std::fs::create_dir_all(restarted.path().join("etc")).unwrap();
        std::fs::write(restarted.path().join("etc/hostname"), "kind-worker\n").unwrap();
        fake.process(21, &["kubelet"], Some(restarted.path()));
        let report = doctor.examine(None).await;
        assert_eq!(report.judged_pid, Some(21));
        assert_eq!(report.root_from, "the running kubelet, pid 21");
        assert!(report.blind.is_none(), "{:?}", report.blind);
        assert_eq!(doctor.root().as_ref(), fake.at("/proc/21/root/var/lib/kubelet"));
    }

    #[test]
    fn no_kubelet_running_is_the_default_root_on_the_host() {
        let fake = FakeHost::new();
        let choice =
            chosen(&DoctorConfig::builder().host(fake.host()).node_name("n").build().unwrap());
        assert_eq!(
            (choice.root_dir.as_path(), choice.root_from.as_str()),
            (Path::new(host::DEFAULT_ROOT), "the default")
        );
        assert_eq!(choice.note, None);
    }
}
