//! Whether the judged kubelet has a plugin whose socket answers: none runs,
//! the socket predates the kubelet (a device plugin's), or it is too new
//! for the kubelet to have registered it yet. A look at the socket alone
//! cannot tell; after a node event it must.

use std::path::Path;
use std::time::{Duration, SystemTime};

use kpm::PluginKind;

use super::Evidence;
use crate::host::View;
use crate::judge::Row;

/// How long after its socket appears a plugin lost to a node event is taken
/// as registered again: the kubelet's plugin manager registers a new
/// socket on its reconciler's next loop, every second
/// (`reconcilerLoopSleepPeriod`), and a device plugin calls `Register`
/// once it serves; twice that, for the calls.
const REGISTERED_WITHIN: Duration = Duration::from_secs(2);

/// Why a row that registers by its socket alone is not registered with the
/// judged kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unregistered {
    /// No kubelet runs.
    NoKubelet,
    /// A device plugin's socket made before the judged kubelet's start,
    /// which removes every socket of `device-plugins/` as it starts and
    /// has not reached this one yet (a plugin that registers again serves
    /// a new socket).
    OlderThanTheKubelet,
    /// A socket made less than [`REGISTERED_WITHIN`] ago.
    JustMade,
}

impl Unregistered {
    /// What the row says of it.
    pub(super) fn said(self) -> Option<&'static str> {
        match self {
            // The row's first words say it.
            Self::NoKubelet => None,
            Self::OlderThanTheKubelet => Some(
                "its socket answers, but is older than the kubelet's start: the kubelet removes \
                 every socket of device-plugins/ as it starts, and has not reached this one yet",
            ),
            Self::JustMade => Some(
                "its socket is back, but was made less than 2s ago: the kubelet registers a new \
                 socket within its plugin manager's next loop, every second",
            ),
        }
    }
}

/// Why a row that registers by its socket alone is not registered with
/// the judged kubelet, if it is not.
pub(super) fn unregistered(row: &Row, evidence: &Evidence<'_>) -> Option<Unregistered> {
    if !row.verdict.registers() {
        return None;
    }
    let Some(started) = evidence.events.kubelet_started else {
        return Some(Unregistered::NoKubelet);
    };
    let made = made(&row.path, evidence.view)?;
    if row.kind == Some(PluginKind::Device) && made < started {
        return Some(Unregistered::OlderThanTheKubelet);
    }
    (made + REGISTERED_WITHIN > evidence.now).then_some(Unregistered::JustMade)
}

/// When the file at `path` on the host was made (its last change: a socket
/// is not written to), if it can be read.
pub(super) fn made(path: &Path, view: &View) -> Option<SystemTime> {
    std::fs::symlink_metadata(view.path(path)).and_then(|meta| meta.modified()).ok()
}
