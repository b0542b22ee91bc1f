//! What `kpm run`, when it is the node's plugin manager in place of the
//! kubelet's, has registered and not got to the API server yet (its pending
//! publications: an API server outage, a conflict being retried). The
//! cluster then lags the node for a reason that is not the plugin's: the
//! doctor calls it publishing, not a failure, and says what kpm run waits
//! for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use kpm::PluginKind;
use kpm::kube::{ObjectKind, PendingPublication};

use kpm_report::Verdict;

/// The future of one read of the pending publications.
type Read = Pin<Box<dyn Future<Output = Vec<PendingPublication>> + Send>>;

/// Reads `kpm run`'s pending publications (its status API's
/// `kubernetes.pending`); none when no `kpm run` answers.
#[derive(Clone)]
pub struct PendingReader(Arc<dyn Fn() -> Read + Send + Sync>);

impl PendingReader {
    /// A reader that calls `read` at each examination.
    pub fn new<F, Fut>(read: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<PendingPublication>> + Send + 'static,
    {
        Self(Arc::new(move || Box::pin(read())))
    }

    pub(crate) async fn read(&self) -> Publishing {
        Publishing((self.0)().await)
    }
}

impl std::fmt::Debug for PendingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingReader")
    }
}

/// The pending publications of one examination.
#[derive(Debug, Default)]
pub(crate) struct Publishing(pub(crate) Vec<PendingPublication>);

impl Publishing {
    /// Turns a finding about `name` that the cluster shows into `publishing`
    /// when kpm run has a publication of one of `kinds` pending for it that
    /// `removes` it (what the cluster keeps and no live plugin serves) or
    /// not (what a live plugin has and the cluster lacks): the cluster
    /// shows what kpm run is about to change.
    pub(crate) fn excuse(
        &self,
        (kind, removes): (PluginKind, bool),
        name: &str,
        (verdict, reason, hint): (&mut Verdict, &mut String, &mut String),
    ) {
        let Some(pending) = self.0.iter().find(|pending| {
            pending.name == name
                && pending.removes == removes
                && ObjectKind::of_plugins(kind).any(|object| object == pending.kind)
        }) else {
            return;
        };
        let since = SystemTime::now().duration_since(pending.since).unwrap_or_default();
        let since = humantime::format_duration(std::time::Duration::from_secs(since.as_secs()));
        let error = pending.last_error.as_deref().map(|error| format!("; last error: {error}"));
        *verdict = Verdict::Publishing;
        *reason = format!(
            "{reason}: kpm run has not got it to the API server yet ({} {name}: {}, wanted for {since}{})",
            pending.kind,
            pending.want,
            error.unwrap_or_default()
        );
        "nothing to fix in the plugin: kpm run retries until the API server holds it \
         (`kpm list` shows it pending); if it lasts, see kpm run's log and the API server"
            .clone_into(hint);
    }
}
