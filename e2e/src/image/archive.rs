//! One image as one tar archive that `ctr images import`, `podman load` and
//! `docker load` all take: an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) and, beside it, a docker archive's `manifest.json`
//! naming the same blobs, as `docker save` writes it since Docker 25. The
//! image has one uncompressed layer.
//!
//! The archive depends on its inputs alone, so that the same files give the
//! same bytes and digests: entries sorted, owned by 0:0, every mtime and the
//! config's `created` the image's `timestamp`, JSON written from structs
//! (their key order does not follow `serde_json`'s `preserve_order`, which
//! another crate of the workspace turns on).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::command::Result;

const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The index annotation containerd and podman name an imported image by.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI annotation of a reference's tag, as Docker writes it.
const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The layer path of [`Image::tmp_dir`].
const TMP: &str = "tmp";

/// What goes into an image: its name, files and how to run it.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    /// `NAME:TAG`, e.g. `ghcr.io/kpm-rs/kpm:0.1.0`.
    pub(crate) name: String,
    /// Files of the host, each copied to its own path in the image.
    pub(crate) files: Vec<ImageFile>,
    /// An empty `/tmp`, mode 1777, for programs that write temporary files.
    pub(crate) tmp_dir: bool,
    pub(crate) entrypoint: Vec<String>,
    pub(crate) cmd: Vec<String>,
    /// The config's `User` (`UID[:GID]`); `None` runs as root.
    pub(crate) user: Option<String>,
    /// The config's `Env`, each `KEY=VALUE`.
    pub(crate) env: Vec<String>,
    /// The OCI name of the CPU architecture (`amd64`, `arm64`).
    pub(crate) architecture: String,
    /// Seconds since the epoch: every entry's mtime and the config's `created`.
    pub(crate) timestamp: u64,
}

/// A host file and where it goes in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageFile {
    /// Read as a regular file, symbolic links followed.
    pub(crate) source: PathBuf,
    /// Absolute, without `.` or `..`: `/usr/local/bin/kpm`.
    pub(crate) path: String,
    /// Permission bits, e.g. `0o755`.
    pub(crate) mode: u32,
}

/// An archive [`write_archive`] wrote.
#[derive(Debug, Clone)]
pub(crate) struct Archive {
    pub(crate) path: PathBuf,
    /// `sha256:…` of the image manifest: the digest `ctr images ls` and a
    /// registry show for the image.
    pub(crate) manifest_digest: String,
    /// The archive's size in bytes.
    pub(crate) size: u64,
}

impl Image {
    /// An image named `name` (`NAME:TAG`) with nothing in it yet, for the
    /// host's architecture, its timestamp `SOURCE_DATE_EPOCH` or else 0.
    pub(crate) fn new(name: &str) -> Result<Self> {
        let tag = name.rsplit('/').next().and_then(|last| last.split_once(':')).map(|(_, t)| t);
        if tag.is_none_or(str::is_empty) || name.contains(char::is_whitespace) {
            return Err(format!("image name `{name}`: write NAME:TAG, e.g. kpm:dev").into());
        }
        Ok(Self {
            name: name.to_owned(),
            files: Vec::new(),
            tmp_dir: false,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            user: None,
            env: Vec::new(),
            architecture: host_architecture()?.to_owned(),
            timestamp: source_date_epoch()?,
        })
    }

    /// The name as containerd's CRI looks images up, Docker's short names
    /// completed: `kpm:dev` is `docker.io/library/kpm:dev`.
    fn qualified_name(&self) -> String {
        match self.name.split_once('/') {
            Some((domain, _)) if domain.contains(['.', ':']) || domain == "localhost" => {
                self.name.clone()
            }
            Some(_) => format!("docker.io/{}", self.name),
            None => format!("docker.io/library/{}", self.name),
        }
    }

    /// The tag, which Docker writes as the OCI reference name.
    fn tag(&self) -> &str {
        self.name.rsplit('/').next().and_then(|last| last.split_once(':')).map_or("", |(_, t)| t)
    }
}

/// The OCI name of the architecture this xtask was built for, which is the
/// one of the binaries it packs.
fn host_architecture() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        other => return Err(format!("no OCI architecture name known for {other}").into()),
    })
}

