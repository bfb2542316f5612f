//! Sizes as people write them: plain bytes (`536870912`) or a number and a unit (`512MiB`,
//! `2GiB`, `1.5GB`). Binary units (`KiB`, `MiB`, `GiB`, `TiB`) count in 1024s, decimal ones
//! (`KB`, `MB`, `GB`, `TB`) in 1000s, as Docker and Kubernetes do; `B` is bytes.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

/// Parses a size into bytes. Units are case-sensitive only where it matters to nobody: `mib`,
/// `MiB` and `MIB` all mean 2^20; `k`/`m`/`g` alone are refused as ambiguous.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: expected bytes or a number and a unit, e.g. \"512MiB\", \"2GiB\", \"1.5GB\"")
    })?;
    let multiplier: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}: use B, KB, MB, GB, TB (powers of 1000) \
                 or KiB, MiB, GiB, TiB (powers of 1024)"
            ));
        }
    };
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    if unit.is_empty() && number.contains('.') {
        return Err(format!("{text:?}: a number of bytes must be whole"));
    }
    Ok(bytes.round() as u64)
}

/// A size for people: `512.0 MiB`, `2.0 GiB`, `900 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Reads a size field as a JSON number of bytes or as a string with a unit; `null` is 0.
pub fn deserialize_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct SizeVisitor;

    impl<'de> Visitor<'de> for SizeVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"a size in bytes, or a string such as "512MiB""#)
        }
        fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
            Ok(value)
        }
        fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
            u64::try_from(value)
                .map_err(|_| E::custom(format!("{value} is negative; a size is bytes >= 0")))
        }
        fn visit_f64<E: de::Error>(self, value: f64) -> Result<u64, E> {
            if value.is_finite() && value >= 0.0 && value.fract() == 0.0 {
                Ok(value as u64)
            } else {
                Err(E::custom(format!("{value} is not a whole number of bytes")))
            }
        }
        fn visit_str<E: de::Error>(self, value: &str) -> Result<u64, E> {
            parse_size(value).map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
            Ok(0)
        }
        fn visit_none<E: de::Error>(self) -> Result<u64, E> {
            Ok(0)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
            d.deserialize_any(self)
        }
    }
    deserializer.deserialize_option(SizeVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_bytes_or_with_units() {
        assert_eq!(parse_size("536870912"), Ok(536_870_912));
        assert_eq!(parse_size("512MiB"), Ok(512 * 1024 * 1024));
        assert_eq!(parse_size("2GiB"), Ok(2 * 1024 * 1024 * 1024));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("64 KiB"), Ok(65_536));
        assert_eq!(parse_size("10b"), Ok(10));
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("5M").unwrap_err().contains("unknown unit \"M\""));
        assert!(parse_size("1.5").unwrap_err().contains("whole"));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(format_size(900), "900 B");
        assert_eq!(format_size(512 * 1024 * 1024), "512.0 MiB");
        assert_eq!(format_size(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
    }

    #[test]
    fn size_fields_take_numbers_strings_and_null() {
        #[derive(serde::Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "deserialize_size")]
            size: u64,
        }
        let read = |json: &str| serde_json::from_str::<Holder>(json).map(|h| h.size);
        assert_eq!(read(r#"{"size": 1024}"#).unwrap(), 1024);
        assert_eq!(read(r#"{"size": "1KiB"}"#).unwrap(), 1024);
        assert_eq!(read(r#"{"size": null}"#).unwrap(), 0);
        assert!(
            read(r#"{"size": -1}"#)
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(read(r#"{"size": "9 parsecs"}"#).is_err());
    }
}
