//! What a dynamically linked ELF program needs of the host to run in an
//! image of its own: its interpreter (the dynamic loader) and the shared
//! libraries it names (`DT_NEEDED`), theirs in turn, each found where the
//! host's loader looks without `/etc/ld.so.cache` and put at that same path
//! in the image, where the same loader looks for it.

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{ElfFile, FileHeader, ProgramHeader};
use object::{Endianness, FileKind};

use super::ImageFile;
use crate::command::Result;

/// The files `program` needs at run time besides itself, sorted by path:
/// none for a static program.
pub(crate) fn runtime_files(program: &Path) -> Result<Vec<ImageFile>> {
    let needs = Needs::read(program)?;
    let Some(interpreter) = needs.interpreter else {
        if needs.libraries.is_empty() {
            return Ok(Vec::new());
        }
        return Err(format!("{}: names libraries but no interpreter", program.display()).into());
    };
    let interpreter = PathBuf::from(interpreter);
    let dirs = library_dirs();
    let mut files = vec![host_file(&interpreter)?];
    // The loader is loaded already, under its own name, when libc names it.
    let mut seen: BTreeSet<String> = interpreter
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .into_iter()
        .collect();
    let mut wanted: VecDeque<(String, PathBuf)> =
        needs.libraries.into_iter().map(|library| (library, program.to_path_buf())).collect();
    while let Some((library, wanted_by)) = wanted.pop_front() {
        if !seen.insert(library.clone()) {
            continue;
        }
        let path = dirs
            .iter()
            .map(|dir| dir.join(&library))
            .find(|path| path.is_file())
            .ok_or_else(|| {
                let dirs: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
                format!(
                    "{} needs {library}, which is in none of {}",
                    wanted_by.display(),
                    dirs.join(", ")
                )
            })?;
        let needs = Needs::read(&path)?;
        wanted.extend(needs.libraries.into_iter().map(|library| (library, path.clone())));
        files.push(host_file(&path)?);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The directories the host's loader searches by default: Debian's
/// multiarch ones, then the 64-bit ones of Fedora and its kin, then the
/// plain ones. A library only `/etc/ld.so.conf` points at is not found, and
/// fails the image here rather than at run time.
fn library_dirs() -> Vec<PathBuf> {
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    [
        format!("/lib/{multiarch}"),
        format!("/usr/lib/{multiarch}"),
        "/lib64".to_owned(),
        "/usr/lib64".to_owned(),
        "/lib".to_owned(),
        "/usr/lib".to_owned(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect()
}

/// `path` as it is on the host: its contents (symbolic links followed) and
/// permission bits, which the kernel checks on the loader (it must be
/// executable) as on any program.
fn host_file(path: &Path) -> Result<ImageFile> {
    let metadata =
        fs::metadata(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let image_path = path
        .to_str()
        .filter(|_| path.is_absolute())
        .ok_or_else(|| format!("{}: not an absolute UTF-8 path", path.display()))?;
    Ok(ImageFile {
        source: path.to_path_buf(),
        path: image_path.to_owned(),
        mode: metadata.permissions().mode() & 0o7777,
    })
}

/// What an ELF file asks of the loader.
#[derive(Debug, Default, PartialEq, Eq)]
struct Needs {
    /// `PT_INTERP`: the loader's path.
    interpreter: Option<String>,
    /// `DT_NEEDED`: library names, in order.
    libraries: Vec<String>,
}

impl Needs {
    fn read(path: &Path) -> Result<Self> {
        let data =
            fs::read(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let needs = match FileKind::parse(&*data) {
            Ok(FileKind::Elf64) => Self::of::<elf::FileHeader64<Endianness>>(&data),
            Ok(FileKind::Elf32) => Self::of::<elf::FileHeader32<Endianness>>(&data),
            Ok(kind) => return Err(format!("{}: not ELF but {kind:?}", path.display()).into()),
            Err(err) => Err(err.to_string()),
        };
        needs.map_err(|err| format!("{}: {err}", path.display()).into())
    }

    fn of<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<Self, String> {
        let file = ElfFile::<Elf>::parse(data).map_err(|err| err.to_string())?;
        let endian = file.endian();
        let mut needs = Self::default();
        for segment in file.elf_program_headers() {
            if let Some(path) = segment.interpreter(endian, data).map_err(|err| err.to_string())? {
                needs.interpreter = Some(String::from_utf8_lossy(path).into_owned());
            }
        }
        let dynamic = file.elf_dynamic_table().map_err(|err| err.to_string())?;
        for entry in &dynamic {
            match entry.tag {
                elf::DT_NEEDED => {
                    let name = dynamic.string(entry).map_err(|err| err.to_string())?;
                    needs.libraries.push(String::from_utf8_lossy(name).into_owned());
                }
                // Libraries found by its own search path would be found
                // in the image only if put where that path says: not done.
                elf::DT_RUNPATH | elf::DT_RPATH => {
                    return Err("has a DT_RUNPATH or DT_RPATH, which xtask image does not follow"
                        .to_owned());
                }
                _ => {}
            }
        }
        Ok(needs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_gets_its_loader_and_libc_at_their_paths() {
        // This test's own binary: linked as the release `kpm` is, against glibc.
        let program = std::env::current_exe().unwrap();
        let needs = Needs::read(&program).unwrap();
        let interpreter = needs.interpreter.unwrap();
        assert!(needs.libraries.iter().any(|library| library.starts_with("libc.so")));

        let files = runtime_files(&program).unwrap();
        let paths: Vec<&str> = files.iter().map(|file| file.path.as_str()).collect();
        assert!(paths.contains(&interpreter.as_str()), "{paths:?}");
        assert!(paths.iter().any(|path| path.ends_with("/libc.so.6")), "{paths:?}");
        assert!(paths.is_sorted(), "{paths:?}");
        let loader = files.iter().find(|file| file.path == interpreter).unwrap();
        assert_ne!(loader.mode & 0o111, 0, "the loader must be executable: {:o}", loader.mode);
        // Each library once, the loader not again under libc's name for it.
        let names: BTreeSet<_> = paths.iter().filter_map(|path| path.rsplit('/').next()).collect();
        assert_eq!(names.len(), paths.len(), "{paths:?}");
    }

    #[test]
    fn a_file_that_is_not_elf_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
        let err = runtime_files(&script).unwrap_err().to_string();
        assert!(err.starts_with(&script.display().to_string()), "{err}");
    }
}
