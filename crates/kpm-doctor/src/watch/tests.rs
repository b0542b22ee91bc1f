//! The watch's decisions, on paused time.

use std::path::Path;

use super::*;
use kpm_report::CANNOT_JUDGE_REASON;
use kpm_report::Verdict;

use crate::judge::Row;
use crate::publish::Occurrence;
use crate::publish::events::{CAN_JUDGE_REASON, RECOVERED_REASON, STABLE_REASON, transitions};
use crate::{Blind, Finding};

const SOCKET: &str = "/r/plugins_registry/csi.example.com-reg.sock";

fn stale() -> Row {
    Row::new(Verdict::Stale, Path::new(SOCKET), "registry", "connection refused".to_owned())
}

fn blind() -> Blind {
    Blind { why: "/r/plugins_registry: cannot be listed".into(), hint: "look".into() }
}

fn reasons(occurrences: &[Occurrence]) -> Vec<(EventType, &str)> {
    occurrences.iter().map(|o| (o.event_type, o.reason.as_str())).collect()
}

#[test]
fn going_blind_needs_a_second_look_and_calls_nothing_recovered() {
    let failing = Standing::of(&Diagnosis::of_parts(vec![stale()], Vec::new(), None));
    let blind = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), Some(blind())));
    assert!(!blind.only_better_than(&failing), "no failure seen is no recovery");
    assert!(!blind.only_better_than(&Standing::default()));
    assert!(!blind.agrees(&Standing::default()));
    assert!(blind.fails());
    assert_eq!(
        reasons(&transitions(&blind, &failing)),
        [(EventType::Warning, CANNOT_JUDGE_REASON)]
    );
    assert_eq!(blind.condition().status, crate::ConditionStatus::Unknown);
}

#[test]
fn seeing_again_is_published_at_once_with_its_own_event() {
    let blind = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), Some(blind())));
    let healthy = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), None));
    assert!(healthy.only_better_than(&blind));
    assert_eq!(reasons(&transitions(&healthy, &blind)), [(EventType::Normal, CAN_JUDGE_REASON)]);
    // A failure seen on the way back is new: it waits for a second look.
    let failing = Standing::of(&Diagnosis::of_parts(vec![stale()], Vec::new(), None));
    assert!(!failing.only_better_than(&blind));
    assert_eq!(
        reasons(&transitions(&failing, &blind)),
        [(EventType::Normal, CAN_JUDGE_REASON), (EventType::Warning, "Stale")]
    );
}

#[test]
fn an_entry_kept_for_a_stale_socket_has_its_event_but_counts_with_the_socket() {
    let entry = Finding {
        name: None,
        verdict: Verdict::StaleCsiNodeEntry,
        path: "csinodes/node1".into(),
        reason: format!("kept for {SOCKET}"),
        hint: String::new(),
        cause: Some(SOCKET.into()),
    };
    let standing = Standing::of(&Diagnosis::of_parts(vec![stale()], vec![entry], None));
    assert_eq!(
        reasons(&transitions(&standing, &Standing::default())),
        [(EventType::Warning, "Stale"), (EventType::Warning, "StaleCsiNodeEntry")]
    );
    let condition = standing.condition();
    assert!(condition.message.starts_with("1 failing: csi.example.com-reg.sock (stale)"));
    // Both go when the socket does.
    let gone = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), None));
    assert_eq!(
        reasons(&transitions(&gone, &standing)),
        [(EventType::Normal, RECOVERED_REASON), (EventType::Normal, RECOVERED_REASON)]
    );
}

/// A socket of the node that comes and goes: present (with `verdict`) for
/// `present`, gone for `gone`, over and over until `until`, then gone.
struct Coming {
    verdict: Verdict,
    present: Duration,
    gone: Duration,
    until: Duration,
}

impl Coming {
    /// Whether the socket is there `at` from the start.
    fn there(&self, at: Duration) -> bool {
        let cycle = self.present + self.gone;
        at < self.until
            && Duration::from_nanos(
                u64::try_from(at.as_nanos() % cycle.as_nanos()).unwrap_or_default(),
            ) < self.present
    }

    /// When it next appears or goes after `at`.
    fn next_change(&self, at: Duration) -> Option<Duration> {
        let step = Duration::from_millis(10);
        let mut t = at + step;
        while t <= self.until {
            if self.there(t) != self.there(at) {
                return Some(t);
            }
            t += step;
        }
        None
    }

    fn standing(&self, at: Duration) -> Standing {
        let rows = if self.there(at) {
            let path = Path::new(SOCKET);
            vec![Row::new(self.verdict, path, "registry", "judged".to_owned())]
        } else {
            Vec::new()
        };
        Standing::of(&Diagnosis::of_parts(rows, Vec::new(), None))
    }
}

