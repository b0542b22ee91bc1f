//! The kubelet's v1beta1 wrapper: v1 requests converted to v1beta1 and the
//! v1beta1 responses back to v1. The messages are identical except that a
//! v1beta1 `Device` has no `share_id` (it converts to `None`).

use kpm_api::dra::{v1, v1beta1};

fn claim(claim: v1::Claim) -> v1beta1::Claim {
    v1beta1::Claim { namespace: claim.namespace, uid: claim.uid, name: claim.name }
}

pub(crate) fn prepare_request(claims: Vec<v1::Claim>) -> v1beta1::NodePrepareResourcesRequest {
    v1beta1::NodePrepareResourcesRequest { claims: claims.into_iter().map(claim).collect() }
}

pub(crate) fn unprepare_request(claims: Vec<v1::Claim>) -> v1beta1::NodeUnprepareResourcesRequest {
    v1beta1::NodeUnprepareResourcesRequest { claims: claims.into_iter().map(claim).collect() }
}

fn device(device: v1beta1::Device) -> v1::Device {
    v1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: None,
    }
}

pub(crate) fn prepare_response(
    response: v1beta1::NodePrepareResourcesResponse,
) -> v1::NodePrepareResourcesResponse {
    v1::NodePrepareResourcesResponse {
        claims: response
            .claims
            .into_iter()
            .map(|(uid, claim)| {
                let claim = v1::NodePrepareResourceResponse {
                    devices: claim.devices.into_iter().map(device).collect(),
                    error: claim.error,
                };
                (uid, claim)
            })
            .collect(),
    }
}

pub(crate) fn unprepare_response(
    response: v1beta1::NodeUnprepareResourcesResponse,
) -> v1::NodeUnprepareResourcesResponse {
    v1::NodeUnprepareResourcesResponse {
        claims: response
            .claims
            .into_iter()
            .map(|(uid, claim)| (uid, v1::NodeUnprepareResourceResponse { error: claim.error }))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1beta1_messages_convert_field_by_field() {
        let claims =
            vec![v1::Claim { namespace: "ns".into(), uid: "uid-1".into(), name: "c".into() }];
        let request = prepare_request(claims.clone());
        assert_eq!(request.claims[0].uid, "uid-1");
        assert_eq!(request.claims[0].namespace, "ns");
        assert_eq!(request.claims[0].name, "c");
        assert_eq!(unprepare_request(claims).claims.len(), 1);

        let mut response = v1beta1::NodePrepareResourcesResponse::default();
        response.claims.insert(
            "uid-1".into(),
            v1beta1::NodePrepareResourceResponse {
                devices: vec![v1beta1::Device {
                    request_names: vec!["gpu".into()],
                    pool_name: "pool1".into(),
                    device_name: "dev1".into(),
                    cdi_device_ids: vec!["vendor.com/gpu=dev1".into()],
                }],
                error: String::new(),
            },
        );
        let converted = prepare_response(response);
        assert_eq!(
            converted.claims["uid-1"].devices,
            [v1::Device {
                request_names: vec!["gpu".into()],
                pool_name: "pool1".into(),
                device_name: "dev1".into(),
                cdi_device_ids: vec!["vendor.com/gpu=dev1".into()],
                share_id: None,
            }]
        );

        let mut response = v1beta1::NodeUnprepareResourcesResponse::default();
        response.claims.insert(
            "uid-1".into(),
            v1beta1::NodeUnprepareResourceResponse { error: "busy".into() },
        );
        assert_eq!(unprepare_response(response).claims["uid-1"].error, "busy");
    }
}
