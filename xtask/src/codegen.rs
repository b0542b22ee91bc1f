//! Protobuf code generation with protox (a protobuf compiler in Rust, so no
//! system `protoc`) and tonic-prost-build. The output is checked in under
//! `crates/kpm-api/src/gen`, one file per proto package.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;

/// Proto sources, relative to `proto/`.
const PROTOS: &[&str] = &[
    "pluginregistration/v1/api.proto",
    "deviceplugin/v1beta1/api.proto",
    "dra/v1beta1/api.proto",
    "dra/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
    "csi/v1/csi.proto",
    "cri/v1/api.proto",
];

const OUT_DIR: &str = "crates/kpm-api/src/gen";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Write,
    Check,
}

pub(crate) fn run(root: &Path, mode: Mode) -> Result {
    let checked_in = root.join(OUT_DIR);
    match mode {
        Mode::Write => {
            fs::create_dir_all(&checked_in)?;
            generate(root, &checked_in)?;
            println!("codegen: wrote {}", checked_in.display());
            Ok(())
        }
        Mode::Check => {
            let fresh = tempfile::tempdir()?;
            generate(root, fresh.path())?;
            let stale = compare(&read_dir(fresh.path())?, &read_dir(&checked_in)?);
            if stale.is_empty() {
                println!("codegen: {} is up to date", checked_in.display());
                Ok(())
            } else {
                Err(format!(
                    "generated code in {} is stale ({}); run `cargo xtask codegen`",
                    checked_in.display(),
                    stale.join(", ")
                )
                .into())
            }
        }
    }
}

fn generate(root: &Path, out_dir: &Path) -> Result {
    let proto_dir = root.join("proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_dir.join(p)).collect();
    let descriptors = protox::compile(&files, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Keep kpm-api transport-agnostic: callers bring their own channel.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_fds(descriptors)?;
    Ok(())
}

fn read_dir(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    if !dir.exists() {
        return Ok(files);
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        files.insert(entry.file_name().to_string_lossy().into_owned(), fs::read(entry.path())?);
    }
    Ok(files)
}

/// Names of the files that differ between the fresh and the checked-in set.
fn compare(
    fresh: &BTreeMap<String, Vec<u8>>,
    checked_in: &BTreeMap<String, Vec<u8>>,
) -> Vec<String> {
    let mut stale = Vec::new();
    for (name, content) in fresh {
        match checked_in.get(name) {
            Some(existing) if existing == content => {}
            Some(_) => stale.push(format!("{name} differs")),
            None => stale.push(format!("{name} missing")),
        }
    }
    stale.extend(
        checked_in
            .keys()
            .filter(|name| !fresh.contains_key(*name))
            .map(|name| format!("{name} is extra")),
    );
    stale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_names_every_kind_of_difference() {
        let fresh = BTreeMap::from([
            ("a.rs".to_owned(), b"1".to_vec()),
            ("b.rs".to_owned(), b"2".to_vec()),
        ]);
        let checked_in = BTreeMap::from([
            ("a.rs".to_owned(), b"0".to_vec()),
            ("c.rs".to_owned(), b"3".to_vec()),
        ]);
        assert_eq!(compare(&fresh, &checked_in), ["a.rs differs", "b.rs missing", "c.rs is extra"]);
        assert!(compare(&fresh, &fresh).is_empty());
    }

    #[test]
    fn checked_in_code_is_fresh() {
        run(&crate::project_root(), Mode::Check).unwrap();
    }
}