/// What `--watch` published while `world` ran for `run`, each with the
/// time since the start: a pass after each change (200 ms of settling)
/// and whenever the loop asked.
async fn published(
    config: WatchConfig,
    world: &Coming,
    run: Duration,
) -> Vec<(Duration, Standing, Standing)> {
    let start = Instant::now();
    let mut pacing = Pacing::new(config);
    let mut published = Vec::new();
    let mut ran = Ran::Due;
    loop {
        let at = start.elapsed();
        let next = pacing.after_pass(&world.standing(at), ran);
        if let Some((standing, before)) = next.publish {
            published.push((at, standing, before));
        }
        let change = world.next_change(at).map(|change| start + change + config.settle);
        ran = if change.is_some_and(|change| change <= next.judge_at) {
            Ran::WokenUp
        } else {
            Ran::Due
        };
        let wake = change.map_or(next.judge_at, |change| change.min(next.judge_at));
        if wake.duration_since(start) > run {
            return published;
        }
        tokio::time::sleep_until(wake).await;
    }
}

const FOUR_ONE: Coming = Coming {
    verdict: Verdict::NotRegistered,
    present: Duration::from_secs(4),
    gone: Duration::from_secs(1),
    until: Duration::from_secs(600),
};

#[tokio::test(start_paused = true)]
async fn a_plugin_flapping_four_seconds_on_one_off_is_written_a_handful_of_times() {
    let run = Duration::from_secs(120);
    let no_damping = FlapConfig::builder().changes(0).build().unwrap();
    let undamped = WatchConfig::builder().flaps(no_damping).build().unwrap();
    let writes_before = published(undamped, &FOUR_ONE, run).await.len();
    let damped = published(WatchConfig::default(), &FOUR_ONE, run).await;
    eprintln!(
        "2 min of a 4 s / 1 s flap: {writes_before} publications undamped, {} damped",
        damped.len()
    );
    assert!(writes_before >= 40, "undamped, each cycle is published twice: {writes_before}");
    assert!(
        damped.len() <= 5,
        "{:?}",
        damped.iter().map(|(at, o, _)| (at, o.condition())).collect::<Vec<_>>()
    );
    let (at, last, before) = damped.last().unwrap();
    assert!(*at < Duration::from_secs(20), "flapping is told within a few cycles: {at:?}");
    let condition = last.condition();
    assert_eq!(condition.reason, "Flapping");
    assert!(
        condition.message.contains("it came back to a state it was in 3 times within 2m"),
        "{}",
        condition.message
    );
    assert_eq!(reasons(&transitions(last, before)).last(), Some(&(EventType::Warning, "Flapping")));
}

#[tokio::test(start_paused = true)]
async fn a_plugin_flapping_every_second_shows_as_failing_within_the_window() {
    // Present and ok a second, gone a second: no two passes 3 s apart agree.
    let world = Coming {
        verdict: Verdict::Ok,
        present: Duration::from_secs(1),
        gone: Duration::from_secs(1),
        ..FOUR_ONE
    };
    let published = published(WatchConfig::default(), &world, Duration::from_secs(120)).await;
    let failing = published.iter().find(|(_, standing, _)| standing.fails());
    let (at, standing, _) = failing.expect("the flapping is published");
    assert!(*at < FlapConfig::default().window(), "{at:?}");
    assert_eq!(standing.condition().reason, "Flapping");
    // Shown as when it was there, whether it is there or not.
    assert_eq!(standing.sockets[Path::new(SOCKET)].verdict, Verdict::Flapping);
}

#[tokio::test(start_paused = true)]
async fn once_still_for_the_hold_it_is_published_at_once_with_its_event() {
    let world = Coming { until: Duration::from_secs(30), ..FOUR_ONE };
    let published = published(WatchConfig::default(), &world, Duration::from_secs(300)).await;
    let (at, last, before) = published.last().unwrap();
    assert!(!last.fails(), "{:?}", last.condition());
    // It went at 29 s, the last change (cycles of 5 s end at 30 s): stable a
    // hold after the pass that saw it, published then.
    let hold = FlapConfig::default().hold();
    let settled = Duration::from_secs(29) + WatchConfig::default().settle + hold;
    assert!(*at >= settled && *at < settled + Duration::from_millis(50), "{at:?}");
    assert_eq!(reasons(&transitions(last, before)), [(EventType::Normal, STABLE_REASON)]);
    assert!(transitions(last, before)[0].note.ends_with("holds still again after flapping: gone"));
}

