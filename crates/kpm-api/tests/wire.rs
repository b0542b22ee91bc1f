//! Pins the wire: literal gRPC paths and hand-encoded protobuf bytes. A proto
//! package rename, a service rename or a renumbered field fails here.

use std::convert::Infallible;
use std::sync::Arc;

use parking_lot::Mutex;

use kpm_api::registration::v1 as reg;
use prost::Message;
use tonic::codegen::http;
use tonic::{Request, Response, Status};

// === Encoding ===

#[test]
fn plugin_info_encodes_to_the_kubelet_field_numbers() {
    let info = reg::PluginInfo {
        r#type: "CSIPlugin".into(),
        name: "a".into(),
        endpoint: "/s".into(),
        supported_versions: vec!["v1".into(), "v2".into()],
    };
    let expected: &[u8] = &[
        0x0a, 9, b'C', b'S', b'I', b'P', b'l', b'u', b'g', b'i', b'n', // 1: type
        0x12, 1, b'a', // 2: name
        0x1a, 2, b'/', b's', // 3: endpoint
        0x22, 2, b'v', b'1', // 4: supported_versions[0]
        0x22, 2, b'v', b'2', // 4: supported_versions[1]
    ];
    assert_eq!(info.encode_to_vec(), expected);
    assert_eq!(reg::PluginInfo::decode(expected).unwrap(), info);
}

#[test]
fn registration_status_encodes_to_the_kubelet_field_numbers() {
    let status = reg::RegistrationStatus { plugin_registered: true, error: "bad".into() };
    let expected: &[u8] = &[
        0x08, 1, // 1: plugin_registered (varint)
        0x12, 3, b'b', b'a', b'd', // 2: error
    ];
    assert_eq!(status.encode_to_vec(), expected);
    // Proto3 defaults are not sent: a plain rejection without a reason is empty.
    assert!(reg::RegistrationStatus::default().encode_to_vec().is_empty());
}

#[test]
fn csi_node_get_info_response_decodes_from_driver_bytes() {
    use kpm_api::csi::v1::NodeGetInfoResponse;
    let bytes: &[u8] = &[
        0x0a, 2, b'n', b'1', // 1: node_id
        0x10, 16, // 2: max_volumes_per_node
        0x1a, 10, // 3: accessible_topology
        0x0a, 8, // Topology.segments entry
        0x0a, 1, b'z', // key
        0x12, 3, b'z', b'o', b'n', // value
        0x60, 1, // field 12, unknown to us: skipped
    ];
    let resp = NodeGetInfoResponse::decode(bytes).unwrap();
    assert_eq!(resp.node_id, "n1");
    assert_eq!(resp.max_volumes_per_node, 16);
    assert_eq!(resp.accessible_topology.unwrap().segments["z"], "zon");
}

/// A container's status as containerd encodes it: the fields kpm reads at
/// their upstream numbers, among fields it leaves out (`image` is 8,
/// `resources` 16), which are skipped.
#[cfg(feature = "cri")]
#[test]
fn cri_container_status_decodes_from_runtime_bytes() {
    use kpm_api::cri::v1::{ContainerState, ContainerStatusResponse};
    let bytes: &[u8] = &[
        0x0a, 52, // ContainerStatusResponse 1: status
        0x0a, 2, b'c', b'1', // 1: id
        0x12, 6, 0x0a, 2, b'r', b'g', 0x10, 3, // 2: metadata {name "rg", attempt 3}
        0x18, 2, // 3: state EXITED
        0x30, 9, // 6: finished_at
        0x38, 1, // 7: exit_code
        0x42, 2, 0x0a, 0, // 8: image, not read
        0x52, 5, b'E', b'r', b'r', b'o', b'r', // 10: reason
        0x72, 10, 0x0a, 2, b'/', b'r', 0x12, 2, b'/', b'h', 0x18, 1, // 14: mounts
        0x7a, 6, b'/', b'l', b'/', b'3', b'.', b'l', // 15: log_path
        0x82, 0x01, 0, // 16: resources, not read
    ];
    let status = ContainerStatusResponse::decode(bytes).unwrap().status.unwrap();
    assert_eq!((status.id.as_str(), status.exit_code, status.finished_at), ("c1", 1, 9));
    let metadata = status.metadata.clone().unwrap();
    assert_eq!((metadata.name.as_str(), metadata.attempt), ("rg", 3));
    assert_eq!(status.state(), ContainerState::ContainerExited);
    assert_eq!(status.reason, "Error");
    assert_eq!(
        (status.mounts[0].container_path.as_str(), status.mounts[0].host_path.as_str()),
        ("/r", "/h")
    );
    assert!(status.mounts[0].readonly);
    assert_eq!(status.log_path, "/l/3.l");
}

