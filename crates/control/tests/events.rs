//! The event log: the ring's bound and paging, and the events that
//! attributed commands leave (and plain ones do not), driven through
//! `ClusterState::apply` without Raft or a clock.

use std::collections::BTreeMap;

use trireme_control::events::{ReportedEvent, MAX_EVENT_MESSAGE_BYTES};
use trireme_control::{
    Actor, ClusterState, Command, Event, EventKind, NodeRegistration, NodeState, PoolRecord,
    PoolReport, ReplicaObserved, Reply, EVENT_LOG_CAPACITY,
};
use trireme_types::{DeviceClass, NodeId, NodeName, PoolName, VolumeName};

const T0: u64 = 1_700_000_000_000;
const GIB: u64 = 1 << 30;

fn vname(name: &str) -> VolumeName {
    VolumeName::new(name).unwrap()
}

fn registration(name: &str) -> NodeRegistration {
    NodeRegistration {
        name: NodeName::new(name).unwrap(),
        api_address: format!("{name}.test:7070"),
        nbd_address: None,
        data_address: None,
        labels: BTreeMap::new(),
    }
}

fn by(actor: Actor, now_ms: u64, command: Command) -> Command {
    Command::Attributed {
        actor,
        now_ms,
        command: Box::new(command),
    }
}

#[track_caller]
fn ok(state: &mut ClusterState, command: Command) -> Reply {
    state.apply(command).expect("the command is accepted")
}

fn pools(node: u64, online: bool) -> Command {
    Command::ReportPools {
        node: NodeId(node),
        pools: vec![PoolReport {
            name: PoolName::new("fast").unwrap(),
            record: PoolRecord {
                class: DeviceClass::Ssd,
                capacity_bytes: 1 << 40,
                free_bytes: 1 << 40,
                online,
                reported_ms: T0,
            },
        }],
    }
}

/// Three nodes with a pool each and a ready three-replica volume `vm1`,
/// built by plain commands (no events).
fn three_nodes() -> ClusterState {
    let mut state = ClusterState::default();
    ok(
        &mut state,
        Command::Bootstrap {
            cluster_id: "c-test".into(),
            join_secret: "secret".into(),
            node: registration("n1"),
            now_ms: T0,
        },
    );
    for (index, name) in ["n2", "n3"].iter().enumerate() {
        ok(
            &mut state,
            Command::AddNode {
                node: registration(name),
                nonce: format!("nonce-{index}"),
                now_ms: T0,
            },
        );
    }
    for node in 1..=3 {
        ok(&mut state, pools(node, true));
    }
    ok(
        &mut state,
        Command::CreateVolume {
            name: vname("vm1"),
            size_bytes: GIB,
            group: None,
            replicas: None,
            nodes: None,
            pool: None,
            adopt: None,
            now_ms: T0,
        },
    );
    for node in 1..=3 {
        let id = state.volumes[&vname("vm1")].id;
        ok(
            &mut state,
            Command::ReportReplica {
                volume: vname("vm1"),
                volume_id: id,
                node: NodeId(node),
                observed: ReplicaObserved::Ready,
                allocated_bytes: 0,
                size_bytes: None,
            },
        );
    }
    assert!(state.events.is_empty(), "plain commands log nothing");
    state
}

fn kinds(state: &ClusterState) -> Vec<EventKind> {
    state.events.iter().map(|event| event.kind).collect()
}

fn event(seq_hint: u64, volume: Option<&str>) -> Event {
    Event {
        seq: seq_hint,
        time_ms: T0,
        kind: EventKind::VerifyFinished,
        node: None,
        volume: volume.map(vname),
        actor: "node n1".into(),
        message: format!("event {seq_hint}"),
    }
}

