//! What kpm wants the API server to hold for its node (the desired state),
//! and how far the reconcile loop has got towards it (the progress), both
//! by [`Target`]: a CSI driver, a device resource, a DRA driver's slice
//! wipe.
//!
//! The publishers' handles (the CSI sink, the DRA cleanup, the device
//! capacity, the leftovers' clean-up) only change the desired state and wake
//! the loop; the loop (`reconcile`) is the one writer. A target's goal keeps
//! the revision it was set at, so that the loop's word on it can be matched
//! with the change a caller waits for, and the time it was set at, so that
//! a difference that lasts shows since when.
//!
//! The loop reports each pass's outcomes; of the passes before, the books
//! keep per target the newest revision the API server agreed with. That
//! revision only grows, so a caller that missed the pass that agreed (a
//! withdrawal or a wipe then leaves the desired state at once) still finds
//! its answer.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use kpm_csi::{CsiError, DriverNodeInfo};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::KubeError;
use crate::status::{ObjectKind, PendingPublication};

/// A device resource's (capacity, allocatable).
pub(crate) type Counts = (usize, usize);

/// One thing the loop brings the API server to, named after its plugin:
/// the key of the desired state, of the loop's outcomes and of what the
/// loop keeps between passes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Target {
    /// A CSI driver's node-id annotation entry, topology labels and
    /// CSINode entry.
    Csi(String),
    /// A device plugin's resource on the Node's status.
    Device(String),
    /// The deletion of a DRA driver's ResourceSlices of this node.
    Wipe(String),
}

impl Target {
    /// The CSI driver, device resource or DRA driver.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Csi(name) | Self::Device(name) | Self::Wipe(name) => name,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Csi(driver) => write!(f, "CSI driver {driver}"),
            Self::Device(resource) => write!(f, "device resource {resource}"),
            Self::Wipe(driver) => write!(f, "ResourceSlices of DRA driver {driver}"),
        }
    }
}

/// What a CSI driver should have on the Node and the CSINode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CsiGoal {
    /// Its node-id annotation entry, topology labels and CSINode entry
    /// (`InstallCSIDriver`).
    Installed(DriverNodeInfo),
    /// No CSINode entry and no annotation entry; labels stay
    /// (`UninstallCSIDriver`). Dropped once the API server agrees.
    Withdrawn,
}

/// What a device resource should show on the Node's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceGoal {
    /// These counts.
    Counts(Counts),
    /// Nothing: as the kubelet does, zero first (a watcher of the Node sees
    /// the last word), then removed. Dropped once the Node shows nothing.
    Gone,
}

/// What kpm wants for one target, and when it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Goal<T> {
    pub(crate) value: T,
    /// The desired state's revision when it was set.
    pub(crate) revision: u64,
    pub(crate) since: SystemTime,
}

/// Everything kpm wants the API server to hold, a goal per target; what is
/// in none of the maps is left alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Desired {
    revision: u64,
    /// By driver name.
    pub(crate) csi: BTreeMap<String, Goal<CsiGoal>>,
    /// By resource name.
    pub(crate) devices: BTreeMap<String, Goal<DeviceGoal>>,
    /// The DRA drivers whose ResourceSlices of this node are due to be
    /// deleted. Dropped once deleted, or when the wipe is called off.
    pub(crate) wipes: BTreeMap<String, Goal<()>>,
}

impl Desired {
    pub(crate) fn is_empty(&self) -> bool {
        self.csi.is_empty() && self.devices.is_empty() && self.wipes.is_empty()
    }

    /// Sets `name`'s goal in `goals` (one of this state's maps) to
    /// `value`; returns its revision, a new one only if the value changed.
    fn set<T: PartialEq>(
        revision: &mut u64,
        goals: &mut BTreeMap<String, Goal<T>>,
        name: &str,
        value: T,
    ) -> u64 {
        if let Some(goal) = goals.get(name)
            && goal.value == value
        {
            return goal.revision;
        }
        *revision += 1;
        goals
            .insert(name.to_owned(), Goal { value, revision: *revision, since: SystemTime::now() });
        *revision
    }

    pub(crate) fn set_csi(&mut self, driver: &str, goal: CsiGoal) -> u64 {
        Self::set(&mut self.revision, &mut self.csi, driver, goal)
    }

