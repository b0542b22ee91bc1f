//! The recorder alone, on paused time: what it queues for each occurrence,
//! when, and what it drops; the publisher's tests send its writes.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

fn recorder(config: EventConfig) -> EventRecorder {
    let node = ObjectReference {
        kind: Some("Node".to_owned()),
        name: Some("node-a".to_owned()),
        ..ObjectReference::default()
    };
    EventRecorder::new(config, node, "kpm-doctor-node-a".to_owned())
}

fn stale(about: &str) -> Occurrence {
    Occurrence {
        event_type: EventType::Warning,
        reason: "Stale".to_owned(),
        about: about.to_owned(),
        note: format!("{about}: connection refused"),
        related: None,
    }
}

/// Takes every write the tokens allow, as a publisher whose writes all go
/// through would.
fn drain(recorder: &mut EventRecorder) -> Vec<Write> {
    let mut writes = Vec::new();
    while let Some(write) = recorder.next_write() {
        writes.push(write.clone());
        recorder.sent();
    }
    writes
}

fn series_count(write: &Write) -> Option<i32> {
    match write {
        Write::Series { count, .. } => Some(*count),
        Write::Create(_) => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_occurrence_is_an_event_about_the_node_named_after_it() {
    let mut recorder = recorder(EventConfig::default());
    recorder.record(stale("/r/a.sock"));
    let writes = drain(&mut recorder);
    let [Write::Create(event)] = writes.as_slice() else { panic!("{writes:?}") };
    assert!(event.metadata.name.as_deref().unwrap().starts_with("node-a."));
    assert_eq!(event.metadata.namespace.as_deref(), Some(EVENT_NAMESPACE));
    assert_eq!(event.regarding.as_ref().unwrap().name.as_deref(), Some("node-a"));
    assert_eq!(event.reason.as_deref(), Some("Stale"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some(ACTION));
    assert_eq!(event.reporting_controller.as_deref(), Some(REPORTING_CONTROLLER));
    assert_eq!(event.reporting_instance.as_deref(), Some("kpm-doctor-node-a"));
    // Nothing more is due until something happens.
    assert_eq!(recorder.next_due(), None);
}

#[tokio::test(start_paused = true)]
async fn only_the_same_reason_about_the_same_plugin_joins_a_series() {
    let mut recorder = recorder(EventConfig::default());
    recorder.record(stale("/r/a.sock"));
    recorder.record(stale("/r/b.sock"));
    recorder.record(Occurrence { reason: "Rejected".to_owned(), ..stale("/r/a.sock") });
    let writes = drain(&mut recorder);
    assert_eq!(writes.iter().filter(|w| matches!(w, Write::Create(_))).count(), 3);
    recorder.record(stale("/r/a.sock"));
    let writes = drain(&mut recorder);
    assert_eq!(writes.iter().map(series_count).collect::<Vec<_>>(), [Some(2)]);
}

#[tokio::test(start_paused = true)]
async fn a_series_that_ends_writes_its_last_count_once() {
    let mut recorder = recorder(EventConfig::default());
    for _ in 0..4 {
        recorder.record(stale("/r/a.sock"));
        tokio::time::advance(MINUTE).await;
    }
    // The create, then the count of 2 at once; 3 and 4 wait.
    assert_eq!(drain(&mut recorder).iter().map(series_count).collect::<Vec<_>>(), [None, Some(2)]);
    // Due when the window (6 min) has passed since the last occurrence,
    // a minute ago.
    let due = recorder.next_due().unwrap();
    assert_eq!(due - tokio::time::Instant::now(), Duration::from_secs(5 * 60));
    tokio::time::sleep_until(due).await;
    assert_eq!(drain(&mut recorder).iter().map(series_count).collect::<Vec<_>>(), [Some(4)]);
    assert_eq!(recorder.next_due(), None);
    // The series is over: the next occurrence is a new event.
    recorder.record(stale("/r/a.sock"));
    assert!(matches!(drain(&mut recorder).as_slice(), [Write::Create(_)]));
}

#[tokio::test(start_paused = true)]
async fn a_long_series_is_counted_at_each_refresh() {
    let config = EventConfig::builder().series_refresh(10 * MINUTE).build().unwrap();
    let mut recorder = recorder(config);
    let mut counts = Vec::new();
    // One occurrence a minute for 25 minutes: the series never ends.
    for _ in 0..25 {
        recorder.record(stale("/r/a.sock"));
        counts.extend(drain(&mut recorder).iter().map(series_count));
        tokio::time::advance(MINUTE).await;
    }
    // At minutes 10 and 20 the refresh falls due, after that minute's
    // occurrence: the 11th and the 21st.
    assert_eq!(counts, [None, Some(2), Some(11), Some(21)]);
}

#[tokio::test(start_paused = true)]
async fn an_outage_keeps_the_newest_writes_and_counts_the_dropped() {
    let mut recorder = recorder(EventConfig::default());
    for n in 0..MAX_QUEUED + 5 {
        recorder.record(stale(&format!("/r/{n}.sock")));
    }
    assert_eq!(recorder.dropped, 5);
    // Nothing was sent: the first write is tried again, and it is the
    // oldest kept.
    let Some(Write::Create(first)) = recorder.next_write() else { panic!() };
    assert_eq!(first.note.as_deref(), Some("/r/5.sock: connection refused"));
}

#[tokio::test(start_paused = true)]
async fn without_a_token_a_write_waits_for_the_refill() {
    let config = EventConfig::builder().burst(2).refill(MINUTE).build().unwrap();
    let mut recorder = recorder(config);
    for n in 0..3 {
        recorder.record(stale(&format!("/r/{n}.sock")));
    }
    assert_eq!(drain(&mut recorder).len(), 2);
    assert_eq!(recorder.next_due().unwrap() - tokio::time::Instant::now(), MINUTE);
    tokio::time::advance(MINUTE / 2).await;
    assert!(recorder.next_write().is_none());
    tokio::time::advance(MINUTE / 2).await;
    assert_eq!(drain(&mut recorder).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_event_about_a_plugin_in_a_pod_is_related_to_that_pod() {
    let mut recorder = recorder(EventConfig::default());
    let pod = kpm_report::PodContainer {
        namespace: "csi".into(),
        pod: "csi-node-x".into(),
        uid: "0b1c".into(),
        container: "node-driver-registrar".into(),
        restarts: 3,
        state: kpm_report::ContainerState::Terminated,
        last_termination: None,
    };
    recorder.record(Occurrence { related: Some(pod), ..stale("/r/a.sock") });
    let writes = drain(&mut recorder);
    let [Write::Create(event)] = writes.as_slice() else { panic!("{writes:?}") };
    assert_eq!(event.regarding.as_ref().unwrap().kind.as_deref(), Some("Node"));
    let related = event.related.as_ref().unwrap();
    assert_eq!(
        (related.kind.as_deref(), related.namespace.as_deref(), related.name.as_deref()),
        (Some("Pod"), Some("csi"), Some("csi-node-x"))
    );
    assert_eq!(related.uid.as_deref(), Some("0b1c"));
    assert_eq!(related.field_path.as_deref(), Some("spec.containers{node-driver-registrar}"));
}

#[test]
fn a_note_is_cut_on_a_character_boundary() {
    let note = "é".repeat(MAX_NOTE_BYTES);
    let cut = bounded(&note, MAX_NOTE_BYTES);
    assert!(cut.len() <= MAX_NOTE_BYTES);
    assert!(cut.ends_with('…'));
    assert_eq!(bounded("short", MAX_NOTE_BYTES), "short");
}
