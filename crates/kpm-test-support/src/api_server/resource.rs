//! The stand-in's `resource.k8s.io/v1` objects: ResourceSlices (create,
//! list and delete-collection by field selector) and ResourceClaims
//! (create with a generated name, get, write the status, delete).

use serde_json::{Value, json};

use super::{State, decode, status};

impl State {
    /// A request about the ResourceSlices: a list or a delete-collection
    /// by the field selector of `query`, or a create.
    pub(super) fn slices(&mut self, method: &str, query: &str, body: Value) -> (u16, Value) {
        match method {
            "GET" => {
                let items: Vec<Value> =
                    self.slices.iter().filter(|s| selected(s, query)).cloned().collect();
                (
                    200,
                    json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {}, "items": items}),
                )
            }
            "POST" => {
                let mut slice = body;
                slice["metadata"]["creationTimestamp"] = json!(now());
                self.slices.push(slice.clone());
                (201, slice)
            }
            "DELETE" => {
                self.slices.retain(|slice| !selected(slice, query));
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
                )
            }
            _ => status(404, "not served by the stand-in"),
        }
    }

    /// A request about the ResourceClaims of `namespace`, `rest` the path
    /// after `resourceclaims`.
    pub(super) fn claim(
        &mut self,
        method: &str,
        namespace: &str,
        rest: &[&str],
        body: Value,
    ) -> (u16, Value) {
        let key = |name: &str| format!("{namespace}/{name}");
        match (method, rest) {
            ("POST", []) => self.create_claim(namespace, body),
            ("GET", [name]) => match self.claims.get(&key(name)) {
                Some(claim) => (200, claim.clone()),
                None => status(404, "resourceclaims not found"),
            },
            ("PUT", [name, "status"]) => {
                self.resource_version += 1;
                let version = self.resource_version.to_string();
                match self.claims.get_mut(&key(name)) {
                    Some(claim) => {
                        claim["status"] = body["status"].clone();
                        claim["metadata"]["resourceVersion"] = json!(version);
                        (200, claim.clone())
                    }
                    None => status(404, "resourceclaims not found"),
                }
            }
            ("DELETE", [name]) => match self.claims.remove(&key(name)) {
                Some(claim) => (200, claim),
                None => status(404, "resourceclaims not found"),
            },
            _ => status(404, "not served by the stand-in"),
        }
    }

    /// Creates a ResourceClaim in `namespace`, naming it from its
    /// `generateName` when it has no name, as the API server does.
    fn create_claim(&mut self, namespace: &str, mut claim: Value) -> (u16, Value) {
        self.resource_version += 1;
        let version = self.resource_version;
        let name = match (
            claim["metadata"]["name"].as_str(),
            claim["metadata"]["generateName"].as_str(),
        ) {
            (Some(name), _) => name.to_owned(),
            (None, Some(prefix)) => format!("{prefix}{version:05}"),
            (None, None) => return status(422, "metadata.name or generateName is required"),
        };
        let key = format!("{namespace}/{name}");
        if self.claims.contains_key(&key) {
            return status(409, "resourceclaims already exists");
        }
        let metadata = &mut claim["metadata"];
        metadata["name"] = json!(name);
        metadata["namespace"] = json!(namespace);
        metadata["uid"] = json!(format!("00000000-0000-4000-8000-{version:012}"));
        metadata["resourceVersion"] = json!(version.to_string());
        metadata["creationTimestamp"] = json!(now());
        self.claims.insert(key, claim.clone());
        (201, claim)
    }
}

/// Whether `slice` matches the `fieldSelector` of `query`
/// (`spec.nodeName=…,spec.driver=…`, percent-encoded).
fn selected(slice: &Value, query: &str) -> bool {
    let selector = query.split('&').find_map(|pair| pair.strip_prefix("fieldSelector="));
    let selector = decode(selector.unwrap_or_default());
    selector.split(',').filter(|term| !term.is_empty()).all(|term| {
        let (field, value) = term.split_once('=').unwrap_or((term, ""));
        let path = field.split('.').fold(slice, |value, key| &value[key]);
        path.as_str() == Some(value)
    })
}

/// The time now, as the API server writes `creationTimestamp`.
fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
