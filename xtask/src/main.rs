//! `cargo xtask`: the project's automation, in Rust so that a fresh machine
//! needs nothing but cargo.
//!
//! - `codegen [--check]`: compile `proto/` with protox and tonic-prost-build into
//!   the checked-in code of `kpm-api`; `--check` fails when that code is stale.
//! - `ci`: everything CI runs, in order, printing each command (fmt, clippy
//!   on the workspace and on each feature set a library user may pick,
//!   the codegen check, tidy, deploy, build, tests, docs), ending with
//!   `cargo package` of the published crates and the line `N passed, M
//!   failed`, printed also when a step failed.
//! - `package`: that `cargo package` step alone.
//! - `bench [--quick] [--only SCENARIO]`: the performance benchmark of
//!   `docs/performance.md` (see `bench.rs`).
//! - `soak [--minutes N | --seconds N] [-- LOADGEN-OPTIONS]`: the soak test of
//!   `docs/reliability.md`, 10 minutes by default (see `soak.rs`).
//! - `interop --bin-dir DIR [--only SCENARIO]`: `kpm` and `kpm-registrar`
//!   against real programs in DIR (see `interop/mod.rs`); not part of `ci`.
//! - `kube-e2e --apiserver BIN --etcd BIN [--manifest FILE] [--only SCENARIO]`:
//!   `kpm run` against a real kube-apiserver and etcd (see `kube_e2e/mod.rs`);
//!   not part of `ci`.
//! - `image [--out FILE] [--name NAME:TAG]`: kpm's image as one archive
//!   that `ctr images import`, `podman load` and `docker load` take, no
//!   registry or Docker needed (see `image/mod.rs`); not part of `ci`.
//! - `node-e2e --bin-dir DIR [--only SCENARIO]`: kpm's image and manifests
//!   on a real node: containerd, the real kubelet and a control plane (see
//!   `node_e2e/mod.rs`); not part of `ci`.
//! - `tidy`: source-tree rules (see `tidy/mod.rs`); also runs as a test.
//! - `deploy`: `deploy/` rendered by `kubectl kustomize` and read back, and the
//!   alerting rules checked and tested by promtool (see `deploy/mod.rs`).
//!
//! Each subcommand answers `--help` (or `-h`) with its usage, on stdout.
//!
//! The suites, `image` and `deploy` live in the crate kpm-e2e (`e2e/`),
//! which also holds what every subcommand shares (`kpm_e2e::command`); this
//! crate is their dispatch, with codegen, tidy and ci. The suites against
//! real programs (`interop`, `kube-e2e`, `node-e2e`) build none of those
//! programs and keep none of their code (see kpm-e2e's crate doc).

mod codegen;
mod tidy;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use kpm_e2e::command::{Misused, Result, cargo, project_root};
use kpm_e2e::{bench, deploy, image, interop, kube_e2e, node_e2e, soak};

/// A subcommand: its name, its usage (the synopsis, `cargo xtask NAME
/// …`, on its first line, what its words stand for below; `--help` prints
/// it, and a misuse repeats it) and what runs it with its options.
struct Subcommand {
    name: &'static str,
    usage: fn() -> String,
    run: fn(&Path, &[&str]) -> Result,
}

/// Every subcommand, in the order the module doc lists them.
const SUBCOMMANDS: &[Subcommand] = &[
    Subcommand {
        name: "codegen",
        usage: || "cargo xtask codegen [--check]".to_owned(),
        run: |root, options| match options {
            [] => codegen::run(root, codegen::Mode::Write),
            ["--check"] => codegen::run(root, codegen::Mode::Check),
            [option, ..] => Err(Misused::refused(option, None).into()),
        },
    },
    Subcommand {
        name: "ci",
        usage: || "cargo xtask ci".to_owned(),
        run: |root, options| no_options(options).and_then(|()| ci(root)),
    },
    Subcommand {
        name: "package",
        usage: || "cargo xtask package".to_owned(),
        run: |root, options| no_options(options).and_then(|()| package(root)),
    },
    Subcommand { name: "bench", usage: bench::usage, run: bench::run },
    Subcommand { name: "soak", usage: soak::usage, run: soak::run },
    Subcommand { name: "interop", usage: interop::usage, run: interop::run },
    Subcommand { name: "kube-e2e", usage: kube_e2e::usage, run: kube_e2e::run },
    Subcommand { name: "image", usage: image::usage, run: image::run },
    Subcommand { name: "node-e2e", usage: node_e2e::usage, run: node_e2e::run },
    Subcommand {
        name: "tidy",
        usage: || "cargo xtask tidy".to_owned(),
        run: |root, options| no_options(options).and_then(|()| tidy::check(root)),
    },
    Subcommand {
        name: "deploy",
        usage: || "cargo xtask deploy".to_owned(),
        run: |root, options| no_options(options).and_then(|()| deploy::check(root)),
    },
];

