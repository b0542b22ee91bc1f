//! Work run in a task of its own: a panic there becomes an error instead of
//! taking the operation (or the manager) down, and a deadline bounds a hang.

use std::future::Future;
use std::time::Duration;

use kpm_cache::HandlerError;
use tokio::task::JoinError;
use tracing::instrument::WithSubscriber as _;

/// The text of a panic caught by joining its task.
pub(crate) fn panic_message(join: JoinError) -> String {
    if join.is_cancelled() {
        return "operation was cancelled".to_owned();
    }
    let payload = join.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "operation panicked".to_owned())
}

/// A handler call that failed.
pub(crate) struct HandlerFailure {
    pub(crate) error: HandlerError,
    /// The call panicked or ran out of time, so it may have stopped halfway:
    /// whatever it registered must be undone.
    pub(crate) aborted: bool,
}

/// Runs a call of the `plugin_type` handler in its own task, for at most
/// `timeout`. Handlers are third-party code on the registration path: one
/// that panics or never returns must not stall its socket forever.
pub(crate) async fn call_handler<F, T>(
    plugin_type: &str,
    timeout: Duration,
    call: F,
) -> Result<T, HandlerFailure>
where
    F: Future<Output = Result<T, HandlerError>> + Send + 'static,
    T: Send + 'static,
{
    // The call logs where its caller does: a task does not inherit the
    // caller's subscriber, and one that set its own (kpm doctor silences
    // the kubelet it judges with) must keep it.
    let task = tokio::spawn(call.with_current_subscriber());
    let abort = task.abort_handle();
    let aborted = |error: String| HandlerFailure { error: error.into(), aborted: true };
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(result)) => result.map_err(|error| HandlerFailure { error, aborted: false }),
        Ok(Err(join)) => {
            Err(aborted(format!("the {plugin_type} handler panicked: {}", panic_message(join))))
        }
        Err(_) => {
            abort.abort();
            Err(aborted(format!("the {plugin_type} handler did not answer within {timeout:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_returning_call_passes_its_result_through() {
        assert!(call_handler("T", Duration::from_secs(1), async { Ok(()) }).await.is_ok());
        let failure =
            call_handler("T", Duration::from_secs(1), async { Err::<(), _>("no".into()) })
                .await
                .err()
                .unwrap();
        assert_eq!((failure.error.to_string().as_str(), failure.aborted), ("no", false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_is_an_aborted_call_with_its_message() {
        let failure = call_handler::<_, ()>("TestPlugin", Duration::from_secs(1), async {
            panic!("boom");
        })
        .await
        .err()
        .unwrap();
        assert_eq!(failure.error.to_string(), "the TestPlugin handler panicked: boom");
        assert!(failure.aborted);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hang_is_cut_off_at_the_deadline_and_its_task_aborted() {
        let (dropped_tx, dropped) = tokio::sync::oneshot::channel::<()>();
        let started = tokio::time::Instant::now();
        let failure = call_handler("TestPlugin", Duration::from_secs(3), async move {
            let _guard = dropped_tx; // dropped when the task is aborted
            std::future::pending::<()>().await;
            Ok(())
        })
        .await
        .err()
        .unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(failure.error.to_string(), "the TestPlugin handler did not answer within 3s");
        assert!(failure.aborted);
        assert!(dropped.await.is_err(), "the hanging call was dropped");
    }
}
