//! The suites `cargo xtask` runs against real programs, the tools they
//! share, and what they build: xtask's dispatch (`xtask/src/main.rs`)
//! names each subcommand once and calls the module here that runs it, with
//! the workspace root and the words after the subcommand's name. Each
//! suite's module has its usage (`usage`, which `--help` prints) and its
//! entry (`run`, or deploy's `check`):
//!
//! - `bench`: the performance benchmark of `docs/performance.md`, and
//!   `soak`: the soak test of `docs/reliability.md`, both a release `kpm run`
//!   driven by the load generator (their shared part is `harness.rs`);
//! - `interop`: `kpm` and `kpm-registrar` against real programs, `kube-e2e`:
//!   `kpm run` and `kpm doctor` against a real kube-apiserver and etcd, and
//!   `node-e2e`: kpm's image and manifests on a real node (their shared part
//!   is `scenario.rs`: the processes, waits and `kpm` calls of a scenario);
//! - `deploy`: `deploy/` rendered by `kubectl kustomize` and read back, and
//!   the alerting rules through promtool, a step of `cargo xtask ci`;
//! - `image`: kpm's image as one archive, which `cargo xtask image` writes
//!   and node-e2e and interop's `check-image` load;
//! - `debian`: the Debian packages deploy and node-e2e install when a
//!   program they need is missing;
//! - `command`: what every subcommand shares, xtask's own too (the `Result`,
//!   the usage error, cargo run with its command line printed, the
//!   workspace root).
//!
//! The suites against real programs (`interop`, `kube-e2e`, `node-e2e`)
//! build none of those programs and keep none of their code: they are given
//! the programs' paths, and a scenario whose program is missing is named as
//! skipped while the suite succeeds.

pub mod bench;
pub mod command;
pub mod deploy;
pub mod image;
pub mod interop;
pub mod kube_e2e;
pub mod node_e2e;
pub mod soak;

mod debian;
mod harness;
mod scenario;