/// For the subcommands that take no options.
fn no_options(options: &[&str]) -> Result {
    match options.first() {
        None => Ok(()),
        Some(option) => Err(Misused::refused(option, None).into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status = dispatch(&project_root(), &args, &mut std::io::stdout(), &mut std::io::stderr());
    ExitCode::from(status)
}

/// Runs the subcommand that `args` (the words after `cargo xtask`) name,
/// and returns the exit status. With `--help` or `-h` among its options it
/// prints its usage instead, on `out`, status 0; a misuse prints what is
/// wrong and the usage on `err`, status 2; a failure its error, status 1.
fn dispatch(root: &Path, args: &[&str], out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let (name, options) = match args {
        ["--help" | "-h" | "help"] => return say(out, &overview(), 0),
        [name, options @ ..] => (*name, options),
        [] => return say(err, &overview(), 2),
    };
    let Some(subcommand) = SUBCOMMANDS.iter().find(|subcommand| subcommand.name == name) else {
        return say(err, &format!("xtask: no subcommand {name}\n{}", overview()), 2);
    };
    let usage = format!("usage: {}", (subcommand.usage)());
    // What follows `--` is another program's (soak's load generator's).
    let own = options.split(|option| *option == "--").next().unwrap_or_default();
    if own.iter().any(|option| matches!(*option, "--help" | "-h")) {
        return say(out, &usage, 0);
    }
    match (subcommand.run)(root, options) {
        Ok(()) => 0,
        Err(error) => match error.downcast_ref::<Misused>() {
            Some(misused) => say(err, &format!("xtask {name}: {misused}\n{usage}"), 2),
            None => say(err, &format!("xtask: {error}"), 1),
        },
    }
}

/// Every subcommand's synopsis.
fn overview() -> String {
    let synopses: Vec<String> = SUBCOMMANDS
        .iter()
        .map(|subcommand| (subcommand.usage)().lines().next().unwrap_or_default().to_owned())
        .collect();
    format!(
        "usage: cargo xtask SUBCOMMAND [OPTIONS] (`cargo xtask SUBCOMMAND --help`: its own)\n  {}",
        synopses.join("\n  ")
    )
}

/// Writes `text` and a newline to `to`, and returns `status`: a closed
/// stdout or stderr leaves no one to tell, so a failed write changes
/// nothing.
fn say(to: &mut dyn Write, text: &str, status: u8) -> u8 {
    _ = writeln!(to, "{text}");
    status
}

/// Property tests run this many cases in CI unless `PROPTEST_CASES` says otherwise.
const CI_PROPTEST_CASES: &str = "2048";

/// Feature sets built one by one in CI: the wire crate with no protos but
/// registration, the transport alone, the `kpm` library with each plugin
/// type alone and with none, and the binary and registrar without `demo` and
/// `stub`.
const FEATURE_SETS: &[&[&str]] = &[
    &["-p", "kpm-api", "--no-default-features"],
    &["-p", "kpm-transport"],
    &["-p", "kpm", "--no-default-features"],
    &["-p", "kpm", "--no-default-features", "--features", "csi"],
    &["-p", "kpm", "--no-default-features", "--features", "device"],
    &["-p", "kpm", "--no-default-features", "--features", "dra"],
    &["-p", "kpm-cli", "-p", "kpm-registrar", "--no-default-features"],
];

/// Runs every CI step, then prints how many tests passed and failed over the
/// whole run as its last line, also when a step failed.
fn ci(root: &Path) -> Result {
    let mut tally = TestTally::default();
    let result = ci_steps(root, &mut tally);
    if result.is_ok() {
        println!("xtask ci: all steps passed");
    }
    println!("{tally}");
    result
}

fn ci_steps(root: &Path, tally: &mut TestTally) -> Result {
    let proptest_cases =
        std::env::var("PROPTEST_CASES").unwrap_or_else(|_| CI_PROPTEST_CASES.to_owned());
    cargo(root, &["fmt", "--all", "--", "--check"], &[])?;
    cargo(
        root,
        &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"],
        &[],
    )?;
    // The workspace build unifies features: check that each feature set a
    // library user may pick builds on its own, without warnings.
    for features in FEATURE_SETS {
        let mut args = vec!["clippy"];
        args.extend_from_slice(features);
        args.extend_from_slice(&["--", "-D", "warnings"]);
        cargo(root, &args, &[])?;
    }
    println!("$ cargo xtask codegen --check");
    codegen::run(root, codegen::Mode::Check)?;
    println!("$ cargo xtask tidy");
    tidy::check(root)?;
    println!("$ cargo xtask deploy");
    deploy::check(root)?;
    cargo(root, &["build", "--workspace", "--all-targets", "--all-features"], &[])?;
    cargo_test(
        root,
        &["test", "--workspace", "--all-features", "--no-fail-fast"],
        &[("PROPTEST_CASES", proptest_cases.as_str())],
        tally,
    )?;
    // A plugin's crate outside the workspace that holds its plugin to the
    // conformance suite in its own `cargo test`, as a driver's CI does.
    let outside = root.join("examples/conformance/Cargo.toml");
    let target = root.join("target");
    cargo_test(
        root,
        &[
            "test",
            "--manifest-path",
            &outside.to_string_lossy(),
            "--target-dir",
            &target.to_string_lossy(),
        ],
        &[],
        tally,
    )?;
    cargo(
        root,
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    package(root)
}

/// The Kubernetes version k8s-openapi is built for where no binary chooses one:
/// kpm-kube packaged alone (a library leaves that choice to the binary); the
/// same one `kpm-cli` chooses (`v1_34`).
const K8S_OPENAPI_VERSION: &str = "1.34";

/// `cargo package` of every crate a user can get from the registry (all but
/// those with `publish = false`): cargo packages each, then builds each from
/// its packaged sources alone, its kpm dependencies taken from their own
/// packages (a local registry overlay), so that a file outside a crate's
/// package, a path dependency without a version or a feature a crate gets only
/// from the workspace fails here rather than at publishing.
fn package(root: &Path) -> Result {
    let metadata = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()?;
    let published: Vec<&cargo_metadata::Package> = metadata
        .workspace_packages()
        .into_iter()
        // `publish = false` reads as an empty list of registries.
        .filter(|package| package.publish.as_ref().is_none_or(|registries| !registries.is_empty()))
        .collect();
    // Cargo takes a registry crate of a given version to be immutable: an
    // earlier run's `kpm-executor 0.1.0`, both as cargo unpacked it from the
    // overlay and as it built it, would be reused after its API changed. So
    // the unpacked copies go, and the packaged builds get a target directory
    // of their own, out of which their kpm crates are cleaned first.
    forget_unpacked(&published)?;
    let target_dir = metadata.target_directory.join("package-check");
    let mut clean = vec!["clean", "--target-dir", target_dir.as_str()];
    let mut package = vec![
        "package",
        "--target-dir",
        target_dir.as_str(),
        // The tree as it is: CI's clone is clean, a developer's need not be.
        "--allow-dirty",
    ];
    for crate_ in &published {
        clean.extend(["-p", crate_.name.as_str()]);
        package.extend(["-p", crate_.name.as_str()]);
    }
    // Without debug info: these builds only prove that each crate builds, and
    // debug info is most of their size and much of their time.
    let env = [
        ("K8S_OPENAPI_ENABLED_VERSION", K8S_OPENAPI_VERSION),
        ("CARGO_PROFILE_DEV_DEBUG", "false"),
    ];
    cargo(root, &clean, &env)?;
    cargo(root, &package, &env)
}

/// Removes every copy cargo has unpacked of these crates at these versions,
/// from whichever registry (`$CARGO_HOME/registry/src/*/NAME-VERSION`); cargo
/// unpacks them again from the `.crate` files it keeps.
fn forget_unpacked(crates: &[&cargo_metadata::Package]) -> Result {
    let Some(cargo_home) = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::home_dir().map(|home| home.join(".cargo")))
    else {
        return Ok(());
    };
    let registries = match std::fs::read_dir(cargo_home.join("registry/src")) {
        Ok(registries) => registries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => {
            return Err(format!("cannot list {}/registry/src: {err}", cargo_home.display()).into());
        }
    };
    for registry in registries {
        let registry = registry?.path();
        for crate_ in crates {
            let unpacked = registry.join(format!("{}-{}", crate_.name, crate_.version));
            match std::fs::remove_dir_all(&unpacked) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("cannot remove {}: {err}", unpacked.display()).into());
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Runs `cargo test <args>` as [`cargo`] does, streaming its standard output
/// line by line while `tally` adds up libtest's summaries.
fn cargo_test(dir: &Path, args: &[&str], env: &[(&str, &str)], tally: &mut TestTally) -> Result {
    let shown_env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    println!("$ {}cargo {}", shown_env.concat(), args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut child = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot start cargo {}: {err}", args.join(" ")))?;
    if let Some(stdout) = child.stdout.take() {
        let mut out = std::io::stdout();
        for line in BufReader::new(stdout).split(b'\n') {
            let line = line?;
            out.write_all(&line)?;
            out.write_all(b"\n")?;
            tally.add(&String::from_utf8_lossy(&line));
        }
        out.flush()?;
    }
    let status = child.wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")).into())
    }
}

/// The tests run so far, from libtest's `test result: ok. 3 passed; 0 failed;
/// …` lines (test binaries, doctests, and the `libtest-mimic` harness alike).
#[derive(Debug, Default, PartialEq, Eq)]
struct TestTally {
    passed: u64,
    failed: u64,
}

impl TestTally {
    /// Adds the counts of `line` if it is a libtest summary.
    fn add(&mut self, line: &str) {
        let Some(counts) = line.trim().strip_prefix("test result: ") else { return };
        for part in counts.split([';', '.']).map(str::trim) {
            if let Some(Ok(n)) = part.strip_suffix(" passed").map(str::parse::<u64>) {
                self.passed += n;
            } else if let Some(Ok(n)) = part.strip_suffix(" failed").map(str::parse::<u64>) {
                self.failed += n;
            }
        }
    }
}

/// The plain closing line of `cargo xtask ci`.
impl std::fmt::Display for TestTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo xtask ARGS` through the dispatch: its exit status, stdout and
    /// stderr.
    fn xtask(args: &[&str]) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = dispatch(&project_root(), args, &mut out, &mut err);
        (status, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    #[test]
    fn every_subcommand_answers_help_with_its_usage() {
        for subcommand in SUBCOMMANDS {
            for help in ["--help", "-h"] {
                let (status, out, err) = xtask(&[subcommand.name, help]);
                let shown = format!("{} {help}", subcommand.name);
                assert_eq!((status, err.as_str()), (0, ""), "{shown}");
                let synopsis = format!("usage: cargo xtask {}", subcommand.name);
                assert!(out.starts_with(&synopsis), "{shown}: {out}");
            }
        }
    }

    #[test]
    fn a_misuse_prints_what_is_wrong_and_the_usage_on_stderr() {
        // (arguments, exit status, what stdout starts with, what stderr
        // starts with)
        let cases: &[(&[&str], u8, &str, &str)] = &[
            (&["--help"], 0, "usage: cargo xtask SUBCOMMAND", ""),
            (&["-h"], 0, "usage: cargo xtask SUBCOMMAND", ""),
            (&[], 2, "", "usage: cargo xtask SUBCOMMAND"),
            (&["frob"], 2, "", "xtask: no subcommand frob\nusage: cargo xtask SUBCOMMAND"),
            (
                &["tidy", "--frob"],
                2,
                "",
                "xtask tidy: cannot take `--frob`\nusage: cargo xtask tidy",
            ),
            (
                &["codegen", "--frob"],
                2,
                "",
                "xtask codegen: cannot take `--frob`\nusage: cargo xtask codegen [--check]",
            ),
            (
                &["image", "--out"],
                2,
                "",
                "xtask image: --out needs a value\nusage: cargo xtask image",
            ),
            (
                &["image", "--tag", "x"],
                2,
                "",
                "xtask image: cannot take `--tag`\nusage: cargo xtask image",
            ),
            (
                &["soak", "--minutes", "0"],
                2,
                "",
                "xtask soak: cannot take `--minutes 0`\nusage: cargo xtask soak",
            ),
            (
                &["bench", "--only", "nothing"],
                2,
                "",
                "xtask bench: cannot take `--only nothing`\nusage: cargo xtask bench",
            ),
            (
                &["interop", "--only", "doctor"],
                2,
                "",
                "xtask interop: needs --bin-dir DIR\nusage: cargo xtask interop",
            ),
            (
                &["kube-e2e", "--etcd", "x"],
                2,
                "",
                "xtask kube-e2e: needs --apiserver BIN\nusage: cargo xtask kube-e2e",
            ),
            (
                &["node-e2e", "--only", "nothing"],
                2,
                "",
                "xtask node-e2e: cannot take `--only nothing`\nusage: cargo xtask node-e2e",
            ),
            (
                &["node-e2e", "--kubelet-dir", "1.30=/x"],
                2,
                "",
                "xtask node-e2e: --kubelet-dir 1.30=/x: 1.30 is not one of",
            ),
        ];
        for (args, status, out, err) in cases {
            let (real_status, real_out, real_err) = xtask(args);
            assert_eq!(real_status, *status, "{args:?}: {real_err}");
            assert!(
                real_out.starts_with(out) && (out.is_empty() == real_out.is_empty()),
                "{args:?}: {real_out}"
            );
            assert!(
                real_err.starts_with(err) && (err.is_empty() == real_err.is_empty()),
                "{args:?}: {real_err}"
            );
        }
    }

    #[test]
    fn the_tally_adds_up_libtest_summaries_and_nothing_else() {
        let mut tally = TestTally::default();
        for line in [
            "running 3 tests",
            "test a ... ok",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 1 filtered out; finished in 1.50s",
            "   Doc-tests kpm",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            "test 4 passed ... ok",
        ] {
            tally.add(line);
        }
        assert_eq!(tally, TestTally { passed: 13, failed: 2 });
        assert_eq!(tally.to_string(), "13 passed, 2 failed");
    }
}
