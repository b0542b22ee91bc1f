//! `kpm watch`: the events of a running `kpm run`, as they happen.

use std::io::Write;
use std::path::Path;

use kpm_status::{Client, Event, EventLine};

use crate::error::CliError;
use crate::output::OutputFormat;

pub(crate) async fn watch(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let mut events = Client::new(status_socket).events().await?;
    while let Some(line) = events.next_line().await? {
        let shown = match (output, serde_json::from_str::<EventLine>(&line)) {
            (OutputFormat::Table, Ok(event)) => text_line(&event).unwrap_or(line),
            _ => line,
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{shown}").and_then(|()| stdout.flush()).map_err(CliError::Output)?;
    }
    Ok(())
}

/// `TIME EVENT TYPE NAME SOCKET [reason | retry in]`, skipping what the
/// event lacks; `TIME device_health DRIVER POOL/DEVICE [PREVIOUS -> ]HEALTH
/// [(expired) | MESSAGE]` for a DRA device's health; none for a line that
/// is not a timed event this version knows (`lagged`), shown as it came.
pub(crate) fn text_line(line: &EventLine) -> Option<String> {
    let time = humantime::format_rfc3339_millis(line.time?.0).to_string();
    let (kind, fields): (&str, Vec<&str>) = match &line.event {
        Event::Subscribed => ("subscribed", Vec::new()),
        Event::Seen { socket, .. } => ("seen", vec![socket]),
        Event::Registered { socket, plugin_type, name, .. } => {
            ("registered", vec![plugin_type, name, socket])
        }
        Event::Rejected { socket, reason, .. } => ("rejected", vec![socket, reason]),
        Event::Deregistered { socket, plugin_type, name, .. } => {
            ("deregistered", vec![plugin_type, name, socket])
        }
        Event::Unresponsive { socket, plugin_type, name, reason, .. } => {
            ("unresponsive", vec![plugin_type, name, socket, reason])
        }
        Event::RetryScheduled { socket, retry_in_ms } => {
            let retry = format!("retry in {retry_in_ms} ms");
            return Some(format!("{time} retry_scheduled {socket} {retry}"));
        }
        Event::DeviceHealth { driver, pool, device, health, previous, expired, message } => {
            let health = match previous {
                Some(previous) => format!("{previous} -> {health}"),
                None => health.clone(),
            };
            let why = if *expired { "(expired)" } else { message };
            let device = format!("{pool}/{device}");
            let fields = [time.as_str(), "device_health", driver, &device, &health, why];
            return Some(join(&fields));
        }
        _ => return None,
    };
    Some(join(&[&[time.as_str(), kind][..], &fields].concat()))
}

/// The fields that are not empty, a space apart.
fn join(fields: &[&str]) -> String {
    fields.iter().filter(|field| !field.is_empty()).copied().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `kpm watch` prints of `line`, as the status API sends it.
    fn text(line: &str) -> String {
        serde_json::from_str::<EventLine>(line)
            .ok()
            .and_then(|event| text_line(&event))
            .unwrap_or(line.to_owned())
    }

    #[test]
    fn text_lines_show_what_each_event_has() {
        let registered = r#"{"time":"2026-11-21T12:00:00.000Z","event":"registered","socket":"/r/a.sock","generation":1,"type":"DevicePlugin","name":"gpu","endpoint":"/r/a.sock"}"#;
        assert_eq!(
            text(registered),
            "2026-11-21T12:00:00.000Z registered DevicePlugin gpu /r/a.sock"
        );
        let rejected = r#"{"time":"2026-11-21T12:00:00.000Z","event":"rejected","socket":"/r/b.sock","generation":2,"reason":"no handler"}"#;
        assert_eq!(text(rejected), "2026-11-21T12:00:00.000Z rejected /r/b.sock no handler");
        let retry = r#"{"time":"2026-11-21T12:00:00.000Z","event":"retry_scheduled","socket":"/r/b.sock","retry_in_ms":500}"#;
        assert_eq!(
            text(retry),
            "2026-11-21T12:00:00.000Z retry_scheduled /r/b.sock retry in 500 ms"
        );
        assert_eq!(
            text(r#"{"time":"2026-11-21T12:00:00.000Z","event":"subscribed"}"#),
            "2026-11-21T12:00:00.000Z subscribed"
        );
        let expired = r#"{"time":"2026-11-21T12:00:00.000Z","event":"device_health","driver":"gpu.example.com","pool":"pool","device":"gpu-0","health":"Unknown","previous":"Healthy","expired":true,"message":""}"#;
        assert_eq!(
            text(expired),
            "2026-11-21T12:00:00.000Z device_health gpu.example.com pool/gpu-0 Healthy -> Unknown (expired)"
        );
        let reported = r#"{"time":"2026-11-21T12:00:00.000Z","event":"device_health","driver":"gpu.example.com","pool":"pool","device":"gpu-0","health":"Unhealthy","previous":null,"expired":false,"message":"fan failed"}"#;
        assert_eq!(
            text(reported),
            "2026-11-21T12:00:00.000Z device_health gpu.example.com pool/gpu-0 Unhealthy fan failed"
        );
        assert_eq!(text(r#"{"event":"lagged","missed":3}"#), r#"{"event":"lagged","missed":3}"#);
        // An event a newer kpm run sends is shown as it came.
        let newer = r#"{"time":"2026-11-21T12:00:00.000Z","event":"renamed","socket":"/r/c.sock"}"#;
        assert_eq!(text(newer), newer);
    }
}
