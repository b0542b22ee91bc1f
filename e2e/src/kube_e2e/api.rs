//! A blocking client of the API server, and the objects the scenarios read
//! and create through it.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use super::NODE_ID_ANNOTATION;
use crate::command::Result;
use crate::scenario::find;

/// A blocking client of the API server with one bearer token.
#[derive(Clone)]
pub(crate) struct Api {
    agent: ureq::Agent,
    pub(crate) server: String,
    token: String,
}

impl Api {
    /// Trusts only `ca_pem`.
    pub(crate) fn new(server: &str, ca_pem: &str, token: &str) -> Result<Self> {
        let ca = ureq::tls::Certificate::from_pem(ca_pem.as_bytes())?;
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[ca]))
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Ok(Self { agent, server: server.to_owned(), token: token.to_owned() })
    }

    /// The same server with another token.
    pub(crate) fn as_token(&self, token: &str) -> Self {
        Self { agent: self.agent.clone(), server: self.server.clone(), token: token.to_owned() }
    }

    /// `method path` with `body` as JSON (a merge patch for PATCH): the
    /// status code and the body (`null` when it is not JSON).
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let content_type =
            if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
        self.request_as(method, path, content_type, body)
    }

    /// [`request`](Self::request) with the body's content type given.
    pub(crate) fn request_as(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Content-Type", content_type)
            .body(body.map(Value::to_string).unwrap_or_default())?;
        let mut response = self.agent.run(request)?;
        let text = response.body_mut().read_to_string()?;
        Ok((response.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// `GET path` accepting `accept`: the status code and the body as it came.
    pub(crate) fn get_text(&self, path: &str, accept: &str) -> Result<(u16, String)> {
        let request = ureq::http::Request::builder()
            .method("GET")
            .uri(format!("{}{path}", self.server))
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Accept", accept)
            .body(String::new())?;
        let mut response = self.agent.run(request)?;
        let text = response.body_mut().with_config().limit(1 << 30).read_to_string()?;
        Ok((response.status().as_u16(), text))
    }

    pub(crate) fn get(&self, path: &str) -> Result<Value> {
        self.expect_ok("GET", path, None)
    }

    /// The collection at `path` as the API server prints it for `kubectl
    /// get`: its printer columns (server-side printing, a `meta.k8s.io`
    /// Table), laid out as kubectl lays them out.
    pub(crate) fn get_table(&self, path: &str) -> Result<String> {
        let (code, text) = self.get_text(path, "application/json;as=Table;v=v1;g=meta.k8s.io")?;
        let table: Value = serde_json::from_str(&text)?;
        if code != 200 {
            return Err(format!("GET {path} as a Table: {code} {}", table["message"]).into());
        }
        let columns: Vec<(usize, String)> = table["columnDefinitions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(_, column)| column["priority"].as_u64().unwrap_or_default() == 0)
            .map(|(i, column)| (i, column["name"].as_str().unwrap_or_default().to_uppercase()))
            .collect();
        let mut lines = vec![columns.iter().map(|(_, name)| name.clone()).collect::<Vec<_>>()];
        for row in table["rows"].as_array().into_iter().flatten() {
            let cells = row["cells"].as_array().cloned().unwrap_or_default();
            lines.push(
                columns
                    .iter()
                    .map(|(i, _)| match cells.get(*i) {
                        Some(Value::String(text)) => text.clone(),
                        Some(Value::Null) | None => "<none>".to_owned(),
                        Some(other) => other.to_string(),
                    })
                    .collect(),
            );
        }
        let widths: Vec<usize> = (0..columns.len())
            .map(|i| lines.iter().map(|line| line[i].len()).max().unwrap_or_default())
            .collect();
        let text = lines
            .iter()
            .map(|line| {
                let cells: Vec<String> = line
                    .iter()
                    .zip(&widths)
                    .map(|(cell, width)| format!("{cell:<width$}"))
                    .collect();
                cells.join("   ").trim_end().to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n");
        Ok(text)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.expect_ok("POST", path, Some(body))
    }

    /// GET, with `None` for 404.
    fn get_optional(&self, path: &str) -> Result<Option<Value>> {
        match self.request("GET", path, None)? {
            (404, _) => Ok(None),
            (200, body) => Ok(Some(body)),
            (code, body) => Err(format!("GET {path}: {code} {}", body["message"]).into()),
        }
    }

    fn expect_ok(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        match self.request(method, path, body)? {
            (200..300, body) => Ok(body),
            (code, body) => Err(format!("{method} {path}: {code} {}", body["message"]).into()),
        }
    }
}

/// A kubeconfig for `token` against `server`.
pub(crate) fn write_kubeconfig(file: &Path, server: &str, ca_pem: &str, token: &str) -> Result {
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    // JSON is YAML: any kubeconfig reader takes it.
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "user"}}],
        "current-context": "e2e",
    });
    fs::write(file, serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

pub(super) const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
pub(super) const CSIDRIVERS: &str = "/apis/storage.k8s.io/v1/csidrivers";
pub(super) const CSINODES: &str = "/apis/storage.k8s.io/v1/csinodes";

/// The doctors' `KubeletPluginReports`: the collection the CRD in
/// `deploy/doctor/crd.yaml` names, which is generated from the report
/// crate's types (and checked by its test), so no path is written here.
pub(crate) static REPORTS: LazyLock<String> = LazyLock::new(|| {
    let crd = serde_norway::from_str(include_str!("../../../deploy/doctor/crd.yaml"));
    #[allow(clippy::expect_used, reason = "a file generated and checked by kpm-report's test")]
    crd.map_err(Into::into).and_then(|crd| collection(&crd)).expect("deploy/doctor/crd.yaml")
});

/// The collection a `CustomResourceDefinition` serves: `/apis/GROUP/VERSION/PLURAL`.
pub(super) fn collection(crd: &Value) -> Result<String> {
    let (group, plural) = (&crd["spec"]["group"], &crd["spec"]["names"]["plural"]);
    let version = &crd["spec"]["versions"][0]["name"];
    let (group, plural, version) = (
        group.as_str().ok_or("a CRD without spec.group")?,
        plural.as_str().ok_or("a CRD without spec.names.plural")?,
        version.as_str().ok_or("a CRD without a version")?,
    );
    Ok(format!("/apis/{group}/{version}/{plural}"))
}

/// Node `node`'s `KubeletPluginReport`, if its doctor wrote one.
pub(crate) fn report(api: &Api, node: &str) -> Result<Option<Value>> {
    api.get_optional(&format!("{}/{node}", *REPORTS))
}

/// A `ResourceSlice` of `driver` on `node`, one device, its pool named after
/// the node with `pool_slices` slices.
pub(super) fn slice(name: &str, driver: &str, node: &str, pool_slices: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": pool_slices},
            "devices": [{"name": format!("{name}-dev")}],
        },
    })
}

