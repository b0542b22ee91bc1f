//! The publisher against the in-process stand-in API server, on paused time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::Value;

use super::events::EventConfig;
use kpm_test_support::api_server::State;

use super::stand_in;
use super::*;
use kpm_report::{CONDITION_TYPE, ConditionStatus};

use crate::condition::PluginsCondition;

const MINUTE: Duration = Duration::from_secs(60);

fn healthy() -> PluginsCondition {
    PluginsCondition {
        status: ConditionStatus::True,
        reason: "PluginsHealthy".into(),
        message: "all 2 plugin sockets of the node are ok".into(),
    }
}

fn failing(reason: &str) -> PluginsCondition {
    PluginsCondition {
        status: ConditionStatus::False,
        reason: reason.into(),
        message: format!("1 failing: a ({reason})"),
    }
}

impl NodePublisher {
    /// Sets the node's own condition only.
    fn set_condition(&mut self, condition: PluginsCondition) {
        self.set_conditions(vec![(CONDITION_TYPE.to_owned(), condition)]);
    }
}

fn occurrence(reason: &str, about: &str) -> Occurrence {
    Occurrence {
        event_type: EventType::Warning,
        reason: reason.into(),
        about: about.into(),
        note: format!("{about} is {reason}"),
        related: None,
    }
}

fn publisher(config: PublishConfig) -> (NodePublisher, std::sync::Arc<parking_lot::Mutex<State>>) {
    let (client, state) = stand_in::client("node1");
    (NodePublisher::new(client, "node1", config), state)
}

#[tokio::test(start_paused = true)]
async fn the_condition_is_written_on_change_and_at_each_heartbeat_only() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.set_condition(healthy());
    publisher.sync().await;
    assert_eq!(state.lock().writes(), 1);
    let condition = state.lock().condition(CONDITION_TYPE).unwrap();
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "PluginsHealthy");

    // Ten idle minutes: the same condition set again and again, no write.
    for _ in 0..10 {
        tokio::time::advance(MINUTE).await;
        publisher.set_condition(healthy());
        publisher.sync().await;
    }
    {
        let seen = state.lock();
        assert_eq!(seen.writes(), 1, "{:?}", seen.requests);
    }
    // The heartbeat is due 30 min after the write.
    let due = publisher.next_due().unwrap();
    tokio::time::sleep_until(due).await;
    publisher.sync().await;
    assert_eq!(state.lock().writes(), 2);
    assert_eq!(stats_writes(&publisher), 2);

    // A change is written at once.
    publisher.set_condition(failing("Stale"));
    publisher.sync().await;
    assert_eq!(state.lock().writes(), 3);
    assert_eq!(state.lock().condition(CONDITION_TYPE).unwrap()["reason"], "Stale");
}

fn stats_writes(publisher: &NodePublisher) -> u64 {
    publisher.stats().condition_writes()
}

