//! The text every `GET /metrics` answers with: Prometheus's classic text format (0.0.4).
//!
//! The manager and the workers count with `prometheus-client`, which writes OpenMetrics: a
//! counter family is named without its `_total` (`# TYPE cube_placements counter`) while its
//! samples carry it (`cube_placements_total 3`). Read as the classic format, which every
//! scraper accepts and Prometheus's own linter (`promtool check metrics`) checks, such a
//! sample belongs to no documented family ("no help text"). [`classic_text`] names each
//! counter family as its samples are named, and drops what the classic format does not have.

/// The content type of [`classic_text`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (as `prometheus_client::encoding::text::encode` writes it) in the classic
/// Prometheus text format: the `# HELP` and `# TYPE` lines of a counter name it with its
/// `_total`, and the OpenMetrics-only lines (`# UNIT`, `# EOF`, a counter's `_created`) are
/// left out.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|line| {
            let (name, kind) = line.strip_prefix("# TYPE ")?.split_once(' ')?;
            (kind == "counter").then_some(name)
        })
        .collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let (name, rest) = line.strip_prefix(prefix)?.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {rest}"))
        });
        if let Some(described) = described {
            text.push_str(&described);
        } else if counters
            .iter()
            .any(|name| is_sample_of(line, name, "_created"))
        {
            continue;
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

/// Whether `line` is a sample of the series `name` + `suffix` (`x_created 1` or `x_created{..} 1`).
fn is_sample_of(line: &str, name: &str, suffix: &str) -> bool {
    line.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(suffix))
        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_described_by_the_name_their_samples_carry() {
        let openmetrics = "\
# HELP cube_tasks Tasks by state.
# TYPE cube_tasks gauge
cube_tasks{state=\"Running\"} 2
# HELP cube_placements Tasks placed on a node.
# TYPE cube_placements counter
cube_placements_total 3
cube_placements_created 1700000000.0
# HELP cube_http_requests HTTP requests answered.
# TYPE cube_http_requests counter
# UNIT cube_http_requests requests
cube_http_requests_total{route=\"/tasks\",method=\"GET\",status=\"200\"} 1
# HELP cube_commit_seconds How long a commit took.
# TYPE cube_commit_seconds histogram
cube_commit_seconds_sum 0.5
cube_commit_seconds_count 1
cube_commit_seconds_bucket{le=\"+Inf\"} 1
# EOF
";
        assert_eq!(
            classic_text(openmetrics),
            "\
# HELP cube_tasks Tasks by state.
# TYPE cube_tasks gauge
cube_tasks{state=\"Running\"} 2
# HELP cube_placements_total Tasks placed on a node.
# TYPE cube_placements_total counter
cube_placements_total 3
# HELP cube_http_requests_total HTTP requests answered.
# TYPE cube_http_requests_total counter
cube_http_requests_total{route=\"/tasks\",method=\"GET\",status=\"200\"} 1
# HELP cube_commit_seconds How long a commit took.
# TYPE cube_commit_seconds histogram
cube_commit_seconds_sum 0.5
cube_commit_seconds_count 1
cube_commit_seconds_bucket{le=\"+Inf\"} 1
"
        );
    }

    #[test]
    fn a_gauge_whose_name_starts_like_a_counter_is_left_alone() {
        let openmetrics = "\
# HELP a Counted.
# TYPE a counter
a_total 1
# HELP a_created_by A gauge.
# TYPE a_created_by gauge
a_created_by 2
# EOF
";
        let text = classic_text(openmetrics);
        assert!(text.contains("# HELP a_created_by A gauge.\n"), "{text}");
        assert!(text.contains("\na_created_by 2\n"), "{text}");
    }
}
