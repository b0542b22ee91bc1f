//! A stand-in Kubernetes API server for tests, as a plain request handler
//! (method, path, query, content type, body → status, body) that a test
//! serves in process (a tower service for kube's client, on paused time)
//! or over TCP (axum, for the `kpm` binary).
//!
//! It holds one Node whose `status.conditions` follow the API server's
//! rules for a list map keyed by type: a server-side apply owns the
//! conditions it names and removes those its manager owned and no longer
//! names; a strategic merge patch (the kubelet's) upserts. A JSON merge
//! patch of the Node or its status (kpm's node info and device capacity)
//! is applied as RFC 7386 says, refused with 409 when it names a
//! `resourceVersion` that is not the Node's. It holds one CSINode (create,
//! update with the same precondition) and ResourceSlices (create, list and
//! delete-collection by field selector) and ResourceClaims (create with a
//! generated name, get, write the status, delete), lists the Node and the CSINode by
//! name and streams their changes to watches ([`State::watch`]). Every
//! write of the Node or the CSINode sets a new `resourceVersion`. It takes
//! `events.k8s.io/v1` Events with the fields the API server requires and
//! patches their series. It can be down, or answer everything with one
//! status code, or refuse some resources (403, 404). It serves a fleet's
//! [`Collection`]s too. Everything else is a 404. [`serve`] serves it over
//! TCP, [`kubeconfig`] names it to a process.

mod collection;
mod resource;
mod tcp;

pub use collection::Collection;
pub use tcp::{kubeconfig, serve};

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The stand-in's state, shared by its server and the test.
pub type Shared = Arc<Mutex<State>>;

/// An answer of [`service`]: a whole body, or a watch's stream of events.
pub type Answer = http::Response<BoxBody<Bytes, Infallible>>;

/// `state` served in process, as a tower service kube's client takes
/// (`kube::Client::new(service(state), "default")`), so that paused time
/// holds: watches stream their events; while `down`, every request is
/// refused as a connection is.
pub fn service<B>(
    state: Shared,
) -> impl tower::Service<
    http::Request<B>,
    Response = Answer,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<Answer>> + Send,
> + Clone
+ Send
+ 'static
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    tower::service_fn(move |request: http::Request<B>| {
        let state = Arc::clone(&state);
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map_err(|err| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{err:?}"))
            })?;
            let body = body.to_bytes();
            let mut state = state.lock();
            if state.down {
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "down"));
            }
            let query = parts.uri.query().unwrap_or_default();
            let (code, body) = if let Some(resource) = State::watched(parts.uri.path(), query) {
                let lines = UnboundedReceiverStream::new(state.watch(&resource))
                    .map(|line| Ok(http_body::Frame::data(Bytes::from(line))));
                (200, BoxBody::new(StreamBody::new(lines)))
            } else {
                let (code, answer) = state.handle(&ApiRequest::of(&parts, &body));
                (code, BoxBody::new(Full::new(Bytes::from(answer))))
            };
            let response = http::Response::builder().status(code).body(body);
            response.map_err(|err| std::io::Error::other(err.to_string()))
        }
    })
}

/// What the stand-in holds and saw.
#[derive(Debug, Default)]
pub struct State {
    /// The Node, if there is one.
    pub node: Option<Value>,
    /// The CSINode, if there is one.
    pub csinode: Option<Value>,
    /// The ResourceSlices.
    pub slices: Vec<Value>,
    /// The ResourceClaims, by `namespace/name`.
    pub claims: BTreeMap<String, Value>,
    /// The last `resourceVersion` given out.
    pub resource_version: u64,
    /// The open watches: the resource (`nodes`, `csinodes`) and where its
    /// events go, one JSON line each.
    pub watches: Vec<(String, mpsc::UnboundedSender<Vec<u8>>)>,
    /// The field manager owning each condition type.
    pub owners: HashMap<String, String>,
    /// The Events, by name.
    pub events: BTreeMap<String, Value>,
    /// The doctor's `KubeletPluginReports`, by name; `None`: their CRD is
    /// not installed (every request about them is a 404).
    pub reports: Option<BTreeMap<String, Value>>,
    /// `METHOD path` of each request, in order.
    pub requests: Vec<String>,
    /// `path?query` of each read (`GET`), in order: how it was asked.
    pub reads: Vec<String>,
    /// When set, every request is answered with this code.
    pub fail: Option<u16>,
    /// When set, every write is answered 500, as by an API server whose
    /// storage is away (kube's client retries a 503 by itself); reads are
    /// served.
    pub read_only: bool,
    /// When set, no request gets through: the adapter refuses the
    /// connection.
    pub down: bool,
    /// Resources (`csinodes`, …) every request about is answered with a
    /// code of their own: 403 as RBAC refuses a user, 404 as a cluster
    /// without them (DRA off, a CRD not installed).
    pub refused: Vec<(String, u16)>,
    /// Collections served before everything above, by their path.
    pub collections: Vec<Collection>,
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
    /// The `Accept` header.
    pub accept: &'a str,
    /// The body.
    pub body: &'a [u8],
}

