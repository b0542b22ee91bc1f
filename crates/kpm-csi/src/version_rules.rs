//! CSI version rules: apimachinery's `ParseGeneric` and
//! `HighestSupportedVersion` (spec A.3), which fail with the kubelet's errors.
//!
//! Only CSI 1.x is supported: 0.x is rejected and 2.x and above are ignored,
//! because a 2.x driver need not be compatible with 1.x.

use std::str::FromStr;

use crate::error::CsiError;
use crate::version::Version;

impl Version {
    /// Parses `text` like apimachinery's `ParseGeneric`
    /// (`^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)*$`, at least two components, no
    /// leading zero in the major component).
    pub fn parse_generic(text: &str) -> Result<Self, CsiError> {
        let unparsable = || CsiError::UnparsableVersion { version: text.to_owned() };
        // RE2's `\s` is `[\t\n\f\r ]`.
        let rest = text.trim_start_matches(['\t', '\n', '\x0c', '\r', ' ']);
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let bytes = rest.as_bytes();
        let digits_from = |start: usize| {
            bytes
                .get(start..)
                .map_or(0, |tail| tail.iter().take_while(|b| b.is_ascii_digit()).count())
        };
        let mut end = digits_from(0);
        if end == 0 {
            return Err(unparsable());
        }
        while bytes.get(end) == Some(&b'.') {
            let digits = digits_from(end + 1);
            if digits == 0 {
                break;
            }
            end += 1 + digits;
        }
        let (numbers, extra) = rest.split_at(end);
        // `(.*)*$` without the `s` flag: `.` does not match a newline.
        if extra.contains('\n') {
            return Err(unparsable());
        }
        let parts: Vec<&str> = numbers.split('.').collect();
        if parts.len() < 2 {
            return Err(CsiError::IllegalVersion { version: text.to_owned() });
        }
        let mut components = Vec::with_capacity(parts.len());
        for (index, part) in parts.into_iter().enumerate() {
            if index == 0 && part.starts_with('0') && part != "0" {
                return Err(CsiError::ZeroPrefixedVersionComponent {
                    version: text.to_owned(),
                    component: part.to_owned(),
                });
            }
            let value = part.parse::<u64>().map_err(|_| CsiError::VersionComponentOutOfRange {
                version: text.to_owned(),
                component: part.to_owned(),
            })?;
            components.push(value);
        }
        Ok(Self::from_components(components))
    }
}

impl FromStr for Version {
    type Err = CsiError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse_generic(text)
    }
}

