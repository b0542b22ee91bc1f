//! No file of library code over [`MAX_LINES`] lines: a file that long does
//! several jobs, and a newcomer looking for one reads them all.
//!
//! Counted: every line (docs and comments too: they are read) of each
//! `crates/*/src/**/*.rs`, but generated code (`src/gen/`), test files
//! (`tests.rs`, anything under a `tests/` directory) and the body of a
//! `#[cfg(test)] mod tests { … }`. Not library code, and not counted: the
//! tools that ship nowhere, `xtask` and its suites' `kpm-e2e` (outside
//! `crates/`) and kpm-bench's load generator ([`TOOLS`]). The CLI counts: it
//! ships, and its code is read as much as the library's.

use std::fs;
use std::path::Path;

use super::walk;
use super::workspace::Crate;
use crate::Result;

/// The most lines of code a library file may have.
const MAX_LINES: usize = 600;

/// Crates under `crates/` whose code is a tool of the repository, not a
/// library or a shipped binary.
const TOOLS: &[&str] = &["kpm-bench"];

/// Reports each file of library code over [`MAX_LINES`].
pub(super) fn check(root: &Path, crates: &[Crate], problems: &mut Vec<String>) -> Result {
    for krate in crates {
        if !krate.dir.starts_with("crates/") || TOOLS.contains(&krate.name.as_str()) {
            continue;
        }
        let src = root.join(&krate.dir).join("src");
        let mut files = Vec::new();
        walk(&src, &mut |path| {
            let relative = path.strip_prefix(&src).unwrap_or(path);
            let in_tests_or_gen = relative.parent().is_some_and(|dir| {
                dir.components()
                    .any(|c| ["gen", "tests"].contains(&&*c.as_os_str().to_string_lossy()))
            });
            let is_rust = path.extension().is_some_and(|ext| ext == "rs");
            if is_rust && !in_tests_or_gen && !path.ends_with("tests.rs") {
                files.push(path.to_path_buf());
            }
        })?;
        for file in files {
            let shown = file.strip_prefix(root).unwrap_or(&file).display().to_string();
            check_file(&shown, &fs::read_to_string(&file)?, problems);
        }
    }
    Ok(())
}

/// One file's lines against [`MAX_LINES`].
fn check_file(shown: &str, text: &str, problems: &mut Vec<String>) {
    let lines = code_lines(text);
    if lines > MAX_LINES {
        problems.push(format!(
            "{shown}: {lines} lines of library code, over {MAX_LINES}: split it by job (a \
             `#[cfg(test)] mod tests` body and `tests.rs` files do not count)"
        ));
    }
}

/// The lines of `text` outside `#[cfg(test)] mod tests { … }` blocks; such a
/// block ends at the first line that is `}` alone (rustfmt's closing brace
/// of an item at the top level).
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut count = 0;
    let mut index = 0;
    while index < lines.len() {
        let opens_tests = lines[index].trim() == "#[cfg(test)]"
            && lines[index + 1..]
                .iter()
                .find(|line| !line.trim().is_empty())
                .is_some_and(|line| line.starts_with("mod tests {"));
        if opens_tests {
            while index < lines.len() && lines[index] != "}" {
                index += 1;
            }
        } else {
            count += 1;
        }
        index += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_module_does_not_count() {
        let text = "//! Doc.\nfn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn b() {\n    }\n}\n";
        assert_eq!(code_lines(text), 3);
        let declared = "//! Doc.\n#[cfg(test)]\nmod tests;\nfn a() {}\n";
        assert_eq!(code_lines(declared), 4);
        let in_the_middle = "fn a() {}\n#[cfg(test)]\nmod tests {\n}\nfn b() {}\n";
        assert_eq!(code_lines(in_the_middle), 2);
    }

    #[test]
    fn a_file_over_the_limit_is_reported() {
        let mut problems = Vec::new();
        let long = format!("//! Doc.\n{}", "fn a() {}\n".repeat(MAX_LINES - 1));
        check_file("crates/kpm-x/src/a.rs", &long, &mut problems);
        let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", "fn t() {}\n".repeat(100));
        check_file("crates/kpm-x/src/a.rs", &format!("{long}{tests}"), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        check_file("crates/kpm-x/src/a.rs", &format!("{long}fn b() {{}}\n"), &mut problems);
        assert_eq!(
            problems,
            ["crates/kpm-x/src/a.rs: 601 lines of library code, over 600: split it by job (a \
                 `#[cfg(test)] mod tests` body and `tests.rs` files do not count)"]
        );
    }

    #[test]
    fn generated_test_and_tool_files_are_not_counted() {
        let root = tempfile::tempdir().unwrap();
        let long = "fn a() {}\n".repeat(MAX_LINES + 1);
        for path in [
            "crates/kpm-x/src/gen/wire.rs",
            "crates/kpm-x/src/tests.rs",
            "crates/kpm-x/src/a/tests/b.rs",
            "crates/kpm-bench/src/main.rs",
            "crates/kpm-x/src/counted.rs",
        ] {
            let path = root.path().join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, &long).unwrap();
        }
        let krate = |name: &str| Crate {
            name: name.to_owned(),
            dir: format!("crates/{name}"),
            deps: Vec::new(),
            published: false,
            library: true,
            metadata: Vec::new(),
        };
        let mut problems = Vec::new();
        check(root.path(), &[krate("kpm-x"), krate("kpm-bench")], &mut problems).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("crates/kpm-x/src/counted.rs: 601 lines"), "{problems:?}");
    }
}
