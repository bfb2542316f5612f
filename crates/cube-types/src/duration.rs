//! Durations as people write them: `"500ms"`, `"10s"`, `"1.5s"`, `"2m"`, `"1h"`.
//!
//! In a task (`HealthCheckInterval`, `HealthCheckTimeout`, `RestartDelay`, `RestartDelayMax`) a
//! duration is a string with a unit. A bare JSON number is refused: Go's `time.Duration` would
//! read `5` as five nanoseconds, a person means five seconds, and guessing either way runs a
//! task that is not the one asked for. Cube writes durations as strings itself
//! ([`format_duration`]), so the tasks a manager sends its workers never carry a bare number.
//! Each of those fields is at most [`MAX_TASK_DURATION`] (`Task::validate` says so).

use std::time::Duration;

/// The longest duration a task may set for a health-check interval or timeout, or a restart
/// delay: a day. Longer waits are a slip of the unit, and far longer ones (`"3000000000000000h"`)
/// overflow the clock arithmetic that schedules probes and restarts.
pub const MAX_TASK_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// [`MAX_TASK_DURATION`] as the messages write it.
pub const MAX_TASK_DURATION_TEXT: &str = "24h";

/// What [`parse_duration`] says of a duration too long for any clock; a task's field adds
/// its own limit to it.
const OUT_OF_RANGE: &str = "is out of range";

/// The forms a duration is written in, for messages.
const ACCEPTED_FORMS: &str = r#""500ms", "5s", "1.5s", "2m", "1h""#;

/// Parses a number followed by `ms`, `s`, `m` or `h`, to the nearest millisecond. A bare `0`
/// is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration: expected a number and a unit: {ACCEPTED_FORMS}")
    })?;
    let seconds_per_unit = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => {
            return Err(format!(
                "{text:?} has no unit: write e.g. \"{text}s\" for seconds ({ACCEPTED_FORMS})"
            ));
        }
        other => {
            return Err(format!(
                "{text:?} has an unknown unit {other:?}: use ms, s, m or h"
            ));
        }
    };
    // Rounded to whole milliseconds, the precision `format_duration` writes: a duration then
    // reads back the same after the manager sends it to a worker (`"0.3m"` is 18s, not
    // 17.999999999s), and one too short to count (`"0.1ms"`) is plainly 0.
    let millis = (value * seconds_per_unit * 1000.0).round();
    if !millis.is_finite() || millis >= u64::MAX as f64 {
        return Err(format!(
            "{text:?} {OUT_OF_RANGE}: far longer than any wait Cube can keep"
        ));
    }
    Ok(Duration::from_millis(millis as u64))
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

/// Serde helpers for `Option<Duration>` fields: written as `"500ms"`, read as such a string;
/// `null` and `""` are unset, a bare number is refused.
pub mod optional {
    use std::fmt;
    use std::time::Duration;

    use serde::Serializer;
    use serde::de::{self, Deserializer, Visitor};

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.serialize_str(&super::format_duration(*duration)),
            None => serializer.serialize_none(),
        }
    }

    /// Reads a string with a unit; `null` and `""` are unset. A number is refused with the
    /// forms that are accepted (see the module's doc).
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        deserializer.deserialize_option(DurationVisitor)
    }

    /// A visitor rather than an untagged enum, so that every refusal is in Cube's words.
    struct DurationVisitor;

    impl<'de> Visitor<'de> for DurationVisitor {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a duration with a unit: {}", super::ACCEPTED_FORMS)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            if text.is_empty() {
                return Ok(None);
            }
            super::parse_duration(text).map(Some).map_err(|why| {
                if why.contains(super::OUT_OF_RANGE) {
                    E::custom(format!(
                        "{why}; the limit is {}",
                        super::MAX_TASK_DURATION_TEXT
                    ))
                } else {
                    E::custom(why)
                }
            })
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
            Err(bare_number(value))
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
            Err(bare_number(value))
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
            Err(bare_number(value))
        }
    }

    fn bare_number<E: de::Error>(value: impl fmt::Display) -> E {
        E::custom(format!(
            "{value} is a bare number; write a duration with a unit: {}",
            super::ACCEPTED_FORMS
        ))
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
    fn durations_are_counted_in_whole_milliseconds() {
        assert_eq!(parse_duration("0.3m"), Ok(Duration::from_secs(18)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("0.1ms"), Ok(Duration::ZERO));
        let read_back = parse_duration(&format_duration(parse_duration("0.0015s").unwrap()));
        assert_eq!(read_back, parse_duration("0.0015s"));
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

    #[derive(Debug, serde::Deserialize)]
    struct Holder {
        #[serde(default, with = "optional")]
        wait: Option<Duration>,
    }

    fn read(json: &str) -> Result<Option<Duration>, String> {
        serde_json::from_str::<Holder>(json)
            .map(|holder| holder.wait)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn a_bare_integer_is_refused_with_the_accepted_forms() {
        let err = read(r#"{"wait": 5}"#).unwrap_err();
        assert!(
            err.starts_with("5 is a bare number; write a duration with a unit: \"500ms\""),
            "{err}"
        );
    }

    #[test]
    fn a_bare_float_is_refused_in_cubes_words_not_serdes() {
        let err = read(r#"{"wait": 1.5}"#).unwrap_err();
        assert!(err.starts_with("1.5 is a bare number"), "{err}");
        assert!(!err.contains("untagged"), "{err}");
        let err = read(r#"{"wait": -3}"#).unwrap_err();
        assert!(err.starts_with("-3 is a bare number"), "{err}");
    }

    #[test]
    fn strings_null_and_empty_read_as_durations_or_unset() {
        assert_eq!(
            read(r#"{"wait": "2m"}"#),
            Ok(Some(Duration::from_secs(120)))
        );
        assert_eq!(read(r#"{"wait": "0s"}"#), Ok(Some(Duration::ZERO)));
        assert_eq!(read(r#"{"wait": null}"#), Ok(None));
        assert_eq!(read(r#"{"wait": ""}"#), Ok(None));
        assert_eq!(read(r#"{}"#), Ok(None));
        let err = read(r#"{"wait": true}"#).unwrap_err();
        assert!(err.contains("a duration with a unit"), "{err}");
    }

    #[test]
    fn a_duration_too_long_for_any_clock_is_refused_in_cubes_words() {
        let err = parse_duration("99999999999999999999999999h").unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        assert!(!err.contains("float"), "{err}");
        let err = read(r#"{"wait": "3000000000000000h"}"#).unwrap_err();
        assert!(
            err.contains("out of range") && err.contains("the limit is 24h"),
            "{err}"
        );
    }
}