pub(super) fn create_slice(
    api: &Api,
    name: &str,
    driver: &str,
    node: &str,
    pool_slices: u32,
) -> Result {
    api.post(SLICES, &slice(name, driver, node, pool_slices)).map(drop)
}

/// The names of all `ResourceSlice`s.
pub(super) fn slices(api: &Api) -> Result<BTreeSet<String>> {
    let list = api.get(SLICES)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// The ResourceSlices of `driver` on `node`.
pub(super) fn slices_of(api: &Api, driver: &str, node: &str) -> Result<BTreeSet<String>> {
    let list = api.get(SLICES)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["spec"]["driver"] == driver && item["spec"]["nodeName"] == node)
        .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
        .collect())
}

/// The entry of `driver` in `CSINode` `node1`, if both exist.
pub(super) fn csinode_driver(api: &Api, driver: &str) -> Result<Option<Value>> {
    let Some(csinode) = api.get_optional("/apis/storage.k8s.io/v1/csinodes/node1")? else {
        return Ok(None);
    };
    Ok(find(&csinode["spec"]["drivers"], "name", driver).cloned())
}

/// The node-id annotation of `node`, parsed; `{}` when absent.
pub(super) fn node_ids(node: &Value) -> Result<Value> {
    match node["metadata"]["annotations"][NODE_ID_ANNOTATION].as_str() {
        Some(ids) => Ok(serde_json::from_str(ids)?),
        None => Ok(json!({})),
    }
}
