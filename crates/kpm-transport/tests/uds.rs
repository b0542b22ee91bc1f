//! Binding and dialing real Unix sockets: what a live socket, a stale one and
//! a missing one come to.

use std::time::Duration;

use kpm_transport::fd::FdBudget;

#[tokio::test]
async fn bind_refuses_a_live_socket_and_replaces_a_stale_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("k.sock");
    let live = kpm_transport::bind(&socket).await.unwrap();
    let err = kpm_transport::bind(&socket).await.unwrap_err();
    assert!(matches!(err, kpm_transport::TransportError::InUse { .. }), "{err}");
    assert!(err.to_string().contains("k.sock"), "error names the path: {err}");
    drop(live); // the file stays behind and nobody listens: stale
    assert!(socket.exists());
    kpm_transport::bind(&socket).await.unwrap();
}

#[tokio::test]
async fn dial_names_the_socket_when_nobody_listens() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("missing.sock");
    let dialer = kpm_transport::Dialer::new(FdBudget::new(4, None), Duration::from_secs(1));
    let err = dialer.grpc(&socket).await.unwrap_err();
    assert!(matches!(err, kpm_transport::TransportError::Dial { .. }), "{err}");
    assert!(err.to_string().contains("missing.sock"), "{err}");
    assert!(err.is_gone(), "a missing socket file is gone: {err:?}");

    // A file nobody listens on refuses connections: gone too.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let err = dialer.grpc(&socket).await.unwrap_err();
    assert!(err.is_gone(), "a refused connection is gone: {err:?}");
}