#[test]
fn the_ring_keeps_the_newest_and_counts_what_a_reader_missed() {
    let mut state = ClusterState::default();
    let total = EVENT_LOG_CAPACITY as u64 + 250;
    for index in 1..=total {
        let volume = if index % 2 == 0 { Some("even") } else { None };
        state.events.push(event(index, volume));
    }
    let log = &state.events;
    assert_eq!(log.len(), EVENT_LOG_CAPACITY);
    assert_eq!(log.last_seq(), total);
    assert_eq!(log.iter().next().unwrap().seq, 251, "the oldest 250 went");
    log.check().unwrap();

    // Newest first page: the last `limit`, oldest first.
    let newest = log.page(None, None, 3);
    let seqs: Vec<u64> = newest.events.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, vec![total - 2, total - 1, total]);
    assert_eq!(newest.missed, 0);

    // A reader that stopped at 100 missed 101..=250.
    let behind = log.page(Some(100), None, 5);
    assert_eq!(behind.missed, 150);
    assert_eq!(behind.events.first().unwrap().seq, 251);
    assert_eq!(behind.events.len(), 5);

    // Up to date: nothing, nothing missed.
    let current = log.page(Some(total), None, 10);
    assert!(current.events.is_empty());
    assert_eq!(current.missed, 0);
    assert_eq!(current.last_seq, total);

    // By volume.
    let even = log.page(Some(1000), Some(&vname("even")), 1000);
    assert!(even
        .events
        .iter()
        .all(|event| event.seq % 2 == 0 && event.seq > 1000));
    assert_eq!(even.events.len(), 125);
}

#[test]
fn a_long_message_is_cut_at_a_character_boundary() {
    let mut state = ClusterState::default();
    let mut long = event(1, None);
    long.message = "é".repeat(MAX_EVENT_MESSAGE_BYTES);
    state.events.push(long);
    let kept = &state.events.iter().next().unwrap().message;
    assert!(kept.len() <= MAX_EVENT_MESSAGE_BYTES);
    assert!(kept.len() >= MAX_EVENT_MESSAGE_BYTES - 1);
    assert!(kept.chars().all(|c| c == 'é'));
}

#[test]
fn attach_detach_and_snapshots_are_logged_with_who_asked() {
    let mut state = three_nodes();
    let token = Actor::AdminToken { via: NodeId(2) };
    ok(
        &mut state,
        by(
            token,
            T0 + 1,
            Command::AttachVolume {
                name: vname("vm1"),
                node: NodeId(1),
                allow_two_primaries: false,
                force_takeover: false,
                now_ms: T0 + 1,
            },
        ),
    );
    ok(
        &mut state,
        by(
            Actor::Loopback { via: NodeId(1) },
            T0 + 2,
            Command::DetachVolume {
                name: vname("vm1"),
                node: None,
            },
        ),
    );
    ok(
        &mut state,
        by(
            token,
            T0 + 3,
            Command::SetSettings {
                settings: trireme_control::ClusterSettings {
                    eviction_enabled: true,
                    ..Default::default()
                },
            },
        ),
    );
    let events: Vec<&Event> = state.events.iter().collect();
    assert_eq!(
        kinds(&state),
        vec![
            EventKind::Attached,
            EventKind::Detached,
            EventKind::SettingsChanged
        ]
    );
    assert_eq!(events[0].actor, "admin token via n2");
    assert_eq!(events[0].node.as_deref(), Some("n1"));
    assert_eq!(events[0].volume, Some(vname("vm1")));
    assert_eq!(events[0].time_ms, T0 + 1);
    assert_eq!(events[1].actor, "local client on n1");
    assert_eq!(events[1].seq, 2);
    assert!(
        events[2].message.contains("eviction on"),
        "{}",
        events[2].message
    );
}

#[test]
fn a_refused_command_logs_nothing() {
    let mut state = three_nodes();
    let before = state.clone();
    let refused = state.apply(by(
        Actor::Node(NodeId(1)),
        T0,
        Command::DetachVolume {
            name: vname("vm1"),
            node: None,
        },
    ));
    assert!(refused.is_err());
    assert_eq!(state, before);
}

#[test]
fn node_states_are_logged_once_per_transition_with_quorum_changes() {
    let mut state = three_nodes();
    let leader = Actor::Node(NodeId(1));
    let offline = |node| Command::SetNodeState {
        node: NodeId(node),
        state: NodeState::Offline,
        now_ms: T0,
    };
    ok(&mut state, by(leader, T0, offline(2)));
    // The leader says it again: not news.
    ok(&mut state, by(leader, T0, offline(2)));
    assert_eq!(kinds(&state), vec![EventKind::NodeOffline]);
    // A second voter gone: the volume has no quorum.
    ok(&mut state, by(leader, T0, offline(3)));
    assert_eq!(
        kinds(&state),
        vec![
            EventKind::NodeOffline,
            EventKind::NodeOffline,
            EventKind::QuorumLost
        ]
    );
    ok(
        &mut state,
        by(
            leader,
            T0,
            Command::SetNodeState {
                node: NodeId(3),
                state: NodeState::Online,
                now_ms: T0,
            },
        ),
    );
    let last: Vec<EventKind> = kinds(&state).into_iter().skip(3).collect();
    assert_eq!(last, vec![EventKind::NodeOnline, EventKind::QuorumRegained]);
    let regained = state.events.iter().last().unwrap();
    assert_eq!(regained.volume, Some(vname("vm1")));
    assert!(regained.message.contains("2 of 3"), "{}", regained.message);
}

