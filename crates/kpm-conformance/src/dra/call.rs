//! One service's calls to a DRA driver, through the check kubelet's DRA
//! manager, and its answers as the kubelet judges them.

use kpm::dra::{DraService, DraView};
use kpm_api::dra::v1;

use crate::outcome::Evidence;

/// A claim's answer to `NodePrepareResources`, whichever the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prepared {
    pub(super) error: String,
    /// The devices, sorted by pool and name, to compare two answers.
    pub(super) devices: Vec<v1::Device>,
}

/// The claims of a response, by uid.
pub(super) type Answers<T> = std::collections::HashMap<String, T>;

/// One service's calls, through the check kubelet's DRA manager, each
/// within its call timeout, on a connection of its own.
pub(super) struct Call<'a> {
    pub(super) dra: &'a DraView,
    pub(super) driver: &'a str,
    pub(super) endpoint: &'a str,
    pub(super) service: DraService,
}

impl Call<'_> {
    /// `NodePrepareResources` with `claims`: each claim's answer by uid, or
    /// the call's error.
    pub(super) async fn prepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> Result<Answers<Prepared>, String> {
        let answer = self.dra.prepare_at(self.driver, self.endpoint, self.service, claims).await;
        let answer = answer.map_err(|err| err.to_string())?;
        Ok(answer
            .claims
            .into_iter()
            .map(|(uid, claim)| (uid, Prepared::new(claim.error, claim.devices)))
            .collect())
    }

    /// `NodeUnprepareResources` with `claims`: each claim's error (empty
    /// when none) by uid, or the call's error.
    pub(super) async fn unprepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> Result<Answers<String>, String> {
        let answer = self.dra.unprepare_at(self.driver, self.endpoint, self.service, claims).await;
        let answer = answer.map_err(|err| err.to_string())?;
        Ok(answer.claims.into_iter().map(|(uid, claim)| (uid, claim.error)).collect())
    }
}

impl Prepared {
    fn new(error: String, mut devices: Vec<v1::Device>) -> Self {
        devices.sort_by(|a, b| (&a.pool_name, &a.device_name).cmp(&(&b.pool_name, &b.device_name)));
        Self { error, devices }
    }

    pub(super) fn cdi_ids(&self) -> impl Iterator<Item = &String> {
        self.devices.iter().flat_map(|device| &device.cdi_device_ids)
    }

    pub(super) fn describe(&self) -> String {
        if !self.error.is_empty() {
            return format!("error {:?}", self.error);
        }
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|device| {
                let share = device.share_id.as_ref().map(|id| format!(" (share {id})"));
                format!(
                    "{}/{}{} for {:?} as {:?}",
                    device.pool_name,
                    device.device_name,
                    share.unwrap_or_default(),
                    device.request_names,
                    device.cdi_device_ids
                )
            })
            .collect();
        if devices.is_empty() { "no devices".into() } else { devices.join(", ") }
    }
}

/// The answers to a call with `sent` judged as the kubelet judges them:
/// it fails the pod on a result for a claim it did not send, and on one
/// it sent without a result.
pub(super) fn judge_uids<T>(answers: &Answers<T>, sent: &[&str], findings: &mut Evidence) {
    let mut unknown: Vec<&String> =
        answers.keys().filter(|uid| !sent.contains(&uid.as_str())).collect();
    unknown.sort();
    if !unknown.is_empty() {
        findings.fail(format!(
            "answered claims it was not sent {unknown:?}: the kubelet fails the pod (result for unknown claim UID)"
        ));
    }
    let missing: Vec<&&str> = sent.iter().filter(|uid| !answers.contains_key(**uid)).collect();
    if !missing.is_empty() {
        findings.fail(format!(
            "no answer for claims {missing:?}: the kubelet fails the pod (skipped ResourceClaims)"
        ));
    }
}
