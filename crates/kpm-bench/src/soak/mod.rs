//! `soak`: well-behaved device plugins churned for minutes with misbehaving
//! plugins mixed in (`misbehave.rs`), while kpm's resident memory, open file
//! descriptors, threads, tokio tasks and operation-executor entries are
//! sampled; the verdict compares the end with a baseline taken after a
//! warm-up.
//!
//! The run: `plugins` device plugins register; then, until the warm-up is
//! over, `rate` of them are removed and re-created per second (round robin)
//! and a misbehaving plugin starts every `bad_interval` (the kinds in turn),
//! each living `bad_lifetime`; then the load pauses for the *baseline*; then
//! the load resumes until `duration` of it has passed; then it pauses again
//! for the *final* sample.
//!
//! A pause lets the running misbehaving plugins end and be cleaned up, then
//! waits until kpm has settled (every well-behaved plugin registered, as many
//! sockets as plugins, no executor entry) for at least `QUIET_MIN` (5 s), so that
//! both quiescent samples see the same steady state: any difference is left
//! over from the load in between. Samples are also taken every `sample_every`
//! throughout, to show the figures over time.
//!
//! [`runner`] runs it and gathers the results; [`report`] turns samples into
//! JSON, draws the verdict and prints the tables of a results file. The
//! runner calls the report, never the reverse.

mod report;
mod runner;

pub(crate) use report::table;
pub(crate) use runner::{Settings, soak};
