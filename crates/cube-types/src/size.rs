//! Sizes as people write them: plain bytes (`536870912`) or a number and a unit (`512MiB`,
//! `2Gi`, `512m`, `1.5GB`). Docker and Kubernetes disagree on what a single letter means, so
//! Cube reads each spelling as the tool that uses it does:
//!
//! | written | means | as in |
//! |---|---|---|
//! | `B`, `b`, or no unit | bytes | |
//! | `b` `k` `m` `g` `t` `p` (lowercase letter) | powers of 1024 | Docker: `docker run -m 512m` |
//! | `Ki` `Mi` `Gi` `Ti` `Pi` | powers of 1024 | Kubernetes: `memory: 512Mi` |
//! | `K` `M` `G` `T` `P` (uppercase letter) | powers of 1000 | Kubernetes: `memory: 512M` |
//! | `KiB` `MiB` `GiB` `TiB` `PiB` | powers of 1024 | IEC |
//! | `KB` `MB` `GB` `TB` `PB` | powers of 1000 | SI |
//!
//! Only the single letters are case-sensitive (`mib`, `MiB` and `MIB` all mean 2^20; `mb` and
//! `MB` both 10^6). Kubernetes' lowercase `m` means *milli*, which no one means of bytes, so
//! `512m` is Docker's 512 MiB; and `512M` is Kubernetes' 512 x 10^6 bytes, about 5% less than
//! Docker's reading of the same text. Sizes are bytes in a `u64`; how large a task or node may
//! declare is checked by validation (`node::MAX_MEMORY_BYTES`, `node::MAX_DISK_BYTES`).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

/// 2^64 as a float: the first value a `u64` cannot hold (`u64::MAX as f64` rounds up to it).
const U64_LIMIT: f64 = 18_446_744_073_709_551_616.0;

const ACCEPTED_UNITS: &str = "use bytes, Docker's b, k, m, g, t (powers of 1024), \
     Kubernetes' Ki, Mi, Gi, Ti (powers of 1024) or K, M, G, T (powers of 1000), \
     or KiB, MiB, GiB, TiB (1024) and KB, MB, GB, TB (1000)";

/// Parses a size into bytes, with the units in the module's table.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let value: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: expected bytes or a number and a unit, e.g. \"512MiB\", \"512Mi\", \"512m\", \"2GiB\"")
    })?;
    let multiplier = unit_multiplier(unit)
        .ok_or_else(|| format!("{text:?} has an unknown unit {unit:?}: {ACCEPTED_UNITS}"))?;
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes >= U64_LIMIT {
        return Err(format!(
            "{text:?} is too large: more bytes than a size can hold"
        ));
    }
    if unit.is_empty() && number.contains('.') {
        return Err(format!("{text:?}: a number of bytes must be whole"));
    }
    Ok(bytes.round() as u64)
}

/// Bytes per unit, after the module's table; `None` for a unit Cube does not know.
fn unit_multiplier(unit: &str) -> Option<f64> {
    const POWERS: [char; 5] = ['k', 'm', 'g', 't', 'p'];
    let power_of = |letter: char| {
        POWERS
            .iter()
            .position(|known| *known == letter.to_ascii_lowercase())
            .map(|index| index as i32 + 1)
    };
    let mut chars = unit.chars();
    match (chars.next(), chars.next(), chars.next(), chars.next()) {
        (None, ..) => Some(1.0),
        (Some('b' | 'B'), None, ..) => Some(1.0),
        // One letter: lowercase is Docker's (binary), uppercase Kubernetes' (decimal).
        (Some(letter), None, ..) => {
            let power = power_of(letter)?;
            Some(if letter.is_ascii_lowercase() {
                1024f64.powi(power)
            } else {
                1000f64.powi(power)
            })
        }
        // `Ki`, `Mi`, ...: Kubernetes' binary units; `KB`, `MB`, ...: decimal.
        (Some(letter), Some('i' | 'I'), None, ..) => Some(1024f64.powi(power_of(letter)?)),
        (Some(letter), Some('b' | 'B'), None, ..) => Some(1000f64.powi(power_of(letter)?)),
        // `KiB`, `MiB`, ...: binary.
        (Some(letter), Some('i' | 'I'), Some('b' | 'B'), None) => {
            Some(1024f64.powi(power_of(letter)?))
        }
        _ => None,
    }
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
            // serde_json reads an integer too large for a u64 as a float: refuse it rather
            // than let `as` saturate it to 2^64 - 1.
            if value >= U64_LIMIT {
                Err(E::custom(format!(
                    "{value} is too large: more bytes than a size can hold"
                )))
            } else if value.is_finite() && value >= 0.0 && value.fract() == 0.0 {
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

    const MIB: u64 = 1024 * 1024;

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
        assert!(parse_size("5X").unwrap_err().contains("unknown unit \"X\""));
        assert!(parse_size("5Mx").unwrap_err().contains("unknown unit"));
        assert!(parse_size("5Bi").unwrap_err().contains("unknown unit"));
        assert!(parse_size("1.5").unwrap_err().contains("whole"));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn dockers_lowercase_letters_are_powers_of_1024() {
        assert_eq!(parse_size("1b"), Ok(1));
        assert_eq!(parse_size("100k"), Ok(100 * 1024));
        assert_eq!(parse_size("512m"), Ok(512 * MIB));
        assert_eq!(parse_size("1g"), Ok(1024 * MIB));
        assert_eq!(parse_size("1t"), Ok(1024 * 1024 * MIB));
    }

    #[test]
    fn kubernetes_binary_units_are_powers_of_1024() {
        assert_eq!(parse_size("1Ki"), Ok(1024));
        assert_eq!(parse_size("512Mi"), Ok(512 * MIB));
        assert_eq!(parse_size("2Gi"), Ok(2048 * MIB));
        assert_eq!(parse_size("1Ti"), Ok(1024 * 1024 * MIB));
    }

    #[test]
    fn kubernetes_uppercase_letters_are_powers_of_1000() {
        assert_eq!(parse_size("512M"), Ok(512_000_000));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("2K"), Ok(2000));
        assert_eq!(parse_size("1T"), Ok(1_000_000_000_000));
    }

    #[test]
    fn spelled_out_units_keep_their_meaning_in_any_case() {
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("512mb"), Ok(512_000_000));
        assert_eq!(parse_size("512MIB"), Ok(512 * MIB));
        assert_eq!(parse_size("1.5GiB"), Ok(1536 * MIB));
    }

    #[test]
    fn a_size_beyond_what_a_u64_holds_is_refused_not_saturated() {
        assert!(
            parse_size("99999999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_size("20000000t").unwrap_err().contains("too large"));
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
        assert_eq!(read(r#"{"size": 5e9}"#).unwrap(), 5_000_000_000);
        let err = read(r#"{"size": 99999999999999999999999}"#).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }
}