#[tokio::test(start_paused = true)]
async fn the_transition_time_moves_with_the_status_only() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.set_condition(failing("Stale"));
    publisher.sync().await;
    let first = state.lock().condition(CONDITION_TYPE).unwrap()["lastTransitionTime"].clone();
    publisher.set_condition(failing("Rejected"));
    publisher.sync().await;
    let condition = state.lock().condition(CONDITION_TYPE).unwrap();
    assert_eq!(condition["reason"], "Rejected");
    assert_eq!(condition["lastTransitionTime"], first);
    assert_eq!(state.lock().writes(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_kubelets_condition_and_the_doctors_keep_each_other() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.set_condition(healthy());
    publisher.sync().await;
    // The kubelet's status patch (a strategic merge patch) between two
    // doctor writes.
    let nodes = publisher.nodes.clone();
    let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "lastHeartbeatTime": "2026-11-25T00:00:00Z",
        "lastTransitionTime": "2026-11-25T00:00:00Z"}]}});
    let params = PatchParams { field_manager: Some("kubelet".into()), ..PatchParams::default() };
    nodes.patch_status("node1", &params, &Patch::Strategic(&ready)).await.unwrap();
    publisher.set_condition(failing("Stale"));
    publisher.sync().await;
    let state = state.lock();
    assert_eq!(state.condition("Ready").unwrap()["reason"], "KubeletReady");
    assert_eq!(state.condition(CONDITION_TYPE).unwrap()["reason"], "Stale");
    assert_eq!(state.owners["Ready"], "kubelet");
    assert_eq!(state.owners[CONDITION_TYPE], FIELD_MANAGER);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_doctor_takes_the_published_condition_and_writes_nothing() {
    let (mut first, state) = publisher(PublishConfig::default());
    first.set_condition(healthy());
    first.sync().await;
    let written = state.lock().condition(CONDITION_TYPE).unwrap();
    let writes = state.lock().writes();
    // A new publisher on the same API server: it reads the condition back,
    // before it has anything to say (its first pass waits for a second).
    let mut second =
        NodePublisher::new(first.nodes.clone().into_client(), "node1", PublishConfig::default());
    second.sync().await;
    second.set_condition(healthy());
    second.sync().await;
    {
        let seen = state.lock();
        assert_eq!(seen.writes(), writes, "{:?}", seen.requests);
    }
    assert_eq!(state.lock().condition(CONDITION_TYPE).unwrap(), written);
    // Its heartbeat is due when the first one's was.
    let due = second.next_due().unwrap();
    assert!(due > tokio::time::Instant::now() + Duration::from_secs(29 * 60), "{due:?}");
}

#[tokio::test(start_paused = true)]
async fn repeated_events_make_one_series_patched_at_its_refresh() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.record(occurrence("Stale", "/r/a.sock"));
    publisher.sync().await;
    assert_eq!(state.lock().events.len(), 1);
    let name = state.lock().events.keys().next().unwrap().clone();
    assert_eq!(state.lock().events[&name]["regarding"]["uid"], "uid-1");
    // The second occurrence makes it a series at once.
    publisher.record(occurrence("Stale", "/r/a.sock"));
    publisher.sync().await;
    assert_eq!(state.lock().events[&name]["series"]["count"], 2);
    let writes = state.lock().writes();
    // A flapping plugin: five more within the window cost no write...
    for _ in 0..5 {
        tokio::time::advance(MINUTE).await;
        publisher.record(occurrence("Stale", "/r/a.sock"));
        publisher.sync().await;
    }
    assert_eq!(state.lock().writes(), writes);
    // ...until the series is finished (6 min without one) or refreshed.
    let due = publisher.next_due().unwrap();
    tokio::time::sleep_until(due).await;
    publisher.sync().await;
    assert_eq!(state.lock().events[&name]["series"]["count"], 7);
    assert_eq!(state.lock().events.len(), 1);
    assert_eq!(publisher.stats().event_writes(), 3);
}

