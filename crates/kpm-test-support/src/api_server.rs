//! A stand-in Kubernetes API server for tests, as a plain request handler
//! (method, path, query, content type, body → status, body) that a test
//! serves in process (a tower service for kube's client, on paused time)
//! or over TCP (axum, for the `kpm` binary).
//!
//! It holds one Node, and the node's CSINode if a test gives it one. The
//! Node's `status.conditions` follow the API server's rules for a list map
//! keyed by type: a server-side apply owns the conditions it names and
//! removes those its manager owned and no longer names; a strategic merge
//! patch (the kubelet's) upserts. It takes
//! `events.k8s.io/v1` Events with the fields the API server requires and
//! patches their series. It can be down, or answer everything with one
//! status code. Everything else is a 404.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

/// What the stand-in holds and saw.
#[derive(Debug, Default)]
pub struct State {
    /// The Node, if there is one.
    pub node: Option<Value>,
    /// The Node's CSINode, if there is one: read-only, as kpm's doctor
    /// only reads it.
    pub csinode: Option<Value>,
    /// The field manager owning each condition type.
    pub owners: HashMap<String, String>,
    /// The Events, by name.
    pub events: BTreeMap<String, Value>,
    /// `METHOD path` of each request, in order.
    pub requests: Vec<String>,
    /// When set, every request is answered with this code.
    pub fail: Option<u16>,
    /// When set, no request gets through: the adapter refuses the
    /// connection.
    pub down: bool,
}

/// A request, as the stand-in reads it.
#[derive(Debug)]
pub struct ApiRequest<'a> {
    /// `GET`, `PATCH`, ...
    pub method: &'a str,
    /// The URI's path.
    pub path: &'a str,
    /// The URI's query, without `?`.
    pub query: &'a str,
    /// The `Content-Type` header.
    pub content_type: &'a str,
    /// The body.
    pub body: &'a [u8],
}

impl State {
    /// A stand-in holding Node `node`, uid `uid-1`, without conditions.
    pub fn with_node(node: &str) -> Self {
        Self {
            node: Some(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "uid": "uid-1"}, "status": {"conditions": []}})),
            ..Self::default()
        }
    }

    /// Requests that wrote (not GET).
    pub fn writes(&self) -> usize {
        self.requests.iter().filter(|r| !r.starts_with("GET ")).count()
    }

    /// The condition of `kind` on the Node.
    pub fn condition(&self, kind: &str) -> Option<Value> {
        self.node.as_ref()?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }

    /// Answers `request`: the status code and a JSON body. Call it only
    /// while not [`down`](Self::down).
    pub fn handle(&mut self, request: &ApiRequest<'_>) -> (u16, Vec<u8>) {
        let (code, body) = self.answer(request);
        (code, body.to_string().into_bytes())
    }

    fn answer(&mut self, request: &ApiRequest<'_>) -> (u16, Value) {
        let body: Value = serde_json::from_slice(request.body).unwrap_or(Value::Null);
        self.requests.push(format!("{} {}", request.method, request.path));
        if let Some(code) = self.fail {
            return status(code, "refused by the test");
        }
        let manager = request
            .query
            .split('&')
            .find_map(|pair| pair.strip_prefix("fieldManager="))
            .unwrap_or("unknown")
            .to_owned();
        let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
        match (request.method, segments.as_slice()) {
            ("GET", ["api", "v1", "nodes", _]) => match &self.node {
                Some(node) => (200, node.clone()),
                None => status(404, "nodes not found"),
            },
            ("GET", ["apis", "storage.k8s.io", "v1", "csinodes", _]) => match &self.csinode {
                Some(csinode) => (200, csinode.clone()),
                None => status(404, "csinodes not found"),
            },
            ("PATCH", ["api", "v1", "nodes", _, "status"]) => {
                let apply = request.content_type.starts_with("application/apply-patch");
                self.patch_conditions(&body, &manager, apply)
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
                    return status(422, &format!("{missing} is required"));
                }
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                self.events.insert(name, body.clone());
                (201, body)
            }
            ("PATCH", ["apis", "events.k8s.io", "v1", "namespaces", "default", "events", name]) => {
                let count = body["series"]["count"].as_i64().unwrap_or(0);
                if count < 2 || body["series"]["lastObservedTime"].is_null() {
                    return status(422, "series.count must be 2 or more");
                }
                match self.events.get_mut(*name) {
                    Some(event) => {
                        event["series"] = body["series"].clone();
                        (200, event.clone())
                    }
                    None => status(404, "events not found"),
                }
            }
            _ => status(404, "not served by the stand-in"),
        }
    }

    fn patch_conditions(&mut self, body: &Value, manager: &str, apply: bool) -> (u16, Value) {
        let Some(mut node) = self.node.take() else { return status(404, "nodes not found") };
        let given: Vec<Value> =
            body["status"]["conditions"].as_array().cloned().unwrap_or_default();
        if !node["status"]["conditions"].is_array() {
            node["status"]["conditions"] = json!([]);
        }
        let Some(conditions) = node["status"]["conditions"].as_array_mut() else {
            return status(500, "conditions is not a list");
        };
        if apply {
            // An apply removes the conditions its manager owned and left out.
            let named: Vec<&Value> = given.iter().map(|c| &c["type"]).collect();
            conditions.retain(|c| {
                let kind = c["type"].as_str().unwrap_or_default();
                self.owners.get(kind).is_none_or(|owner| owner != manager)
                    || named.contains(&&c["type"])
            });
        }
        for condition in given {
            let kind = condition["type"].as_str().unwrap_or_default().to_owned();
            match conditions.iter_mut().find(|c| c["type"] == kind.as_str()) {
                Some(existing) => *existing = condition,
                None => conditions.push(condition),
            }
            self.owners.insert(kind, manager.to_owned());
        }
        self.node = Some(node.clone());
        (200, node)
    }
}

/// A `Status` answer.
fn status(code: u16, message: &str) -> (u16, Value) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code});
    (code, body)
}
