//! What `kpm run`, when it is the node's plugin manager in place of the
//! kubelet's, has registered and not got to the API server yet (its pending
//! publications: an API server outage, a conflict being retried). The
//! cluster then lags the node for a reason that is not the plugin's: the
//! doctor calls it publishing, not a failure, and says what kpm run waits
//! for.

use std::time::{Duration, SystemTime};

use kpm::PluginKind;
use kpm::kube::{ObjectKind, PendingPublication};

use crate::host::Seen;

/// What a finding excused as publishing is told to do.
pub(crate) const PUBLISHING_HINT: &str = "nothing to fix in the plugin: kpm run retries until the \
    API server holds it (`kpm list` shows it pending); if it lasts, see kpm run's log and the API \
    server";

/// The change a pending publication makes in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// What a live plugin has and the cluster lacks.
    Add,
    /// What the cluster keeps and no live plugin serves.
    Remove,
}

/// The pending publications of one examination.
#[derive(Debug, Default)]
pub(crate) struct Publishing(pub(crate) Vec<PendingPublication>);

impl Publishing {
    /// What a `kpm run` serving the status API on the judged `root`
    /// (`kpm.sock`) has not got to the API server yet: the node's plugin
    /// manager is then kpm, not the kubelet's. None when nothing answers
    /// there within `timeout`.
    pub(crate) async fn read(root: &Seen, timeout: Duration) -> Self {
        let client = kpm_status::Client::new(root.join(kpm_status::STATUS_SOCKET_NAME).as_ref());
        match tokio::time::timeout(timeout, client.plugins()).await {
            Ok(Ok(list)) => Self(list.kubernetes.map(|kube| kube.pending).unwrap_or_default()),
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "no kpm run's pending publications");
                Self::default()
            }
            Err(_) => Self::default(),
        }
    }

    /// Why the cluster shows what it does of `name` (a plugin of `kind`),
    /// when kpm run has a publication pending that makes the `change`:
    /// `reason`, what the doctor found, with what kpm run waits for. The
    /// finding is then `publishing` ([`PUBLISHING_HINT`]), not the
    /// plugin's failure.
    pub(crate) fn excuse(
        &self,
        kind: PluginKind,
        change: Change,
        name: &str,
        reason: &str,
    ) -> Option<String> {
        let pending = self.0.iter().find(|pending| {
            pending.name == name
                && pending.removes == (change == Change::Remove)
                && ObjectKind::of_plugins(kind).any(|object| object == pending.kind)
        })?;
        let since = SystemTime::now().duration_since(pending.since).unwrap_or_default();
        let since = humantime::format_duration(std::time::Duration::from_secs(since.as_secs()));
        let error = pending.last_error.as_deref().map(|error| format!("; last error: {error}"));
        Some(format!(
            "{reason}: kpm run has not got it to the API server yet ({} {name}: {}, wanted for {since}{})",
            pending.kind,
            pending.want,
            error.unwrap_or_default()
        ))
    }
}
