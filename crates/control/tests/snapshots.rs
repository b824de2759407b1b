//! Sans-IO tests of snapshots in the control state machine: taking them
//! (attached through the primary, detached through fenced replicas),
//! deleting, rolling back, cloning, schedules, and the refusals that keep a
//! snapshot's last copy and a running rollback safe.

use std::collections::{BTreeMap, BTreeSet};

use trireme_control::{
    ClusterState, Command, CommandError, NodeRegistration, PoolRecord, PoolReport, ReplicaKind,
    ReplicaObserved, Reply, SnapshotRecord, SnapshotState, SnapshotTaker, VolumeRecord,
};
use trireme_types::{
    DeviceClass, Generation, NodeId, NodeName, PoolName, SnapshotId, SnapshotName, VolumeName,
};

const T0: u64 = 1_700_000_000_000;
const GIB: u64 = 1 << 30;

fn vname(name: &str) -> VolumeName {
    VolumeName::new(name).unwrap()
}

fn sname(name: &str) -> SnapshotName {
    SnapshotName::new(name).unwrap()
}

fn ids(nodes: &[u64]) -> BTreeSet<NodeId> {
    nodes.iter().map(|node| NodeId(*node)).collect()
}

#[track_caller]
fn ok(state: &mut ClusterState, command: Command) -> Reply {
    let shown = format!("{command:?}");
    state
        .apply(command)
        .unwrap_or_else(|error| panic!("{shown} was refused: {error}"))
}

#[track_caller]
fn refused(state: &mut ClusterState, command: Command) -> CommandError {
    let before = state.clone();
    let shown = format!("{command:?}");
    let error = state
        .apply(command)
        .err()
        .unwrap_or_else(|| panic!("{shown} was accepted"));
    assert_eq!(*state, before, "{shown} was refused but changed the state");
    error
}

fn registration(name: &str) -> NodeRegistration {
    NodeRegistration {
        name: NodeName::new(name).unwrap(),
        api_address: format!("{name}.test:7450"),
        nbd_address: None,
        data_address: None,
        labels: BTreeMap::new(),
    }
}

/// `count` online nodes with a pool each, and volume `v` (1 GiB) on n1-n3,
/// reported ready.
fn cluster(count: u64) -> ClusterState {
    let mut state = ClusterState::default();
    ok(
        &mut state,
        Command::Bootstrap {
            cluster_id: "c".into(),
            join_secret: "s".into(),
            node: registration("n1"),
            now_ms: T0,
        },
    );
    for index in 2..=count {
        ok(
            &mut state,
            Command::AddNode {
                node: registration(&format!("n{index}")),
                nonce: format!("nonce-{index}"),
                now_ms: T0,
            },
        );
    }
    for index in 1..=count {
        ok(
            &mut state,
            Command::ReportPools {
                node: NodeId(index),
                pools: vec![PoolReport {
                    name: PoolName::new("p1").unwrap(),
                    record: PoolRecord {
                        class: DeviceClass::Ssd,
                        capacity_bytes: 100 * GIB,
                        free_bytes: 100 * GIB - index * GIB,
                        online: true,
                        reported_ms: T0,
                    },
                }],
            },
        );
    }
    ok(
        &mut state,
        Command::CreateVolume {
            name: vname("v"),
            size_bytes: GIB,
            group: None,
            replicas: None,
            nodes: Some(
                ["n1", "n2", "n3"]
                    .iter()
                    .map(|name| NodeName::new(*name).unwrap())
                    .collect(),
            ),
            pool: None,
            adopt: None,
            now_ms: T0,
        },
    );
    ready(&mut state, "v");
    state
}

fn ready(state: &mut ClusterState, volume: &str) {
    let record = state.volumes[&vname(volume)].clone();
    for replica in record.diskful() {
        ok(
            state,
            Command::ReportReplica {
                volume: vname(volume),
                volume_id: record.id,
                node: replica.node,
                observed: ReplicaObserved::Ready,
                allocated_bytes: 0,
                size_bytes: None,
            },
        );
    }
}

fn volume<'a>(state: &'a ClusterState, name: &str) -> &'a VolumeRecord {
    &state.volumes[&vname(name)]
}

