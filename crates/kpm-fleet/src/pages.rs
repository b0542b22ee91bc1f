//! How the fleet reader asks the API server: every request through one
//! [`Reader`], which bounds it in time and counts it and the bytes of its
//! answer; lists page by page (`limit`, `continue`), or whole from the
//! watch cache, as objects or as the server-side `Table` `kubectl get`
//! asks for.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::header::{ACCEPT, HeaderValue};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{GetParams, ListParams};
use kube::core::ObjectList;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::time::error::Elapsed;
use tracing::debug;

use super::{FleetConfig, FleetError};

/// What a list asks the server-side `Table` for: `meta.k8s.io/v1`, the only
/// version every supported API server serves.
const TABLE_OF_V1: HeaderValue =
    HeaderValue::from_static("application/json;as=Table;v=v1;g=meta.k8s.io");

/// Reads through one client, each request bounded by the config's timeout;
/// counts the requests and the bytes of their answers, as the client read
/// them (the cost a read puts on the API server, said in `-o json`).
pub(crate) struct Reader<'a> {
    client: &'a kube::Client,
    pub(crate) config: &'a FleetConfig,
    requests: AtomicUsize,
    bytes: AtomicUsize,
}

/// How a list went.
pub(crate) enum Listed {
    /// Every page was read.
    Read,
    /// An optional resource, not served (404) or not allowed (403) on the
    /// first page: unseen, not a failure.
    Unseen(Box<kube::core::Status>),
}

/// A page of a list: its items and the token of the next page.
pub(crate) trait Page: DeserializeOwned {
    /// One item: an object, or a table's row.
    type Item;

    /// Whether it is a server-side `Table`, asked for as one.
    const TABLE: bool;

    /// The items, and the `continue` token, empty on the last page.
    fn into_parts(self) -> (Vec<Self::Item>, Option<String>);
}

impl<T: Clone + DeserializeOwned> Page for ObjectList<T> {
    type Item = T;

    const TABLE: bool = false;

    fn into_parts(self) -> (Vec<T>, Option<String>) {
        (self.items, self.metadata.continue_)
    }
}

/// A server-side `Table` (`meta.k8s.io/v1`) asked for without its objects
/// (`includeObject=None`): each row's cells, named by the columns.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Table {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    column_definitions: Vec<Column>,
    #[serde(default)]
    rows: Vec<TableRow>,
}

#[derive(Debug, Clone, Deserialize)]
struct Column {
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
struct TableRow {
    cells: Vec<serde_json::Value>,
}

/// A table's row: its cells, named by its table's columns (held once for
/// all its rows); the first column is the object's name.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    columns: Arc<[String]>,
    cells: Vec<serde_json::Value>,
}

impl Row {
    /// The object's name: the first cell.
    pub(crate) fn name(&self) -> Option<&str> {
        self.cells.first().and_then(serde_json::Value::as_str)
    }

    /// The cell of `column`, read as `T`; none when the table has no such
    /// column, the cell is empty (`null`: the field is not set) or is not
    /// a `T`.
    pub(crate) fn cell<T: DeserializeOwned>(&self, column: &str) -> Option<T> {
        let index = self.columns.iter().position(|name| name == column)?;
        T::deserialize(self.cells.get(index)?).ok()
    }
}

impl Page for Table {
    type Item = Row;

    const TABLE: bool = true;

    fn into_parts(self) -> (Vec<Row>, Option<String>) {
        let columns: Arc<[String]> = self.column_definitions.into_iter().map(|c| c.name).collect();
        let rows = self
            .rows
            .into_iter()
            .map(|row| Row { columns: Arc::clone(&columns), cells: row.cells })
            .collect();
        (rows, self.metadata.continue_)
    }
}

impl<'a> Reader<'a> {
    pub(crate) fn new(client: &'a kube::Client, config: &'a FleetConfig) -> Self {
        Self { client, config, requests: AtomicUsize::new(0), bytes: AtomicUsize::new(0) }
    }