impl<'a> ApiRequest<'a> {
    /// The request of `parts` with `body`, as a server (a tower service for
    /// kube's client, axum) received it.
    pub fn of(parts: &'a http::request::Parts, body: &'a [u8]) -> Self {
        let header =
            |name| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
        Self {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or_default(),
            content_type: header(http::header::CONTENT_TYPE),
            accept: header(http::header::ACCEPT),
            body,
        }
    }
}

impl State {
    /// A stand-in holding Node `node`, uid `uid-1`, without conditions.
    pub fn with_node(node: &str) -> Self {
        Self {
            node: Some(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "uid": "uid-1", "resourceVersion": "1"},
                "status": {"conditions": []}})),
            resource_version: 1,
            reports: Some(BTreeMap::new()),
            ..Self::default()
        }
    }

    /// The `KubeletPluginReport` `name`, when there is one.
    pub fn report(&self, name: &str) -> Option<&Value> {
        self.reports.as_ref()?.get(name)
    }

    /// Opens a watch of `resource` (`nodes`, `csinodes`): the lines of its
    /// events from now on, until the stand-in goes [`down`](Self::go_down).
    pub fn watch(&mut self, resource: &str) -> mpsc::UnboundedReceiver<Vec<u8>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.watches.push((resource.to_owned(), sender));
        receiver
    }

    /// Whether a request with `query` is a watch, and of which resource;
    /// the adapter answers it with [`watch`](Self::watch)'s lines.
    pub fn watched(path: &str, query: &str) -> Option<String> {
        let watch = query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1");
        let resource = Self::resource(path)?;
        watch.then(|| resource.to_owned())
    }

    /// The resource (`nodes`, `csinodes`, …) a cluster-scoped `path` is about.
    fn resource(path: &str) -> Option<&str> {
        path.trim_start_matches('/').split('/').nth(match path {
            p if p.starts_with("/api/") => 2,
            _ => 3,
        })
    }

    /// Stops answering, as a killed API server does: every request is
    /// refused and every watch ends.
    pub fn go_down(&mut self) {
        self.down = true;
        self.watches.clear();
    }

    /// The CSINode's drivers, by name.
    pub fn csinode_drivers(&self) -> Vec<String> {
        let drivers = self
            .csinode
            .as_ref()
            .and_then(|csinode| csinode["spec"]["drivers"].as_array().cloned());
        drivers
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// The Node's annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<String> {
        self.node.as_ref()?["metadata"]["annotations"][key].as_str().map(str::to_owned)
    }

    /// The Node's capacity and allocatable of `resource`, as written.
    pub fn counts(&self, resource: &str) -> (Option<String>, Option<String>) {
        let status = self.node.as_ref().map(|node| &node["status"]);
        let count = |field: &str| {
            status.and_then(|status| status[field][resource].as_str()).map(str::to_owned)
        };
        (count("capacity"), count("allocatable"))
    }

    /// Changes the Node with `change`, as another writer would: a new
    /// `resourceVersion`, and an event to its watches.
    pub fn change_node(&mut self, change: impl FnOnce(&mut Value)) {
        if let Some(mut node) = self.node.take() {
            change(&mut node);
            self.node = Some(self.stored("nodes", "MODIFIED", node));
        }
    }

    /// Changes the CSINode with `change`, as another writer would.
    pub fn change_csinode(&mut self, change: impl FnOnce(&mut Value)) {
        if let Some(mut csinode) = self.csinode.take() {
            change(&mut csinode);
            self.csinode = Some(self.stored("csinodes", "MODIFIED", csinode));
        }
    }

    /// `object` of `resource` with a new `resourceVersion`, sent to the
    /// resource's watches as an event of `kind`.
    fn stored(&mut self, resource: &str, kind: &str, mut object: Value) -> Value {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        let mut line = json!({"type": kind, "object": object}).to_string().into_bytes();
        line.push(b'\n');
        self.watches
            .retain(|(watched, sender)| watched != resource || sender.send(line.clone()).is_ok());
        object
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
        if request.method == "GET" {
            self.reads.push(format!("{}?{}", request.path, request.query));
        }
        if let Some(answer) = self.before_the_routes(request) {
            return answer;
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
            ("GET", ["api", "v1", "nodes"]) => self.list("NodeList", "v1", self.node.clone()),
            ("GET", ["apis", "storage.k8s.io", "v1", "csinodes"]) => {
                self.list("CSINodeList", "storage.k8s.io/v1", self.csinode.clone())
            }
            ("PATCH", ["api", "v1", "nodes", _, "status"])
                if request.content_type.starts_with("application/merge-patch") =>
            {
                self.merge_node(&body)
            }
            ("PATCH", ["api", "v1", "nodes", _]) => self.merge_node(&body),
            ("PATCH", ["api", "v1", "nodes", _, "status"]) => {
                let apply = request.content_type.starts_with("application/apply-patch");
                self.patch_conditions(&body, &manager, apply)
            }
            ("GET", ["apis", "storage.k8s.io", "v1", "csinodes", _]) => match &self.csinode {
                Some(csinode) => (200, csinode.clone()),
                None => status(404, "csinodes not found"),
            },
            ("POST", ["apis", "storage.k8s.io", "v1", "csinodes"]) => {
                self.write_csinode(body, true)
            }
            ("PUT", ["apis", "storage.k8s.io", "v1", "csinodes", _]) => {
                self.write_csinode(body, false)
            }
            (method, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                self.slices(method, request.query, body)
            }
            (
                method,
                [
                    "apis",
                    "resource.k8s.io",
                    "v1",
                    "namespaces",
                    namespace,
                    "resourceclaims",
                    rest @ ..,
                ],
            ) => self.claim(method, namespace, rest, body),
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
            ("GET", ["apis", REPORT_GROUP, REPORT_VERSION, REPORTS, name]) => self.get_report(name),
            ("PATCH", ["apis", REPORT_GROUP, REPORT_VERSION, REPORTS, name, rest @ ..]) => {
                self.apply_report(name, &body, rest == ["status"])
            }
            _ => status(404, "not served by the stand-in"),
        }
    }

    /// The answer set by the test, if any (a failure, a refused resource),
    /// else that of a collection.
    fn before_the_routes(&self, request: &ApiRequest<'_>) -> Option<(u16, Value)> {
        if let Some(code) = self.fail {
            return Some(status(code, "refused by the test"));
        }
        if self.read_only && request.method != "GET" {
            return Some(status(500, "the storage is away (read-only by the test)"));
        }
        let resource = State::resource(request.path);
        if let Some((resource, code)) =
            self.refused.iter().find(|(r, _)| resource == Some(r.as_str()))
        {
            let message = match code {
                403 => format!("{resource} is forbidden (by the test)"),
                404 => "the server could not find the requested resource".to_owned(),
                _ => format!("{resource}: refused by the test"),
            };
            return Some(status(*code, &message));
        }
        self.collections.iter().find_map(|c| c.answer(request))
    }

    fn get_report(&self, name: &str) -> (u16, Value) {
        match self.reports.as_ref().map(|reports| reports.get(name)) {
            Some(Some(report)) => (200, report.clone()),
            Some(None) => status(404, "kubeletpluginreports not found"),
            None => status(404, "the server could not find the requested resource"),
        }
    }

    /// A server-side apply of a report: of its metadata and spec, creating
    /// it, or of its status (404 when there is no report).
    fn apply_report(&mut self, name: &str, body: &Value, status_only: bool) -> (u16, Value) {
        self.resource_version += 1;
        let version = self.resource_version.to_string();
        let Some(reports) = &mut self.reports else {
            return status(404, "the server could not find the requested resource");
        };
        let report = match (reports.get_mut(name), status_only) {
            (Some(report), true) => {
                report["status"] = body["status"].clone();
                report
            }
            (None, true) => return status(404, "kubeletpluginreports not found"),
            (existing, false) => {
                let report = existing.map_or_else(
                    || body.clone(),
                    |existing| {
                        let mut report = existing.clone();
                        report["metadata"] = body["metadata"].clone();
                        report["spec"] = body["spec"].clone();
                        report
                    },
                );
                reports.insert(name.to_owned(), report);
                let Some(report) = reports.get_mut(name) else { return status(500, "lost") };
                report
            }
        };
        report["metadata"]["resourceVersion"] = json!(version);
        (200, report.clone())
    }

    /// Creates the CSINode (409 if there is one), or updates it (409 when
    /// `csinode` names another `resourceVersion`).
    fn write_csinode(&mut self, csinode: Value, create: bool) -> (u16, Value) {
        match (&self.csinode, create) {
            (Some(_), true) => return status(409, "csinodes already exists"),
            (None, false) => return status(404, "csinodes not found"),
            (Some(current), false)
                if csinode["metadata"]["resourceVersion"]
                    != current["metadata"]["resourceVersion"] =>
            {
                return status(409, "the object has been modified");
            }
            _ => {}
        }
        let (code, event) = if create { (201, "ADDED") } else { (200, "MODIFIED") };
        let csinode = self.stored("csinodes", event, csinode);
        self.csinode = Some(csinode.clone());
        (code, csinode)
    }

    /// A list of `object`, if any, at the last `resourceVersion`.
    fn list(&self, kind: &str, api_version: &str, object: Option<Value>) -> (u16, Value) {
        let items: Vec<Value> = object.into_iter().collect();
        let metadata = json!({"resourceVersion": self.resource_version.to_string()});
        (
            200,
            json!({"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}),
        )
    }

    /// A JSON merge patch of the Node, refused when it names another
    /// `resourceVersion`.
    fn merge_node(&mut self, patch: &Value) -> (u16, Value) {
        let Some(node) = &self.node else { return status(404, "nodes not found") };
        let precondition = &patch["metadata"]["resourceVersion"];
        if !precondition.is_null() && *precondition != node["metadata"]["resourceVersion"] {
            return status(409, "the object has been modified");
        }
        let mut node = node.clone();
        merge(&mut node, patch);
        let node = self.stored("nodes", "MODIFIED", node);
        self.node = Some(node.clone());
        (200, node)
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
        let node = self.stored("nodes", "MODIFIED", node);
        self.node = Some(node.clone());
        (200, node)
    }
}

/// The doctor's reports: their group, version and plural.
const REPORT_GROUP: &str = "doctor.kpm.io";
const REPORT_VERSION: &str = "v1alpha1";
const REPORTS: &str = "kubeletpluginreports";

/// RFC 7386: `patch`'s members replace `target`'s, objects merge, `null`
/// removes.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in members {
        if value.is_null() {
            if let Some(object) = target.as_object_mut() {
                object.remove(key);
            }
        } else {
            merge(&mut target[key.as_str()], value);
        }
    }
}

/// Percent-decodes a query value.
fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|hex| std::str::from_utf8(hex).ok());
        match (bytes[i], hex.and_then(|hex| u8::from_str_radix(hex, 16).ok())) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// A `Status` answer, with the reason the API server gives the code
/// (kube's `get_opt` reads a 404 as missing only with `NotFound`).
fn status(code: u16, message: &str) -> (u16, Value) {
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code});
    (code, body)
}
