//! The Dockerfile builds kpm with the workspace's Rust: the tag of its
//! `FROM rust:…` is the `rust-version` of `[workspace.package]`, so that a
//! raised `rust-version` cannot leave the image to an older toolchain, which
//! fails the build (or, lowered, to a newer one than users are promised).

use std::fs;
use std::path::Path;

use super::docs::workspace_rust_version;
use crate::Result;

const DOCKERFILE: &str = "Dockerfile";

/// Runs the check on the tree at `root`.
pub(super) fn check(root: &Path, problems: &mut Vec<String>) -> Result {
    let read = |path: &str| {
        fs::read_to_string(root.join(path))
            .map_err(|err| format!("tidy: cannot read {path}: {err}"))
    };
    // docs.rs reports a Cargo.toml without one.
    if let Some(version) = workspace_rust_version(&read("Cargo.toml")?) {
        check_rust_image(&read(DOCKERFILE)?, &version, problems);
    }
    Ok(())
}

/// Each `FROM rust:X…` of the Dockerfile has X = `version`, and there is one.
fn check_rust_image(dockerfile: &str, version: &str, problems: &mut Vec<String>) {
    let mut found = false;
    for (number, line) in dockerfile.lines().enumerate() {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|word| word.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        // `FROM [--platform=…] IMAGE [AS NAME]`
        let Some(image) = words.find(|word| !word.starts_with("--")) else { continue };
        let Some(tag) =
            image.strip_prefix("rust:").or_else(|| image.strip_prefix("docker.io/library/rust:"))
        else {
            continue;
        };
        found = true;
        // `1.89-bookworm`: the version, then the variant.
        let (stated, variant) = tag.split_once('-').map_or((tag, ""), |(v, rest)| (v, rest));
        if stated != version {
            let write = if variant.is_empty() {
                version.to_owned()
            } else {
                format!("{version}-{variant}")
            };
            problems.push(format!(
                "{DOCKERFILE}:{}: builds with {image}, the workspace's rust-version is \
                 {version}: write `rust:{write}`",
                number + 1
            ));
        }
    }
    if !found {
        problems.push(format!(
            "{DOCKERFILE} has no `FROM rust:…` stage: build kpm in `FROM rust:{version}-bookworm \
             AS build`, the workspace's rust-version"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKERFILE_TEXT: &str = "# syntax=docker/dockerfile:1\n\
                                   # FROM rust:1.0 in a comment\n\
                                   FROM rust:1.89-bookworm AS build\n\
                                   RUN cargo build\n\
                                   FROM gcr.io/distroless/cc-debian12\n";

    #[test]
    fn the_dockerfile_builds_with_the_workspace_rust_version() {
        let mut problems = Vec::new();
        check_rust_image(DOCKERFILE_TEXT, "1.89", &mut problems);
        let platform = DOCKERFILE_TEXT.replace("FROM rust", "from --platform=$BUILDPLATFORM rust");
        check_rust_image(&platform, "1.89", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");

        check_rust_image(DOCKERFILE_TEXT, "1.90", &mut problems);
        check_rust_image(&DOCKERFILE_TEXT.replace("1.89-bookworm", "1.88"), "1.90", &mut problems);
        assert_eq!(
            problems,
            [
                "Dockerfile:3: builds with rust:1.89-bookworm, the workspace's rust-version is \
                 1.90: write `rust:1.90-bookworm`",
                "Dockerfile:3: builds with rust:1.88, the workspace's rust-version is 1.90: \
                 write `rust:1.90`",
            ]
        );
        problems.clear();
        check_rust_image("FROM debian:12\n", "1.90", &mut problems);
        assert_eq!(
            problems,
            ["Dockerfile has no `FROM rust:…` stage: build kpm in `FROM rust:1.90-bookworm AS \
                 build`, the workspace's rust-version"]
        );
    }
}
