//! Why the fleet could not be read.

use std::borrow::Cow;
use std::time::Duration;

/// Why the fleet could not be read; each names the resource and the page.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// The API server refused a list request, or it failed on the way.
    #[error("list {resource} (page {page}): {}", short(source))]
    List {
        /// `kubeletpluginreports`, `nodes`, `csidrivers`, `csinodes` or
        /// `resourceslices`.
        resource: Cow<'static, str>,
        /// The page, from 1.
        page: usize,
        /// kube-rs's error.
        #[source]
        source: kube::Error,
    },
    /// A list request got no answer in time.
    #[error("list {resource} (page {page}): no answer within {}", humantime::format_duration(*timeout))]
    Timeout {
        /// `kubeletpluginreports`, `nodes`, `csidrivers`, `csinodes` or
        /// `resourceslices`.
        resource: Cow<'static, str>,
        /// The page, from 1.
        page: usize,
        /// The bound.
        timeout: Duration,
    },
    /// The API server refused to get one object, or the request failed on
    /// the way (a 404 is not an error: the object went meanwhile).
    #[error("get {resource} {name}: {}", short(source))]
    Get {
        /// `kubeletpluginreports`, `nodes` or `csinodes`.
        resource: Cow<'static, str>,
        /// The object's name.
        name: String,
        /// kube-rs's error.
        #[source]
        source: kube::Error,
    },
    /// A request for one object got no answer in time.
    #[error("get {resource} {name}: no answer within {}", humantime::format_duration(*timeout))]
    GetTimeout {
        /// `kubeletpluginreports`, `nodes` or `csinodes`.
        resource: Cow<'static, str>,
        /// The object's name.
        name: String,
        /// The bound.
        timeout: Duration,
    },
    /// The API server gave the same `continue` token twice: following it
    /// would never end.
    #[error("list {resource} (page {page}): the API server repeated the continue token")]
    Paging {
        /// `kubeletpluginreports`, `nodes`, `csidrivers`, `csinodes` or
        /// `resourceslices`.
        resource: Cow<'static, str>,
        /// The page, from 1.
        page: usize,
    },
}

impl FleetError {
    /// Whether the API server refused the reader (403): what it may not
    /// read is unseen, not a failure of the read.
    pub(crate) fn is_forbidden(&self) -> bool {
        let (Self::Get { source, .. } | Self::List { source, .. }) = self else {
            return false;
        };
        matches!(source, kube::Error::Api(status) if status.code == 403)
    }
}

/// kube-rs's error in one line an operator reads: an API server's refusal
/// as its message and code (not the whole `Status`), any other error with
/// its causes (a refused connection is in a source).
fn short(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => kpm_api::gotext::error_chain(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_of_the_reader_is_forbidden() {
        let status = |code: u16| {
            let status: kube::core::Status = serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": "no", "reason": "Forbidden", "code": code,
            }))
            .unwrap();
            kube::Error::Api(Box::new(status))
        };
        let get = |code| FleetError::Get {
            resource: Cow::Borrowed("pods"),
            name: "p".into(),
            source: status(code),
        };
        assert!(get(403).is_forbidden());
        assert!(!get(500).is_forbidden());
        let list =
            FleetError::List { resource: Cow::Borrowed("pods"), page: 1, source: status(403) };
        assert!(list.is_forbidden());
    }
}
