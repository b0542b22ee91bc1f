//! What every `cargo xtask` subcommand shares, the suites here and xtask's
//! own (codegen, tidy, ci) alike: the `Result` they return, the usage error
//! the dispatch turns into a usage text, cargo run with its command line
//! printed, and the workspace root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a subcommand returns: any error, printed by the dispatch.
pub type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// A subcommand's error when its options are wrong, saying what is wrong;
/// the dispatch adds the subcommand's usage.
#[derive(Debug)]
pub struct Misused(pub String);

impl Misused {
    /// `option` (with the `value` that followed it, if any) is not one the
    /// subcommand takes.
    pub fn refused(option: &str, value: Option<&str>) -> Self {
        let given: Vec<&str> = [Some(option), value].into_iter().flatten().collect();
        Self(format!("cannot take `{}`", given.join(" ")))
    }

    /// `option`, which it needs, was not given.
    pub fn missing(option: &str) -> Self {
        Self(format!("needs {option}"))
    }
}

impl std::fmt::Display for Misused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Misused {}

/// The workspace root: the parent of this crate's manifest directory, as it
/// is of xtask's (both are top-level directories of the workspace).
pub fn project_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).to_path_buf()
}

/// Runs `cargo <args>` in `dir`, echoing the command line first.
pub fn cargo(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result {
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
