//! `kpm list`: the plugins of a running `kpm run`, as a table or JSON.

use std::path::Path;
use std::time::{Duration, SystemTime};

use kpm_status::model::{CsiDriver, DraDevice, Kubernetes, ObjectSync, Plugin};
use kpm_status::{Client, PluginList};

use crate::error::CliError;
use crate::output::OutputFormat;

pub(crate) async fn list(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let list = Client::new(status_socket).plugins().await?;
    crate::output::print(&output.render(&list, table)?)
}

/// The plugins (type, name, state, age, socket, last error), then whichever
/// of CSI drivers, device resources and DRA drivers there are, then how
/// publishing to the Kubernetes API goes, when kpm publishes.
pub(crate) fn table(list: &PluginList) -> String {
    let now = SystemTime::now();
    let plugins = list.plugins.iter().map(|p| {
        vec![
            p.plugin_type.clone(),
            p.name.clone(),
            state(p, now),
            p.registered_at.map_or_else(|| "-".to_owned(), |at| age(at.0, now)),
            p.socket_path.clone(),
            p.last_error.clone().unwrap_or_default(),
        ]
    });
    let mut out = columns(&["TYPE", "NAME", "STATE", "AGE", "SOCKET", "LAST ERROR"], plugins);
    if !list.csi_drivers.is_empty() {
        let drivers = list.csi_drivers.iter().map(|d| {
            vec![
                d.name.clone(),
                d.version.clone(),
                d.node_id.clone().unwrap_or_default(),
                d.max_volumes.filter(|max| *max > 0).map_or("-".into(), |max| max.to_string()),
                refreshed(d, now),
                d.endpoint.clone(),
            ]
        });
        out.push('\n');
        let header = ["CSI DRIVER", "VERSION", "NODE ID", "MAX VOLUMES", "REFRESHED", "ENDPOINT"];
        out.push_str(&columns(&header, drivers));
    }
    if !list.device_resources.is_empty() {
        let resources = list.device_resources.iter().map(|r| {
            let total = r.healthy + r.unhealthy;
            vec![r.resource.clone(), format!("{}/{total}", r.healthy), r.endpoint.clone()]
        });
        out.push('\n');
        out.push_str(&columns(&["DEVICE RESOURCE", "HEALTHY", "ENDPOINT"], resources));
    }
    if !list.dra_drivers.is_empty() {
        let drivers = list.dra_drivers.iter().map(|d| {
            let connected = d.instances.iter().filter(|i| i.connected).count();
            let mut row = vec![
                d.name.clone(),
                format!("{connected}/{}", d.instances.len()),
                d.instances.last().map(|i| i.version.clone()).unwrap_or_default(),
            ];
            row.extend(device_health(&d.devices));
            row.push(d.cleanup_pending_until.map(|at| rfc3339(at.0)).unwrap_or_default());
            row
        });
        out.push('\n');
        let header =
            ["DRA DRIVER", "CONNECTED", "VERSION", "HEALTHY", "UNHEALTHY", "UNKNOWN", "CLEANUP AT"];
        out.push_str(&columns(&header, drivers));
    }
    if let Some(kube) = &list.kubernetes {
        out.push('\n');
        out.push_str(&kubernetes(kube, now));
    }
    out
}

/// How many of a DRA driver's devices are `Healthy`, `Unhealthy` and
/// `Unknown` (an expired report among them); `-` for a driver that reported
/// none (or has no health service).
fn device_health(devices: &[DraDevice]) -> [String; 3] {
    ["Healthy", "Unhealthy", "Unknown"].map(|health| {
        if devices.is_empty() {
            return "-".to_owned();
        }
        devices.iter().filter(|device| device.health == health).count().to_string()
    })
}