#[tokio::test(start_paused = true)]
async fn a_plugin_restarting_once_is_not_flapping() {
    let world = Coming {
        verdict: Verdict::Ok,
        present: Duration::from_secs(50),
        gone: Duration::from_secs(2),
        until: Duration::from_secs(102),
    };
    let published = published(WatchConfig::default(), &world, Duration::from_secs(100)).await;
    assert!(
        published.iter().all(|(_, standing, _)| !standing.fails()),
        "{:?}",
        published.iter().map(|(at, o, _)| (at, o.condition())).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_failure_waits_for_a_second_look_and_a_recovery_does_not() {
    let mut pacing = Pacing::new(WatchConfig::default());
    let healthy = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), None));
    let failing = Standing::of(&Diagnosis::of_parts(vec![stale()], Vec::new(), None));
    assert!(pacing.after_pass(&healthy, Ran::Due).publish.is_some(), "the first pass");
    let next = pacing.after_pass(&failing, Ran::WokenUp);
    assert!(next.publish.is_none());
    assert_eq!(next.judge_at - Instant::now(), WatchConfig::default().confirm);
    tokio::time::sleep_until(next.judge_at).await;
    let next = pacing.after_pass(&failing, Ran::Due);
    assert_eq!(next.judge_at - Instant::now(), Duration::from_secs(6));
    assert!(next.publish.is_some_and(|(standing, _)| standing.fails()));
    // Still failing: looked at again sooner than the period, less often each
    // time, up to the period.
    let waits: Vec<Duration> =
        (0..5).map(|_| pacing.after_pass(&failing, Ran::Due).judge_at - Instant::now()).collect();
    assert_eq!(waits, [12, 24, 48, 96, 192].map(Duration::from_secs));
    let capped = pacing.after_pass(&failing, Ran::Due).judge_at - Instant::now();
    assert_eq!(capped, WatchConfig::default().period);
    assert!(pacing.after_pass(&healthy, Ran::WokenUp).publish.is_some(), "recovered at once");
}

#[tokio::test(start_paused = true)]
async fn without_a_confirm_a_failing_node_is_still_looked_at_with_pauses() {
    // Before the one backoff, a zero confirm doubled to zero: rechecks
    // without pause while a failure held still.
    let config = WatchConfig::builder().confirm(Duration::ZERO).build().unwrap();
    let mut pacing = Pacing::new(config);
    let failing = Standing::of(&Diagnosis::of_parts(vec![stale()], Vec::new(), None));
    pacing.after_pass(&failing, Ran::Due);
    let waits: Vec<Duration> =
        (0..4).map(|_| pacing.after_pass(&failing, Ran::Due).judge_at - Instant::now()).collect();
    assert_eq!(waits, [1, 2, 4, 8].map(Duration::from_secs));
}

/// The node with the ResourceSlices of `gpu.example.com`, whose driver
/// went, beside a kubelet of `version`: what the kubelet wipes by itself.
fn orphaned_slices(version: &str) -> Standing {
    let slices = Finding {
        name: Some("gpu.example.com".into()),
        verdict: Verdict::OrphanedSlices,
        path: "resourceslices/gpu.example.com".into(),
        reason: "1 ResourceSlice(s) of node n1 from driver gpu.example.com".into(),
        hint: String::new(),
        cause: None,
    };
    let mut report = Diagnosis::of_parts(Vec::new(), vec![slices], None);
    report.kubelet_version = Some(version.to_owned());
    Standing::of(&report)
}

fn healthy_beside(version: &str) -> Standing {
    let mut report = Diagnosis::of_parts(Vec::new(), Vec::new(), None);
    report.kubelet_version = Some(version.to_owned());
    Standing::of(&report)
}