#[tokio::test(start_paused = true)]
async fn events_beyond_the_burst_wait_for_their_token() {
    let events = EventConfig::builder().burst(3).build().unwrap();
    let config = PublishConfig::builder().events(events).build().unwrap();
    let (mut publisher, state) = publisher(config);
    for n in 0..5 {
        publisher.record(occurrence("Stale", &format!("/r/{n}.sock")));
    }
    publisher.sync().await;
    assert_eq!(state.lock().events.len(), 3);
    let due = publisher.next_due().unwrap();
    assert_eq!(due - tokio::time::Instant::now(), Duration::from_secs(5 * 60));
    tokio::time::sleep_until(due).await;
    publisher.sync().await;
    assert_eq!(state.lock().events.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_403_is_tried_again_with_backoff_and_never_spins() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    state.lock().fail = Some(403);
    publisher.set_condition(failing("Stale"));
    publisher.record(occurrence("Stale", "/r/a.sock"));
    // An hour of syncs every 100 ms of a caller that keeps asking.
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3600) {
        publisher.sync().await;
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let tries = state.lock().requests.len();
    // 1 s doubling to 2 min: 1+2+...+64 (127 s) then every 2 min: about 35.
    assert!((20..=40).contains(&tries), "{tries} tries in an hour");
    assert!(publisher.stats().failing());
    // Allowed again: the current state goes out at the next try.
    state.lock().fail = None;
    publisher.set_condition(failing("Rejected"));
    tokio::time::sleep_until(publisher.next_due().unwrap()).await;
    publisher.sync().await;
    let state = state.lock();
    assert_eq!(state.condition(CONDITION_TYPE).unwrap()["reason"], "Rejected");
    assert_eq!(state.events.len(), 1);
    assert!(!publisher.stats().failing());
}

#[tokio::test(start_paused = true)]
async fn while_the_api_server_is_down_nothing_is_lost() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.set_condition(healthy());
    publisher.sync().await;
    state.lock().down = true;
    publisher.set_condition(failing("Stale"));
    publisher.record(occurrence("Stale", "/r/a.sock"));
    publisher.sync().await;
    tokio::time::advance(Duration::from_secs(10)).await;
    publisher.set_condition(healthy());
    publisher.record(Occurrence {
        event_type: EventType::Normal,
        ..occurrence(events::RECOVERED_REASON, "/r/a.sock")
    });
    publisher.sync().await;
    assert!(publisher.stats().failing());
    state.lock().down = false;
    tokio::time::sleep_until(publisher.next_due().unwrap()).await;
    publisher.sync().await;
    let state = state.lock();
    assert_eq!(state.condition(CONDITION_TYPE).unwrap()["status"], "True");
    let reasons: Vec<&Value> = state.events.values().map(|e| &e["reason"]).collect();
    assert_eq!(reasons, ["Stale", events::RECOVERED_REASON]);
}

/// The outcome of a node with `rows`.
fn outcome(rows: Vec<crate::Row>) -> Standing {
    Standing::of(&crate::Diagnosis::of_parts(rows, Vec::new(), None))
}

fn stale_row() -> crate::Row {
    crate::Row::new(
        crate::Verdict::Stale,
        std::path::Path::new("/r/plugins_registry/a-reg.sock"),
        "registry",
        "connection refused".to_owned(),
    )
}

#[tokio::test(start_paused = true)]
async fn the_report_says_what_the_condition_says_owned_by_the_node() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    publisher.set(&outcome(vec![stale_row()]));
    publisher.sync().await;
    let report = state.lock().report("node1").cloned().unwrap();
    assert_eq!(report["spec"]["nodeName"], "node1");
    let owner = &report["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["uid"]),
        (&"Node".into(), &"node1".into(), &"uid-1".into())
    );
    let status = &report["status"];
    assert_eq!(status["health"], "Failing");
    assert_eq!(status["reason"], state.lock().condition(CONDITION_TYPE).unwrap()["reason"]);
    assert_eq!(status["plugins"][0]["socket"], "/r/plugins_registry/a-reg.sock");
    assert_eq!(status["plugins"][0]["verdict"], "stale");
    assert_eq!(status["counts"]["failing"], 1);
    assert!(status["heartbeatTime"].is_string());
    assert_eq!(publisher.stats().report_writes(), 1);

    // The same outcome again and again: nothing written, until the heartbeat.
    let writes = state.lock().writes();
    for _ in 0..10 {
        tokio::time::advance(MINUTE).await;
        publisher.set(&outcome(vec![stale_row()]));
        publisher.sync().await;
    }
    assert_eq!(state.lock().writes(), writes);
    tokio::time::sleep_until(publisher.next_due().unwrap()).await;
    publisher.sync().await;
    assert_eq!(publisher.stats().report_writes(), 2);
    // Its entry is still dated from the first write.
    let report = state.lock().report("node1").cloned().unwrap();
    assert_eq!(report["status"]["plugins"][0]["since"], status["plugins"][0]["since"]);
}

