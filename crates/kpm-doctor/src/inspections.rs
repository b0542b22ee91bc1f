//! Sockets inspected concurrently, each in a task of its own and bounded in
//! time, so that every socket comes back as a row: one whose inspection
//! panicked or never ended fails, it is not dropped from a report that
//! would then look healthy.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::task::{Id, JoinSet};

/// Why an inspection has no outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lost {
    /// Its task panicked (a kpm bug), with the panic's message.
    Panicked(String),
    /// It took longer than the bound: a hang the inspection's own timeouts
    /// did not catch.
    TimedOut(Duration),
}

/// Runs each of `inspections`, a socket's path and its inspection, at once,
/// each bounded by `bound`; every path comes back, with its outcome or why
/// it has none, in no set order.
pub(crate) async fn each<T, F>(
    inspections: impl IntoIterator<Item = (PathBuf, F)>,
    bound: Duration,
) -> Vec<(PathBuf, Result<T, Lost>)>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    let mut paths: Vec<(Id, PathBuf)> = Vec::new();
    for (path, inspection) in inspections {
        let task = tasks.spawn(async move {
            tokio::time::timeout(bound, inspection).await.map_err(|_| Lost::TimedOut(bound))
        });
        paths.push((task.id(), path));
    }
    let mut outcomes = Vec::with_capacity(paths.len());
    while let Some(joined) = tasks.join_next_with_id().await {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, outcome),
            Err(err) => {
                let id = err.id();
                let message = match err.try_into_panic() {
                    Ok(panic) => panic_message(&*panic),
                    Err(err) => err.to_string(),
                };
                (id, Err(Lost::Panicked(message)))
            }
        };
        if let Some(at) = paths.iter().position(|(task, _)| *task == id) {
            outcomes.push((paths.swap_remove(at).1, outcome));
        }
    }
    outcomes
}

/// What a panic said, when it said it as text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicked_or_hung_inspection_is_a_failing_row_not_a_missing_one() {
        type Inspection = std::pin::Pin<Box<dyn Future<Output = &'static str> + Send>>;
        let inspections: Vec<(PathBuf, Inspection)> = vec![
            ("/r/ok.sock".into(), Box::pin(async { "registered" })),
            ("/r/panics.sock".into(), Box::pin(async { panic!("an index out of bounds") })),
            ("/r/hangs.sock".into(), Box::pin(std::future::pending())),
        ];
        let bound = Duration::from_secs(12);
        let mut outcomes = each(inspections, bound).await;
        outcomes.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            outcomes,
            [
                ("/r/hangs.sock".into(), Err(Lost::TimedOut(bound))),
                ("/r/ok.sock".into(), Ok("registered")),
                ("/r/panics.sock".into(), Err(Lost::Panicked("an index out of bounds".into()))),
            ]
        );
    }
}
