//! `kpm list`: the plugins of a running `kpm run`, as a table or JSON.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::status_api::{self, client};
use crate::{CliError, OutputFormat};

pub(crate) async fn list(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let body = client::get_json(status_socket, status_api::PLUGINS_PATH).await?;
    let list: Value = serde_json::from_slice(&body).map_err(|err| CliError::QueryStatus {
        path: status_socket.to_path_buf(),
        message: format!("unexpected response: {err}"),
    })?;
    crate::output::print(&output.render(&list, table)?)
}

/// The string at `key` of `value`; empty when absent or not a string.
fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}

/// The array at `key` of `value`; empty when absent.
fn items<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value[key].as_array().map_or(&[], Vec::as_slice)
}

/// The plugins (type, name, state, age, socket, last error), then whichever
/// of CSI drivers, device resources and DRA drivers there are, then how
/// publishing to the Kubernetes API goes, when kpm publishes. `list` is the
/// document of `GET /v1/plugins`.
pub(crate) fn table(list: &Value) -> String {
    let now = SystemTime::now();
    let plugins = items(list, "plugins").iter().map(|p| {
        vec![
            text(p, "type"),
            text(p, "name"),
            state(p, now),
            p["registered_at"].as_str().map_or_else(|| "-".to_owned(), |at| age(at, now)),
            text(p, "socket_path"),
            text(p, "last_error"),
        ]
    });
    let mut out = columns(&["TYPE", "NAME", "STATE", "AGE", "SOCKET", "LAST ERROR"], plugins);
    let csi_drivers = items(list, "csi_drivers");
    if !csi_drivers.is_empty() {
        let drivers = csi_drivers.iter().map(|d| {
            vec![
                text(d, "name"),
                text(d, "version"),
                text(d, "node_id"),
                d["max_volumes"]
                    .as_i64()
                    .filter(|max| *max > 0)
                    .map_or("-".into(), |max| max.to_string()),
                refreshed(d, now),
                text(d, "endpoint"),
            ]
        });
        out.push('\n');
        let header = ["CSI DRIVER", "VERSION", "NODE ID", "MAX VOLUMES", "REFRESHED", "ENDPOINT"];
        out.push_str(&columns(&header, drivers));
    }
    let device_resources = items(list, "device_resources");
    if !device_resources.is_empty() {
        let resources = device_resources.iter().map(|r| {
            let count = |key: &str| r[key].as_u64().unwrap_or_default();
            let total = count("healthy") + count("unhealthy");
            vec![text(r, "resource"), format!("{}/{total}", count("healthy")), text(r, "endpoint")]
        });
        out.push('\n');
        out.push_str(&columns(&["DEVICE RESOURCE", "HEALTHY", "ENDPOINT"], resources));
    }
    let dra_drivers = items(list, "dra_drivers");
    if !dra_drivers.is_empty() {
        let drivers = dra_drivers.iter().map(|d| {
            let instances = items(d, "instances");
            let connected = instances.iter().filter(|i| i["connected"] == true).count();
            let mut row = vec![
                text(d, "name"),
                format!("{connected}/{}", instances.len()),
                instances.last().map(|i| text(i, "version")).unwrap_or_default(),
            ];
            row.extend(device_health(items(d, "devices")));
            row.push(text(d, "cleanup_pending_until"));
            row
        });
        out.push('\n');
        let header =
            ["DRA DRIVER", "CONNECTED", "VERSION", "HEALTHY", "UNHEALTHY", "UNKNOWN", "CLEANUP AT"];
        out.push_str(&columns(&header, drivers));
    }
    if list["kubernetes"].is_object() {
        out.push('\n');
        out.push_str(&kubernetes(&list["kubernetes"], now));
    }
    out
}

/// How many of a DRA driver's devices are `Healthy`, `Unhealthy` and
/// `Unknown` (an expired report among them); `-` for a driver that reported
/// none (or has no health service).
fn device_health(devices: &[Value]) -> [String; 3] {
    ["Healthy", "Unhealthy", "Unknown"].map(|health| {
        if devices.is_empty() {
            return "-".to_owned();
        }
        devices.iter().filter(|device| device["health"] == health).count().to_string()
    })
}

