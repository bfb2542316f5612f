//! Durations as people write them: `"500ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`.

use std::time::Duration;

/// Parses a number followed by `ms`, `s`, `m` or `h`. A bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: expected a number and a unit, e.g. \"500ms\", \"10s\", \"2m\""))?;
    let seconds_per_unit = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => {
            return Err(format!(
                "{text:?} has no unit: write e.g. \"{text}s\" for seconds"
            ));
        }
        other => {
            return Err(format!(
                "{text:?} has an unknown unit {other:?}: use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|err| format!("{text:?} is out of range: {err}"))
}

/// A duration for people and for [`parse_duration`]: `"500ms"`, `"2s"`, `"1.5s"`, `"0s"`.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis == 0 {
        "0s".to_string()
    } else if !millis.is_multiple_of(1000) {
        format!("{millis}ms")
    } else {
        format!("{}s", millis / 1000)
    }
}

/// Serde helpers for `Option<Duration>` fields: written as `"500ms"`, read as such a string or
/// as Go's `time.Duration` integer of nanoseconds; `null` is unset.
pub mod optional {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.serialize_str(&super::format_duration(*duration)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Nanoseconds(u64),
        }
        Ok(match Option::<Written>::deserialize(deserializer)? {
            None => None,
            Some(Written::Nanoseconds(nanos)) => Some(Duration::from_nanos(nanos)),
            Some(Written::Text(text)) if text.is_empty() => None,
            Some(Written::Text(text)) => {
                Some(super::parse_duration(&text).map_err(serde::de::Error::custom)?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_are_written_so_that_they_read_back() {
        for text in ["0s", "500ms", "2s", "1500ms", "120s"] {
            let duration = parse_duration(text).unwrap();
            assert_eq!(format_duration(duration), text);
        }
    }

    #[test]
    fn bad_durations_say_what_is_wrong() {
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(
            parse_duration("10 days")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