#[tokio::test(start_paused = true)]
async fn a_gone_drivers_slices_are_held_back_for_the_kubelets_wipe_delay() {
    // The 30 s delay, and the wipe's own 5 s.
    let (kubelet, after) = ("v1.33.13", Duration::from_secs(35));
    let mut pacing = Pacing::new(WatchConfig::default());
    assert!(pacing.after_pass(&healthy_beside(kubelet), Ran::Due).publish.is_some());
    // The driver goes: its slices are held back, judged again at the end of
    // the grace, and wiped by the kubelet before: nothing is published.
    let start = Instant::now();
    let next = pacing.after_pass(&orphaned_slices(kubelet), Ran::WokenUp);
    assert!(next.publish.is_none());
    assert_eq!(next.judge_at - start, after);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(pacing.after_pass(&orphaned_slices(kubelet), Ran::Due).publish.is_none());
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(pacing.after_pass(&healthy_beside(kubelet), Ran::WokenUp).publish.is_none());

    // Gone again, and never wiped: published after the grace and a second look.
    let start = Instant::now();
    let next = pacing.after_pass(&orphaned_slices(kubelet), Ran::WokenUp);
    assert!(next.publish.is_none());
    tokio::time::sleep_until(next.judge_at).await;
    let next = pacing.after_pass(&orphaned_slices(kubelet), Ran::Due);
    assert!(next.publish.is_none(), "a new failure, at the grace's end: a second look");
    tokio::time::sleep_until(next.judge_at).await;
    let (standing, before) =
        pacing.after_pass(&orphaned_slices(kubelet), Ran::Due).publish.unwrap();
    assert_eq!(Instant::now() - start, after + WatchConfig::default().confirm);
    assert_eq!(reasons(&transitions(&standing, &before)), [(EventType::Warning, "OrphanedSlices")]);
}

#[tokio::test(start_paused = true)]
async fn beside_a_kubelet_that_wipes_at_once_slices_are_held_for_the_wipe_only() {
    let kubelet = "v1.32.13";
    let mut pacing = Pacing::new(WatchConfig::default());
    pacing.after_pass(&healthy_beside(kubelet), Ran::Due);
    // Two passes a moment apart, as a socket's removal and its settling
    // make: no second look yet, the wipe has its 5 s.
    let next = pacing.after_pass(&orphaned_slices(kubelet), Ran::WokenUp);
    assert_eq!(next.judge_at - Instant::now(), Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(pacing.after_pass(&orphaned_slices(kubelet), Ran::WokenUp).publish.is_none());
    tokio::time::sleep_until(next.judge_at).await;
    let next = pacing.after_pass(&orphaned_slices(kubelet), Ran::Due);
    tokio::time::sleep_until(next.judge_at).await;
    let published = pacing.after_pass(&orphaned_slices(kubelet), Ran::Due).publish;
    assert!(published.is_some_and(|(standing, _)| standing.fails()));
}

#[tokio::test(start_paused = true)]
async fn a_plugin_lost_to_the_kubelets_restart_is_published_at_once_and_its_plugin_condition_too() {
    let mut pacing = Pacing::new(WatchConfig::default());
    let registered = || {
        let mut row = Row::new(
            Verdict::Ok,
            Path::new("/r/device-plugins/gpu.sock"),
            "device-plugins",
            "ok".to_owned(),
        );
        row.kind = Some(kpm::PluginKind::Device);
        row.name = Some("vendor.com/gpu".to_owned());
        row
    };
    let healthy = Standing::of(&Diagnosis::of_parts(vec![registered()], Vec::new(), None));
    assert!(pacing.after_pass(&healthy, Ran::Due).publish.is_some(), "the first pass");
    let condition = healthy.plugin_condition("vendor.com/gpu");
    assert_eq!(
        (condition.status, condition.reason.as_str()),
        (crate::ConditionStatus::True, "PluginRegistered")
    );
    let lost = Row { verdict: Verdict::NotRegisteredAgain, found_in: "deleted", ..registered() };
    let lost = Standing::of(&Diagnosis::of_parts(vec![lost], Vec::new(), None));
    // No second look: the kubelet's start is no flicker.
    let next = pacing.after_pass(&lost, Ran::WokenUp);
    let (published, _) = next.publish.expect("published at once");
    assert_eq!(published.condition().reason, "NotRegisteredAgain");
    let condition = published.plugin_condition("vendor.com/gpu");
    assert_eq!(
        (condition.status, condition.reason.as_str()),
        (crate::ConditionStatus::False, "NotRegisteredAgain")
    );
    // Another failure still waits for one.
    let both = Standing::of(&Diagnosis::of_parts(
        vec![
            Row { verdict: Verdict::NotRegisteredAgain, found_in: "deleted", ..registered() },
            stale(),
        ],
        Vec::new(),
        None,
    ));
    assert!(pacing.after_pass(&both, Ran::WokenUp).publish.is_none());
    // A plugin no socket names, and a node not judged.
    let condition = healthy.plugin_condition("csi.example.com");
    assert_eq!(
        (condition.status, condition.reason.as_str(), condition.message.as_str()),
        (
            crate::ConditionStatus::False,
            "PluginNotFound",
            "no plugin socket of this node registers csi.example.com"
        )
    );
    let blind = Standing::of(&Diagnosis::of_parts(Vec::new(), Vec::new(), Some(blind())));
    assert_eq!(blind.plugin_condition("vendor.com/gpu").status, crate::ConditionStatus::Unknown);
}