/// The node published for, per kind of object when it last synced and the
/// error that followed, if any; what the API server does not hold yet;
/// then the API requests made and failed.
fn kubernetes(kube: &Kubernetes, now: SystemTime) -> String {
    let objects = kube.objects.iter().map(|object| {
        vec![
            object.kind.clone(),
            object.last_success.map_or_else(|| "never".to_owned(), |at| ago(at.0, now)),
            current_error(object, now).unwrap_or_else(|| "-".to_owned()),
        ]
    });
    let total: u64 = kube.requests.iter().map(|r| r.count).sum();
    let failed: u64 = kube
        .requests
        .iter()
        .filter(|r| r.outcome != kpm::kube::RequestCount::SUCCESS)
        .map(|r| r.count)
        .sum();
    let pending = if kube.pending.is_empty() {
        "Pending: none: the API server holds all kpm publishes\n".to_owned()
    } else {
        let rows = kube.pending.iter().map(|publication| {
            vec![
                publication.kind.to_string(),
                publication.name.clone(),
                publication.want.clone(),
                ago(publication.since, now),
                publication.last_error.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        });
        format!("Pending:\n{}", columns(&["KIND", "NAME", "WANT", "SINCE", "LAST ERROR"], rows))
    };
    format!(
        "Kubernetes (node {})\n{}{pending}API requests: {total}, failed: {failed}\n",
        kube.node,
        columns(&["KIND", "LAST SYNC", "LAST ERROR"], objects)
    )
}

/// The last error with how long ago it was, unless a success came after it:
/// an error is kept after later successes.
fn current_error(object: &ObjectSync, now: SystemTime) -> Option<String> {
    let error = object.last_error.as_ref()?;
    let succeeded_since = object.last_success.is_some_and(|success| success.0 >= error.at.0);
    (!succeeded_since).then(|| format!("{} ({})", error.message, ago(error.at.0, now)))
}

/// `42s ago`.
fn ago(at: SystemTime, now: SystemTime) -> String {
    format!("{} ago", age(at, now))
}

/// A CSI driver's allocatable refresh: `every 10s, 4s ago`, `every 10s,
/// never` before the first, `-` without one.
fn refreshed(driver: &CsiDriver, now: SystemTime) -> String {
    let Some(period) = driver.allocatable_update_period_s else {
        return "-".to_owned();
    };
    let last = driver.allocatable_refreshed_at.map_or("never".into(), |at| ago(at.0, now));
    format!("every {}, {last}", whole(Duration::from_secs(period)))
}

/// The plugin's state, with when the next attempt is while it backs off:
/// `backing_off (retry in 8s)`.
fn state(plugin: &Plugin, now: SystemTime) -> String {
    match plugin.retry_at {
        Some(at) => {
            let wait = at.0.duration_since(now).unwrap_or_default();
            format!("{} (retry in {})", plugin.state, whole(wait))
        }
        None => plugin.state.clone(),
    }
}

/// How long ago `at` was.
fn age(at: SystemTime, now: SystemTime) -> String {
    whole(now.duration_since(at).unwrap_or_default())
}

/// `at` as the status API writes it (RFC 3339, UTC, milliseconds).
fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
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
    use serde_json::{Value, json};

    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    /// The status API's document, as `kpm list` reads it.
    fn read(list: &Value) -> PluginList {
        serde_json::from_value(list.clone()).unwrap()
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        let now = humantime::parse_rfc3339("2026-11-21T12:00:00Z").unwrap();
        assert_eq!(age(at("2026-11-21T11:59:18Z"), now), "42s");
        assert_eq!(age(at("2026-11-21T11:55:00.5Z"), now), "4m");
        assert_eq!(age(at("2026-11-21T09:00:00Z"), now), "3h");
        assert_eq!(age(at("2026-11-19T12:00:00Z"), now), "2d");
        assert_eq!(age(at("2026-11-21T12:00:01Z"), now), "0s");
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
        let state = |plugin: &Value| state(&serde_json::from_value(plugin.clone()).unwrap(), now);
        assert_eq!(state(&plugin), "backing_off (retry in 8s)");
        plugin["retry_at"] = json!("2026-11-21T11:59:59Z");
        assert_eq!(state(&plugin), "backing_off (retry in 0s)");
        plugin["retry_at"] = Value::Null;
        plugin["state"] = json!("failed");
        assert_eq!(state(&plugin), "failed");
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
            table(&read(&list)),
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
            table(&read(&list)),
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
                   "reported_at": "2026-11-21T12:00:00Z", "expires_at": null})
        };
        list["dra_drivers"] = json!([
            {
                "name": "gpu.example.com",
                "instances": [{"endpoint": "/p/dra.sock", "version": "v1.DRAPlugin",
                               "connected": true, "registered_at": "2026-11-21T12:00:00Z"}],
                "cleanup_pending_until": null,
                "devices": [device("gpu-0", "Healthy"), device("gpu-1", "Unknown"),
                            device("gpu-2", "Healthy")],
            },
            {
                "name": "nic.example.com",
                "instances": [{"endpoint": "/p/nic.sock", "version": "v1beta1.DRAPlugin",
                               "connected": true, "registered_at": "2026-11-21T12:00:00Z"}],
                "cleanup_pending_until": null,
            },
        ]);
        assert_eq!(
            table(&read(&list)),
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
                "want": "capacity 2, allocatable 2", "removes": false, "since": "2026-11-21T11:59:18Z",
                "last_error": missing}],
        });
        assert_eq!(
            kubernetes(&serde_json::from_value(kube).unwrap(), now),
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
        assert!(!table(&read(&list)).contains("Kubernetes"), "{}", table(&read(&list)));
        list["kubernetes"] =
            json!({"node": "node1", "objects": [object("Node", None, None)], "requests": []});
        assert_eq!(
            table(&read(&list)),
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
