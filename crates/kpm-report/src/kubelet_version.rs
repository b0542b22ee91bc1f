//! The kubelet minors the doctor's verdicts and fixes were checked against,
//! beside the real kubelet of each (`cargo xtask node-e2e --kubelet-dir`,
//! `docs/operations.md`, "Every kubelet minor"), and what a report says of
//! a kubelet outside them: that its verdicts describe the checked kubelets'
//! behaviour, rather than guessing at this one's.

use std::ops::RangeInclusive;

/// The minors of Kubernetes 1.x whose kubelets the doctor was run beside.
pub const CHECKED_MINORS: RangeInclusive<u32> = 31..=36;

/// Whether the doctor was checked against the kubelet of `version` (as a
/// Node's `nodeInfo.kubeletVersion` gives it, `v1.35.6`): `None` when the
/// version is no release's (`v0.0.0-master+…`, a development build).
pub fn checked(version: &str) -> Option<bool> {
    minor(version).map(|minor| CHECKED_MINORS.contains(&minor))
}

/// The minor of Kubernetes 1.x of a kubelet's `version` (`v1.33.13` → 33):
/// `None` for a development build (`v0.0.0-master+…`) or no version.
pub fn minor(version: &str) -> Option<u32> {
    version.strip_prefix("v1.")?.split(['.', '-', '+']).next()?.parse().ok()
}

/// What a report says of a kubelet of `version` the doctor was not checked
/// against, if it was not.
pub fn unchecked_note(version: &str) -> Option<String> {
    let (first, last) = (CHECKED_MINORS.start(), CHECKED_MINORS.end());
    let which = match checked(version) {
        Some(true) => return None,
        Some(false) => "a kubelet minor",
        None => "a development build of the kubelet",
    };
    Some(format!(
        "kubelet {version} is {which} kpm's doctor was not checked against (1.{first} to \
         1.{last}): its verdicts and fixes say what those kubelets do"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_checked_by_its_minor() {
        assert_eq!(checked("v1.35.6"), Some(true));
        assert_eq!(checked("v1.34.0-rc.1+abc"), Some(true));
        assert_eq!(checked("v1.31.14"), Some(true));
        assert_eq!(checked("v1.30.14"), Some(false));
        assert_eq!(checked("v1.37.0"), Some(false));
        assert_eq!(checked("v0.0.0-master+8e16b12fda5b"), None);
        assert_eq!(checked("1.35.6"), None);
    }

    #[test]
    fn only_a_kubelet_outside_the_checked_minors_gets_a_note() {
        assert_eq!(unchecked_note("v1.36.2"), None);
        let note = unchecked_note("v1.30.14").unwrap();
        assert!(note.contains("v1.30.14") && note.contains("1.31 to 1.36"), "{note}");
        assert!(unchecked_note("v0.0.0-master+abc").unwrap().contains("development build"));
    }
}