    /// The requests made, and the bytes of their answers.
    pub(crate) fn cost(&self) -> (usize, usize) {
        (self.requests.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// `request`'s answer as `T`; `Err(Elapsed)` when it took longer than
    /// the config's timeout.
    async fn fetch<T: DeserializeOwned>(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<Result<T, kube::Error>, Elapsed> {
        let request = match request {
            Ok(request) => request,
            Err(err) => return Ok(Err(kube::Error::BuildRequest(err))),
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let timeout = self.config.request_timeout;
        let answer = tokio::time::timeout(timeout, self.client.request_text(request)).await?;
        Ok(answer.and_then(|text| {
            self.bytes.fetch_add(text.len(), Ordering::Relaxed);
            serde_json::from_str(&text).map_err(kube::Error::SerdeError)
        }))
    }

    /// `name` of the collection at `path` (`what`), or none when it does
    /// not exist (it went since it was listed). From the API server's
    /// watch cache (`resourceVersion=0`): a view of the fleet a moment old
    /// is as good, and it costs etcd nothing.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        what: Cow<'static, str>,
        path: &str,
        name: &str,
    ) -> Result<Option<T>, FleetError> {
        let request = kube::core::Request::new(path).get(name, &GetParams::any());
        match self.fetch::<T>(request).await {
            Ok(Ok(object)) => Ok(Some(object)),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(None),
            Ok(Err(source)) => {
                Err(FleetError::Get { resource: what, name: name.to_owned(), source })
            }
            Err(Elapsed { .. }) => Err(FleetError::GetTimeout {
                resource: what,
                name: name.to_owned(),
                timeout: self.config.request_timeout,
            }),
        }
    }

    /// Lists the collection at `path` page by page (its objects, or a
    /// table's rows), handing each page's items to `fold`; `params` asking
    /// for the watch cache's version (`match_any`) are one page.
    /// With `optional`, a 403 or 404 on the first page is
    /// [`Listed::Unseen`]; any other failure ends the read.
    pub(crate) async fn list<P: Page>(
        &self,
        what: Cow<'static, str>,
        path: &str,
        optional: bool,
        mut params: ListParams,
        mut fold: impl FnMut(Vec<P::Item>),
    ) -> Result<Listed, FleetError> {
        let collection = kube::core::Request::new(path);
        // A list from the watch cache (`resourceVersion=0`) is served whole,
        // and kube-rs sends no version with a limit: it is one page.
        if params.resource_version.is_none() {
            params = params.limit(self.config.page_size);
        }
        let mut page = 0;
        loop {
            page += 1;
            let mut request = collection.list(&params);
            if P::TABLE
                && let Ok(request) = &mut request
            {
                without_objects(request);
            }
            let listed: P = match self.fetch(request).await {
                Ok(Ok(listed)) => listed,
                Ok(Err(kube::Error::Api(status)))
                    if optional && page == 1 && matches!(status.code, 403 | 404) =>
                {
                    debug!(resource = %what, code = status.code, "not seen");
                    return Ok(Listed::Unseen(status));
                }
                Ok(Err(source)) => return Err(FleetError::List { resource: what, page, source }),
                Err(Elapsed { .. }) => {
                    let timeout = self.config.request_timeout;
                    return Err(FleetError::Timeout { resource: what, page, timeout });
                }
            };
            let (items, token) = listed.into_parts();
            debug!(resource = %what, page, items = items.len(), "listed a page");
            fold(items);
            match token.filter(|token| !token.is_empty()) {
                None => return Ok(Listed::Read),
                Some(token) if params.continue_token.as_ref() == Some(&token) => {
                    return Err(FleetError::Paging { resource: what, page });
                }
                Some(token) => params.continue_token = Some(token),
            }
        }
    }
}

/// Asks for a list's `Table` without the objects: names and columns only.
fn without_objects(request: &mut http::Request<Vec<u8>>) {
    request.headers_mut().insert(ACCEPT, TABLE_OF_V1);
    let uri = request.uri().to_string();
    let separator = if uri.contains('?') { '&' } else { '?' };
    if let Ok(uri) = format!("{uri}{separator}includeObject=None").parse() {
        *request.uri_mut() = uri;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_page_is_read_into_rows_by_column_name() {
        // As kube-apiserver v1.36.2 answers for the CRD's printer columns.
        let table: Table = serde_json::from_value(serde_json::json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "812", "continue": "next"},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0},
                {"name": "Health", "type": "string", "format": "", "description": "", "priority": 0},
                {"name": "Failing", "type": "integer", "format": "", "description": "", "priority": 0},
                {"name": "Registered", "type": "string", "format": "", "description": "", "priority": 1},
            ],
            "rows": [
                {"cells": ["n1", "Failing", 2, "CSIPlugin:a"], "object": null},
                {"cells": ["n2", "Healthy", 0, null]},
            ],
        }))
        .unwrap();
        let (rows, token) = table.into_parts();
        assert_eq!(token.as_deref(), Some("next"));
        assert_eq!(rows[0].name(), Some("n1"));
        assert_eq!(rows[0].cell::<u32>("Failing"), Some(2));
        assert_eq!(rows[0].cell::<String>("Registered").as_deref(), Some("CSIPlugin:a"));
        assert_eq!(rows[1].cell::<String>("Registered"), None, "null: the field is not set");
        assert_eq!(rows[1].cell::<String>("Nope"), None);
    }

    #[test]
    fn a_table_is_asked_for_without_its_objects() {
        let request = kube::core::Request::new("/api/v1/nodes");
        let mut list = request.list(&ListParams::default().limit(500)).unwrap();
        without_objects(&mut list);
        assert_eq!(list.uri().to_string(), "/api/v1/nodes?&limit=500&includeObject=None");
        assert_eq!(list.headers()[ACCEPT], "application/json;as=Table;v=v1;g=meta.k8s.io");
    }
}
