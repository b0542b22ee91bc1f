//! [`Found`]: what an examination has found so far, which each of its
//! steps adds to and reads.

use crate::judge::Row;
use crate::{Blind, Finding};

/// What one examination of the node has found so far: the rows of its
/// sockets, the findings beyond them, what could not be looked at, and why
/// nothing can be read as healthy. `Doctor::examine` makes one and hands
/// it to each step, which adds what it finds and reads what earlier steps
/// found; the report is made of it at the end.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// One row per socket judged.
    pub(crate) plugins: Vec<Row>,
    /// What is wrong beyond the sockets (API objects, pods, other roots).
    pub(crate) findings: Vec<Finding>,
    /// What could not be looked at, each in one line.
    pub(crate) unseen: Vec<String>,
    /// Why the doctor could not look at all, once known.
    pub(crate) blind: Option<Blind>,
}
