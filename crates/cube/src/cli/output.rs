//! How the commands print: padded tables like `docker ps`, `key: value` blocks, relative
//! times, JSON and YAML. Pure functions that return lines, so that tests read them without a
//! terminal; the commands print what they return.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Spaces between two columns, as `docker ps` separates them.
const COLUMN_GAP: &str = "   ";

/// Rows of cells as lines: every column is as wide as its widest cell (as a terminal shows
/// it: see [`display_width`]), cells are left-aligned and columns are separated by three
/// spaces. The last column is not padded, so no line ends in spaces. The first row is usually
/// the header.
pub fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(display_width(cell));
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate() {
                if index > 0 {
                    line.push_str(COLUMN_GAP);
                }
                line.push_str(cell);
                let padding = widths[index].saturating_sub(display_width(cell));
                line.extend(std::iter::repeat_n(' ', padding));
            }
            line.truncate(line.trim_end().len());
            line
        })
        .collect()
}

/// How many columns a terminal gives `text`: two for a wide character (CJK ideographs,
/// Hangul, fullwidth forms, emoji shown as pictures), none for a combining mark, a zero-width
/// character, a variation selector or a control character, one for the rest. A name with an
/// emoji (`🚀web`) would otherwise push every later column of its row one place right.
pub fn display_width(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

fn char_width(c: char) -> usize {
    let code = u32::from(c);
    // Ranges from Unicode's East Asian Width (W and F) and its zero-width classes, the
    // blocks a name or a message may hold; what is not listed counts as one.
    const ZERO: &[(u32, u32)] = &[
        (0x0000, 0x001F),
        (0x007F, 0x009F),
        (0x0300, 0x036F),
        (0x200B, 0x200F),
        (0x2028, 0x202E),
        (0x2060, 0x2064),
        (0x20D0, 0x20FF),
        (0xFE00, 0xFE0F),
        (0xFE20, 0xFE2F),
        (0xFEFF, 0xFEFF),
        (0x1F3FB, 0x1F3FF),
        (0xE0000, 0xE01EF),
    ];
    const WIDE: &[(u32, u32)] = &[
        (0x1100, 0x115F),
        (0x231A, 0x231B),
        (0x2329, 0x232A),
        (0x23E9, 0x23EC),
        (0x23F0, 0x23F0),
        (0x23F3, 0x23F3),
        (0x25FD, 0x25FE),
        (0x2614, 0x2615),
        (0x2648, 0x2653),
        (0x267F, 0x267F),
        (0x2693, 0x2693),
        (0x26A1, 0x26A1),
        (0x26AA, 0x26AB),
        (0x26BD, 0x26BE),
        (0x26C4, 0x26C5),
        (0x26CE, 0x26CE),
        (0x26D4, 0x26D4),
        (0x26EA, 0x26EA),
        (0x26F2, 0x26F3),
        (0x26F5, 0x26F5),
        (0x26FA, 0x26FA),
        (0x26FD, 0x26FD),
        (0x2705, 0x2705),
        (0x270A, 0x270B),
        (0x2728, 0x2728),
        (0x274C, 0x274C),
        (0x274E, 0x274E),
        (0x2753, 0x2755),
        (0x2757, 0x2757),
        (0x2795, 0x2797),
        (0x27B0, 0x27B0),
        (0x27BF, 0x27BF),
        (0x2B1B, 0x2B1C),
        (0x2B50, 0x2B50),
        (0x2B55, 0x2B55),
        (0x2E80, 0x303E),
        (0x3041, 0x33FF),
        (0x3400, 0x4DBF),
        (0x4E00, 0x9FFF),
        (0xA000, 0xA4CF),
        (0xA960, 0xA97F),
        (0xAC00, 0xD7A3),
        (0xF900, 0xFAFF),
        (0xFE10, 0xFE19),
        (0xFE30, 0xFE6F),
        (0xFF00, 0xFF60),
        (0xFFE0, 0xFFE6),
        (0x16FE0, 0x18AFF),
        (0x1B000, 0x1B2FF),
        (0x1F004, 0x1F004),
        (0x1F0CF, 0x1F0CF),
        (0x1F18E, 0x1F18E),
        (0x1F191, 0x1F19A),
        (0x1F200, 0x1F251),
        (0x1F300, 0x1F64F),
        (0x1F680, 0x1F6FF),
        (0x1F7E0, 0x1F7EB),
        (0x1F90C, 0x1F9FF),
        (0x1FA70, 0x1FAFF),
        (0x20000, 0x2FFFD),
        (0x30000, 0x3FFFD),
    ];
    let within = |ranges: &[(u32, u32)]| {
        ranges
            .binary_search_by(|&(low, high)| {
                if high < code {
                    std::cmp::Ordering::Less
                } else if low > code {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    };
    if within(ZERO) {
        0
    } else if within(WIDE) {
        2
    } else {
        1
    }
}

/// `key: value` lines with the values aligned; an empty value reads `-`. A value of several
/// lines has its later lines indented under the first.
pub fn key_values(pairs: &[(&str, String)]) -> Vec<String> {
    let width = pairs
        .iter()
        .map(|(key, _)| key.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut lines = Vec::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        let value = if value.trim().is_empty() { "-" } else { value };
        let mut value_lines = value.lines();
        let first = value_lines.next().unwrap_or("-");
        lines.push(format!("{label:<width$} {first}"));
        for rest in value_lines {
            lines.push(format!("{:<width$} {rest}", ""));
        }
    }
    lines
}

/// How long ago `then` was, as `docker ps` says it: "5 seconds ago", "3 minutes ago",
/// "2 hours ago", "4 days ago"; `-` when the time is unknown. A time in the future (clocks
/// that disagree) reads as just now.
pub fn time_ago(then: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(then) = then else {
        return "-".to_string();
    };
    let seconds = (now - then).num_seconds().max(0);
    let (count, unit) = match seconds {
        0 => return "Less than a second ago".to_string(),
        1..60 => (seconds, "second"),
        60..3_600 => (seconds / 60, "minute"),
        // Up to two days in hours, as Docker does: "36 hours ago" is clearer than "1 day".
        3_600..172_800 => (seconds / 3_600, "hour"),
        172_800..1_209_600 => (seconds / 86_400, "day"),
        1_209_600..5_184_000 => (seconds / 604_800, "week"),
        5_184_000..63_072_000 => (seconds / 2_592_000, "month"),
        _ => (seconds / 31_536_000, "year"),
    };
    let plural = if count == 1 { "" } else { "s" };
    format!("{count} {unit}{plural} ago")
}

/// A time for a details block: RFC 3339 and how long ago, or `-` when unknown.
pub fn time_with_age(time: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match time {
        Some(time) => format!(
            "{} ({})",
            time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            time_ago(Some(time), now)
        ),
        None => "-".to_string(),
    }
}

/// How long until `then`, for what is due: "in 6s", "in 2m5s", "in 1h3m"; "now" once it is
/// due. Seconds are rounded up, so that a wait of 5.2 s never reads as 5 s.
pub fn time_until(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let millis = (then - now).num_milliseconds();
    if millis <= 0 {
        return "now".to_string();
    }
    let seconds = (millis + 999) / 1000;
    match seconds {
        0..60 => format!("in {seconds}s"),
        60..3_600 => format!("in {}m{}s", seconds / 60, seconds % 60),
        _ => format!("in {}h{}m", seconds / 3_600, seconds % 3_600 / 60),
    }
}

/// CPU cores without noise: `2`, `0.5`, `1.25` (two decimals at most).
pub fn format_cores(cores: f64) -> String {
    let rounded = (cores * 100.0).round() / 100.0;
    if rounded == 0.0 {
        return "0".to_string();
    }
    let text = format!("{rounded:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Prints a value as pretty JSON on stdout, the only thing `-o json` prints there.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}

/// Prints a value as YAML on stdout: the same objects `-o json` prints.
pub fn print_yaml<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_norway::to_string(value)?;
    print!("{text}");
    Ok(())
}

/// Prints lines on stdout.
pub fn print_lines(lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|cell| cell.to_string()).collect()
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_three_spaces_apart() {
        let lines = table(&[
            row(&["ID", "NAME", "STATE"]),
            row(&["3f2a9c1e", "web", "Running"]),
            row(&["bb1d59ef", "a-long-name", "Pending"]),
        ]);
        assert_eq!(
            lines,
            vec![
                "ID         NAME          STATE",
                "3f2a9c1e   web           Running",
                "bb1d59ef   a-long-name   Pending",
            ]
        );
    }

    #[test]
    fn empty_last_cells_leave_no_trailing_spaces() {
        let lines = table(&[row(&["NAME", "PORTS"]), row(&["web", ""])]);
        assert_eq!(lines, vec!["NAME   PORTS", "web"]);
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let lines = table(&[row(&["é", "x"]), row(&["ab", "y"])]);
        assert_eq!(lines, vec!["é    x", "ab   y"]);
    }

    #[test]
    fn wide_characters_take_two_columns_and_combining_marks_none() {
        let lines = table(&[
            row(&["NAME", "STATE"]),
            row(&["🚀web", "Running"]),
            row(&["日本", "Pending"]),
            row(&["cafe\u{301}", "Failed"]),
            row(&["plain", "Completed"]),
        ]);
        // The second column starts at the same terminal column on every line.
        let starts: Vec<usize> = lines
            .iter()
            .map(|line| {
                let second = line.rfind(' ').unwrap() + 1;
                display_width(&line[..second])
            })
            .collect();
        assert_eq!(starts, vec![8; 5], "{lines:#?}");
        assert_eq!(lines[1], "🚀web   Running");
        assert_eq!(lines[2], "日本    Pending");
        assert_eq!(lines[3], "cafe\u{301}    Failed");
        assert_eq!(display_width("🚀web"), 5);
        assert_eq!(display_width("日本"), 4);
        assert_eq!(display_width("é"), 1);
    }

    #[test]
    fn a_table_without_rows_has_no_lines() {
        assert!(table(&[]).is_empty());
    }

    #[test]
    fn key_values_align_values_and_show_empty_ones_as_a_dash() {
        let lines = key_values(&[
            ("ID", "3f2a".to_string()),
            ("ExitCode", String::new()),
            ("Error", "one\ntwo".to_string()),
        ]);
        assert_eq!(
            lines,
            vec![
                "ID:       3f2a",
                "ExitCode: -",
                "Error:    one",
                "          two"
            ]
        );
    }

    #[test]
    fn times_read_as_docker_says_them() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let ago = |seconds: i64| time_ago(Some(now - chrono::Duration::seconds(seconds)), now);
        assert_eq!(ago(0), "Less than a second ago");
        assert_eq!(ago(1), "1 second ago");
        assert_eq!(ago(5), "5 seconds ago");
        assert_eq!(ago(60), "1 minute ago");
        assert_eq!(ago(3 * 60 + 59), "3 minutes ago");
        assert_eq!(ago(2 * 3_600), "2 hours ago");
        assert_eq!(ago(47 * 3_600), "47 hours ago");
        assert_eq!(ago(3 * 86_400), "3 days ago");
        assert_eq!(ago(21 * 86_400), "3 weeks ago");
        assert_eq!(ago(90 * 86_400), "3 months ago");
        assert_eq!(ago(800 * 86_400), "2 years ago");
    }

    #[test]
    fn an_unknown_time_is_a_dash_and_a_future_one_is_now() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        assert_eq!(time_ago(None, now), "-");
        assert_eq!(
            time_ago(Some(now + chrono::Duration::seconds(30)), now),
            "Less than a second ago"
        );
        assert_eq!(time_with_age(None, now), "-");
        assert_eq!(
            time_with_age(Some(now - chrono::Duration::seconds(90)), now),
            "2024-05-01T11:58:30Z (1 minute ago)"
        );
    }

    #[test]
    fn a_time_to_come_reads_as_how_long_until_it() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let after = |millis: i64| time_until(now + chrono::Duration::milliseconds(millis), now);
        assert_eq!(after(5_200), "in 6s");
        assert_eq!(after(6_000), "in 6s");
        assert_eq!(after(125_000), "in 2m5s");
        assert_eq!(after(3_780_000), "in 1h3m");
        assert_eq!(after(0), "now");
        assert_eq!(after(-3_000), "now");
    }

    #[test]
    fn cores_are_written_without_trailing_zeros() {
        assert_eq!(format_cores(2.0), "2");
        assert_eq!(format_cores(0.5), "0.5");
        assert_eq!(format_cores(0.1 + 0.2), "0.3");
        assert_eq!(format_cores(1.25), "1.25");
        assert_eq!(format_cores(0.0), "0");
    }
}
