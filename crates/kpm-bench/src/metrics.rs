//! kpm's Prometheus endpoint (`kpm run --metrics-addr`): one `GET /metrics`
//! and its series, through the tests' client and reader
//! (`kpm_test_support::{http, prometheus}`), so that the bench reads kpm's
//! metrics as the tests check them.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kpm_test_support::{http, prometheus};

use crate::Result;

/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The series of one scrape and their values.
#[derive(Debug, Default)]
pub(crate) struct Scrape {
    /// Series and value; only whole numbers are kept, which every figure
    /// read here is (counters and gauges of things).
    series: Vec<(String, u64)>,
}

impl Scrape {
    /// Reads the text format; an error on a malformed line.
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let samples = prometheus::parse(text)?;
        let series = samples
            .into_iter()
            .filter_map(|sample| Some((sample.series.to_owned(), sample.value.parse().ok()?)))
            .collect();
        Ok(Self { series })
    }

    /// The series of metric `name` that carry `label` (`key="value"`), if given.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        label: Option<&'a str>,
    ) -> impl Iterator<Item = u64> + 'a {
        self.series
            .iter()
            .filter(move |(series, _)| {
                let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
                metric == name && label.is_none_or(|label| labels.contains(label))
            })
            .map(|(_, value)| *value)
    }

    /// The sum of the matching series, `None` if there is none.
    pub(crate) fn sum(&self, name: &str, label: Option<&str>) -> Option<u64> {
        let mut values = self.matching(name, label).peekable();
        values.peek()?;
        Some(values.sum())
    }

    /// The number of matching series.
    pub(crate) fn count(&self, name: &str, label: Option<&str>) -> u64 {
        self.matching(name, label).map(|_| 1).sum()
    }
}

/// `GET http://addr/metrics`, on a blocking thread: the client is the
/// tests' synchronous one, bounded by the socket's timeouts.
pub(crate) async fn scrape(addr: SocketAddr) -> Result<Scrape> {
    let get = move || -> Result<Scrape> {
        let what = format!("GET http://{addr}/metrics");
        let mut stream = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)
            .map_err(|err| format!("connect to kpm's metrics on {addr}: {err}"))?;
        stream.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
        stream.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
        let answer = http::request(&mut stream, "GET", "/metrics", "")
            .map_err(|err| format!("{what}: {err}"))?;
        if !(200..300).contains(&answer.code) {
            return Err(format!("{what}: HTTP {}", answer.code).into());
        }
        Scrape::parse(&answer.body)
    };
    tokio::task::spawn_blocking(get).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_series_by_name_and_label() {
        let scrape = Scrape::parse(
            "# HELP kpm_operations Sockets\n\
             # TYPE kpm_operations gauge\n\
             kpm_operations 3\n\
             kpm_tokio_tasks 612\n\
             plugin_manager_total_plugins{socket_path=\"/r/a b.sock\",state=\"actual_state_of_world\"} 1\n\
             plugin_manager_total_plugins{socket_path=\"/r/b.sock\",state=\"actual_state_of_world\"} 1\n\
             plugin_manager_total_plugins{socket_path=\"/r/b.sock\",state=\"desired_state_of_world\"} 1\n\
             kpm_registrations_total{type=\"DevicePlugin\"} 40\n\
             kpm_registrations_total{type=\"CSIPlugin\"} 2\n\
             # EOF\n",
        )
        .unwrap();
        assert_eq!(scrape.sum("kpm_operations", None), Some(3));
        assert_eq!(scrape.sum("kpm_tokio_tasks", None), Some(612));
        assert_eq!(scrape.sum("kpm_registrations_total", None), Some(42));
        assert_eq!(scrape.sum("kpm_rejections_total", None), None);
        let actual = Some("state=\"actual_state_of_world\"");
        assert_eq!(scrape.count("plugin_manager_total_plugins", actual), 2);
        assert_eq!(scrape.count("plugin_manager_total_plugins", None), 3);
        assert_eq!(scrape.count("kpm_operations_total", None), 0);
    }
}