// === Client paths ===

type HttpResult = Result<http::Response<tonic::body::Body>, Infallible>;

/// A gRPC "server" that records each request path and answers Unimplemented.
#[derive(Clone, Default)]
struct PathRecorder(Arc<Mutex<Vec<String>>>);

impl tower::Service<http::Request<tonic::body::Body>> for PathRecorder {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<HttpResult>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.0.lock().push(req.uri().path().to_owned());
        std::future::ready(Ok(Status::unimplemented("recorded").into_http()))
    }
}

impl PathRecorder {
    fn last(&self) -> String {
        self.0.lock().last().cloned().unwrap_or_default()
    }
}

#[tokio::test]
async fn generated_clients_call_the_literal_grpc_paths() {
    use kpm_api::{csi, deviceplugin, dra, dra_health};

    let rec = PathRecorder::default();
    let svc = || rec.clone();

    let mut c = reg::registration_client::RegistrationClient::new(svc());
    let _ = c.get_info(reg::InfoRequest {}).await;
    assert_eq!(rec.last(), "/pluginregistration.Registration/GetInfo");
    let _ = c.notify_registration_status(reg::RegistrationStatus::default()).await;
    assert_eq!(rec.last(), "/pluginregistration.Registration/NotifyRegistrationStatus");

    let mut c = deviceplugin::v1beta1::registration_client::RegistrationClient::new(svc());
    let _ = c.register(deviceplugin::v1beta1::RegisterRequest::default()).await;
    assert_eq!(rec.last(), "/v1beta1.Registration/Register");

    let mut c = deviceplugin::v1beta1::device_plugin_client::DevicePluginClient::new(svc());
    let _ = c.list_and_watch(deviceplugin::v1beta1::Empty {}).await;
    assert_eq!(rec.last(), "/v1beta1.DevicePlugin/ListAndWatch");
    let _ = c.allocate(deviceplugin::v1beta1::AllocateRequest::default()).await;
    assert_eq!(rec.last(), "/v1beta1.DevicePlugin/Allocate");

    // DRA: the gRPC service lives in the long proto package; the short
    // "v1beta1.DRAPlugin" is only the name a driver advertises at registration.
    let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(svc());
    let _ = c.node_prepare_resources(dra::v1beta1::NodePrepareResourcesRequest::default()).await;
    assert_eq!(rec.last(), "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources");
    let mut c = dra::v1::dra_plugin_client::DraPluginClient::new(svc());
    let _ = c.node_prepare_resources(dra::v1::NodePrepareResourcesRequest::default()).await;
    assert_eq!(rec.last(), "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources");
    let _ = c.node_unprepare_resources(dra::v1::NodeUnprepareResourcesRequest::default()).await;
    assert_eq!(rec.last(), "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources");

    let mut c = dra_health::v1::dra_resource_health_client::DraResourceHealthClient::new(svc());
    let _ = c.node_watch_resources(dra_health::v1::NodeWatchResourcesRequest {}).await;
    assert_eq!(rec.last(), "/v1.DRAResourceHealth/NodeWatchResources");
    let mut c =
        dra_health::v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(svc());
    let _ = c.node_watch_resources(dra_health::v1alpha1::NodeWatchResourcesRequest {}).await;
    assert_eq!(rec.last(), "/v1alpha1.DRAResourceHealth/NodeWatchResources");

    let mut c = csi::v1::node_client::NodeClient::new(svc());
    let _ = c.node_get_info(csi::v1::NodeGetInfoRequest {}).await;
    assert_eq!(rec.last(), "/csi.v1.Node/NodeGetInfo");
    let _ = c.node_get_capabilities(csi::v1::NodeGetCapabilitiesRequest {}).await;
    assert_eq!(rec.last(), "/csi.v1.Node/NodeGetCapabilities");
    let mut c = csi::v1::identity_client::IdentityClient::new(svc());
    let _ = c.get_plugin_info(csi::v1::GetPluginInfoRequest {}).await;
    assert_eq!(rec.last(), "/csi.v1.Identity/GetPluginInfo");
    let _ = c.probe(csi::v1::ProbeRequest {}).await;
    assert_eq!(rec.last(), "/csi.v1.Identity/Probe");

    #[cfg(feature = "cri")]
    {
        use kpm_api::cri::v1 as cri;
        let mut c = cri::runtime_service_client::RuntimeServiceClient::new(svc());
        let _ = c.list_containers(cri::ListContainersRequest::default()).await;
        assert_eq!(rec.last(), "/runtime.v1.RuntimeService/ListContainers");
        let _ = c.container_status(cri::ContainerStatusRequest::default()).await;
        assert_eq!(rec.last(), "/runtime.v1.RuntimeService/ContainerStatus");
    }
}

