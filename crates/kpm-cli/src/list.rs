//! `kpm list`: the plugins of a running `kpm run`, as a table or JSON.

use std::io::Write;
use std::path::Path;

use crate::status_api::{self, PluginList};
use crate::{CliError, OutputFormat};

pub(crate) async fn list(status_socket: &Path, output: OutputFormat) -> Result<(), CliError> {
    let body = status_api::get_json(status_socket, status_api::PLUGINS_PATH).await?;
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

/// Columns: STATE, TYPE, NAME, SOCKET, and the last error if any.
fn table(list: &PluginList) -> String {
    let rows: Vec<[String; 5]> = list
        .plugins
        .iter()
        .map(|p| {
            [
                p.state.clone(),
                p.plugin_type.clone(),
                p.name.clone(),
                p.socket_path.clone(),
                p.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let header = ["STATE", "TYPE", "NAME", "SOCKET", "LAST ERROR"].map(str::to_owned);
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> =
            row.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status_api::PluginJson;

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
        };
        let list = PluginList {
            plugins: vec![plugin("registered", "gpu", None), plugin("failed", "n", Some("boom"))],
        };
        assert_eq!(
            table(&list),
            "STATE       TYPE          NAME  SOCKET       LAST ERROR\n\
             registered  DevicePlugin  gpu   /r/gpu.sock\n\
             failed      DevicePlugin  n     /r/n.sock    boom\n"
        );
    }
}
