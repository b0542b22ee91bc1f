//! A stand-in API server for the publisher's tests, in process (so that
//! paused time holds): one Node whose `status.conditions` follow the API
//! server's rules for a list map keyed by type (a server-side apply owns
//! the conditions it names and removes those it owned and no longer
//! names; a strategic merge patch, as the kubelet sends, upserts), and the
//! `events.k8s.io/v1` Events with the fields the API server requires. It
//! can be down, or answer every request with one status code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use kube::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// What the stand-in holds and saw.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) node: Option<Value>,
    /// The field manager owning each condition type.
    pub(crate) owners: HashMap<String, String>,
    pub(crate) events: BTreeMap<String, Value>,
    /// `METHOD path` of each request, in order.
    pub(crate) requests: Vec<String>,
    /// When set, every request is answered with this code.
    pub(crate) fail: Option<u16>,
    /// When set, no request gets through (a connection refused).
    pub(crate) down: bool,
}

impl State {
    /// Requests that wrote (not GET).
    pub(crate) fn writes(&self) -> usize {
        self.requests.iter().filter(|r| !r.starts_with("GET ")).count()
    }

    /// The condition of `kind` on the Node.
    pub(crate) fn condition(&self, kind: &str) -> Option<Value> {
        self.node.as_ref()?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }
}

/// A client of a stand-in holding Node `node` (with `uid-1`), and its state.
pub(crate) fn client(node: &str) -> (kube::Client, Arc<Mutex<State>>) {
    let state = Arc::new(Mutex::new(State {
        node: Some(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "uid": "uid-1"}, "status": {"conditions": []}})),
        ..State::default()
    }));
    let shared = Arc::clone(&state);
    let service = tower::service_fn(move |request: Request<Body>| {
        let state = Arc::clone(&shared);
        async move { serve(&state, request).await }
    });
    (kube::Client::new(service, "default"), state)
}

async fn serve(
    state: &Mutex<State>,
    request: Request<Body>,
) -> Result<Response<Body>, std::io::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut state = state.lock();
    if state.down {
        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "down"));
    }
    state.requests.push(format!("{} {path}", parts.method));
    if let Some(code) = state.fail {
        return Ok(status(code, "refused by the test"));
    }
    let manager = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("fieldManager="))
        .unwrap_or("unknown")
        .to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Ok(match (parts.method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "nodes", _]) => match &state.node {
            Some(node) => ok(node),
            None => status(404, "nodes not found"),
        },
        ("PATCH", ["api", "v1", "nodes", _, "status"]) => {
            let apply = content_type.starts_with("application/apply-patch");
            patch_conditions(&mut state, &body, &manager, apply)
        }
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", "default", "events"]) => {
            let required = [
                "eventTime",
                "reportingController",
                "reportingInstance",
                "action",
                "reason",
                "regarding",
                "type",
            ];
            if let Some(missing) = required.iter().find(|field| body[**field].is_null()) {
                return Ok(status(422, &format!("{missing} is required")));
            }
            let name = body["metadata"]["name"].as_str().unwrap().to_owned();
            state.events.insert(name, body.clone());
            ok(&body)
        }
        ("PATCH", ["apis", "events.k8s.io", "v1", "namespaces", "default", "events", name]) => {
            let count = body["series"]["count"].as_i64().unwrap_or(0);
            if count < 2 || body["series"]["lastObservedTime"].is_null() {
                return Ok(status(422, "series.count must be 2 or more"));
            }
            match state.events.get_mut(*name) {
                Some(event) => {
                    event["series"] = body["series"].clone();
                    ok(event)
                }
                None => status(404, "events not found"),
            }
        }
        _ => status(404, "not served by the stand-in"),
    })
}

fn patch_conditions(state: &mut State, body: &Value, manager: &str, apply: bool) -> Response<Body> {
    let Some(mut node) = state.node.take() else { return status(404, "nodes not found") };
    let given: Vec<Value> = body["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let conditions = node["status"]["conditions"].as_array_mut().unwrap();
    if apply {
        // An apply removes the conditions its manager owned and left out.
        let named: Vec<&Value> = given.iter().map(|c| &c["type"]).collect();
        conditions.retain(|c| {
            let kind = c["type"].as_str().unwrap_or_default();
            state.owners.get(kind).is_none_or(|owner| owner != manager)
                || named.contains(&&c["type"])
        });
    }
    for condition in given {
        let kind = condition["type"].as_str().unwrap().to_owned();
        match conditions.iter_mut().find(|c| c["type"] == kind.as_str()) {
            Some(existing) => *existing = condition,
            None => conditions.push(condition),
        }
        state.owners.insert(kind, manager.to_owned());
    }
    state.node = Some(node.clone());
    ok(&node)
}

fn ok(body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(body.to_string().into_bytes()))
        .unwrap()
}

fn status(code: u16, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code});
    Response::builder().status(code).body(Body::from(body.to_string().into_bytes())).unwrap()
}
