//! `cargo xtask`: the project's automation, in Rust so that a fresh machine
//! needs nothing but cargo.
//!
//! - `codegen [--check]`: compile `proto/` with protox and tonic-prost-build into
//!   the checked-in code of `kpm-api`; `--check` fails when that code is stale.
//! - `ci`: everything CI runs, in order, printing each command.
//! - `bench [--quick] [--only SCENARIO]`: the performance benchmark of
//!   `docs/performance.md` (see `bench.rs`).
//! - `soak [--minutes N | --seconds N] [-- LOADGEN-OPTIONS]`: the soak test of
//!   `docs/reliability.md`, 10 minutes by default (see `soak.rs`).
//! - `interop --bin-dir DIR [--only SCENARIO]`: `kpm` and `kpm-registrar`
//!   against real programs in DIR (see `interop.rs`); not part of `ci`.
//! - `kube-e2e --apiserver BIN --etcd BIN [--manifest FILE] [--only SCENARIO]`:
//!   `kpm run` against a real kube-apiserver and etcd (see `kube_e2e.rs`);
//!   not part of `ci`.
//! - `tidy`: source-tree rules (see `tidy.rs`); also runs as a test.

mod bench;
mod codegen;
mod harness;
mod interop;
mod kube_e2e;
mod scenario;
mod soak;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const USAGE: &str = "usage: cargo xtask <codegen [--check] | ci | bench [--quick] [--only SCENARIO] \
                     | soak [--minutes N | --seconds N] [-- LOADGEN-OPTIONS] \
                     | interop --bin-dir DIR [--only SCENARIO] \
                     | kube-e2e --apiserver BIN --etcd BIN [--manifest FILE] [--only SCENARIO] | tidy>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["codegen"] => codegen::run(&project_root(), codegen::Mode::Write),
        ["codegen", "--check"] => codegen::run(&project_root(), codegen::Mode::Check),
        ["ci"] => ci(),
        ["bench", options @ ..] => bench::run(&project_root(), options),
        ["soak", options @ ..] => soak::run(&project_root(), options),
        ["interop", options @ ..] => interop::run(&project_root(), options),
        ["kube-e2e", options @ ..] => kube_e2e::run(&project_root(), options),
        ["tidy"] => tidy::check(&project_root()),
        ["--help" | "-h" | "help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn project_root() -> PathBuf {
    let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask_dir.parent().unwrap_or(xtask_dir).to_path_buf()
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

fn ci() -> Result {
    let root = project_root();
    let proptest_cases =
        std::env::var("PROPTEST_CASES").unwrap_or_else(|_| CI_PROPTEST_CASES.to_owned());
    cargo(&root, &["fmt", "--all", "--", "--check"], &[])?;
    cargo(
        &root,
        &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"],
        &[],
    )?;
    // The workspace build unifies features: check that each feature set a
    // library user may pick builds on its own, without warnings.
    for features in FEATURE_SETS {
        let mut args = vec!["clippy"];
        args.extend_from_slice(features);
        args.extend_from_slice(&["--", "-D", "warnings"]);
        cargo(&root, &args, &[])?;
    }
    println!("$ cargo xtask codegen --check");
    codegen::run(&root, codegen::Mode::Check)?;
    println!("$ cargo xtask tidy");
    tidy::check(&root)?;
    cargo(&root, &["build", "--workspace", "--all-targets", "--all-features"], &[])?;
    cargo(
        &root,
        &["test", "--workspace", "--all-features"],
        &[("PROPTEST_CASES", proptest_cases.as_str())],
    )?;
    cargo(
        &root,
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    println!("xtask ci: all steps passed");
    Ok(())
}

/// Runs `cargo <args>` in `dir`, echoing the command line first.
fn cargo(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result {
    let shown_env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    println!("$ {}cargo {}", shown_env.concat(), args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .status()
        .map_err(|err| format!("cannot start cargo {}: {err}", args.join(" ")))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")).into())
    }
}