fn snapshot<'a>(state: &'a ClusterState, volume_name: &str, name: &str) -> &'a SnapshotRecord {
    volume(state, volume_name)
        .snapshot(&sname(name))
        .unwrap_or_else(|| panic!("no snapshot {volume_name}@{name}"))
}

fn create(volume: &str, name: &str) -> Command {
    Command::CreateSnapshot {
        volume: vname(volume),
        name: sname(name),
        scheduled: false,
        now_ms: T0 + 10,
    }
}

fn report(volume: &str, id: SnapshotId, from: u64, holders: &[u64]) -> Command {
    Command::ReportSnapshot {
        volume: vname(volume),
        id,
        from: NodeId(from),
        holders: ids(holders),
        error: None,
    }
}

fn attach(state: &mut ClusterState, node: u64) {
    ok(
        state,
        Command::AttachVolume {
            name: vname("v"),
            node: NodeId(node),
            allow_two_primaries: false,
            force_takeover: false,
            now_ms: T0 + 5,
        },
    );
}

fn detach(state: &mut ClusterState) {
    ok(
        state,
        Command::DetachVolume {
            name: vname("v"),
            node: None,
        },
    );
}

fn fence(state: &mut ClusterState, nodes: &[u64]) {
    let generation = volume(state, "v").generation;
    for node in nodes {
        ok(
            state,
            Command::ReportFenced {
                volume: vname("v"),
                node: NodeId(*node),
                generation,
            },
        );
    }
}

/// Takes `v@name` through the primary on n1 (attached by the caller).
fn take_attached(state: &mut ClusterState, name: &str, holders: &[u64]) -> SnapshotId {
    let Reply::Snapshot(record) = ok(state, create("v", name)) else {
        panic!("a snapshot reply");
    };
    ok(state, report("v", record.id, 1, holders));
    record.id
}

#[test]
fn an_attached_volumes_snapshot_is_taken_by_its_primary() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    let Reply::Snapshot(record) = ok(&mut state, create("v", "s1")) else {
        panic!("a snapshot reply");
    };
    assert_eq!(
        record.state,
        SnapshotState::Creating {
            taker: SnapshotTaker::Primary { node: NodeId(1) }
        }
    );
    assert_eq!(record.size_bytes, GIB);
    // Only the primary reports it, and only for diskful replicas.
    let error = refused(&mut state, report("v", record.id, 2, &[2]));
    assert!(error.to_string().contains("another node"), "{error}");
    ok(&mut state, report("v", record.id, 1, &[1, 2, 3, 7]));
    let taken = snapshot(&state, "v", "s1");
    assert_eq!(taken.state, SnapshotState::Ready);
    assert_eq!(taken.nodes, ids(&[1, 2, 3]));
    // Names are unique per volume; unknown volumes are named.
    let error = refused(&mut state, create("v", "s1"));
    assert!(
        matches!(error, CommandError::SnapshotExists { .. }),
        "{error}"
    );
    let error = refused(&mut state, create("nosuch", "s1"));
    assert!(error.to_string().contains("nosuch"), "{error}");
    // Ids are never reused.
    let second = take_attached(&mut state, "s2", &[1, 2]);
    assert!(second > record.id);
}