    pub(crate) fn set_device(&mut self, resource: &str, goal: DeviceGoal) -> u64 {
        Self::set(&mut self.revision, &mut self.devices, resource, goal)
    }

    pub(crate) fn add_wipe(&mut self, driver: &str) -> u64 {
        Self::set(&mut self.revision, &mut self.wipes, driver, ())
    }

    /// The revision `target`'s goal was set at, if it has one.
    pub(crate) fn revision_of(&self, target: &Target) -> Option<u64> {
        match target {
            Target::Csi(driver) => self.csi.get(driver).map(|goal| goal.revision),
            Target::Device(resource) => self.devices.get(resource).map(|goal| goal.revision),
            Target::Wipe(driver) => self.wipes.get(driver).map(|goal| goal.revision),
        }
    }

    /// Drops `target`'s goal if it is still the one set at `revision`: a
    /// newer one stays.
    pub(crate) fn drop_at(&mut self, target: &Target, revision: u64) {
        fn drop_from<T>(goals: &mut BTreeMap<String, Goal<T>>, name: &str, revision: u64) {
            if goals.get(name).is_some_and(|goal| goal.revision == revision) {
                goals.remove(name);
            }
        }
        match target {
            Target::Csi(driver) => drop_from(&mut self.csi, driver, revision),
            Target::Device(resource) => drop_from(&mut self.devices, resource, revision),
            Target::Wipe(driver) => drop_from(&mut self.wipes, driver, revision),
        }
    }
}

/// How one pass of the loop left one target.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// The API server holds what the goal says.
    Agreed,
    /// The API server holds what the goal says, and the target leaves the
    /// desired state: a withdrawn driver, a gone resource the Node no
    /// longer shows, a done wipe.
    Done,
    /// A step was written and the next one follows (a withdrawn driver's
    /// annotation entry after its CSINode entry), or a write waits for its
    /// turn (the Node's status, [`KubeConfig::capacity_interval`]).
    ///
    /// [`KubeConfig::capacity_interval`]: crate::KubeConfig::capacity_interval
    Writing,
    /// The API server could not be brought to it: `attempts` passes in a
    /// row failed since the goal was set, this one on `object`. `unread`
    /// when the objects could not even be read: whether the API server
    /// still holds what it agreed with before is unknown, so an earlier
    /// agreement stands.
    Failing { attempts: u32, object: ObjectKind, error: Arc<KubeError>, unread: bool },
    /// A rule of the kubelet's refuses it (a topology label another
    /// writer set differently, an annotation that is not JSON): retried
    /// only when the object or the goal changes.
    Refused(Arc<CsiError>),
}

impl State {
    /// Whether the API server holds what the goal says.
    pub(crate) fn agreed(&self) -> bool {
        matches!(self, Self::Agreed | Self::Done)
    }
}

/// How one pass of the loop left one target, at the goal's revision, and
/// what it shows as pending, if the API server does not hold it.
#[derive(Debug, Clone)]
pub(crate) struct PassResult {
    pub(crate) revision: u64,
    pub(crate) state: State,
    pub(crate) pending: Option<PendingPublication>,
}

/// The loop's word to a caller waiting on one goal.
#[derive(Debug, Clone)]
pub(crate) enum Settled {
    /// The API server agreed with it, or with a newer goal of the target.
    Agreed,
    /// A rule of the kubelet's refuses it (on the Node).
    Refused(Arc<CsiError>),
    /// As many passes in a row as the caller allows failed, the last on
    /// `object`.
    Failed { object: ObjectKind, error: Arc<KubeError> },
}

/// What the books keep of the loop's passes.
#[derive(Debug, Default)]
struct Progress {
    /// Per target, the newest revision the API server agreed with; it only
    /// grows. Kept while the target has a goal or a caller waits on it.
    agreed: BTreeMap<Target, u64>,
    /// The last pass's outcomes.
    last: BTreeMap<Target, PassResult>,
}

/// The desired state, shared by the handles that change it and the loop
/// that reads it, with the loop's progress.
#[derive(Debug)]
pub(crate) struct Books {
    desired: Mutex<Desired>,
    /// The desired state's revision, for the loop to wait on.
    revision: watch::Sender<u64>,
    progress: watch::Sender<Progress>,
    /// How many callers wait on each target.
    waiting: Mutex<BTreeMap<Target, usize>>,
}

