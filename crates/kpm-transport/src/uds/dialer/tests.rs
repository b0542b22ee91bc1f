//! What a dialer's settings do to its connections, on real Unix sockets:
//! optional holders refused while the budget is short, connections counted
//! while live.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use std::path::Path;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_optional_holder_is_refused_while_a_quarter_or_less_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("raw.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let budget = FdBudget::new(4, None);
    let optional = Dialer::new(budget.clone(), TIMEOUT).optional_holder();
    let first = optional.stream(&socket).await.unwrap();
    let _held = (budget.acquire().await, budget.acquire().await);

    let err = optional.stream(&socket).await.unwrap_err();
    assert!(matches!(err, TransportError::NoSparePermit { .. }), "{err:?}");
    assert!(err.to_string().contains("raw.sock"), "{err}");
    assert!(!err.is_gone(), "kpm's shortage is not the plugin's absence");
    assert_eq!(budget.stats().optional_refused, 1);
    assert_eq!(budget.in_use(), 3, "nothing was dialled");

    // An operation's dial still gets the last permit.
    let waiting = Dialer::new(budget.clone(), TIMEOUT);
    let second = waiting.stream(&socket).await.unwrap();
    assert_eq!(budget.in_use(), 4);
    drop((first, second, listener));
}

#[tokio::test]
async fn a_connection_is_live_from_the_first_bytes_until_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("raw.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let live = LiveConnections::new();
    let dialer = Dialer::new(FdBudget::new(4, None), TIMEOUT).counted_in(&live);
    let mut io = dialer.stream(&socket).await.unwrap();
    let (mut server, _) = listener.accept().await.unwrap();
    assert_eq!(live.count(), 0, "connected but silent is not live");

    server.write_all(b"hello").await.unwrap();
    let mut buf = [0_u8; 16];
    let read = io.read(&mut buf).await.unwrap();
    assert_eq!(read, 5);
    assert_eq!(live.count(), 1);
    assert_eq!(*live.subscribe().borrow(), 1);

    drop(server);
    let read = io.read(&mut buf).await.unwrap();
    assert_eq!(read, 0);
    assert_eq!(live.count(), 0, "end-of-file ends the connection");
    drop(io);
    assert_eq!(live.count(), 0, "dropping an ended connection counts nothing twice");

    // A live connection dropped counts no more.
    let mut io = dialer.stream(&socket).await.unwrap();
    let (mut server, _) = listener.accept().await.unwrap();
    server.write_all(b"hello").await.unwrap();
    assert_eq!(io.read(&mut buf).await.unwrap(), 5);
    assert_eq!(live.count(), 1);
    drop(io);
    assert_eq!(live.count(), 0, "dropped");
}

#[tokio::test]
async fn under_a_host_root_a_host_path_is_dialled_there_and_named_as_given() {
    let host = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(host.path().join("run")).unwrap();
    let listener = tokio::net::UnixListener::bind(host.path().join("run/raw.sock")).unwrap();
    let reach = Reach::new(FdBudget::new(4, None), HostRoot::at(host.path()));
    let dialer = Dialer::new(reach, TIMEOUT);
    let on_host = Path::new("/run/raw.sock");
    let _io = dialer.stream(on_host).await.unwrap();
    let _accepted = listener.accept().await.unwrap();

    let err = dialer.stream(Path::new("/run/gone.sock")).await.unwrap_err();
    assert!(err.is_gone(), "{err:?}");
    let said = err.to_string();
    assert!(said.contains("/run/gone.sock"), "{said}");
    assert!(!said.contains(&*host.path().to_string_lossy()), "the prefix is not named: {said}");
}
