//! The socket path of an endpoint a plugin advertises.

use std::path::Path;

/// The socket path of a plugin's endpoint, a path on the host. The kubelet
/// dials an endpoint as a raw path; some plugins (CSI drivers) report a
/// gRPC target instead (`unix:///csi/csi.sock` or `unix:/csi/csi.sock`), so
/// a `unix://` or `unix:` prefix is stripped and both forms work.
///
/// ```
/// use std::path::Path;
///
/// let csi = Path::new("/csi/csi.sock");
/// assert_eq!(kpm_api::endpoint_path("unix:///csi/csi.sock"), csi);
/// assert_eq!(kpm_api::endpoint_path("unix:/csi/csi.sock"), csi);
/// assert_eq!(kpm_api::endpoint_path("/csi/csi.sock"), csi);
/// ```
pub fn endpoint_path(endpoint: &str) -> &Path {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    Path::new(path)
}
