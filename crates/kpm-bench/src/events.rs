//! A client of kpm's event stream (`GET /v1/events` on the status socket,
//! JSON lines), timestamping each event as it arrives.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use crate::Result;

/// One line of the stream.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// `seen`, `registered`, `rejected`, `deregistered`, `retry_scheduled`
    /// or `lagged` (the stream dropped events).
    pub(crate) kind: String,
    pub(crate) socket: String,
    /// When the line arrived here.
    pub(crate) at: Instant,
}

/// Subscribes to the event stream of the status API at `socket`; returns once
/// kpm confirmed the subscription (its `subscribed` line), so that nothing
/// that happens afterwards is missed.
pub(crate) async fn subscribe(socket: &Path) -> Result<mpsc::UnboundedReceiver<Event>> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|err| format!("connect to the status API {}: {err}", socket.display()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/v1/events")
        .header(hyper::header::HOST, "kpm")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    if !response.status().is_success() {
        return Err(format!("GET /v1/events: HTTP {}", response.status()).into());
    }
    let mut body = response.into_body();
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut pending = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else { continue };
            let at = Instant::now();
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let Ok(value) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
                if tx.send(Event { kind: text("event"), socket: text("socket"), at }).is_err() {
                    return;
                }
            }
        }
    });
    loop {
        match rx.recv().await {
            Some(event) if event.kind == "subscribed" => return Ok(rx),
            Some(_) => {}
            None => return Err("the event stream ended before `subscribed`".into()),
        }
    }
}

/// What [`deregistrations`] saw.
pub(crate) struct Deregistrations {
    /// From each socket's instant to its `deregistered` event.
    pub(crate) latencies: Vec<Duration>,
    /// The sockets whose event never came, sorted.
    pub(crate) missing: Vec<String>,
    /// How often the stream lagged.
    pub(crate) lagged: usize,
}

impl Deregistrations {
    /// `report` with the fields every deregistration scenario adds:
    /// latencies, missing sockets, lags.
    pub(crate) fn added_to(self, mut report: serde_json::Value) -> serde_json::Value {
        if let Some(fields) = report.as_object_mut() {
            fields.insert("latency_ms".into(), crate::stats::summary(self.latencies));
            fields.insert("missing_count".into(), self.missing.len().into());
            fields.insert("missing".into(), crate::stats::listed(&self.missing).into());
            fields.insert("lagged".into(), self.lagged.into());
        }
        report
    }
}

/// Waits for the `deregistered` event of every socket in `since`, at most
/// `timeout`.
pub(crate) async fn deregistrations(
    events: &mut mpsc::UnboundedReceiver<Event>,
    mut since: HashMap<String, Instant>,
    timeout: Duration,
) -> Deregistrations {
    let mut latencies = Vec::with_capacity(since.len());
    let mut lagged = 0;
    let deadline = tokio::time::Instant::now() + timeout;
    while !since.is_empty() {
        let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.recv()).await else {
            break;
        };
        match event.kind.as_str() {
            "deregistered" => {
                if let Some(at) = since.remove(&event.socket) {
                    latencies.push(event.at.duration_since(at));
                }
            }
            "lagged" => lagged += 1,
            _ => {}
        }
    }
    let mut missing: Vec<String> = since.into_keys().collect();
    missing.sort();
    Deregistrations { latencies, missing, lagged }
}
