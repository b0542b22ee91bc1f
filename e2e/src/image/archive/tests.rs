//! The archive's bytes, blobs, digests and layer, from small files of a temp dir.

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::Value;

use super::*;

/// An image of two small files and `/tmp`, its inputs in `dir`.
fn image(dir: &Path) -> Image {
    let program = dir.join("program");
    let data = dir.join("data");
    fs::write(&program, "#!/not/run\n").unwrap();
    fs::write(&data, "some data\n").unwrap();
    let mut image = Image::new("example.com/tools/probe:1.2").unwrap();
    image.files = vec![
        ImageFile { source: program, path: "/usr/local/bin/probe".to_owned(), mode: 0o755 },
        ImageFile { source: data, path: "/etc/probe/data".to_owned(), mode: 0o640 },
    ];
    image.tmp_dir = true;
    image.entrypoint = vec!["/usr/local/bin/probe".to_owned()];
    image.cmd = vec!["serve".to_owned()];
    image.user = Some("65532:65532".to_owned());
    image.architecture = "amd64".to_owned();
    image.timestamp = 0;
    image
}

/// What a tar entry's header says, and its bytes.
#[derive(Debug)]
struct TarEntry {
    kind: tar::EntryType,
    mode: u32,
    owner: (u64, u64),
    mtime: u64,
    bytes: Vec<u8>,
}

/// A tar archive's entries, in its order, each path once.
fn entries(tar_bytes: &[u8]) -> Vec<(String, TarEntry)> {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut entries: Vec<(String, TarEntry)> = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header().clone();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        let path = entry.path().unwrap().to_string_lossy().trim_end_matches('/').to_owned();
        assert!(entries.iter().all(|(seen, _)| *seen != path), "{path} twice");
        let metadata = TarEntry {
            kind: header.entry_type(),
            mode: header.mode().unwrap(),
            owner: (header.uid().unwrap(), header.gid().unwrap()),
            mtime: header.mtime().unwrap(),
            bytes,
        };
        entries.push((path, metadata));
    }
    entries
}

fn sha256(bytes: &[u8]) -> String {
    Blob::new(bytes.to_vec()).digest()
}

/// The blob a descriptor names, its digest and size checked.
fn blob<'a>(archive: &'a BTreeMap<String, TarEntry>, descriptor: &Value) -> &'a [u8] {
    let digest = descriptor["digest"].as_str().unwrap();
    let path = format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap());
    let bytes = &archive[&path].bytes;
    assert_eq!(sha256(bytes), digest, "{path}");
    assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64), "{path}");
    bytes
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let first = write_archive(&image, &dir.path().join("out/first.tar")).unwrap();
    let second = write_archive(&image, &dir.path().join("out/second.tar")).unwrap();
    let (first_bytes, second_bytes) =
        (fs::read(&first.path).unwrap(), fs::read(&second.path).unwrap());
    assert!(first_bytes == second_bytes, "two archives of the same image differ");
    assert_eq!(first.manifest_digest, second.manifest_digest);
    assert_eq!(first.size, first_bytes.len() as u64);
    let mode = fs::metadata(&first.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);

    let mut later = image.clone();
    later.timestamp = 1_700_000_000;
    let third = write_archive(&later, &dir.path().join("out/third.tar")).unwrap();
    assert_ne!(third.manifest_digest, first.manifest_digest, "the timestamp is in the image");
}

