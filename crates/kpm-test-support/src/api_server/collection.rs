//! The stand-in's collections of any kind (a fleet's Nodes, CSINodes,
//! slices, reports, pods): listed in pages as kube-apiserver lists them
//! (`limit`, `continue`), by `key=value` label selector and the
//! `spec.nodeName` field selector, as a server-side `Table` when asked
//! (`as=Table` in `Accept`), and got by name.

use serde_json::{Value, json};

use super::{ApiRequest, decode, status};

/// One collection: its items and its table's columns after the name.
#[derive(Debug)]
pub struct Collection {
    path: String,
    kind: String,
    api_version: String,
    items: Vec<Value>,
    /// Each column's name, JSON path and type, as a CRD's printer columns.
    columns: Vec<(String, String, String)>,
}

impl Collection {
    /// An empty collection served at `path`, of `kind` objects of `api_version`.
    pub fn new(path: &str, kind: &str, api_version: &str) -> Self {
        Self {
            path: path.to_owned(),
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
            items: Vec::new(),
            columns: Vec::new(),
        }
    }

    /// With the table's `columns` after the name: each one's name, JSON
    /// path and type (a CRD's `additionalPrinterColumns`).
    #[must_use]
    pub fn with_columns(
        mut self,
        columns: impl IntoIterator<Item = (String, String, String)>,
    ) -> Self {
        self.columns = columns.into_iter().collect();
        self
    }

    /// Adds `item`.
    pub fn push(&mut self, item: &Value) {
        self.items.push(item.clone());
    }

    /// The answer to `request` if it reads this collection: a page of it,
    /// or one item by name (404 when there is none).
    pub(super) fn answer(&self, request: &ApiRequest<'_>) -> Option<(u16, Value)> {
        if request.method != "GET" {
            return None;
        }
        if request.path == self.path {
            return Some(self.page(request.query, request.accept.contains("as=Table")));
        }
        let name = request.path.strip_prefix(self.path.as_str())?.strip_prefix('/')?;
        let found = self.items.iter().find(|item| item["metadata"]["name"] == name);
        Some(found.map_or_else(|| status(404, "not found"), |item| (200, item.clone())))
    }

    /// A row of the table: the name, then each column's value at its path;
    /// a `date` an age, a `string` as Go prints it.
    fn row(&self, item: &Value) -> Value {
        let mut cells = vec![item["metadata"]["name"].clone()];
        for (_, path, kind) in &self.columns {
            let value = path.trim_start_matches('.').split('.').fold(item, |v, key| &v[key]);
            cells.push(match (value, kind.as_str()) {
                (Value::Null, _) => Value::Null,
                (_, "date") => "5m".into(),
                (Value::String(_), _) | (_, "integer") => value.clone(),
                (other, _) => other.to_string().into(),
            });
        }
        json!({"cells": cells, "object": null})
    }

    /// The page a list asks for: at most `limit` items from the offset its
    /// `continue` token names, of those its selectors select; as a `Table`
    /// when asked. A token the stand-in did not give is refused as an
    /// expired one is (410).
    fn page(&self, query: &str, table: bool) -> (u16, Value) {
        let param = |name: &str| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(key, _)| *key == name)
                .map(|(_, value)| decode(value))
        };
        let labels = param("labelSelector");
        let label =
            labels.as_deref().map(|selector| selector.split_once('=').unwrap_or((selector, "")));
        let node = param("fieldSelector");
        let node = node.as_deref().map(|selector| selector.trim_start_matches("spec.nodeName="));
        let selected: Vec<&Value> = self
            .items
            .iter()
            .filter(|item| {
                label.is_none_or(|(key, value)| item["metadata"]["labels"][key] == value)
            })
            .filter(|item| node.is_none_or(|node| item["spec"]["nodeName"] == node))
            .collect();
        let start = match param("continue") {
            None => 0,
            Some(token) => match token.strip_prefix("offset-").and_then(|n| n.parse().ok()) {
                Some(offset) => selected.len().min(offset),
                None => return status(410, "the continue token is not the stand-in's"),
            },
        };
        let limit = param("limit").and_then(|limit| limit.parse().ok()).unwrap_or(selected.len());
        let end = start.saturating_add(limit).min(selected.len());
        let token = if end < selected.len() { format!("offset-{end}") } else { String::new() };
        let metadata = json!({"resourceVersion": "42", "continue": token});
        let page = &selected[start..end];
        if table {
            let mut columns = vec![json!({"name": "Name", "type": "string", "format": "name"})];
            columns.extend(
                self.columns.iter().map(|(name, _, kind)| json!({"name": name, "type": kind})),
            );
            let rows: Vec<Value> = page.iter().map(|item| self.row(item)).collect();
            let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata, "columnDefinitions": columns, "rows": rows});
            return (200, table);
        }
        let list = json!({"kind": format!("{}List", self.kind), "apiVersion": self.api_version,
            "metadata": metadata, "items": page});
        (200, list)
    }
}