#[tokio::test(start_paused = true)]
async fn without_the_crd_the_condition_and_events_go_out_alone() {
    let (mut publisher, state) = publisher(PublishConfig::default());
    state.lock().reports = None;
    publisher.set(&outcome(vec![stale_row()]));
    publisher.record(occurrence("Stale", "/r/plugins_registry/a-reg.sock"));
    publisher.sync().await;
    assert_eq!(state.lock().condition(CONDITION_TYPE).unwrap()["reason"], "Stale");
    assert_eq!(state.lock().events.len(), 1);
    assert!(!publisher.stats().failing());
    assert_eq!(publisher.stats().report_writes(), 0);
    // The CRD installed: the report follows at the next try.
    state.lock().reports = Some(std::collections::BTreeMap::new());
    tokio::time::sleep_until(publisher.next_due().unwrap()).await;
    publisher.sync().await;
    assert_eq!(state.lock().report("node1").unwrap()["status"]["reason"], "Stale");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_doctor_keeps_the_reports_dates_and_writes_nothing() {
    let (mut first, state) = publisher(PublishConfig::default());
    first.set(&outcome(vec![stale_row()]));
    first.sync().await;
    let written = state.lock().report("node1").cloned().unwrap();
    let writes = state.lock().writes();
    tokio::time::advance(MINUTE).await;
    let mut second =
        NodePublisher::new(first.nodes.clone().into_client(), "node1", PublishConfig::default());
    second.set(&outcome(vec![stale_row()]));
    second.sync().await;
    assert_eq!(state.lock().writes(), writes, "{:?}", state.lock().requests);
    assert_eq!(state.lock().report("node1").cloned().unwrap(), written);
    // Deleted behind its back: made again at the next change, after a try
    // that finds it gone.
    state.lock().reports = Some(std::collections::BTreeMap::new());
    second.set(&outcome(Vec::new()));
    second.sync().await;
    assert!(state.lock().report("node1").is_none());
    second.set(&outcome(vec![stale_row()]));
    tokio::time::sleep_until(second.next_due().unwrap()).await;
    second.sync().await;
    let again = state.lock().report("node1").cloned().unwrap();
    assert_eq!(again["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(again["status"]["plugins"][0]["verdict"], "stale");
}

#[tokio::test(start_paused = true)]
async fn plugin_conditions_are_written_with_the_nodes_and_a_stop_leaves_them_all_unknown() {
    let gpu = crate::PluginConditionType::parse("vendor.com/gpu").unwrap();
    let config = PublishConfig::builder().plugin_conditions([gpu]).build().unwrap();
    let (mut publisher, state) = publisher(config);
    let registered = PluginsCondition {
        status: ConditionStatus::True,
        reason: "PluginRegistered".into(),
        message: "vendor.com/gpu is registered (/r/device-plugins/gpu.sock)".into(),
    };
    publisher.set_conditions(vec![
        (CONDITION_TYPE.to_owned(), healthy()),
        ("vendor.com/gpu-PluginRegistered".to_owned(), registered),
    ]);
    publisher.sync().await;
    {
        let seen = state.lock();
        assert_eq!(seen.writes(), 1, "one apply for both");
        assert_eq!(seen.condition("vendor.com/gpu-PluginRegistered").unwrap()["status"], "True");
        assert_eq!(seen.owners["vendor.com/gpu-PluginRegistered"], FIELD_MANAGER);
    }
    publisher.stop("the node is going down").await;
    let seen = state.lock();
    assert_eq!(seen.writes(), 2);
    for condition_type in [CONDITION_TYPE, "vendor.com/gpu-PluginRegistered"] {
        let condition = seen.condition(condition_type).unwrap();
        assert_eq!(condition["status"], "Unknown", "{condition_type}");
        assert_eq!(condition["reason"], "DoctorStopped", "{condition_type}");
        let message = condition["message"].as_str().unwrap();
        assert!(message.starts_with("the doctor stopped (the node is going down)"), "{message}");
    }
}

#[test]
fn a_plugin_condition_type_is_taken_once() {
    let gpu = crate::PluginConditionType::parse("vendor.com/gpu").unwrap();
    let again = crate::PluginConditionType::parse("other=vendor.com/gpu-PluginRegistered").unwrap();
    let err = PublishConfig::builder().plugin_conditions([gpu, again]).build().unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin condition other: its type vendor.com/gpu-PluginRegistered is vendor.com/gpu's already"
    );
}