/// The node published for, per kind of object when it last synced and the
/// error that followed, if any; what the API server does not hold yet;
/// then the API requests made and failed.
fn kubernetes(kube: &Value, now: SystemTime) -> String {
    let objects = items(kube, "objects").iter().map(|object| {
        vec![
            text(object, "kind"),
            object["last_success"].as_str().map_or_else(|| "never".to_owned(), |at| ago(at, now)),
            current_error(object, now).unwrap_or_else(|| "-".to_owned()),
        ]
    });
    let requests = items(kube, "requests");
    let count = |r: &Value| r["count"].as_u64().unwrap_or_default();
    let total: u64 = requests.iter().map(count).sum();
    let failed: u64 = requests
        .iter()
        .filter(|r| r["outcome"] != kpm::kube::RequestCount::SUCCESS)
        .map(count)
        .sum();
    let pending = items(kube, "pending");
    let pending = if pending.is_empty() {
        "Pending: none: the API server holds all kpm publishes\n".to_owned()
    } else {
        let rows = pending.iter().map(|publication| {
            vec![
                text(publication, "kind"),
                text(publication, "name"),
                text(publication, "want"),
                ago(&text(publication, "since"), now),
                publication["last_error"].as_str().unwrap_or("-").to_owned(),
            ]
        });
        format!("Pending:\n{}", columns(&["KIND", "NAME", "WANT", "SINCE", "LAST ERROR"], rows))
    };
    format!(
        "Kubernetes (node {})\n{}{pending}API requests: {total}, failed: {failed}\n",
        text(kube, "node"),
        columns(&["KIND", "LAST SYNC", "LAST ERROR"], objects)
    )
}

/// The last error with how long ago it was, unless a success came after it:
/// an error is kept after later successes.
fn current_error(object: &Value, now: SystemTime) -> Option<String> {
    let error = object.get("last_error").filter(|error| error.is_object())?;
    let at = text(error, "at");
    let succeeded_since = match (object["last_success"].as_str().and_then(parse), parse(&at)) {
        (Some(success), Some(failure)) => success >= failure,
        _ => false,
    };
    (!succeeded_since).then(|| format!("{} ({})", text(error, "message"), ago(&at, now)))
}

/// `42s ago`, or `?` for a time that does not parse.
fn ago(rfc3339: &str, now: SystemTime) -> String {
    parse(rfc3339).map_or_else(
        || "?".to_owned(),
        |at| format!("{} ago", whole(now.duration_since(at).unwrap_or_default())),
    )
}

/// A CSI driver's allocatable refresh: `every 10s, 4s ago`, `every 10s,
/// never` before the first, `-` without one.
fn refreshed(driver: &Value, now: SystemTime) -> String {
    let Some(period) = driver["allocatable_update_period_s"].as_u64() else {
        return "-".to_owned();
    };
    let last =
        driver["allocatable_refreshed_at"].as_str().map_or("never".into(), |at| ago(at, now));
    format!("every {}, {last}", whole(Duration::from_secs(period)))
}

/// The plugin's state, with when the next attempt is while it backs off:
/// `backing_off (retry in 8s)`.
fn state(plugin: &Value, now: SystemTime) -> String {
    let state = text(plugin, "state");
    match plugin["retry_at"].as_str() {
        Some(at) => {
            let wait = parse(at).map(|at| at.duration_since(now).unwrap_or_default());
            format!("{state} (retry in {})", wait.map_or_else(|| "?".to_owned(), whole))
        }
        None => state,
    }
}

/// How long ago an RFC 3339 time was.
fn age(rfc3339: &str, now: SystemTime) -> String {
    parse(rfc3339)
        .map_or_else(|| "?".to_owned(), |at| whole(now.duration_since(at).unwrap_or_default()))
}

fn parse(rfc3339: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(rfc3339).ok()
}

