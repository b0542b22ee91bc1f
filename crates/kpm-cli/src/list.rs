//! `kpm list`: the plugins of a running `kpm run`, as a table or JSON.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::status_api::model::{KubeObjectJson, KubernetesJson, PluginJson, PluginList};
use crate::status_api::{self, client};
use crate::{CliError, OutputFormat};

pub(crate) async fn list(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let body = client::get_json(status_socket, status_api::PLUGINS_PATH).await?;
    let list: PluginList = serde_json::from_slice(&body).map_err(|err| CliError::QueryStatus {
        path: status_socket.to_path_buf(),
        message: format!("unexpected response: {err}"),
    })?;
    let mut stdout = std::io::stdout().lock();
    let text = match output {
        OutputFormat::Json => {
            let mut json = serde_json::to_string_pretty(&list)
                .map_err(|err| CliError::Output(std::io::Error::other(err)))?;
            json.push('\n');
            json
        }
        OutputFormat::Table => table(&list),
    };
    stdout.write_all(text.as_bytes()).map_err(CliError::Output)
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
            p.registered_at.as_deref().map_or_else(|| "-".to_owned(), |at| age(at, now)),
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
                d.endpoint.clone(),
            ]
        });
        out.push('\n');
        out.push_str(&columns(&["CSI DRIVER", "VERSION", "NODE ID", "ENDPOINT"], drivers));
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
            let newest = d.instances.last();
            vec![
                d.name.clone(),
                format!("{connected}/{}", d.instances.len()),
                newest.map(|i| i.version.clone()).unwrap_or_default(),
                d.cleanup_pending_until.clone().unwrap_or_default(),
            ]
        });
        out.push('\n');
        out.push_str(&columns(&["DRA DRIVER", "CONNECTED", "VERSION", "CLEANUP AT"], drivers));
    }
    if let Some(kube) = &list.kubernetes {
        out.push('\n');
        out.push_str(&kubernetes(kube, now));
    }
    out
}

/// The node published for, per kind of object when it last synced and the
/// error that followed, if any; then the API requests made and failed.
fn kubernetes(kube: &KubernetesJson, now: SystemTime) -> String {
    let objects = kube.objects.iter().map(|object| {
        vec![
            object.kind.clone(),
            object.last_success.as_deref().map_or_else(|| "never".to_owned(), |at| ago(at, now)),
            current_error(object, now).unwrap_or_else(|| "-".to_owned()),
        ]
    });
    let total: u64 = kube.requests.iter().map(|r| r.count).sum();
    let failed: u64 = kube.requests.iter().filter(|r| r.failed()).map(|r| r.count).sum();
    format!(
        "Kubernetes (node {})\n{}API requests: {total}, failed: {failed}\n",
        kube.node,
        columns(&["KIND", "LAST SYNC", "LAST ERROR"], objects)
    )
}

/// The last error with how long ago it was, unless a success came after it:
/// an error is kept after later successes.
fn current_error(object: &KubeObjectJson, now: SystemTime) -> Option<String> {
    let error = object.last_error.as_ref()?;
    let succeeded_since = match (object.last_success.as_deref().and_then(parse), parse(&error.at)) {
        (Some(success), Some(failure)) => success >= failure,
        _ => false,
    };
    (!succeeded_since).then(|| format!("{} ({})", error.message, ago(&error.at, now)))
}

/// `42s ago`, or `?` for a time that does not parse.
fn ago(rfc3339: &str, now: SystemTime) -> String {
    parse(rfc3339).map_or_else(
        || "?".to_owned(),
        |at| format!("{} ago", whole(now.duration_since(at).unwrap_or_default())),
    )
}

