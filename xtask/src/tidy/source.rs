//! Line rules for every Rust source file: a module doc, no trailing
//! whitespace, no ignored tests, no gRPC server on a plain Unix listener.

use std::path::Path;

/// Where a gRPC server may accept on a plain Unix listener: `kpm_transport`
/// itself, and the test that shows h2 alone refuses grpc-go's `:authority`.
/// Everything else accepts through `kpm_transport::bind` or `Incoming`.
const PLAIN_LISTENERS_ALLOWED: &[&str] =
    &["crates/kpm-transport/src/", "tests/tests/grpc_go_authority.rs"];

pub(super) fn check_source(root: &Path, file: &Path, text: &str, problems: &mut Vec<String>) {
    let relative = file.strip_prefix(root).unwrap_or(file);
    let shown = relative.display();
    let plain_listener_allowed = PLAIN_LISTENERS_ALLOWED
        .iter()
        .any(|allowed| relative.to_string_lossy().starts_with(allowed));
    if !text.starts_with("//!") {
        problems.push(format!("{shown}: does not start with a `//!` module doc"));
    }
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        if line.ends_with(' ') || line.ends_with('\t') {
            problems.push(format!("{shown}:{number}: trailing whitespace"));
        }
        // Split so that this file does not trip its own rule.
        for banned in [concat!("#[", "ignore"), concat!("#[", "should_panic")] {
            if line.trim_start().starts_with(banned) {
                problems.push(format!("{shown}:{number}: `{banned}]` is not allowed"));
            }
        }
        if !plain_listener_allowed && line.contains(concat!("UnixListener", "Stream")) {
            problems.push(format!(
                "{shown}:{number}: a gRPC server accepts through `kpm_transport::bind` or \
                 `kpm_transport::Incoming`, which take any `:authority`"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_module_doc_and_banned_attributes_are_reported() {
        let mut problems = Vec::new();
        let text = format!("fn main() {{}} \n{}]\n", concat!("#[", "ignore"));
        check_source(Path::new("/r"), Path::new("/r/a.rs"), &text, &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn a_grpc_server_on_a_plain_listener_is_reported() {
        let text = format!(
            "//! Doc.\nlet incoming = {}::new(listener);\n",
            concat!("UnixListener", "Stream")
        );
        let mut problems = Vec::new();
        check_source(Path::new("/r"), Path::new("/r/crates/kpm-x/src/a.rs"), &text, &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        problems.clear();
        check_source(
            Path::new("/r"),
            Path::new("/r/crates/kpm-transport/src/uds/a.rs"),
            &text,
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:?}");
    }
}
