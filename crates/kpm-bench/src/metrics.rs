//! kpm's Prometheus endpoint (`kpm run --metrics-addr`): one `GET /metrics`
//! over HTTP/1.1, and a minimal reading of the text format (`series value`
//! lines, where a series is `name` or `name{labels}`).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

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
    /// Reads the text format; comments and lines without a whole number are skipped.
    pub(crate) fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            // Label values may hold spaces; the value is after the last one.
            .filter_map(|line| line.rsplit_once(' '))
            .filter_map(|(series, value)| Some((series.to_owned(), value.parse().ok()?)))
            .collect();
        Self { series }
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

/// `GET http://addr/metrics`.
pub(crate) async fn scrape(addr: SocketAddr) -> Result<Scrape> {
    let get = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|err| format!("connect to kpm's metrics on {addr}: {err}"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::get("/metrics")
            .header(hyper::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        if !response.status().is_success() {
            return Err(format!("GET /metrics: HTTP {}", response.status()).into());
        }
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, crate::Error>(Scrape::parse(&String::from_utf8_lossy(&body)))
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, get)
        .await
        .map_err(|_| format!("GET http://{addr}/metrics: no answer within {SCRAPE_TIMEOUT:?}"))?
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
        );
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