#[test]
fn a_detached_volumes_snapshot_waits_for_fencing_and_every_target() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    detach(&mut state);
    let error = refused(&mut state, create("v", "s1"));
    assert!(matches!(error, CommandError::NotFenced { .. }), "{error}");
    // A fence of another generation does not count.
    ok(
        &mut state,
        Command::ReportFenced {
            volume: vname("v"),
            node: NodeId(3),
            generation: Generation(1),
        },
    );
    assert!(volume(&state, "v").fenced.is_empty());
    fence(&mut state, &[1, 2]);
    let Reply::Snapshot(record) = ok(&mut state, create("v", "s1")) else {
        panic!("a snapshot reply");
    };
    // Only the fenced, up-to-date replicas take it.
    let SnapshotState::Creating {
        taker: SnapshotTaker::Replicas { targets, .. },
    } = &record.state
    else {
        panic!("taken by the replicas: {record:?}");
    };
    assert_eq!(*targets, ids(&[1, 2]));
    let error = refused(&mut state, report("v", record.id, 3, &[3]));
    assert!(error.to_string().contains("not asked"), "{error}");
    ok(&mut state, report("v", record.id, 1, &[1]));
    assert!(matches!(
        snapshot(&state, "v", "s1").state,
        SnapshotState::Creating { .. }
    ));
    ok(
        &mut state,
        Command::ReportSnapshot {
            volume: vname("v"),
            id: record.id,
            from: NodeId(2),
            holders: BTreeSet::new(),
            error: Some("disk failed".into()),
        },
    );
    let taken = snapshot(&state, "v", "s1");
    assert_eq!(taken.state, SnapshotState::Ready);
    assert_eq!(taken.nodes, ids(&[1]));
}

#[test]
fn an_attach_fails_a_snapshot_being_taken_and_late_copies_are_recorded() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    detach(&mut state);
    fence(&mut state, &[1, 2, 3]);
    let Reply::Snapshot(record) = ok(&mut state, create("v", "s1")) else {
        panic!("a snapshot reply");
    };
    attach(&mut state, 2);
    assert!(volume(&state, "v").fenced.is_empty());
    assert!(matches!(
        snapshot(&state, "v", "s1").state,
        SnapshotState::Failed { .. }
    ));
    // A node that took it anyway is recorded, so a delete removes its copy.
    ok(&mut state, report("v", record.id, 1, &[1]));
    assert_eq!(snapshot(&state, "v", "s1").nodes, ids(&[1]));
    ok(
        &mut state,
        Command::DeleteSnapshot {
            volume: vname("v"),
            name: sname("s1"),
        },
    );
    ok(
        &mut state,
        Command::SnapshotRemoved {
            volume: vname("v"),
            id: record.id,
            node: NodeId(1),
        },
    );
    assert!(volume(&state, "v").snapshots.is_empty());
}

#[test]
fn a_deleted_snapshot_goes_once_every_copy_is_removed() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    let id = take_attached(&mut state, "s1", &[1, 2, 3]);
    ok(
        &mut state,
        Command::DeleteSnapshot {
            volume: vname("v"),
            name: sname("s1"),
        },
    );
    assert_eq!(snapshot(&state, "v", "s1").state, SnapshotState::Deleting);
    for node in [1, 2] {
        ok(
            &mut state,
            Command::SnapshotRemoved {
                volume: vname("v"),
                id,
                node: NodeId(node),
            },
        );
    }
    assert_eq!(snapshot(&state, "v", "s1").nodes, ids(&[3]));
    ok(
        &mut state,
        Command::SnapshotRemoved {
            volume: vname("v"),
            id,
            node: NodeId(3),
        },
    );
    assert!(volume(&state, "v").snapshot(&sname("s1")).is_none());
    let error = refused(
        &mut state,
        Command::DeleteSnapshot {
            volume: vname("v"),
            name: sname("s1"),
        },
    );
    assert!(
        matches!(error, CommandError::UnknownSnapshot { .. }),
        "{error}"
    );
}

