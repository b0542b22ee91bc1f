//! The one reader of kpm's Prometheus endpoint, for the tests and the load
//! generator: the text format (`OpenMetrics` as `prometheus-client` writes
//! it) checked line by line and read as `series value` samples.
//!
//! Not a crate: the ones on crates.io (`prometheus-parse`) skip the lines
//! they cannot read, where the tests want a malformed line to fail, and
//! re-key the labels, where the tests name a series as kpm writes it.

use std::collections::HashMap;

/// One sample line, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample<'a> {
    /// The metric's name.
    pub name: &'a str,
    /// The series: the name and its labels, `name{key="value",…}`.
    pub series: &'a str,
    /// The value, a number (Go's float syntax, `+Inf` and `NaN` too).
    pub value: &'a str,
}

/// The samples of `text`, in order; an error naming the first line that
/// is no comment of the format (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) and
/// no sample with a valid name, closed labels and a number.
pub fn parse(text: &str) -> Result<Vec<Sample<'_>>, String> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split_whitespace().next().unwrap_or_default();
            if !["HELP", "TYPE", "UNIT", "EOF"].contains(&kind) {
                return Err(format!("bad comment: {line}"));
            }
            continue;
        }
        // Label values may hold spaces; the value is after the last one.
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| format!("no value: {line}"))?;
        let name = &series[..series.find('{').unwrap_or(series.len())];
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(format!("bad metric name: {line}"));
        }
        if name.len() < series.len() && !series.ends_with('}') {
            return Err(format!("unterminated labels: {line}"));
        }
        if value.parse::<f64>().is_err() {
            return Err(format!("bad value: {line}"));
        }
        samples.push(Sample { name, series, value });
    }
    Ok(samples)
}

/// `series -> value` of `text`, for a test. Panics on a malformed line.
pub fn values(text: &str) -> HashMap<String, f64> {
    let samples = parse(text).unwrap_or_else(|err| panic!("{err}\nin:\n{text}"));
    samples
        .into_iter()
        .map(|sample| (sample.series.to_owned(), sample.value.parse().unwrap_or(f64::NAN)))
        .collect()
}

/// `series -> value` of `GET /metrics` on the TCP address `addr`, for a
/// test. Panics on an error or a malformed line.
pub fn scrape(addr: &str) -> HashMap<String, f64> {
    values(&crate::http::get(addr, "/metrics"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_with_labels_holding_spaces() {
        let text = "# HELP kpm_operations Sockets\n\
                    # TYPE kpm_operations gauge\n\
                    kpm_operations 3\n\
                    plugin_manager_total_plugins{socket_path=\"/r/a b.sock\"} 1\n\
                    kpm_seconds_bucket{le=\"+Inf\"} 2.5\n\
                    # EOF\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(
            samples[1],
            Sample {
                name: "plugin_manager_total_plugins",
                series: "plugin_manager_total_plugins{socket_path=\"/r/a b.sock\"}",
                value: "1",
            }
        );
        assert_eq!(values(text).get("kpm_seconds_bucket{le=\"+Inf\"}"), Some(&2.5));
    }

    #[test]
    fn a_malformed_line_is_an_error() {
        for line in ["# NOTE x", "kpm-x 1", "kpm_x{a=\"b\" 1", "kpm_x one", "kpm_x"] {
            assert!(parse(line).is_err(), "{line}");
        }
    }
}
