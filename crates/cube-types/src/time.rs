//! Times on the wire: RFC 3339 strings, where Go's zero time (`0001-01-01T00:00:00Z`, what the
//! book's files carry for "not yet") and `null` both mean unset.

use chrono::{DateTime, Datelike, Utc};
use serde::{Deserialize, Deserializer, Serializer};

/// Serde helpers for `Option<DateTime<Utc>>` fields (`#[serde(with = "crate::time::optional")]`).
pub mod optional {
    use super::*;

    pub fn serialize<S: Serializer>(
        value: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(time) => serializer.serialize_str(&time.to_rfc3339()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        let Some(text) = text else { return Ok(None) };
        if text.is_empty() {
            return Ok(None);
        }
        let time = DateTime::parse_from_rfc3339(&text)
            .map_err(|err| {
                serde::de::Error::custom(format!("invalid RFC 3339 time {text:?}: {err}"))
            })?
            .with_timezone(&Utc);
        // Go's zero time, and anything before year 2 with it, is "unset".
        Ok(if time.year() <= 1 { None } else { Some(time) })
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Holder {
        #[serde(default, with = "super::optional")]
        at: Option<DateTime<Utc>>,
    }

    #[test]
    fn go_zero_time_reads_as_unset() {
        let holder: Holder = serde_json::from_str(r#"{"at": "0001-01-01T00:00:00Z"}"#).unwrap();
        assert!(holder.at.is_none());
    }

    #[test]
    fn a_real_time_round_trips() {
        let holder: Holder = serde_json::from_str(r#"{"at": "2026-11-20T10:00:00Z"}"#).unwrap();
        let text = serde_json::to_string(&holder).unwrap();
        assert_eq!(text, r#"{"at":"2026-11-20T10:00:00+00:00"}"#);
    }

    #[test]
    fn a_malformed_time_is_refused_with_the_text() {
        let err = serde_json::from_str::<Holder>(r#"{"at": "yesterday"}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("yesterday"), "{err}");
    }
}