/// The plugin's state, with when the next attempt is while it backs off:
/// `backing_off (retry in 8s)`.
fn state(plugin: &PluginJson, now: SystemTime) -> String {
    match &plugin.retry_at {
        Some(at) => {
            let wait = parse(at).map(|at| at.duration_since(now).unwrap_or_default());
            format!("{} (retry in {})", plugin.state, wait.map_or_else(|| "?".to_owned(), whole))
        }
        None => plugin.state.clone(),
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
    use super::*;
    use crate::status_api::model::{
        CsiDriverJson, DeviceResourceJson, DraDriverJson, DraInstanceJson, KubeErrorJson,
        KubeRequestJson, NodeJson,
    };

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
        let mut plugin = PluginJson {
            socket_path: "/r/n.sock".into(),
            plugin_type: String::new(),
            name: String::new(),
            endpoint: String::new(),
            versions: vec![],
            state: "backing_off".into(),
            generation: 1,
            last_error: Some("GetInfo: connection refused".into()),
            registered_at: None,
            retry_at: Some("2026-11-21T12:00:08.25Z".into()),
            server_pid: None,
        };
        assert_eq!(state(&plugin, now), "backing_off (retry in 8s)");
        plugin.retry_at = Some("2026-11-21T11:59:59Z".into());
        assert_eq!(state(&plugin, now), "backing_off (retry in 0s)");
        plugin.retry_at = None;
        plugin.state = "failed".into();
        assert_eq!(state(&plugin, now), "failed");
    }

    #[test]
    fn table_aligns_columns_and_shows_errors() {
        let plugin = |state: &str, name: &str, error: Option<&str>| PluginJson {
            socket_path: format!("/r/{name}.sock"),
            plugin_type: "DevicePlugin".into(),
            name: name.into(),
            endpoint: String::new(),
            versions: vec![],
            state: state.into(),
            generation: 1,
            last_error: error.map(str::to_owned),
            registered_at: None,
            retry_at: None,
            server_pid: None,
        };
        let mut list = PluginList {
            plugins: vec![plugin("registered", "gpu", None), plugin("failed", "n", Some("boom"))],
            csi_drivers: Vec::new(),
            node: NodeJson::default(),
            device_resources: Vec::new(),
            dra_drivers: Vec::new(),
            kubernetes: None,
        };
        assert_eq!(
            table(&list),
            "TYPE          NAME  STATE       AGE  SOCKET       LAST ERROR\n\
             DevicePlugin  gpu   registered  -    /r/gpu.sock\n\
             DevicePlugin  n     failed      -    /r/n.sock    boom\n"
        );
        list.plugins.clear();
        list.csi_drivers.push(CsiDriverJson {
            name: "csi.example.com".into(),
            endpoint: "/csi/csi.sock".into(),
            version: "1.0.0".into(),
            node_id: Some("node-1".into()),
            topology: std::collections::BTreeMap::new(),
            max_volumes: Some(16),
        });
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             CSI DRIVER       VERSION  NODE ID  ENDPOINT\n\
             csi.example.com  1.0.0    node-1   /csi/csi.sock\n"
        );
        list.csi_drivers.clear();
        list.device_resources.push(DeviceResourceJson {
            resource: "vendor.com/gpu".into(),
            endpoint: "/dp/gpu.sock".into(),
            healthy: 1,
            unhealthy: 1,
            devices: Vec::new(),
            removal_at: None,
        });
        list.dra_drivers.push(DraDriverJson {
            name: "gpu.example.com".into(),
            instances: vec![DraInstanceJson {
                endpoint: "/p/dra.sock".into(),
                version: "v1.DRAPlugin".into(),
                connected: true,
                registered_at: "T".into(),
            }],
            cleanup_pending_until: None,
            devices: Vec::new(),
        });
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             DEVICE RESOURCE  HEALTHY  ENDPOINT\n\
             vendor.com/gpu   1/2      /dp/gpu.sock\n\
             \n\
             DRA DRIVER       CONNECTED  VERSION       CLEANUP AT\n\
             gpu.example.com  1/1        v1.DRAPlugin\n"
        );
    }

    fn object(kind: &str, success: Option<&str>, error: Option<(&str, &str)>) -> KubeObjectJson {
        KubeObjectJson {
            kind: kind.into(),
            last_success: success.map(str::to_owned),
            last_error: error
                .map(|(at, message)| KubeErrorJson { at: at.into(), message: message.into() }),
        }
    }

    fn request(verb: &str, resource: &str, outcome: &str, count: u64) -> KubeRequestJson {
        KubeRequestJson {
            verb: verb.into(),
            resource: resource.into(),
            outcome: outcome.into(),
            count,
        }
    }

    #[test]
    fn kubernetes_section_shows_syncs_current_errors_and_failed_requests() {
        let now = humantime::parse_rfc3339("2026-11-21T12:00:00Z").unwrap();
        let missing = "node \"node1\" not found; kpm waits for it and never creates it";
        let kube = KubernetesJson {
            node: "node1".into(),
            objects: vec![
                object("Node", None, Some(("2026-11-21T11:59:57Z", missing))),
                // Failed, then synced: the error is history.
                object(
                    "CSINode",
                    Some("2026-11-21T11:59:30Z"),
                    Some(("2026-11-21T11:58:00Z", "409")),
                ),
                // Synced, then failed: the error is current.
                object(
                    "Node status",
                    Some("2026-11-21T11:00:00Z"),
                    Some(("2026-11-21T11:59:18Z", "timeout")),
                ),
                object("ResourceSlice", None, None),
            ],
            requests: vec![
                request("get", "nodes", "404", 2),
                request("patch", "nodes/status", "success", 3),
                request("patch", "nodes/status", "timeout", 1),
            ],
        };
        assert_eq!(
            kubernetes(&kube, now),
            format!(
                "Kubernetes (node node1)\n\
                 KIND           LAST SYNC  LAST ERROR\n\
                 Node           never      {missing} (3s ago)\n\
                 CSINode        30s ago    -\n\
                 Node status    1h ago     timeout (42s ago)\n\
                 ResourceSlice  never      -\n\
                 API requests: 6, failed: 3\n"
            )
        );
    }

    #[test]
    fn the_kubernetes_section_follows_the_plugins_only_when_kpm_publishes() {
        let mut list = PluginList {
            plugins: Vec::new(),
            csi_drivers: Vec::new(),
            node: NodeJson::default(),
            device_resources: Vec::new(),
            dra_drivers: Vec::new(),
            kubernetes: None,
        };
        assert!(!table(&list).contains("Kubernetes"), "{}", table(&list));
        list.kubernetes = Some(KubernetesJson {
            node: "node1".into(),
            objects: vec![object("Node", None, None)],
            requests: Vec::new(),
        });
        assert_eq!(
            table(&list),
            "TYPE  NAME  STATE  AGE  SOCKET  LAST ERROR\n\
             \n\
             Kubernetes (node node1)\n\
             KIND  LAST SYNC  LAST ERROR\n\
             Node  never      -\n\
             API requests: 0, failed: 0\n"
        );
    }
}