#[test]
fn a_pool_going_offline_is_a_disk_failure_event() {
    let mut state = three_nodes();
    let node = Actor::Node(NodeId(3));
    ok(&mut state, by(node, T0, pools(3, false)));
    ok(&mut state, by(node, T0, pools(3, false)));
    ok(&mut state, by(node, T0, pools(3, true)));
    assert_eq!(
        kinds(&state),
        vec![EventKind::PoolOffline, EventKind::PoolOnline]
    );
    assert_eq!(state.events.iter().next().unwrap().actor, "node n3");
}

#[test]
fn a_reported_event_is_logged_only_when_attributed() {
    let mut state = three_nodes();
    let report = Command::RecordEvent {
        event: ReportedEvent {
            kind: EventKind::VerifyFinished,
            node: Some(NodeId(1)),
            volume: Some(vname("vm1")),
            message: "verify of vm1 done".into(),
        },
    };
    ok(&mut state, report.clone());
    assert!(state.events.is_empty());
    ok(&mut state, by(Actor::Node(NodeId(1)), T0, report));
    assert_eq!(kinds(&state), vec![EventKind::VerifyFinished]);
    let unknown = state.apply(by(
        Actor::Node(NodeId(1)),
        T0,
        Command::RecordEvent {
            event: ReportedEvent {
                kind: EventKind::Repaired,
                node: Some(NodeId(9)),
                volume: None,
                message: String::new(),
            },
        },
    ));
    assert!(unknown.is_err());
    let nested = state.apply(by(
        Actor::Node(NodeId(1)),
        T0,
        by(Actor::Node(NodeId(1)), T0, pools(1, true)),
    ));
    assert!(nested.is_err(), "an attributed command cannot wrap another");
}

#[test]
fn the_log_survives_the_snapshot_round_trip_and_old_states_load() {
    let mut state = three_nodes();
    ok(&mut state, by(Actor::Node(NodeId(1)), T0, pools(2, false)));
    let json = serde_json::to_string(&state).unwrap();
    let loaded: ClusterState = serde_json::from_str(&json).unwrap();
    assert_eq!(loaded, state);

    // A state written before the log existed.
    let mut old: serde_json::Value = serde_json::to_value(three_nodes()).unwrap();
    old.as_object_mut().unwrap().remove("events");
    let loaded: ClusterState = serde_json::from_value(old).unwrap();
    assert!(loaded.events.is_empty());
    assert_eq!(loaded.events.last_seq(), 0);
}

#[test]
fn kind_names_are_the_serde_names() {
    use EventKind::*;
    for kind in [
        NodeJoined,
        NodeOnline,
        NodeOffline,
        NodeEvicted,
        NodeRemoved,
        NodeLabelsChanged,
        PoolOffline,
        PoolOnline,
        VolumeCreated,
        VolumeDeleted,
        VolumeGrown,
        VolumeCloned,
        Attached,
        Detached,
        PrimaryChanged,
        Reattached,
        QuorumLost,
        QuorumRegained,
        ReplicaAdded,
        ReplicaRemoved,
        ReplicaFailed,
        ReplicaOutdated,
        ResyncStarted,
        ResyncFinished,
        PlacementRestored,
        SnapshotCreated,
        SnapshotTaken,
        SnapshotFailed,
        SnapshotDeleted,
        RolledBack,
        ScheduleChanged,
        GroupCreated,
        GroupChanged,
        GroupDeleted,
        SettingsChanged,
        VerifyFinished,
        Repaired,
    ] {
        assert_eq!(
            serde_json::to_value(kind).unwrap(),
            serde_json::Value::String(kind.as_str().into())
        );
    }
}

#[test]
fn an_attributed_bootstrap_creates_the_cluster_and_logs_it() {
    let mut state = ClusterState::default();
    ok(
        &mut state,
        by(
            Actor::Node(NodeId(1)),
            T0,
            Command::Bootstrap {
                cluster_id: "c-test".into(),
                join_secret: "secret".into(),
                node: registration("n1"),
                now_ms: T0,
            },
        ),
    );
    assert_eq!(kinds(&state), vec![EventKind::NodeJoined]);
    assert_eq!(state.events.iter().next().unwrap().actor, "node n1");
}