#[test]
fn the_index_the_docker_manifest_and_the_config_name_blobs_of_their_digests() {
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path());
    let written = write_archive(&image, &dir.path().join("image.tar")).unwrap();
    let archive = entries(&fs::read(&written.path).unwrap());
    let paths: Vec<&str> = archive.iter().map(|(path, _)| path.as_str()).collect();
    assert!(paths.is_sorted(), "{paths:?}");
    for (path, entry) in &archive {
        assert_eq!((entry.owner, entry.mtime), ((0, 0), 0), "{path}");
    }
    let archive: BTreeMap<String, TarEntry> = archive.into_iter().collect();
    let json = |path: &str| -> Value { serde_json::from_slice(&archive[path].bytes).unwrap() };
    assert_eq!(json("oci-layout"), serde_json::json!({"imageLayoutVersion": "1.0.0"}));

    let index = json("index.json");
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["mediaType"], INDEX_MEDIA_TYPE);
    let [descriptor] = index["manifests"].as_array().unwrap().as_slice() else {
        panic!("one manifest: {index}");
    };
    assert_eq!(descriptor["mediaType"], MANIFEST_MEDIA_TYPE);
    assert_eq!(descriptor["annotations"][CONTAINERD_NAME], "example.com/tools/probe:1.2");
    assert_eq!(descriptor["annotations"][OCI_REF_NAME], "1.2");
    assert_eq!(descriptor["digest"], written.manifest_digest.as_str());
    let manifest: Value = serde_json::from_slice(blob(&archive, descriptor)).unwrap();
    assert_eq!(manifest["mediaType"], MANIFEST_MEDIA_TYPE);
    assert_eq!(manifest["config"]["mediaType"], CONFIG_MEDIA_TYPE);
    let config_bytes = blob(&archive, &manifest["config"]);
    let [layer] = manifest["layers"].as_array().unwrap().as_slice() else {
        panic!("one layer: {manifest}");
    };
    assert_eq!(layer["mediaType"], LAYER_MEDIA_TYPE);
    let layer_bytes = blob(&archive, layer);

    let config: Value = serde_json::from_slice(config_bytes).unwrap();
    assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([layer["digest"]]));
    assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    assert_eq!((&config["architecture"], &config["os"]), (&"amd64".into(), &"linux".into()));
    assert_eq!(
        config["config"],
        serde_json::json!({
            "User": "65532:65532",
            "Entrypoint": ["/usr/local/bin/probe"],
            "Cmd": ["serve"],
            "WorkingDir": "/",
        })
    );

    let docker = json("manifest.json");
    let expected = serde_json::json!([{
        "Config": format!("blobs/sha256/{}", sha256(config_bytes).trim_start_matches("sha256:")),
        "RepoTags": ["example.com/tools/probe:1.2"],
        "Layers": [format!("blobs/sha256/{}", sha256(layer_bytes).trim_start_matches("sha256:"))],
    }]);
    assert_eq!(docker, expected);
    assert_eq!(archive.len(), 2 + 3 + 3, "blobs/, blobs/sha256/, three blobs, three files");
}

#[test]
fn the_layer_holds_the_files_under_their_parent_directories_with_their_modes() {
    let dir = tempfile::tempdir().unwrap();
    let mut image = image(dir.path());
    image.timestamp = 1_700_000_000;
    let layer = entries(&layer_tar(&image).unwrap());
    for (path, entry) in &layer {
        assert_eq!((entry.owner, entry.mtime), ((0, 0), 1_700_000_000), "{path}");
    }
    let shown: Vec<(&str, tar::EntryType, u32, &[u8])> = layer
        .iter()
        .map(|(path, entry)| (path.as_str(), entry.kind, entry.mode, entry.bytes.as_slice()))
        .collect();
    let (dir_, file) = (tar::EntryType::Directory, tar::EntryType::Regular);
    assert_eq!(
        shown,
        [
            ("etc", dir_, 0o755, &b""[..]),
            ("etc/probe", dir_, 0o755, b""),
            ("etc/probe/data", file, 0o640, b"some data\n"),
            ("tmp", dir_, 0o1777, b""),
            ("usr", dir_, 0o755, b""),
            ("usr/local", dir_, 0o755, b""),
            ("usr/local/bin", dir_, 0o755, b""),
            ("usr/local/bin/probe", file, 0o755, b"#!/not/run\n"),
        ]
    );
}

#[test]
fn paths_that_cannot_be_laid_out_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut image = image(dir.path());
    let source = image.files[0].source.clone();
    for (path, wanted) in [
        ("usr/bin/x", "absolute"),
        ("/usr/../bin/x", "absolute"),
        ("/usr/local/bin/probe", "twice"),
        ("/usr/local/bin/probe/x", "not a directory"),
        ("/usr/local", "directory of other files"),
    ] {
        image.files.truncate(2);
        image.files.push(ImageFile { source: source.clone(), path: path.to_owned(), mode: 0o644 });
        let err = layer_tar(&image).unwrap_err().to_string();
        assert!(err.contains(wanted), "{path}: {err}");
    }
}

#[test]
fn names_need_a_tag_and_short_ones_are_qualified_for_containerd() {
    assert!(Image::new("ghcr.io/kpm-rs/kpm").is_err());
    assert!(Image::new("localhost:5000/kpm").is_err());
    assert!(Image::new("kpm:").is_err());
    let qualified = |name: &str| Image::new(name).unwrap().qualified_name();
    assert_eq!(qualified("kpm:dev"), "docker.io/library/kpm:dev");
    assert_eq!(qualified("someone/kpm:dev"), "docker.io/someone/kpm:dev");
    assert_eq!(qualified("localhost/kpm:dev"), "localhost/kpm:dev");
    assert_eq!(qualified("localhost:5000/kpm:dev"), "localhost:5000/kpm:dev");
    assert_eq!(qualified("ghcr.io/kpm-rs/kpm:0.1.0"), "ghcr.io/kpm-rs/kpm:0.1.0");
    assert_eq!(Image::new("localhost:5000/kpm:dev").unwrap().tag(), "dev");
}