impl Default for Books {
    fn default() -> Self {
        Self {
            desired: Mutex::default(),
            revision: watch::Sender::new(0),
            progress: watch::Sender::new(Progress::default()),
            waiting: Mutex::default(),
        }
    }
}

impl Books {
    /// Changes the desired state with `change`, and wakes the loop if a
    /// goal was set anew (one dropped needs no pass).
    pub(crate) fn change<R>(&self, change: impl FnOnce(&mut Desired) -> R) -> R {
        let mut desired = self.desired.lock();
        let before = desired.revision;
        let result = change(&mut desired);
        if desired.revision != before {
            self.revision.send_replace(desired.revision);
        }
        result
    }

    /// The changes of the desired state, for the loop: mark one seen
    /// before taking [`desired`](Self::desired).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// A copy of the desired state, for one pass of the loop.
    pub(crate) fn desired(&self) -> Desired {
        self.desired.lock().clone()
    }

    /// The newest revision of each target the API server agreed with, for
    /// a pass that cannot read the objects.
    pub(crate) fn agreed(&self) -> BTreeMap<Target, u64> {
        self.progress.borrow().agreed.clone()
    }

    /// Takes a pass's outcomes: the agreed revisions grow, and the targets
    /// done leave the desired state, unless their goal changed meanwhile.
    pub(crate) fn report(&self, outcomes: BTreeMap<Target, PassResult>) {
        let done: Vec<(Target, u64)> = outcomes
            .iter()
            .filter(|(_, outcome)| matches!(outcome.state, State::Done))
            .map(|(target, outcome)| (target.clone(), outcome.revision))
            .collect();
        self.progress.send_modify(|progress| {
            for (target, outcome) in outcomes.iter().filter(|(_, o)| o.state.agreed()) {
                let agreed = progress.agreed.entry(target.clone()).or_default();
                *agreed = (*agreed).max(outcome.revision);
            }
            let desired = self.desired.lock();
            let waiting = self.waiting.lock();
            progress.agreed.retain(|target, _| {
                desired.revision_of(target).is_some() || waiting.contains_key(target)
            });
            progress.last = outcomes;
        });
        // Only once the agreements are out: a caller that finds its target
        // gone finds it agreed.
        let mut desired = self.desired.lock();
        for (target, revision) in &done {
            desired.drop_at(target, *revision);
        }
    }

    /// What the API server does not hold yet, oldest first, by the last
    /// pass.
    pub(crate) fn pending(&self) -> Vec<PendingPublication> {
        let progress = self.progress.borrow();
        let mut pending: Vec<PendingPublication> =
            progress.last.values().filter_map(|outcome| outcome.pending.clone()).collect();
        pending.sort_by_key(|pending| pending.since);
        pending
    }

    /// Sets a goal with `change`, which returns its revision (or `None`
    /// to set none), for a caller who then waits on it with
    /// [`Awaited::settled`]. The caller counts as waiting before the loop
    /// can see the goal, so the target's agreement is kept for it however
    /// many passes go by before it looks.
    pub(crate) fn set_awaited(
        &self,
        target: Target,
        change: impl FnOnce(&mut Desired) -> Option<u64>,
    ) -> Option<Awaited<'_>> {
        self.change(|desired| {
            let waiting = Waiting::on(self, target);
            change(desired).map(|revision| Awaited { waiting, revision })
        })
    }
}

/// A goal its caller waits on, from [`Books::set_awaited`].
pub(crate) struct Awaited<'a> {
    waiting: Waiting<'a>,
    revision: u64,
}

impl Awaited<'_> {
    /// The revision the goal was set at.
    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    /// Waits for the loop's word on the goal: the API server agrees (with
    /// it or a newer goal), a rule refuses it, or `attempts` passes in a
    /// row failed. `None` when a newer goal replaced it first, or it was
    /// dropped unagreed (a wipe called off).
    pub(crate) async fn settled(&self, attempts: u32) -> Option<Settled> {
        let Waiting { books, target } = &self.waiting;
        let mut progress = books.progress.subscribe();
        let mut word = None;
        let settled = progress.wait_for(|progress| {
            word = progress.word(target, self.revision, attempts);
            word.is_some() || books.desired.lock().revision_of(target) != Some(self.revision)
        });
        // The sender lives as long as the books.
        settled.await.ok()?;
        word
    }
}

