//! How kpm's status types write times in JSON (feature `serde`), shared by
//! the handler crates and the facade so that the status API shows every time
//! one way: RFC 3339, UTC, with milliseconds (`2026-11-21T12:00:00.250Z`);
//! and how a reader of the status API (`kpm doctor`) reads them back.

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A time that serializes as RFC 3339 with milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub SystemTime);

impl Serialize for Rfc3339 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_rfc3339_millis(self.0))
    }
}

/// `serialize_with` for a time field, as [`Rfc3339`].
pub fn rfc3339<S: Serializer>(at: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    Rfc3339(*at).serialize(serializer)
}

impl<'de> Deserialize<'de> for Rfc3339 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        humantime::parse_rfc3339(&text).map(Self).map_err(serde::de::Error::custom)
    }
}

/// `deserialize_with` for a time field written by [`rfc3339`]: RFC 3339 in
/// UTC (`Z` or `+00:00`), with or without a fraction of a second.
pub fn from_rfc3339<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SystemTime, D::Error> {
    Rfc3339::deserialize(deserializer).map(|at| at.0)
}

/// `serialize_with` for an optional time field: `null` when absent.
#[allow(clippy::ref_option, reason = "the signature serde's `serialize_with` calls")]
pub fn rfc3339_opt<S: Serializer>(
    at: &Option<SystemTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    at.map(Rfc3339).serialize(serializer)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[derive(Serialize)]
    struct Fields {
        #[serde(serialize_with = "rfc3339")]
        at: SystemTime,
        #[serde(serialize_with = "rfc3339_opt")]
        maybe: Option<SystemTime>,
        #[serde(serialize_with = "rfc3339_opt")]
        never: Option<SystemTime>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Read {
        #[serde(deserialize_with = "from_rfc3339")]
        at: SystemTime,
    }

    #[test]
    fn a_written_time_reads_back_and_a_time_not_in_utc_is_refused() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_262_400_250);
        let written = serde_json::to_string(&Rfc3339(at)).unwrap();
        let read: Read = serde_json::from_str(&format!(r#"{{"at":{written}}}"#)).unwrap();
        assert_eq!(read, Read { at });
        let whole: Read = serde_json::from_str(r#"{"at":"2026-11-21T12:00:00Z"}"#).unwrap();
        assert_eq!(whole.at, UNIX_EPOCH + Duration::from_secs(1_795_262_400));
        for refused in [r#"{"at":"2026-11-21T12:00:00+01:00"}"#, r#"{"at":"soon"}"#, r#"{"at":1}"#]
        {
            assert!(serde_json::from_str::<Read>(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn times_are_rfc3339_in_utc_with_milliseconds() {
        let at = UNIX_EPOCH + Duration::from_micros(1_795_262_400_250_999);
        let fields = Fields { at, maybe: Some(at), never: None };
        assert_eq!(
            serde_json::to_string(&fields).unwrap(),
            r#"{"at":"2026-11-21T12:00:00.250Z","maybe":"2026-11-21T12:00:00.250Z","never":null}"#
        );
    }
}
