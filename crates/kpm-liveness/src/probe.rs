//! One liveness probe: dial the registration socket, ask `GetInfo`.

use std::path::Path;
use std::time::Duration;

use kpm_api::constants::MAX_REGISTRATION_MESSAGE_BYTES;
use kpm_api::gotext::go_code_name;
use kpm_api::registration::v1::InfoRequest;
use kpm_api::registration::v1::registration_client::RegistrationClient;
use kpm_api::uds;

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Nobody is there (socket file missing, connection refused): the
    /// plugin is gone, no point in asking again.
    pub gone: bool,
    /// The dial or `GetInfo` error, for logs and the `Unresponsive` event.
    pub reason: String,
}

/// Dials `socket` and asks `GetInfo`, each step within `timeout`. The
/// answer's content is not checked: the probe asks whether the plugin is
/// alive, registration already judged what it said.
pub async fn probe(socket: &Path, timeout: Duration) -> Result<(), ProbeFailure> {
    let channel = uds::dial(socket, timeout)
        .await
        .map_err(|err| ProbeFailure { gone: err.is_gone(), reason: err.to_string() })?;
    let mut client =
        RegistrationClient::new(channel).max_decoding_message_size(MAX_REGISTRATION_MESSAGE_BYTES);
    let call = client.get_info(uds::timed_request(InfoRequest {}, timeout));
    match uds::within(timeout, call).await {
        Ok(_) => Ok(()),
        Err(Some(status)) => Err(ProbeFailure {
            gone: false,
            reason: format!("GetInfo: {}: {}", go_code_name(status.code()), status.message()),
        }),
        Err(None) => Err(ProbeFailure {
            gone: false,
            reason: format!("GetInfo timed out after {timeout:?}"),
        }),
    }
}
