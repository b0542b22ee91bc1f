//! `kpm watch`: the events of a running `kpm run`, as they happen.

use std::io::Write;
use std::path::Path;

use http_body_util::BodyExt;

use serde_json::Value;

use crate::status_api;
use crate::{CliError, OutputFormat};

pub(crate) async fn watch(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let mut body =
        status_api::client::request(status_socket, status_api::EVENTS_PATH).await?.into_body();
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|err| CliError::QueryStatus {
            path: status_socket.to_path_buf(),
            message: err.to_string(),
        })?;
        let Ok(data) = frame.into_data() else { continue };
        pending.extend_from_slice(&data);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            let shown = match output {
                OutputFormat::Json => line,
                OutputFormat::Table => text_line(&line),
            };
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{shown}").and_then(|()| stdout.flush()).map_err(CliError::Output)?;
        }
    }
    Ok(())
}

/// `TIME EVENT TYPE NAME SOCKET [reason | retry in]`, skipping what the
/// event lacks; `TIME device_health DRIVER POOL/DEVICE [PREVIOUS -> ]HEALTH
/// [(expired) | MESSAGE]` for a DRA device's health; a line that is not a
/// timed event (`lagged`) as it is.
pub(crate) fn text_line(line: &str) -> String {
    let event = serde_json::from_str::<Value>(line).unwrap_or_default();
    let field = |key: &str| event[key].as_str();
    let (Some(time), Some(kind)) = (field("time"), field("event")) else {
        return line.to_owned();
    };
    if kind == "device_health" {
        let text = |key: &str| field(key).unwrap_or_default();
        let health = match field("previous") {
            Some(previous) => format!("{previous} -> {}", text("health")),
            None => text("health").to_owned(),
        };
        let why = if event["expired"] == true { "(expired)" } else { text("message") };
        let device = format!("{}/{}", text("pool"), text("device"));
        let fields = [time, kind, text("driver"), &device, &health, why];
        return fields.into_iter().filter(|field| !field.is_empty()).collect::<Vec<_>>().join(" ");
    }
    let retry = event["retry_in_ms"].as_u64().map(|ms| format!("retry in {ms} ms"));
    [Some(time), Some(kind), field("type"), field("name"), field("socket")]
        .into_iter()
        .flatten()
        .map(str::to_owned)
        .chain(field("reason").map(str::to_owned).or(retry))
        .filter(|field| !field.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_show_what_each_event_has() {
        let registered = r#"{"time":"T","event":"registered","socket":"/r/a.sock","generation":1,"type":"DevicePlugin","name":"gpu","endpoint":"/r/a.sock"}"#;
        assert_eq!(text_line(registered), "T registered DevicePlugin gpu /r/a.sock");
        let rejected = r#"{"time":"T","event":"rejected","socket":"/r/b.sock","generation":2,"reason":"no handler"}"#;
        assert_eq!(text_line(rejected), "T rejected /r/b.sock no handler");
        let retry =
            r#"{"time":"T","event":"retry_scheduled","socket":"/r/b.sock","retry_in_ms":500}"#;
        assert_eq!(text_line(retry), "T retry_scheduled /r/b.sock retry in 500 ms");
        assert_eq!(text_line(r#"{"time":"T","event":"subscribed"}"#), "T subscribed");
        let expired = r#"{"time":"T","event":"device_health","driver":"gpu.example.com","pool":"pool","device":"gpu-0","health":"Unknown","previous":"Healthy","expired":true,"message":""}"#;
        assert_eq!(
            text_line(expired),
            "T device_health gpu.example.com pool/gpu-0 Healthy -> Unknown (expired)"
        );
        let reported = r#"{"time":"T","event":"device_health","driver":"gpu.example.com","pool":"pool","device":"gpu-0","health":"Unhealthy","previous":null,"expired":false,"message":"fan failed"}"#;
        assert_eq!(
            text_line(reported),
            "T device_health gpu.example.com pool/gpu-0 Unhealthy fan failed"
        );
        assert_eq!(
            text_line(r#"{"event":"lagged","missed":3}"#),
            r#"{"event":"lagged","missed":3}"#
        );
    }
}