/// `SOURCE_DATE_EPOCH` (reproducible-builds.org), or 0 when it is not set.
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) => value.trim().parse().map_err(|err| {
            format!("SOURCE_DATE_EPOCH={value}: not whole seconds since the epoch: {err}").into()
        }),
        Err(std::env::VarError::NotPresent) => Ok(0),
        Err(err) => Err(format!("SOURCE_DATE_EPOCH: {err}").into()),
    }
}

/// Writes `image` to `out` (its directory created), replacing it whole only
/// once the archive is complete.
pub(crate) fn write_archive(image: &Image, out: &Path) -> Result<Archive> {
    let layer = Blob::new(layer_tar(image)?);
    let config = Blob::new(serde_json::to_vec(&ImageConfig::of(image, &layer))?);
    let manifest = Blob::new(serde_json::to_vec(&Manifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE,
        config: config.descriptor(CONFIG_MEDIA_TYPE),
        layers: vec![layer.descriptor(LAYER_MEDIA_TYPE)],
    })?);
    let mut manifest_descriptor = manifest.descriptor(MANIFEST_MEDIA_TYPE);
    manifest_descriptor.annotations = BTreeMap::from([
        (CONTAINERD_NAME, image.qualified_name()),
        (OCI_REF_NAME, image.tag().to_owned()),
    ]);
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: INDEX_MEDIA_TYPE,
        manifests: vec![manifest_descriptor],
    })?;
    let docker_manifest = serde_json::to_vec(&[DockerManifest {
        config: config.path(),
        repo_tags: vec![image.name.clone()],
        layers: vec![layer.path()],
    }])?;

    let mut blobs = [&layer, &config, &manifest];
    blobs.sort_by(|a, b| a.hex.cmp(&b.hex));
    let mut entries = vec![Entry::dir("blobs", 0o755), Entry::dir("blobs/sha256", 0o755)];
    entries.extend(blobs.iter().map(|blob| Entry::data(&blob.path(), &blob.bytes)));
    entries.push(Entry::data("index.json", &index));
    entries.push(Entry::data("manifest.json", &docker_manifest));
    entries.push(Entry::data("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#));

    let dir = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .map_err(|err| format!("cannot create a file in {}: {err}", dir.display()))?;
    let mut writer = std::io::BufWriter::new(file.as_file_mut());
    write_tar(&mut writer, &entries, image.timestamp)?;
    writer.flush()?;
    drop(writer);
    // A temp file is private; an image archive is for anyone to load.
    fs::set_permissions(file.path(), fs::Permissions::from_mode(0o644))?;
    let size = file.as_file().metadata()?.len();
    file.persist(out).map_err(|err| format!("cannot write {}: {err}", out.display()))?;
    Ok(Archive { path: out.to_path_buf(), manifest_digest: manifest.digest(), size })
}

/// A blob of the layout and its sha256, in hex.
struct Blob {
    bytes: Vec<u8>,
    hex: String,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        let hex = Sha256::digest(&bytes).iter().fold(String::new(), |mut hex, byte| {
            // Writing to a String cannot fail.
            let _ = write!(hex, "{byte:02x}");
            hex
        });
        Self { bytes, hex }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// Its path in the archive, which the OCI index and the docker manifest share.
    fn path(&self) -> String {
        format!("blobs/sha256/{}", self.hex)
    }

    fn descriptor(&self, media_type: &'static str) -> Descriptor {
        Descriptor {
            media_type,
            digest: self.digest(),
            size: self.bytes.len() as u64,
            annotations: BTreeMap::new(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: &'static str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    schema_version: u32,
    media_type: &'static str,
    manifests: Vec<Descriptor>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    media_type: &'static str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// An entry of `docker save`'s `manifest.json`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    repo_tags: Vec<String>,
    layers: Vec<String>,
}

/// The OCI image config.
#[derive(Serialize)]
struct ImageConfig<'a> {
    created: String,
    architecture: &'a str,
    os: &'static str,
    config: RunConfig<'a>,
    rootfs: RootFs,
    history: [History; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    env: &'a [String],
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    working_dir: &'static str,
}

#[derive(Serialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

#[derive(Serialize)]
struct History {
    created: String,
    created_by: &'static str,
}

impl<'a> ImageConfig<'a> {
    fn of(image: &'a Image, layer: &Blob) -> Self {
        let created = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(image.timestamp),
        )
        .to_string();
        Self {
            created: created.clone(),
            architecture: &image.architecture,
            os: "linux",
            config: RunConfig {
                user: image.user.as_deref(),
                env: &image.env,
                entrypoint: &image.entrypoint,
                cmd: &image.cmd,
                working_dir: "/",
            },
            // Uncompressed: the layer's digest is its diff id.
            rootfs: RootFs { kind: "layers", diff_ids: vec![layer.digest()] },
            history: [History { created, created_by: "cargo xtask image" }],
        }
    }
}

/// An entry of a tar archive.
struct Entry<'a> {
    path: String,
    mode: u32,
    content: Content<'a>,
}

enum Content<'a> {
    Dir,
    Bytes(&'a [u8]),
    /// A host file, read as the archive is written: one at a time in memory.
    File(&'a Path),
}

impl<'a> Entry<'a> {
    fn dir(path: &str, mode: u32) -> Self {
        Self { path: path.to_owned(), mode, content: Content::Dir }
    }

    fn data(path: &str, bytes: &'a [u8]) -> Self {
        Self { path: path.to_owned(), mode: 0o644, content: Content::Bytes(bytes) }
    }
}

/// The image's one layer: every file at its path, the directories above
/// each (0755) and `/tmp` if asked for, sorted so that a directory comes
/// before what it holds.
fn layer_tar(image: &Image) -> Result<Vec<u8>> {
    // Each path in the image: `None` for a directory, else its file.
    let mut tree: BTreeMap<String, Option<&ImageFile>> = BTreeMap::new();
    if image.tmp_dir {
        tree.insert(TMP.to_owned(), None);
    }
    for file in &image.files {
        let parts = image_path_parts(&file.path)?;
        for depth in 1..parts.len() {
            if let Some(Some(other)) = tree.insert(parts[..depth].join("/"), None) {
                return Err(format!(
                    "image paths {} and {}: the first is a file, not a directory",
                    other.path, file.path
                )
                .into());
            }
        }
        match tree.insert(parts.join("/"), Some(file)) {
            None => {}
            Some(Some(other)) => {
                return Err(format!(
                    "image path {} given twice: {} and {}",
                    file.path,
                    other.source.display(),
                    file.source.display()
                )
                .into());
            }
            Some(None) => {
                return Err(
                    format!("image path {} is a directory of other files", file.path).into()
                );
            }
        }
    }
    let entries: Vec<Entry<'_>> = tree
        .into_iter()
        .map(|(path, file)| match file {
            Some(file) => Entry { path, mode: file.mode, content: Content::File(&file.source) },
            None if path == TMP => Entry { path, mode: 0o1777, content: Content::Dir },
            None => Entry { path, mode: 0o755, content: Content::Dir },
        })
        .collect();
    let mut layer = Vec::new();
    write_tar(&mut layer, &entries, image.timestamp)?;
    Ok(layer)
}

/// The components of an absolute image path with neither `.` nor `..`.
fn image_path_parts(path: &str) -> Result<Vec<&str>> {
    let mut components = Path::new(path).components();
    let absolute = components.next() == Some(Component::RootDir);
    let parts: Option<Vec<&str>> = components
        .map(|component| match component {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect();
    match parts {
        Some(parts) if absolute && !parts.is_empty() => Ok(parts),
        _ => Err(format!("image path `{path}`: write an absolute path without `.` or `..`").into()),
    }
}

/// Writes `entries`, in their order, as a tar archive of owner 0:0, every
/// mtime `timestamp`.
fn write_tar(out: &mut impl Write, entries: &[Entry<'_>], timestamp: u64) -> Result {
    let mut builder = tar::Builder::new(out);
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mode(entry.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(timestamp);
        // A zeroed header's type is `\0`, the pre-POSIX spelling: say '0'.
        header.set_entry_type(tar::EntryType::Regular);
        let file_bytes;
        let data: &[u8] = match entry.content {
            Content::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                &[]
            }
            Content::Bytes(bytes) => bytes,
            Content::File(source) => {
                file_bytes = fs::read(source)
                    .map_err(|err| format!("cannot read {}: {err}", source.display()))?;
                &file_bytes
            }
        };
        header.set_size(data.len() as u64);
        builder
            .append_data(&mut header, &entry.path, data)
            .map_err(|err| format!("cannot add {} to the archive: {err}", entry.path))?;
    }
    builder.into_inner()?.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests;