/// A duration in its largest whole unit: `42s`, `5m`, `3h`, `2d`.
fn whole(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// Left-aligned columns two spaces apart, without trailing blanks.
fn columns(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(header).add_rows(rows);
    table.column_iter_mut().for_each(|column| {
        column.set_padding((0, 2));
    });
    table.trim_fmt() + "\n"
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ages_use_the_largest_whole_unit() {
        let now = humantime::parse_rfc3339("2026-11-21T12:00:00Z").unwrap();
        assert_eq!(age("2026-11-21T11:59:18Z", now), "42s");
        assert_eq!(age("2026-11-21T11:55:00.5Z", now), "4m");
        assert_eq!(age("2026-11-21T09:00:00Z", now), "3h");
        assert_eq!(age("2026-11-19T12:00:00Z", now), "2d");
        assert_eq!(age("yesterday", now), "?");
    }

    #[test]
    fn a_plugin_backing_off_shows_when_it_is_retried() {
        let now = humantime::parse_rfc3339("2026-11-21T12:00:00Z").unwrap();
        let mut plugin = json!({
            "socket_path": "/r/n.sock", "type": "", "name": "", "endpoint": "", "versions": [],
            "state": "backing_off", "generation": 1,
            "last_error": "GetInfo: connection refused", "registered_at": null,
            "retry_at": "2026-11-21T12:00:08.25Z", "server_pid": null,
        });
        assert_eq!(state(&plugin, now), "backing_off (retry in 8s)");
        plugin["retry_at"] = json!("2026-11-21T11:59:59Z");
        assert_eq!(state(&plugin, now), "backing_off (retry in 0s)");
        plugin["retry_at"] = Value::Null;
        plugin["state"] = json!("failed");
        assert_eq!(state(&plugin, now), "failed");
    }

    /// An empty document of `GET /v1/plugins`.
    fn empty() -> Value {
        json!({
            "plugins": [], "csi_drivers": [],
            "node": {"annotations": {}, "labels": {}, "csinode": {"drivers": []}},
            "device_resources": [], "dra_drivers": [], "kubernetes": null,
        })
    }

    #[test]
    fn table_aligns_columns_and_shows_errors() {
        let plugin = |state: &str, name: &str, error: Option<&str>| {
            json!({
                "socket_path": format!("/r/{name}.sock"), "type": "DevicePlugin", "name": name,
                "endpoint": "", "versions": [], "state": state, "generation": 1,
                "last_error": error, "registered_at": null, "retry_at": null, "server_pid": null,
            })
        };
        let mut list = empty();
        list["plugins"] =
            json!([plugin("registered", "gpu", None), plugin("failed", "n", Some("boom"))]);
        assert_eq!(
            table(&list),
            "TYPE          NAME  STATE       AGE  SOCKET       LAST ERROR\n\
             DevicePlugin  gpu   registered  -    /r/gpu.sock\n\
             DevicePlugin  n     failed      -    /r/n.sock    boom\n"
        );
        list["plugins"] = json!([]);
        let two_minutes_ago = SystemTime::now() - Duration::from_secs(120);
        let refreshed_at = humantime::format_rfc3339_millis(two_minutes_ago).to_string();
        list["csi_drivers"] = json!([{
            "name": "csi.example.com", "endpoint": "/csi/csi.sock", "version": "1.0.0",
            "node_id": "node-1", "topology": {}, "max_volumes": 16,
            "allocatable_update_period_s": 60, "allocatable_refreshed_at": refreshed_at,
        }, {
            "name": "b.example.com", "endpoint": "/csi/b.sock", "version": "1.0.0",
            "node_id": "node-1", "topology": {}, "max_volumes": 0,
            "allocatable_update_period_s": 10, "allocatable_refreshed_at": null,
        }, {
            "name": "c.example.com", "endpoint": "/csi/c.sock", "version": "1.0.0",
            "node_id": "node-1", "topology": {}, "max_volumes": null,
            "allocatable_update_period_s": null, "allocatable_refreshed_at": null,
        }]);
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             CSI DRIVER       VERSION  NODE ID  MAX VOLUMES  REFRESHED         ENDPOINT\n\
             csi.example.com  1.0.0    node-1   16           every 1m, 2m ago  /csi/csi.sock\n\
             b.example.com    1.0.0    node-1   -            every 10s, never  /csi/b.sock\n\
             c.example.com    1.0.0    node-1   -            -                 /csi/c.sock\n"
        );
        list["csi_drivers"] = json!([]);
        list["device_resources"] = json!([{
            "resource": "vendor.com/gpu", "endpoint": "/dp/gpu.sock", "healthy": 1,
            "unhealthy": 1, "devices": [],
        }]);
        let device = |name: &str, health: &str| {
            json!({"pool": "pool", "device": name, "health": health, "message": "",
                   "reported_at": "T", "expires_at": null})
        };
        list["dra_drivers"] = json!([
            {
                "name": "gpu.example.com",
                "instances": [{"endpoint": "/p/dra.sock", "version": "v1.DRAPlugin",
                               "connected": true, "registered_at": "T"}],
                "cleanup_pending_until": null,
                "devices": [device("gpu-0", "Healthy"), device("gpu-1", "Unknown"),
                            device("gpu-2", "Healthy")],
            },
            {
                "name": "nic.example.com",
                "instances": [{"endpoint": "/p/nic.sock", "version": "v1beta1.DRAPlugin",
                               "connected": true, "registered_at": "T"}],
                "cleanup_pending_until": null,
            },
        ]);
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             DEVICE RESOURCE  HEALTHY  ENDPOINT\n\
             vendor.com/gpu   1/2      /dp/gpu.sock\n\
             \n\
             DRA DRIVER       CONNECTED  VERSION            HEALTHY  UNHEALTHY  UNKNOWN  CLEANUP AT\n\
             gpu.example.com  1/1        v1.DRAPlugin       2        0          1\n\
             nic.example.com  1/1        v1beta1.DRAPlugin  -        -          -\n"
        );
    }

    fn object(kind: &str, success: Option<&str>, error: Option<(&str, &str)>) -> Value {
        json!({
            "kind": kind,
            "last_success": success,
            "last_error": error.map(|(at, message)| json!({"at": at, "message": message})),
        })
    }

    fn request(verb: &str, resource: &str, outcome: &str, count: u64) -> Value {
        json!({"verb": verb, "resource": resource, "outcome": outcome, "count": count})
    }

    #[test]
    fn kubernetes_section_shows_syncs_current_errors_and_failed_requests() {
        let now = humantime::parse_rfc3339("2026-11-21T12:00:00Z").unwrap();
        let missing = "node \"node1\" not found; kpm waits for it and never creates it";
        let kube = json!({
            "node": "node1",
            "objects": [
                object("Node", None, Some(("2026-11-21T11:59:57Z", missing))),
                // Failed, then synced: the error is history.
                object("CSINode", Some("2026-11-21T11:59:30Z"), Some(("2026-11-21T11:58:00Z", "409"))),
                // Synced, then failed: the error is current.
                object(
                    "Node status",
                    Some("2026-11-21T11:00:00Z"),
                    Some(("2026-11-21T11:59:18Z", "timeout")),
                ),
                object("ResourceSlice", None, None),
            ],
            "requests": [
                request("get", "nodes", "404", 2),
                request("patch", "nodes/status", "success", 3),
                request("patch", "nodes/status", "timeout", 1),
            ],
            "pending": [{"kind": "Node status", "name": "vendor.com/gpu",
                "want": "capacity 2, allocatable 2", "since": "2026-11-21T11:59:18Z",
                "last_error": missing}],
        });
        assert_eq!(
            kubernetes(&kube, now),
            format!(
                "Kubernetes (node node1)\n\
                 KIND           LAST SYNC  LAST ERROR\n\
                 Node           never      {missing} (3s ago)\n\
                 CSINode        30s ago    -\n\
                 Node status    1h ago     timeout (42s ago)\n\
                 ResourceSlice  never      -\n\
                 Pending:\n\
                 KIND         NAME            WANT                       SINCE    LAST ERROR\n\
                 Node status  vendor.com/gpu  capacity 2, allocatable 2  42s ago  {missing}\n\
                 API requests: 6, failed: 3\n"
            )
        );
    }

    #[test]
    fn the_kubernetes_section_follows_the_plugins_only_when_kpm_publishes() {
        let mut list = empty();
        assert!(!table(&list).contains("Kubernetes"), "{}", table(&list));
        list["kubernetes"] =
            json!({"node": "node1", "objects": [object("Node", None, None)], "requests": []});
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             Kubernetes (node node1)\n\
             KIND  LAST SYNC  LAST ERROR\n\
             Node  never      -\n\
             Pending: none: the API server holds all kpm publishes\n\
             API requests: 0, failed: 0\n"
        );
    }
}
