//! Reads the status API of a running `kpm run`, typed.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;

use crate::{EVENTS_PATH, PLUGINS_PATH, PluginList, StatusError};

/// A client of the status API on one socket; each call is one connection.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client of the status API served on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self { socket: socket.into() }
    }

    /// The socket it reads.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/plugins`: the plugins and what kpm run published.
    pub async fn plugins(&self) -> Result<PluginList, StatusError> {
        let body = self.get(PLUGINS_PATH).await?.collect().await.map_err(|err| self.query(err))?;
        serde_json::from_slice(&body.to_bytes())
            .map_err(|err| self.query(format!("unexpected response: {err}")))
    }

    /// `GET /v1/events`: the event stream, from a `subscribed` line on.
    pub async fn events(&self) -> Result<Events, StatusError> {
        let body = self.get(EVENTS_PATH).await?;
        Ok(Events { client: self.clone(), body, pending: Vec::new() })
    }

    /// Sends `GET path`; returns the body once the status is a success.
    async fn get(&self, path: &str) -> Result<Incoming, StatusError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| StatusError::Connect { path: self.socket.clone(), source })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| self.query(err))?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, "kpm")
            .body(Empty::<Bytes>::new())
            .map_err(|err| self.query(err))?;
        let response = sender.send_request(request).await.map_err(|err| self.query(err))?;
        if !response.status().is_success() {
            return Err(self.query(format!("GET {path}: HTTP {}", response.status())));
        }
        Ok(response.into_body())
    }

    fn query(&self, message: impl std::fmt::Display) -> StatusError {
        StatusError::Query { path: self.socket.clone(), message: format!("{message}") }
    }
}

/// The lines of `GET /v1/events`, as they come.
#[derive(Debug)]
pub struct Events {
    client: Client,
    body: Incoming,
    /// Bytes received after the last whole line.
    pending: Vec<u8>,
}

impl Events {
    /// The next line, as sent (an [`EventLine`](crate::EventLine) in
    /// JSON); none once the server ends the stream.
    pub async fn next_line(&mut self) -> Result<Option<String>, StatusError> {
        loop {
            if let Some(end) = self.pending.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..end]).into_owned()));
            }
            let Some(frame) = self.body.frame().await else { return Ok(None) };
            let frame = frame.map_err(|err| self.client.query(err))?;
            if let Ok(data) = frame.into_data() {
                self.pending.extend_from_slice(&data);
            }
        }
    }
}