impl Progress {
    /// The word on `target`'s goal at `revision`, if there is one yet.
    fn word(&self, target: &Target, revision: u64, attempts: u32) -> Option<Settled> {
        if self.agreed.get(target).is_some_and(|agreed| *agreed >= revision) {
            return Some(Settled::Agreed);
        }
        let outcome = self.last.get(target).filter(|outcome| outcome.revision == revision)?;
        match &outcome.state {
            State::Refused(error) => Some(Settled::Refused(Arc::clone(error))),
            State::Failing { attempts: failed, object, error, .. } if *failed >= attempts => {
                Some(Settled::Failed { object: *object, error: Arc::clone(error) })
            }
            _ => None,
        }
    }
}

/// A caller waiting on a target, counted so that the target's agreed
/// revision is kept until it has read it.
struct Waiting<'a> {
    books: &'a Books,
    target: Target,
}

impl<'a> Waiting<'a> {
    fn on(books: &'a Books, target: Target) -> Self {
        *books.waiting.lock().entry(target.clone()).or_default() += 1;
        Self { books, target }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.books.waiting.lock();
        if let Some(callers) = waiting.get_mut(&self.target) {
            *callers -= 1;
            if *callers == 0 {
                waiting.remove(&self.target);
            }
        }
    }
}

/// Data-driven, as rust-analyzer's tests are: each case is a script of
/// goals set, callers waiting and passes reported, and the transcript it
/// gives, through one helper, [`check`](tests::check), on paused time.
#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::time::Duration;

    use super::*;

    /// A script, one step a line, each echoed in the transcript with what
    /// came of it, indented:
    ///
    /// - `install DRIVER NODE-ID`, `withdraw DRIVER`, `count RESOURCE
    ///   CAPACITY ALLOCATABLE`, `gone RESOURCE`, `wipe DRIVER` set a goal:
    ///   `rN`, its revision, and whether the loop is woken;
    /// - `wait TARGET [ATTEMPTS]` starts a caller waiting on the target's
    ///   goal (`csi/NAME`, `device/NAME`, `wipe/NAME`), numbered `#1`,
    ///   `#2`, … in the order they start; `#N: WORD` when it has its word;
    /// - `call-off TARGET` drops the target's goal, as a wipe's caller
    ///   does when it stops waiting: `dropped`, and whether the loop is
    ///   woken;
    /// - `pass TARGET=STATE, …` reports one pass of the loop, at the goal's
    ///   revision or at `TARGET@REVISION` (a pass that worked from an older
    ///   copy); STATE is `agreed`, `done`, `writing`, `refused`,
    ///   `failing:ATTEMPTS` (on the CSINode) or `unread:ATTEMPTS`. `;`
    ///   separates passes reported back to back, before any caller looks.
    ///
    /// After a `pass` or a `call-off`, the desired state's goals and the
    /// books' agreed revisions; at the end, the callers still waiting.
    async fn check(script: &str) -> String {
        let books = Arc::new(Books::default());
        let mut changes = books.changes();
        let (said, mut words) = tokio::sync::mpsc::unbounded_channel();
        let mut callers = 0;
        let mut waiting = Vec::new();
        let mut transcript = String::new();
        for line in script.trim().lines().map(str::trim) {
            writeln!(transcript, "{line}").unwrap();
            let (step, rest) = line.split_once(' ').unwrap_or((line, ""));
            let args: Vec<&str> = rest.split_whitespace().collect();
            // A goal set: its revision.
            let set = |change: &dyn Fn(&mut Desired) -> u64| {
                Some(format!("r{}", books.change(|d| change(d))))
            };
            let change = match step {
                "install" => {
                    let info = DriverNodeInfo {
                        node_id: args[1].into(),
                        max_volumes_per_node: 0,
                        topology: BTreeMap::new(),
                    };
                    set(&|d| d.set_csi(args[0], CsiGoal::Installed(info.clone())))
                }
                "withdraw" => set(&|d| d.set_csi(args[0], CsiGoal::Withdrawn)),
                "count" => {
                    let counts = (args[1].parse().unwrap(), args[2].parse().unwrap());
                    set(&|d| d.set_device(args[0], DeviceGoal::Counts(counts)))
                }
                "gone" => set(&|d| d.set_device(args[0], DeviceGoal::Gone)),
                "wipe" => set(&|d| d.add_wipe(args[0])),
                "wait" => {
                    let target = target(args[0]);
                    let revision = books.desired.lock().revision_of(&target).unwrap();
                    let attempts = args.get(1).map_or(u32::MAX, |n| n.parse().unwrap());
                    callers += 1;
                    waiting.push(callers);
                    let (books, said, caller) = (Arc::clone(&books), said.clone(), callers);
                    tokio::spawn(async move {
                        let waiting = Waiting::on(&books, target);
                        let word = Awaited { waiting, revision }.settled(attempts).await;
                        said.send((caller, word)).unwrap();
                    });
                    None
                }
                "call-off" => {
                    let target = target(args[0]);
                    let revision = books.desired.lock().revision_of(&target).unwrap();
                    books.change(|d| d.drop_at(&target, revision));
                    Some("dropped".to_owned())
                }
                "pass" => {
                    for pass in rest.split(';') {
                        let outcomes = pass
                            .split(',')
                            .filter(|spec| !spec.trim().is_empty())
                            .map(|spec| outcome(&books, spec.trim()))
                            .collect();
                        books.report(outcomes);
                    }
                    None
                }
                _ => panic!("unknown step {line:?}"),
            };
            if let Some(change) = change {
                let woke = changes.has_changed().unwrap();
                changes.borrow_and_update();
                let woke = if woke { "wakes the loop" } else { "the loop sleeps" };
                writeln!(transcript, "  {change}, {woke}").unwrap();
            }
            if matches!(step, "pass" | "call-off") {
                writeln!(transcript, "  {}", books_now(&books)).unwrap();
            }
            // Every caller that can have its word has it.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut said = Vec::new();
            while let Ok(word) = words.try_recv() {
                said.push(word);
            }
            said.sort_by_key(|(caller, _)| *caller);
            for (caller, word) in said {
                waiting.retain(|waiter| *waiter != caller);
                let word = match word {
                    None => "none".to_owned(),
                    Some(Settled::Agreed) => "agreed".to_owned(),
                    Some(Settled::Refused(_)) => "refused".to_owned(),
                    Some(Settled::Failed { object, .. }) => format!("failed on {object}"),
                };
                writeln!(transcript, "  #{caller}: {word}").unwrap();
            }
        }
        if !waiting.is_empty() {
            let waiting: Vec<String> = waiting.iter().map(|caller| format!("#{caller}")).collect();
            writeln!(transcript, "still waiting: {}", waiting.join(", ")).unwrap();
        }
        transcript
    }

    fn target(text: &str) -> Target {
        match text.split_once('/') {
            Some(("csi", name)) => Target::Csi(name.into()),
            Some(("device", name)) => Target::Device(name.into()),
            Some(("wipe", name)) => Target::Wipe(name.into()),
            _ => panic!("not a target: {text:?}"),
        }
    }

    fn short(target: &Target) -> String {
        match target {
            Target::Csi(name) => format!("csi/{name}"),
            Target::Device(name) => format!("device/{name}"),
            Target::Wipe(name) => format!("wipe/{name}"),
        }
    }

    /// `TARGET[@REVISION]=STATE`.
    fn outcome(books: &Books, spec: &str) -> (Target, PassResult) {
        let (at, state) = spec.split_once('=').unwrap();
        let (name, revision) = at.split_once('@').map_or((at, None), |(n, r)| (n, Some(r)));
        let target = target(name);
        let revision = revision.map_or_else(
            || books.desired.lock().revision_of(&target).unwrap(),
            |revision| revision.parse().unwrap(),
        );
        let error = Arc::new(KubeError::NodeNotFound { node: "node1".into() });
        let failing = |attempts: &str, unread| State::Failing {
            attempts: attempts.parse().unwrap(),
            object: ObjectKind::CsiNode,
            error: Arc::clone(&error),
            unread,
        };
        let state = match state.split_once(':') {
            None if state == "agreed" => State::Agreed,
            None if state == "done" => State::Done,
            None if state == "writing" => State::Writing,
            None if state == "refused" => State::Refused(Arc::new(CsiError::EmptyNodeId)),
            Some(("failing", attempts)) => failing(attempts, false),
            Some(("unread", attempts)) => failing(attempts, true),
            _ => panic!("not a state: {state:?}"),
        };
        (target, PassResult { revision, state, pending: None })
    }

    /// `desired: TARGET rN, …; agreed: TARGET rN, …`.
    fn books_now(books: &Books) -> String {
        let list = |entries: Vec<(Target, u64)>| {
            let entries: Vec<String> =
                entries.iter().map(|(target, r)| format!("{} r{r}", short(target))).collect();
            if entries.is_empty() { "none".to_owned() } else { entries.join(", ") }
        };
        let desired = books.desired.lock();
        let csi = desired.csi.iter().map(|(n, g)| (Target::Csi(n.clone()), g.revision));
        let devices = desired.devices.iter().map(|(n, g)| (Target::Device(n.clone()), g.revision));
        let wipes = desired.wipes.iter().map(|(n, g)| (Target::Wipe(n.clone()), g.revision));
        let goals = csi.chain(devices).chain(wipes).collect();
        let agreed = books.agreed().into_iter().collect();
        format!("desired: {}; agreed: {}", list(goals), list(agreed))
    }

    /// (name, script, transcript).
    const CASES: &[(&str, &str, &str)] = &[
        (
            "a goal set again as it is keeps its revision and lets the loop sleep",
            "
            install a n1
            install a n1
            install a n2
            count g 2 1
            count g 2 1
            wipe d
            wipe d
            ",
            "
install a n1
  r1, wakes the loop
install a n1
  r1, the loop sleeps
install a n2
  r2, wakes the loop
count g 2 1
  r3, wakes the loop
count g 2 1
  r3, the loop sleeps
wipe d
  r4, wakes the loop
wipe d
  r4, the loop sleeps
            ",
        ),
        (
            "a caller has its word when the API server agrees, not before",
            "
            install a n1
            wait csi/a 4
            pass csi/a=writing
            pass csi/a=agreed
            ",
            "
install a n1
  r1, wakes the loop
wait csi/a 4
pass csi/a=writing
  desired: csi/a r1; agreed: none
pass csi/a=agreed
  desired: csi/a r1; agreed: csi/a r1
  #1: agreed
            ",
        ),
        (
            "a caller that missed the pass that agreed has its word all the same",
            "
            install a n1
            wait csi/a 4
            pass csi/a=agreed; csi/a=unread:1
            ",
            "
install a n1
  r1, wakes the loop
wait csi/a 4
pass csi/a=agreed; csi/a=unread:1
  desired: csi/a r1; agreed: csi/a r1
  #1: agreed
            ",
        ),
        (
            "a withdrawal done leaves at once, and is agreed for its caller however late",
            "
            withdraw a
            wait csi/a 4
            pass csi/a=writing; csi/a=done;
            pass
            ",
            "
withdraw a
  r1, wakes the loop
wait csi/a 4
pass csi/a=writing; csi/a=done;
  desired: none; agreed: csi/a r1
  #1: agreed
pass
  desired: none; agreed: none
            ",
        ),
        (
            "a wipe done is agreed for its caller two passes later",
            "
            wipe d
            wait wipe/d
            pass wipe/d=done; ;
            ",
            "
wipe d
  r1, wakes the loop
wait wipe/d
pass wipe/d=done; ;
  desired: none; agreed: wipe/d r1
  #1: agreed
            ",
        ),
        (
            "a caller gives up after its attempts, even one it missed; one allowing more waits on",
            "
            install a n1
            wait csi/a 4
            wait csi/a
            pass csi/a=failing:3
            pass csi/a=failing:4; csi/a=failing:5
            ",
            "
install a n1
  r1, wakes the loop
wait csi/a 4
wait csi/a
pass csi/a=failing:3
  desired: csi/a r1; agreed: none
pass csi/a=failing:4; csi/a=failing:5
  desired: csi/a r1; agreed: none
  #1: failed on CSINode
still waiting: #2
            ",
        ),
        (
            "a refusal is a word at once",
            "
            install a n1
            wait csi/a 4
            pass csi/a=refused
            ",
            "
install a n1
  r1, wakes the loop
wait csi/a 4
pass csi/a=refused
  desired: csi/a r1; agreed: none
  #1: refused
            ",
        ),
        (
            "an earlier agreement stands while the objects cannot be read",
            "
            install a n1
            pass csi/a=agreed
            pass csi/a=unread:9
            wait csi/a 4
            ",
            "
install a n1
  r1, wakes the loop
pass csi/a=agreed
  desired: csi/a r1; agreed: csi/a r1
pass csi/a=unread:9
  desired: csi/a r1; agreed: csi/a r1
wait csi/a 4
  #1: agreed
            ",
        ),
        (
            "a newer goal leaves the caller of the older one without a word, or agreed with it",
            "
            install a n1
            wait csi/a 4
            install a n2
            pass csi/a=writing
            wait csi/a 4
            install a n3
            pass csi/a=agreed
            ",
            "
install a n1
  r1, wakes the loop
wait csi/a 4
install a n2
  r2, wakes the loop
pass csi/a=writing
  desired: csi/a r2; agreed: none
  #1: none
wait csi/a 4
install a n3
  r3, wakes the loop
pass csi/a=agreed
  desired: csi/a r3; agreed: csi/a r3
  #2: agreed
            ",
        ),
        (
            "an outcome at an older revision is no word on the newer goal",
            "
            install a n1
            install a n2
            wait csi/a 4
            pass csi/a@1=refused
            pass csi/a@1=agreed
            pass csi/a=agreed
            ",
            "
install a n1
  r1, wakes the loop
install a n2
  r2, wakes the loop
wait csi/a 4
pass csi/a@1=refused
  desired: csi/a r2; agreed: none
pass csi/a@1=agreed
  desired: csi/a r2; agreed: csi/a r1
pass csi/a=agreed
  desired: csi/a r2; agreed: csi/a r2
  #1: agreed
            ",
        ),
        (
            "the agreed revision only grows",
            "
            install a n1
            install a n2
            pass csi/a=agreed
            pass csi/a@1=agreed
            wait csi/a 4
            ",
            "
install a n1
  r1, wakes the loop
install a n2
  r2, wakes the loop
pass csi/a=agreed
  desired: csi/a r2; agreed: csi/a r2
pass csi/a@1=agreed
  desired: csi/a r2; agreed: csi/a r2
wait csi/a 4
  #1: agreed
            ",
        ),
        (
            "a target done at an older revision stays for its newer goal",
            "
            withdraw a
            install a n1
            pass csi/a@1=done
            ",
            "
withdraw a
  r1, wakes the loop
install a n1
  r2, wakes the loop
pass csi/a@1=done
  desired: csi/a r2; agreed: csi/a r1
            ",
        ),
        (
            "a gone resource leaves once done, not once agreed, and its agreement with it",
            "
            count g 2 1
            gone g
            pass device/g=agreed
            pass device/g=done
            pass
            ",
            "
count g 2 1
  r1, wakes the loop
gone g
  r2, wakes the loop
pass device/g=agreed
  desired: device/g r2; agreed: device/g r2
pass device/g=done
  desired: none; agreed: device/g r2
pass
  desired: none; agreed: none
            ",
        ),
        (
            "a wipe called off goes without waking the loop, and its caller has no word",
            "
            wipe d
            wait wipe/d
            call-off wipe/d
            pass
            ",
            "
wipe d
  r1, wakes the loop
wait wipe/d
call-off wipe/d
  dropped, the loop sleeps
  desired: none; agreed: none
pass
  desired: none; agreed: none
  #1: none
            ",
        ),
    ];

    /// A caller counts as waiting from the moment it sets its goal: two
    /// passes that go by before it looks (the first agrees and drops the
    /// wipe, the second forgets targets nobody waits on) leave it its word.
    #[tokio::test(start_paused = true)]
    async fn a_goal_set_for_a_caller_keeps_its_agreement_until_the_caller_looks() {
        let books = Books::default();
        let target = Target::Wipe("d".into());
        let awaited = books.set_awaited(target.clone(), |d| Some(d.add_wipe("d"))).unwrap();
        let done = PassResult { revision: awaited.revision(), state: State::Done, pending: None };
        books.report(BTreeMap::from([(target, done)]));
        books.report(BTreeMap::new());
        assert!(matches!(awaited.settled(u32::MAX).await, Some(Settled::Agreed)));
    }

    #[tokio::test(start_paused = true)]
    async fn cases() {
        for (name, script, expected) in CASES {
            let transcript = check(script).await;
            assert_eq!(transcript.trim(), expected.trim(), "{name}:\n{transcript}");
        }
    }
}
