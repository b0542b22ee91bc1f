//! The stub services against real clients: served next to the registration
//! service on a socket in a temp dir, called over gRPC.

#![cfg(feature = "stub")]
// Test helpers may unwrap: a failed setup fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use kpm_api::csi::v1::node_client::NodeClient;
use kpm_api::csi::v1::{NodeGetInfoRequest, NodeGetInfoResponse, Topology};
use kpm_registrar::stub::StubCsiDriver;
use kpm_registrar::{CSI_PLUGIN, Registrar};
use kpm_test_support::DEADLINE;

/// `routes` served beside the registration service of a `plugin_type`
/// plugin in a temp dir (kept while the registrar lives), and a channel to
/// them.
async fn serve(
    plugin_type: &str,
    routes: tonic::service::Routes,
) -> (Registrar, tempfile::TempDir, tonic::transport::Channel) {
    let dir = tempfile::tempdir().unwrap();
    let registrar = Registrar::builder(plugin_type, "plugin.example.com")
        .socket_dir(dir.path())
        .routes(routes)
        .serve()
        .await
        .unwrap();
    let dialer = kpm_transport::Dialer::new(kpm_transport::fd::budget().clone(), DEADLINE);
    let channel = dialer.grpc(registrar.socket_path()).await.unwrap().channel;
    (registrar, dir, channel)
}

/// Serves `driver` and returns its `NodeGetInfo` answer.
async fn node_get_info(driver: StubCsiDriver) -> NodeGetInfoResponse {
    let (registrar, _dir, channel) = serve(CSI_PLUGIN, driver.routes()).await;
    let info = NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}).await.unwrap();
    registrar.shutdown().await.unwrap();
    info.into_inner()
}

#[tokio::test]
async fn a_csi_driver_reports_no_topology_and_no_volume_limit_by_default() {
    let info = node_get_info(StubCsiDriver::new("csi.example.com", "node-1")).await;
    assert_eq!(
        info,
        NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 0,
            accessible_topology: None
        }
    );
}

#[tokio::test]
async fn a_csi_driver_reports_its_topology_segments_and_max_volumes() {
    let driver = StubCsiDriver::new("csi.example.com", "node-1")
        .topology("topology.example.com/zone", "z0")
        .topology("topology.example.com/rack", "r1")
        .topology("topology.example.com/zone", "z1")
        .max_volumes(7);
    let info = node_get_info(driver).await;
    let segments = HashMap::from([
        ("topology.example.com/zone".to_owned(), "z1".to_owned()),
        ("topology.example.com/rack".to_owned(), "r1".to_owned()),
    ]);
    assert_eq!(
        info,
        NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 7,
            accessible_topology: Some(Topology { segments })
        }
    );
}

/// Kubelets 1.34 and later call `v1.DRAPlugin`, 1.32 and 1.33
/// `v1beta1.DRAPlugin`: the stub driver answers on both services' paths.
#[tokio::test]
async fn a_dra_driver_prepares_claims_on_both_plugin_services() {
    use kpm_api::dra::{v1, v1beta1};
    use kpm_registrar::DRA_PLUGIN;
    use kpm_registrar::stub::StubDraDriver;

    let (registrar, _dir, channel) = serve(DRA_PLUGIN, StubDraDriver::new().routes()).await;

    let claim = |uid: &str| v1::Claim { uid: uid.into(), ..Default::default() };
    let prepared = v1::dra_plugin_client::DraPluginClient::new(channel.clone())
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim("a")] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims.keys().collect::<Vec<_>>(), ["a"]);

    let claim = |uid: &str| v1beta1::Claim { uid: uid.into(), ..Default::default() };
    let prepared = v1beta1::dra_plugin_client::DraPluginClient::new(channel)
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest { claims: vec![claim("b")] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims.keys().collect::<Vec<_>>(), ["b"]);
    registrar.shutdown().await.unwrap();
}