#[test]
fn the_last_copy_of_a_snapshot_is_kept() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    take_attached(&mut state, "only-on-3", &[3]);
    let error = refused(
        &mut state,
        Command::RemoveReplica {
            name: vname("v"),
            node: NodeId(3),
        },
    );
    assert!(
        matches!(error, CommandError::LastSnapshotCopy { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("only-on-3"), "{error}");
    let error = refused(&mut state, Command::RemoveNode { node: NodeId(3) });
    assert!(
        matches!(error, CommandError::LastSnapshotCopy { .. }),
        "{error}"
    );
    // n2 holds no last copy: its replica may go, and snapshot records
    // follow the replicas.
    take_attached(&mut state, "on-2-and-3", &[2, 3]);
    ok(
        &mut state,
        Command::RemoveReplica {
            name: vname("v"),
            node: NodeId(2),
        },
    );
    assert_eq!(snapshot(&state, "v", "on-2-and-3").nodes, ids(&[3]));
}

#[test]
fn a_rollback_makes_the_holders_up_to_date_at_a_new_generation() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    let id = take_attached(&mut state, "s1", &[1, 2]);
    let rollback = Command::RollbackVolume {
        volume: vname("v"),
        snapshot: sname("s1"),
    };
    let error = refused(&mut state, rollback.clone());
    assert!(
        matches!(error, CommandError::VolumeAttached { .. }),
        "{error}"
    );
    detach(&mut state);
    let before = volume(&state, "v").generation;
    ok(&mut state, rollback.clone());
    let record = volume(&state, "v");
    assert_eq!(record.in_sync, ids(&[1, 2]), "n3 lacks the snapshot");
    assert!(record.generation > before);
    assert_eq!(record.rollback.as_ref().unwrap().pending, ids(&[1, 2]));
    // No attach, second rollback or snapshot while it runs.
    let error = refused(
        &mut state,
        Command::AttachVolume {
            name: vname("v"),
            node: NodeId(1),
            allow_two_primaries: false,
            force_takeover: false,
            now_ms: T0 + 20,
        },
    );
    assert!(
        matches!(error, CommandError::RollbackPending { .. }),
        "{error}"
    );
    refused(&mut state, rollback);
    refused(&mut state, create("v", "s2"));
    for node in [1, 2] {
        ok(
            &mut state,
            Command::RolledBack {
                volume: vname("v"),
                node: NodeId(node),
                snapshot: id,
            },
        );
    }
    assert!(volume(&state, "v").rollback.is_none());
    attach(&mut state, 1);
}

#[test]
fn a_volume_grown_since_the_snapshot_is_not_rolled_back() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    take_attached(&mut state, "s1", &[1, 2, 3]);
    detach(&mut state);
    ok(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: 2 * GIB,
        },
    );
    let error = refused(
        &mut state,
        Command::RollbackVolume {
            volume: vname("v"),
            snapshot: sname("s1"),
        },
    );
    assert!(error.to_string().contains("clone the snapshot"), "{error}");
}

#[test]
fn a_clone_is_placed_on_the_snapshots_nodes_in_their_pools() {
    let mut state = cluster(4);
    attach(&mut state, 1);
    let id = take_attached(&mut state, "s1", &[1, 3]);
    let clone = Command::CloneVolume {
        name: vname("c"),
        source: vname("v"),
        snapshot: sname("s1"),
        group: None,
        now_ms: T0 + 30,
    };
    ok(&mut state, clone.clone());
    let record = volume(&state, "c");
    let diskful: BTreeSet<NodeId> = record.diskful().map(|replica| replica.node).collect();
    assert_eq!(diskful, ids(&[1, 3]));
    assert_eq!(record.in_sync, ids(&[1, 3]));
    assert_eq!(record.size_bytes, GIB);
    assert_eq!(record.origin.as_ref().unwrap().snapshot, id);
    // Two copies: a tiebreaker elsewhere.
    assert!(record
        .replicas
        .iter()
        .any(|replica| replica.kind == ReplicaKind::Tiebreaker));
    let error = refused(&mut state, clone);
    assert!(
        matches!(error, CommandError::VolumeExists { .. }),
        "{error}"
    );
    // The snapshot and its volume stay while the clone's copies are made.
    let error = refused(
        &mut state,
        Command::DeleteSnapshot {
            volume: vname("v"),
            name: sname("s1"),
        },
    );
    assert!(error.to_string().contains("being cloned"), "{error}");
    detach(&mut state);
    // Not even with its snapshots: the clone still reads from them.
    let error = refused(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: true,
        },
    );
    assert!(
        matches!(error, CommandError::ClonesBeingMade { .. })
            && error.to_string().contains("volume(s) c are being made")
            && error.to_string().contains("trireme volume delete CLONE"),
        "{error}"
    );
    ready(&mut state, "c");
    ok(
        &mut state,
        Command::DeleteSnapshot {
            volume: vname("v"),
            name: sname("s1"),
        },
    );
    let error = refused(
        &mut state,
        Command::CloneVolume {
            name: vname("d"),
            source: vname("v"),
            snapshot: sname("nosuch"),
            group: None,
            now_ms: T0,
        },
    );
    assert!(
        matches!(error, CommandError::UnknownSnapshot { .. }),
        "{error}"
    );
}

