//! The runtime asked on a real Unix socket, served by a tonic server that
//! answers as containerd does.

use std::time::Duration;

use kpm_pods::{Containers, PodsError, Runtime};
use kpm_report::ContainerState;
use kpm_test_support::cri::{FakeContainer, serve};
use kpm_transport::Dialer;
use kpm_transport::fd::FdBudget;

const POD: (&str, &str, &str) = ("kube-system", "csi-node-x", "u1");

fn dialer() -> Dialer {
    Dialer::new(FdBudget::new(16, None), Duration::from_secs(5))
}

#[tokio::test]
async fn a_look_lists_once_and_asks_the_status_of_the_runs_wanted_only() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("containerd.sock");
    let served = serve(
        &socket,
        vec![
            FakeContainer::new("a1", POD, "registrar", 3)
                .exited(1, "Error", 1_700_000_000_000_000_000)
                .mount("/registration", "/var/lib/kubelet/plugins_registry"),
            FakeContainer::new("a0", POD, "registrar", 2).exited(1, "Error", 1),
            FakeContainer::new("d0", POD, "driver", 0),
        ],
    )
    .await;
    let mut runtime = Runtime::connect(&dialer(), &socket).await.unwrap();
    let mut containers: Containers = runtime.containers().await.unwrap();
    assert_eq!(containers.runs().count(), 3);
    assert!(served.runtime.status_calls.lock().is_empty(), "listing asks no status");

    runtime.load_status(&mut containers, ["a1", "gone"]).await.unwrap();
    runtime.load_status(&mut containers, ["a1"]).await.unwrap();
    assert_eq!(
        *served.runtime.status_calls.lock(),
        ["a1"],
        "each status asked once, the unknown never"
    );

    let run = containers.by_id("a1").unwrap();
    let named = containers.pod_container(run);
    assert_eq!(
        named.to_string(),
        "pod kube-system/csi-node-x, container registrar (terminated, 3 restarts, last Error exit 1)"
    );
    assert_eq!(named.state, ContainerState::Terminated);
    let socket_in_registry = std::path::Path::new("/var/lib/kubelet/plugins_registry/x-reg.sock");
    assert_eq!(
        run.container_path_of(socket_in_registry).unwrap(),
        std::path::Path::new("/registration/x-reg.sock")
    );
    let status = run.status.as_ref().unwrap();
    assert_eq!(
        status.log_path.as_deref().unwrap(),
        std::path::Path::new("/var/log/pods/kube-system_csi-node-x_u1/registrar/3.log")
    );
}

#[tokio::test]
async fn a_runtime_that_is_not_there_is_named_with_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("containerd.sock");
    let err = Runtime::connect(&dialer(), &socket).await.unwrap_err();
    assert!(matches!(err, PodsError::Dial { .. }), "{err:?}");
    assert!(err.to_string().starts_with("dial the container runtime at "), "{err}");
    assert!(err.to_string().contains("containerd.sock"), "{err}");
}