// === Server routing ===

struct Plugin;

#[tonic::async_trait]
impl reg::registration_server::Registration for Plugin {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo { name: "wire".into(), ..Default::default() }))
    }
    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        if req.into_inner().plugin_registered {
            Ok(Response::new(reg::RegistrationStatusResponse {}))
        } else {
            Err(Status::invalid_argument("expected plugin_registered = true"))
        }
    }
}

struct Kubelet;

#[tonic::async_trait]
impl kpm_api::deviceplugin::v1beta1::registration_server::Registration for Kubelet {
    async fn register(
        &self,
        req: Request<kpm_api::deviceplugin::v1beta1::RegisterRequest>,
    ) -> Result<Response<kpm_api::deviceplugin::v1beta1::Empty>, Status> {
        if req.into_inner().resource_name == "vendor.com/gpu" {
            Ok(Response::new(kpm_api::deviceplugin::v1beta1::Empty {}))
        } else {
            Err(Status::invalid_argument("unexpected resource name"))
        }
    }
}

/// Sends `msg` to the literal `path` with a raw gRPC client (no generated code)
/// and decodes the reply as `R`.
async fn raw_call<M, R>(
    channel: tonic::service::Routes,
    path: &'static str,
    msg: M,
) -> Result<R, Status>
where
    M: Message + Send + Sync + 'static,
    R: Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<M, R>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(Request::new(msg), path, codec).await.map(Response::into_inner)
}

#[tokio::test]
async fn servers_answer_the_literal_grpc_paths() {
    use kpm_api::deviceplugin::v1beta1 as dp;

    // The servers as tonic's router composes them; no transport needed.
    let channel =
        tonic::service::Routes::new(reg::registration_server::RegistrationServer::new(Plugin))
            .add_service(dp::registration_server::RegistrationServer::new(Kubelet));

    let info: reg::PluginInfo =
        raw_call(channel.clone(), "/pluginregistration.Registration/GetInfo", reg::InfoRequest {})
            .await
            .unwrap();
    assert_eq!(info.name, "wire");
    let status = reg::RegistrationStatus { plugin_registered: true, error: String::new() };
    let _: reg::RegistrationStatusResponse = raw_call(
        channel.clone(),
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        status,
    )
    .await
    .unwrap();
    let register = dp::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "gpu.sock".into(),
        resource_name: "vendor.com/gpu".into(),
        options: None,
    };
    let _: dp::Empty =
        raw_call(channel.clone(), "/v1beta1.Registration/Register", register).await.unwrap();

    // A wrong package is not silently accepted.
    let wrong: Result<reg::PluginInfo, _> =
        raw_call(channel, "/v1.Registration/GetInfo", reg::InfoRequest {}).await;
    assert_eq!(wrong.unwrap_err().code(), tonic::Code::Unimplemented);
}

#[test]
fn service_names_and_constants_match_the_kubelet() {
    use kpm_api::constants::*;
    assert_eq!(reg::registration_server::SERVICE_NAME, "pluginregistration.Registration");
    assert_eq!(
        kpm_api::dra::v1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!((CSI_PLUGIN, DEVICE_PLUGIN, DRA_PLUGIN), ("CSIPlugin", "DevicePlugin", "DRAPlugin"));
    // The kinds' types on the wire and the names users type and read.
    let kinds = kpm_api::PluginKind::ALL.map(|kind| (kind.plugin_type(), kind.name()));
    assert_eq!(kinds, [("CSIPlugin", "csi"), ("DevicePlugin", "device"), ("DRAPlugin", "dra")]);
    assert_eq!(DRA_SUPPORTED_SERVICES, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(
        (PLUGINS_REGISTRY_DIR_NAME, DEVICE_PLUGINS_DIR_NAME, KUBELET_SOCKET_NAME),
        ("plugins_registry", "device-plugins", "kubelet.sock")
    );
}
