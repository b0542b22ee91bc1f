//! Registration socket names, and their paths checked against the Unix socket
//! path limit.

use std::path::{Path, PathBuf};

use kpm_api::constants::MAX_SOCKET_PATH_BYTES;

use crate::RegistrarError;

/// Suffix of every registration socket file name, as node-driver-registrar
/// and the DRA kubelet-plugin helper name theirs.
pub const SOCKET_SUFFIX: &str = "-reg.sock";

/// The file name of a plugin's registration socket: `<name>-reg.sock`, or
/// `<name>-<uid>-reg.sock` with a (non-empty) rolling-update uid, so that two
/// instances of one driver can be registered side by side during an update.
///
/// Plugin names may contain `/` (device plugins are named after extended
/// resources such as `vendor.com/gpu`), which a file name cannot: every `/`
/// and NUL in `name` and `uid` becomes `_`. A leading `.` also becomes `_`,
/// because the node agent ignores dot-files in its registry directory. Only the
/// file name changes; `GetInfo` still reports the name as given.
///
/// ```
/// use kpm_registrar::socket_file_name;
///
/// assert_eq!(socket_file_name("vendor.com/gpu", None), "vendor.com_gpu-reg.sock");
/// assert_eq!(socket_file_name("dra.example.com", Some("f00d")), "dra.example.com-f00d-reg.sock");
/// ```
pub fn socket_file_name(name: &str, rolling_update_uid: Option<&str>) -> String {
    let mut file = sanitize(name);
    if let Some(uid) = rolling_update_uid.filter(|uid| !uid.is_empty()) {
        file.push('-');
        file.push_str(&sanitize(uid));
    }
    file.push_str(SOCKET_SUFFIX);
    if file.starts_with('.') {
        file.replace_range(..1, "_");
    }
    file
}

/// `dir/file`, provided it fits in `sun_path`.
pub(crate) fn socket_path(dir: &Path, file: &str) -> Result<PathBuf, RegistrarError> {
    let path = dir.join(file);
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(RegistrarError::SocketPathTooLong { path, len, max: MAX_SOCKET_PATH_BYTES });
    }
    Ok(path)
}

fn sanitize(part: &str) -> String {
    part.chars().map(|c| if c == '/' || c == '\0' { '_' } else { c }).collect()
}
