//! kpm's sockets at the open-files limit: accepting neither ends nor spins
//! on `EMFILE`, and a dial waits for an fd instead of failing. Alone in its
//! test binary: it lowers the process's own limit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use kpm_transport::{self as uds, fd};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tokio_stream::StreamExt as _;

/// Long enough for a spinning or failing accept loop to show.
const SETTLE: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "current_thread")]
async fn accepting_and_dialing_wait_out_a_shortage_of_fds() {
    // Sized before the fds run out, as `kpm run` does first thing.
    fd::init(fd::DEFAULT_RESERVE);
    let dir = tempfile::tempdir().unwrap();
    let mut incoming = uds::bind(&dir.path().join("server.sock")).await.unwrap();
    let other = uds::bind(&dir.path().join("other.sock")).await.unwrap();
    // Queued in the backlog before the fds run out.
    let _client = tokio::net::UnixStream::connect(dir.path().join("server.sock")).await.unwrap();

    let open = u64::try_from(fd::open_fds().unwrap()).unwrap();
    let Rlimit { maximum, .. } = getrlimit(Resource::Nofile);
    setrlimit(Resource::Nofile, Rlimit { current: Some(open + 16), maximum }).unwrap();
    let mut hogs = Vec::new();
    let shortage = loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => hogs.push(file),
            Err(err) => break err,
        }
    };
    assert!(fd::is_shortage(&shortage), "{shortage}");

    // Neither an error nor the end of the stream: accepting waits.
    let next = tokio::time::timeout(SETTLE, incoming.next()).await;
    assert!(next.is_err(), "accepted, failed or ended at EMFILE: {next:?}");
    let before = fd::budget().stats();
    assert!(before.shortage_episodes >= 1 && before.shortage_waits >= 1, "{before:?}");
    // Paused after each shortage: a few attempts, not thousands.
    assert!(before.shortage_waits < 100, "accept spins: {before:?}");

    let target = dir.path().join("other.sock");
    let dialer = uds::Dialer::new(fd::budget().clone(), DEADLINE);
    let dial = tokio::spawn(async move { dialer.stream(&target).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!dial.is_finished(), "the dial did not wait for an fd");

    hogs.truncate(hogs.len() - 2);
    let accepted = tokio::time::timeout(DEADLINE, incoming.next()).await.unwrap();
    assert!(matches!(accepted, Some(Ok(_))), "{accepted:?}");
    let stream = tokio::time::timeout(DEADLINE, dial).await.unwrap().unwrap().unwrap();
    assert_eq!(fd::budget().in_use(), 2, "the accepted and the dialed connection hold permits");
    drop((accepted, stream));
    assert_eq!(fd::budget().in_use(), 0, "released when the connections close");
    drop(other);
}
