//! CPU as people write it: a number of cores (`0.5`, `2`) or a string, `"0.5"`, `"2"`, or
//! Kubernetes' millicores, `"500m"` (half a core). Cube writes it back as a number of cores.
//! How many cores a task or node may declare is checked by validation
//! ([`crate::node::MAX_CPU_CORES`]).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

const ACCEPTED_FORMS: &str =
    r#"write cores as a number (0.5, 2) or a string ("0.5", "2", or "500m" for millicores)"#;

/// Parses `"0.5"`, `"2"` or `"500m"` into cores.
pub fn parse_cpu(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    if let Some(millis) = trimmed.strip_suffix('m') {
        return millis
            .parse::<u64>()
            .map(|millis| millis as f64 / 1000.0)
            .map_err(|_| format!("{text:?} is not a number of millicores: {ACCEPTED_FORMS}"));
    }
    match trimmed.parse::<f64>() {
        Ok(cores) if cores.is_finite() => Ok(cores),
        _ => Err(format!(
            "{text:?} is not a number of cores: {ACCEPTED_FORMS}"
        )),
    }
}

/// Reads a CPU field as a JSON number of cores or a string ([`parse_cpu`]); `null` is 0.
/// A negative or huge number is read as written, for validation to refuse with the limit.
pub fn deserialize_cpu<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    struct CpuVisitor;

    impl<'de> Visitor<'de> for CpuVisitor {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a number of cores: {ACCEPTED_FORMS}")
        }
        fn visit_u64<E: de::Error>(self, value: u64) -> Result<f64, E> {
            Ok(value as f64)
        }
        fn visit_i64<E: de::Error>(self, value: i64) -> Result<f64, E> {
            Ok(value as f64)
        }
        fn visit_f64<E: de::Error>(self, value: f64) -> Result<f64, E> {
            Ok(value)
        }
        fn visit_str<E: de::Error>(self, value: &str) -> Result<f64, E> {
            parse_cpu(value).map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }
        fn visit_none<E: de::Error>(self) -> Result<f64, E> {
            Ok(0.0)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
            d.deserialize_any(self)
        }
    }
    deserializer.deserialize_option(CpuVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "deserialize_cpu")]
        cpu: f64,
    }

    fn read(json: &str) -> Result<f64, String> {
        serde_json::from_str::<Holder>(json)
            .map(|holder| holder.cpu)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn cores_read_as_numbers_strings_or_millicores() {
        assert_eq!(read(r#"{"cpu": 0.5}"#), Ok(0.5));
        assert_eq!(read(r#"{"cpu": 2}"#), Ok(2.0));
        assert_eq!(read(r#"{"cpu": "0.5"}"#), Ok(0.5));
        assert_eq!(read(r#"{"cpu": "2"}"#), Ok(2.0));
        assert_eq!(read(r#"{"cpu": "500m"}"#), Ok(0.5));
        assert_eq!(read(r#"{"cpu": "1500m"}"#), Ok(1.5));
        assert_eq!(read(r#"{"cpu": null}"#), Ok(0.0));
        assert_eq!(read(r#"{}"#), Ok(0.0));
    }

    #[test]
    fn a_cpu_that_is_not_a_number_says_which_forms_are_accepted() {
        for text in ["two", "1.5m", "m", "NaN", "inf"] {
            let err = parse_cpu(text).unwrap_err();
            assert!(err.contains("500m"), "{text}: {err}");
        }
        let err = read(r#"{"cpu": true}"#).unwrap_err();
        assert!(err.contains("a number of cores"), "{err}");
    }
}