/// The highest supported CSI version in `versions`, like apimachinery's
/// `HighestSupportedVersion`: entries are scanned from the last to the first,
/// unparsable ones are remembered and skipped, majors above 1 are ignored, the
/// largest remaining entry wins and must have major 1.
pub fn highest_supported_version(versions: &[String]) -> Result<Version, CsiError> {
    if versions.is_empty() {
        return Err(CsiError::EmptySupportedVersions);
    }
    let mut highest: Option<Version> = None;
    let mut last_error = None;
    for text in versions.iter().rev() {
        let version = match Version::parse_generic(text) {
            Ok(version) => version,
            Err(err) => {
                last_error = Some(Box::new(err));
                continue;
            }
        };
        if version.major() > 1 {
            continue;
        }
        if highest.as_ref().is_none_or(|current| *current < version) {
            highest = Some(version);
        }
    }
    match highest {
        None => Err(CsiError::NoSupportedVersion { versions: versions.to_vec(), last_error }),
        Some(version) if version.major() != 1 => Err(CsiError::NotV1 { version }),
        Some(version) => Ok(version),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn list(csv: &str) -> Vec<String> {
        if csv.is_empty() { Vec::new() } else { csv.split(',').map(str::to_owned).collect() }
    }

    /// apimachinery `TestHighestSupportedVersion`, every case.
    #[test]
    fn highest_supported_version_follows_apimachinery() {
        let passing = [
            ("v1.0.0", "1.0.0"),
            ("1.0.0", "1.0.0"),
            ("0.2.0,v1.0.0", "1.0.0"),
            ("0.2.0,v1.2.3", "1.2.3"),
            ("v1.2.3,v0.3.0", "1.2.3"),
            ("v1.2.3,v0.3.0,2.0.1", "1.2.3"),
            ("v1.2.3,4.9.12,v0.3.0,2.0.1", "1.2.3"),
            ("v1.2.3,boo,v0.3.0,2.0.1", "1.2.3"),
        ];
        for (versions, expected) in passing {
            let highest = highest_supported_version(&list(versions))
                .unwrap_or_else(|err| panic!("{versions}: {err}"));
            assert_eq!(highest.to_string(), expected, "{versions}");
        }
        let failing = [
            "0.3.0",
            "0.2.0",
            "v0.3.0",
            "v0.2.0",
            "0.2.0,v0.3.0",
            "4.9.12,2.0.1",
            "",
            "var,boo,foo",
        ];
        for versions in failing {
            assert!(highest_supported_version(&list(versions)).is_err(), "{versions} must fail");
        }
    }

    #[test]
    fn highest_supported_version_errors_read_like_apimachinery() {
        let text = |csv: &str| highest_supported_version(&list(csv)).unwrap_err().to_string();
        assert_eq!(text(""), "empty array for supported versions");
        assert_eq!(
            text("0.2.0,v0.3.0"),
            "highest supported version reported is 0.3.0, must be v1.x"
        );
        assert_eq!(
            text("4.9.12,2.0.1"),
            "could not find a highest supported version from versions ([4.9.12 2.0.1]) \
             reported: <nil>"
        );
        // Scanned from the end, so the remembered error is the first entry's.
        assert_eq!(
            text("var,boo,foo"),
            "could not find a highest supported version from versions ([var boo foo]) reported: \
             could not parse \"var\" as version"
        );
    }

    #[test]
    fn generic_versions_parse_like_apimachinery() {
        let ok = [
            ("1.2", "1.2"),
            ("v1.2.3", "1.2.3"),
            ("  v1.2.3-rc.1+build", "1.2.3"),
            ("1.2.3.4", "1.2.3.4"),
            ("1.02.3", "1.2.3"),
            ("0.1", "0.1"),
            ("1.2.", "1.2"),
            ("1.2 trailing text", "1.2"),
        ];
        for (text, shown) in ok {
            let version =
                Version::parse_generic(text).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert_eq!(version.to_string(), shown, "{text}");
        }
        let err = |text: &str| Version::parse_generic(text).unwrap_err().to_string();
        assert_eq!(err("boo"), "could not parse \"boo\" as version");
        assert_eq!(err("vv1.0"), "could not parse \"vv1.0\" as version");
        assert_eq!(err("1.0\n"), "could not parse \"1.0\\n\" as version");
        assert_eq!(err("v1"), "illegal version string \"v1\"");
        assert_eq!(err("1..2"), "illegal version string \"1..2\"");
        assert_eq!(err("01.2"), "illegal zero-prefixed version component \"01\" in \"01.2\"");
        assert_eq!(
            err("1.99999999999999999999"),
            "illegal non-numeric version component \"99999999999999999999\" in \
             \"1.99999999999999999999\": strconv.ParseUint: parsing \"99999999999999999999\": \
             value out of range"
        );
    }

    #[test]
    fn versions_compare_component_wise_with_missing_components_as_zero() {
        let v = |text: &str| Version::parse_generic(text).unwrap();
        assert_eq!(v("1.0"), v("1.0.0"));
        assert!(v("1.0") < v("1.0.1"));
        assert!(v("1.10.0") > v("1.9.9"));
        assert!(v("0.3.0") < v("1.0.0"));
        assert_eq!(v("v1.2.3").major(), 1);
        assert_eq!(v("v1.2.3").minor(), 2);
        assert_eq!(v("v1.2.3").components(), [1, 2, 3]);
        assert_eq!("v1.2.3".parse::<Version>().unwrap(), v("1.2.3"));
    }

    proptest! {
        /// The winner is the largest 1.x entry, whatever else the list holds.
        #[test]
        fn the_highest_one_x_version_wins(
            entries in proptest::collection::vec((0u64..4, 0u64..20, 0u64..20, any::<bool>()), 1..8)
        ) {
            let versions: Vec<String> = entries
                .iter()
                .map(|(major, minor, patch, v)| {
                    format!("{}{major}.{minor}.{patch}", if *v { "v" } else { "" })
                })
                .collect();
            let expected = entries
                .iter()
                .filter(|(major, ..)| *major <= 1)
                .map(|(major, minor, patch, _)| (*major, *minor, *patch))
                .max();
            match (highest_supported_version(&versions), expected) {
                (Ok(version), Some((1, minor, patch))) => {
                    prop_assert_eq!(version.components(), [1, minor, patch]);
                }
                (Err(CsiError::NotV1 { version }), Some((0, minor, patch))) => {
                    prop_assert_eq!(version.components(), [0, minor, patch]);
                }
                (Err(CsiError::NoSupportedVersion { .. }), None) => {}
                (got, expected) => prop_assert!(false, "{versions:?}: {got:?} vs {expected:?}"),
            }
        }

        /// Display prints what parsing reads back as an equal version.
        #[test]
        fn displayed_versions_parse_back(
            components in proptest::collection::vec(0u64..1000, 2..5)
        ) {
            let text = components.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
            let version = Version::parse_generic(&format!("v{text}-extra")).unwrap();
            prop_assert_eq!(version.to_string(), text.clone());
            prop_assert_eq!(Version::parse_generic(&version.to_string()).unwrap(), version);
        }
    }
}