#[test]
fn a_volume_with_snapshots_is_deleted_only_when_the_request_says_so() {
    let mut state = cluster(4);
    attach(&mut state, 1);
    take_attached(&mut state, "s1", &[1, 2, 3]);
    take_attached(&mut state, "s2", &[1, 2, 3]);
    ok(
        &mut state,
        Command::CloneVolume {
            name: vname("c"),
            source: vname("v"),
            snapshot: sname("s1"),
            group: None,
            now_ms: T0 + 30,
        },
    );
    ready(&mut state, "c");
    detach(&mut state);
    let delete = |with_snapshots| Command::DeleteVolume {
        name: vname("v"),
        with_snapshots,
    };
    let error = refused(&mut state, delete(false));
    let text = error.to_string();
    assert!(
        matches!(error, CommandError::HasSnapshots { .. })
            && text.contains("snapshot(s) s1, s2")
            && text.contains("--with-snapshots")
            && text.contains("Clones made from them (c) keep their data"),
        "{text}"
    );
    // A snapshot being deleted no longer holds the volume back.
    for name in ["s1", "s2"] {
        ok(
            &mut state,
            Command::DeleteSnapshot {
                volume: vname("v"),
                name: sname(name),
            },
        );
    }
    assert!(volume(&state, "v")
        .snapshots
        .iter()
        .all(|snapshot| snapshot.state == SnapshotState::Deleting));
    ok(&mut state, delete(false));
    assert!(volume(&state, "v").deleting);

    // With the flag, the snapshots go with the volume.
    let mut state = cluster(4);
    attach(&mut state, 1);
    take_attached(&mut state, "s1", &[1, 2, 3]);
    detach(&mut state);
    ok(&mut state, delete(true));
    assert!(volume(&state, "v").deleting);
}

#[test]
fn schedules_take_and_prune_snapshots() {
    let mut state = cluster(3);
    attach(&mut state, 1);
    let schedule = |every: u64, keep: usize| Command::SetSnapshotSchedule {
        volume: vname("v"),
        schedule: Some((every, keep)),
        now_ms: T0,
    };
    let error = refused(&mut state, schedule(1, 2));
    assert!(error.to_string().contains("too often"), "{error}");
    let error = refused(&mut state, schedule(60, 0));
    assert!(error.to_string().contains("--keep 0"), "{error}");
    ok(&mut state, schedule(60, 2));
    assert_eq!(state.schedule_work(T0 + 59_000), (vec![], vec![]));
    let (take, prune) = state.schedule_work(T0 + 60_000);
    assert_eq!(take, vec![vname("v")]);
    assert!(prune.is_empty());
    let mut now = T0 + 60_000;
    for index in 0..3 {
        let Reply::Snapshot(record) = ok(
            &mut state,
            Command::CreateSnapshot {
                volume: vname("v"),
                name: sname(&format!("auto-{index}")),
                scheduled: true,
                now_ms: now,
            },
        ) else {
            panic!("a snapshot reply");
        };
        ok(&mut state, report("v", record.id, 1, &[1, 2, 3]));
        now += 60_000;
    }
    // A snapshot taken by hand is never pruned.
    take_attached(&mut state, "mine", &[1, 2, 3]);
    let (_, prune) = state.schedule_work(now - 60_000);
    assert_eq!(prune, vec![(vname("v"), sname("auto-0"))]);
}

#[test]
fn a_state_from_before_snapshots_loads() {
    let state = cluster(3);
    let mut json = serde_json::to_value(&state).unwrap();
    json.as_object_mut().unwrap().remove("next_snapshot_id");
    let volume = json["volumes"]["v"].as_object_mut().unwrap();
    for field in ["snapshots", "schedule", "rollback", "origin", "fenced"] {
        volume.remove(field);
    }
    let old: ClusterState = serde_json::from_value(json).unwrap();
    assert_eq!(old, state);
    old.check_invariants().unwrap();
}
