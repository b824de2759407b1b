//! Sans-IO tests of the control state machine: `ClusterState::apply` driven
//! directly, without Raft, storage or a clock.
//!
//! Every refusal goes through [`refused`], which also checks the promise in
//! `apply`'s documentation that a refused command leaves the state unchanged.
//! The property test at the end feeds random sequences of valid and invalid
//! commands and checks that nothing panics, the invariants hold, the state
//! survives the JSON round trip that snapshots and log entries go through,
//! and two fresh states fed the same sequence end equal (the determinism every
//! Raft member relies on).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trireme_control::command::MAX_PLACE_COUNT;
use trireme_control::{
    ClusterSettings, ClusterState, Command, CommandError, FencedPrimary, NodeRegistration,
    NodeState, PoolRecord, PoolReport, PrimaryRecord, QuorumPolicy, ReplicaKind, ReplicaObserved,
    Reply, ResourceGroup, SyncProgress, VolumeRecord, DEFAULT_GROUP, JOIN_WINDOW_MS,
};
use trireme_types::{
    DeviceClass, Generation, GroupName, NodeId, NodeName, PoolName, SnapshotId, SnapshotName,
    VolumeName,
};

/// Proposers stamp commands with their clock; any fixed epoch will do.
const T0: u64 = 1_700_000_000_000;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn vname(name: &str) -> VolumeName {
    VolumeName::new(name).unwrap()
}

fn nname(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

fn gname(name: &str) -> GroupName {
    GroupName::new(name).unwrap()
}

fn pname(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

fn registration(name: &str, zone: Option<&str>) -> NodeRegistration {
    NodeRegistration {
        name: nname(name),
        api_address: format!("{name}.test:7070"),
        nbd_address: None,
        data_address: None,
        labels: zone
            .map(|zone| BTreeMap::from([("zone".to_string(), zone.to_string())]))
            .unwrap_or_default(),
    }
}

fn bootstrap_command(zone: Option<&str>) -> Command {
    Command::Bootstrap {
        cluster_id: "c-test".into(),
        join_secret: "secret".into(),
        node: registration("n1", zone),
        now_ms: T0,
    }
}

fn pool(name: &str, class: DeviceClass, free_bytes: u64) -> PoolReport {
    PoolReport {
        name: pname(name),
        record: PoolRecord {
            class,
            capacity_bytes: TIB,
            free_bytes,
            online: true,
            reported_ms: T0,
        },
    }
}

fn add_node_command(name: &str, zone: Option<&str>, nonce: &str, now_ms: u64) -> Command {
    Command::AddNode {
        node: registration(name, zone),
        nonce: nonce.into(),
        now_ms,
    }
}

fn create_command(name: &str, size_bytes: u64) -> Command {
    Command::CreateVolume {
        name: vname(name),
        size_bytes,
        group: None,
        replicas: None,
        nodes: None,
        pool: None,
        adopt: None,
        now_ms: T0,
    }
}

/// `create_command` with a replica count, a manual node list and a group.
fn create_with(
    name: &str,
    replicas: Option<usize>,
    nodes: Option<&[&str]>,
    group: Option<&str>,
) -> Command {
    Command::CreateVolume {
        name: vname(name),
        size_bytes: 10 * GIB,
        group: group.map(gname),
        replicas,
        nodes: nodes.map(|nodes| nodes.iter().map(|node| nname(node)).collect()),
        pool: None,
        adopt: None,
        now_ms: T0,
    }
}

fn group(name: &str, place_count: usize, min_place_count: usize, spread: &[&str]) -> ResourceGroup {
    ResourceGroup {
        name: gname(name),
        place_count,
        min_place_count,
        pools: Vec::new(),
        class: None,
        replicas_on_different: spread.iter().map(|key| key.to_string()).collect(),
        diskless_on_remaining: false,
        on_no_quorum: QuorumPolicy::Suspend,
    }
}

/// Applies a command that must succeed.
#[track_caller]
fn apply_ok(state: &mut ClusterState, command: Command) -> Reply {
    let shown = format!("{command:?}");
    match state.apply(command) {
        Ok(reply) => reply,
        Err(error) => panic!("{shown} was refused: {error}"),
    }
}

/// Applies a command that must be refused, and checks it changed nothing.
#[track_caller]
fn refused(state: &mut ClusterState, command: Command) -> CommandError {
    let before = state.clone();
    let shown = format!("{command:?}");
    match state.apply(command) {
        Ok(reply) => panic!("{shown} was accepted ({reply:?}); it should be refused"),
        Err(error) => {
            assert_eq!(
                *state, before,
                "refused {shown} ({error}) changed the state"
            );
            error
        }
    }
}

#[track_caller]
fn added(reply: Reply) -> NodeId {
    match reply {
        Reply::NodeAdded { node } => node,
        other => panic!("expected NodeAdded, got {other:?}"),
    }
}

#[track_caller]
fn created(reply: Reply) -> VolumeRecord {
    match reply {
        Reply::Volume(record) => *record,
        other => panic!("expected a volume, got {other:?}"),
    }
}

/// A bootstrapped cluster with one node per zone (`n1`, `n2`, ...), each
/// with one ssd pool `p1`. Node ids are 1, 2, ... in the order of `zones`.
fn cluster(zones: &[&str]) -> ClusterState {
    let mut state = ClusterState::default();
    apply_ok(&mut state, bootstrap_command(Some(zones[0])));
    for (index, zone) in zones.iter().enumerate().skip(1) {
        let name = format!("n{}", index + 1);
        let nonce = format!("nonce-{}", index + 1);
        let id = added(apply_ok(
            &mut state,
            add_node_command(&name, Some(zone), &nonce, T0),
        ));
        assert_eq!(id, NodeId(index as u64 + 1));
    }
    for index in 0..zones.len() {
        apply_ok(
            &mut state,
            Command::ReportPools {
                node: NodeId(index as u64 + 1),
                // Different free space so the placer's weights differ.
                pools: vec![pool("p1", DeviceClass::Ssd, (index as u64 + 1) * 100 * GIB)],
            },
        );
    }
    state
}

fn diskful_nodes(volume: &VolumeRecord) -> BTreeSet<NodeId> {
    volume.diskful().map(|replica| replica.node).collect()
}

fn report_all_ready(state: &mut ClusterState, volume: &str) {
    let record = state.volumes[&vname(volume)].clone();
    for replica in record.diskful() {
        apply_ok(
            state,
            Command::ReportReplica {
                volume: vname(volume),
                volume_id: record.id,
                node: replica.node,
                observed: ReplicaObserved::Ready,
                allocated_bytes: GIB,
                size_bytes: None,
            },
        );
    }
}

#[test]
fn everything_but_bootstrap_is_refused_before_the_cluster_exists() {
    let mut state = ClusterState::default();
    for command in [
        add_node_command("n2", None, "x", T0),
        create_command("v", GIB),
        Command::SetSettings {
            settings: ClusterSettings::default(),
        },
        Command::RemoveNode { node: NodeId(1) },
    ] {
        assert_eq!(refused(&mut state, command), CommandError::NotBootstrapped);
    }
    assert_eq!(state, ClusterState::default());
}

#[test]
fn bootstrap_creates_the_first_node_and_the_default_group() {
    let mut state = ClusterState::default();
    let first = added(apply_ok(&mut state, bootstrap_command(Some("za"))));
    assert_eq!(first, NodeId(1));
    assert_eq!(state.cluster_id, "c-test");
    assert_eq!(state.join_secret, "secret");
    assert_eq!(state.created_ms, T0);
    assert_eq!(state.next_node_id, 2);
    assert_eq!(state.next_volume_id, 1);
    let node = &state.nodes[&NodeId(1)];
    assert_eq!(node.name, nname("n1"));
    assert_eq!(node.state, NodeState::Online);
    assert_eq!(node.labels["zone"], "za");
    assert!(node.pools.is_empty());
    assert_eq!(state.groups.len(), 1);
    assert_eq!(
        state.groups[&gname(DEFAULT_GROUP)],
        ResourceGroup::default_group()
    );

    let again = refused(&mut state, bootstrap_command(None));
    assert_eq!(
        again,
        CommandError::AlreadyBootstrapped {
            cluster_id: "c-test".into()
        }
    );

    let mut fresh = ClusterState::default();
    let empty = refused(
        &mut fresh,
        Command::Bootstrap {
            cluster_id: String::new(),
            join_secret: "s".into(),
            node: registration("n1", None),
            now_ms: T0,
        },
    );
    assert!(matches!(empty, CommandError::Invalid(_)), "{empty:?}");
}

#[test]
fn joining_nodes_get_increasing_ids_and_need_unique_names() {
    let mut state = ClusterState::default();
    apply_ok(&mut state, bootstrap_command(None));
    let second = added(apply_ok(
        &mut state,
        add_node_command("n2", None, "a", T0 + 1),
    ));
    let third = added(apply_ok(
        &mut state,
        add_node_command("n3", None, "b", T0 + 2),
    ));
    assert_eq!((second, third), (NodeId(2), NodeId(3)));
    assert_eq!(state.next_node_id, 4);
    assert_eq!(state.nodes[&third].joined_ms, T0 + 2);

    let taken = refused(&mut state, add_node_command("n2", None, "c", T0 + 3));
    assert_eq!(taken, CommandError::NodeNameTaken { name: "n2".into() });
    assert!(taken.to_string().contains("'n2'"), "{taken}");
    // The refused join's nonce was not remembered: it can be used again.
    added(apply_ok(
        &mut state,
        add_node_command("n4", None, "c", T0 + 4),
    ));

    // Ids are never reused, even after a removal.
    apply_ok(&mut state, Command::RemoveNode { node: NodeId(4) });
    let fifth = added(apply_ok(
        &mut state,
        add_node_command("n4", None, "d", T0 + 5),
    ));
    assert_eq!(fifth, NodeId(5));
}

#[test]
fn a_replayed_join_is_refused_until_its_nonce_is_forgotten() {
    let mut state = ClusterState::default();
    apply_ok(&mut state, bootstrap_command(None));
    added(apply_ok(
        &mut state,
        add_node_command("n2", None, "once", T0),
    ));

    // Same nonce, even under another name, within the window.
    let replay = refused(&mut state, add_node_command("n3", None, "once", T0 + 1000));
    assert_eq!(replay, CommandError::JoinReplayed);
    let replay = refused(
        &mut state,
        add_node_command("n3", None, "once", T0 + JOIN_WINDOW_MS),
    );
    assert_eq!(replay, CommandError::JoinReplayed);

    // Past the window the nonce is forgotten (the join's signed timestamp is
    // what refuses such an old request; the state only remembers the window).
    let late = T0 + JOIN_WINDOW_MS + 1;
    let third = added(apply_ok(
        &mut state,
        add_node_command("n3", None, "once", late),
    ));
    assert_eq!(third, NodeId(3));
    assert_eq!(
        state.join_nonces,
        BTreeMap::from([("once".to_string(), late)])
    );

    // Old nonces are dropped by the next accepted join.
    added(apply_ok(
        &mut state,
        add_node_command("n4", None, "other", late + JOIN_WINDOW_MS + 1),
    ));
    assert!(!state.join_nonces.contains_key("once"));
}

#[test]
fn a_refused_join_does_not_forget_old_nonces() {
    // `apply` promises that a refused command changes nothing. A join that
    // is refused (duplicate name here) must not prune expired nonces either.
    let mut state = ClusterState::default();
    apply_ok(&mut state, bootstrap_command(None));
    added(apply_ok(
        &mut state,
        add_node_command("n2", None, "old", T0),
    ));
    let later = T0 + JOIN_WINDOW_MS + 1;
    let taken = refused(&mut state, add_node_command("n2", None, "new", later));
    assert_eq!(taken, CommandError::NodeNameTaken { name: "n2".into() });
}

#[test]
fn reported_pools_replace_the_previous_list() {
    let mut state = cluster(&["za", "zb"]);
    apply_ok(
        &mut state,
        Command::ReportPools {
            node: NodeId(2),
            pools: vec![
                pool("fast", DeviceClass::Nvme, GIB),
                pool("slow", DeviceClass::Hdd, 2 * GIB),
            ],
        },
    );
    let pools: Vec<&str> = state.nodes[&NodeId(2)]
        .pools
        .keys()
        .map(PoolName::as_str)
        .collect();
    assert_eq!(pools, ["fast", "slow"]);
    apply_ok(
        &mut state,
        Command::ReportPools {
            node: NodeId(2),
            pools: Vec::new(),
        },
    );
    assert!(state.nodes[&NodeId(2)].pools.is_empty());
    let unknown = refused(
        &mut state,
        Command::ReportPools {
            node: NodeId(9),
            pools: Vec::new(),
        },
    );
    assert_eq!(unknown, CommandError::UnknownNode { node: NodeId(9) });
}

#[test]
fn a_volume_is_placed_on_distinct_nodes_with_pools() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    let record = created(apply_ok(&mut state, create_command("v1", 10 * GIB)));
    assert_eq!(state.volumes[&vname("v1")], record);
    assert_eq!(record.id, 1);
    assert_eq!(state.next_volume_id, 2);
    assert_eq!(record.size_bytes, 10 * GIB);
    assert_eq!(record.group, gname(DEFAULT_GROUP));
    assert!(!record.deleting);
    // The default group: three diskful replicas, odd, so no tiebreaker.
    assert_eq!(diskful_nodes(&record).len(), 3);
    assert_eq!(record.replicas.len(), 3);
    for replica in &record.replicas {
        assert_eq!(replica.kind, ReplicaKind::Diskful);
        assert_eq!(replica.pool, Some(pname("p1")));
        assert_eq!(replica.observed, ReplicaObserved::Pending);
    }

    let second = created(apply_ok(&mut state, create_command("v2", GIB)));
    assert_eq!(second.id, 2);

    let exists = refused(&mut state, create_command("v1", GIB));
    assert_eq!(exists, CommandError::VolumeExists { name: "v1".into() });
    let zero = refused(&mut state, create_command("v3", 0));
    assert!(
        matches!(&zero, CommandError::InvalidSize { name, .. } if name == "v3"),
        "{zero:?}"
    );
    let unknown = refused(&mut state, create_with("v3", None, None, Some("nope")));
    assert_eq!(
        unknown,
        CommandError::UnknownGroup {
            name: "nope".into()
        }
    );
}

#[test]
fn a_volume_needs_pools_to_be_placed() {
    let mut state = ClusterState::default();
    apply_ok(&mut state, bootstrap_command(None));
    let error = refused(&mut state, create_command("v1", GIB));
    assert!(
        matches!(&error, CommandError::Placement { name, .. } if name == "v1"),
        "{error:?}"
    );
}

#[test]
fn explicit_replica_counts_are_all_or_nothing() {
    let mut state = cluster(&["za", "zb", "zc"]);
    // Two diskful replicas are even: the third node becomes the tiebreaker.
    let two = created(apply_ok(
        &mut state,
        create_with("two", Some(2), None, None),
    ));
    assert_eq!(diskful_nodes(&two).len(), 2);
    let tiebreakers: Vec<_> = two
        .replicas
        .iter()
        .filter(|replica| replica.kind == ReplicaKind::Tiebreaker)
        .collect();
    assert_eq!(tiebreakers.len(), 1);
    assert!(!diskful_nodes(&two).contains(&tiebreakers[0].node));
    assert_eq!(tiebreakers[0].pool, None);

    let one = created(apply_ok(
        &mut state,
        create_with("one", Some(1), None, None),
    ));
    assert_eq!(one.replicas.len(), 1);

    let four = refused(&mut state, create_with("four", Some(4), None, None));
    assert!(matches!(four, CommandError::Placement { .. }), "{four:?}");
    for count in [0, MAX_PLACE_COUNT + 1] {
        let error = refused(&mut state, create_with("bad", Some(count), None, None));
        assert!(matches!(error, CommandError::Invalid(_)), "{error:?}");
    }
}

#[test]
fn manual_nodes_get_exactly_the_diskful_replicas() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    let record = created(apply_ok(
        &mut state,
        create_with("manual", None, Some(&["n1", "n4"]), None),
    ));
    assert_eq!(
        diskful_nodes(&record),
        BTreeSet::from([NodeId(1), NodeId(4)])
    );

    let unknown = refused(
        &mut state,
        create_with("m2", None, Some(&["n1", "ghost"]), None),
    );
    assert!(
        matches!(&unknown, CommandError::Placement { reason, .. } if reason.contains("ghost")),
        "{unknown:?}"
    );
    apply_ok(
        &mut state,
        Command::SetNodeState {
            node: NodeId(2),
            state: NodeState::Offline,
            now_ms: T0,
        },
    );
    let offline = refused(&mut state, create_with("m3", None, Some(&["n2"]), None));
    assert!(
        matches!(&offline, CommandError::Placement { reason, .. } if reason.contains("n2") && reason.contains("offline")),
        "{offline:?}"
    );
}

#[test]
fn groups_constrain_placement_by_label() {
    // Two nodes share zone za: a two-zone group fits, a four-zone one not.
    let mut state = cluster(&["za", "za", "zb", "zc"]);
    apply_ok(
        &mut state,
        Command::CreateGroup {
            group: group("spread", 3, 3, &["zone"]),
        },
    );
    for index in 0..5 {
        let name = format!("s{index}");
        let record = created(apply_ok(
            &mut state,
            create_with(&name, None, None, Some("spread")),
        ));
        let zones: BTreeSet<&str> = record
            .diskful()
            .map(|replica| state.nodes[&replica.node].labels["zone"].as_str())
            .collect();
        assert_eq!(zones.len(), 3, "{record:?}");
        assert_eq!(record.group, gname("spread"));
    }
    let four = refused(&mut state, create_with("s9", Some(4), None, Some("spread")));
    assert!(matches!(four, CommandError::Placement { .. }), "{four:?}");
    let conflict = refused(
        &mut state,
        create_with("s9", None, Some(&["n1", "n2"]), Some("spread")),
    );
    assert!(
        matches!(&conflict, CommandError::Placement { reason, .. } if reason.contains("zone=za")),
        "{conflict:?}"
    );
}

#[test]
fn groups_are_validated_and_only_unused_ones_are_deleted() {
    let mut state = cluster(&["za", "zb", "zc"]);
    for (place, min) in [(0, 0), (MAX_PLACE_COUNT + 1, 1), (2, 0), (2, 3)] {
        let error = refused(
            &mut state,
            Command::CreateGroup {
                group: group("g", place, min, &[]),
            },
        );
        assert!(matches!(error, CommandError::Invalid(_)), "{error:?}");
    }
    apply_ok(
        &mut state,
        Command::CreateGroup {
            group: group("g", 2, 1, &[]),
        },
    );
    let exists = refused(
        &mut state,
        Command::CreateGroup {
            group: group("g", 1, 1, &[]),
        },
    );
    assert_eq!(exists, CommandError::GroupExists { name: "g".into() });

    apply_ok(&mut state, create_with("user", None, None, Some("g")));
    let used = refused(&mut state, Command::DeleteGroup { name: gname("g") });
    assert_eq!(
        used,
        CommandError::GroupInUse {
            name: "g".into(),
            volumes: "user".into()
        }
    );
    let default = refused(
        &mut state,
        Command::DeleteGroup {
            name: gname(DEFAULT_GROUP),
        },
    );
    assert_eq!(default, CommandError::DefaultGroup);
    let unknown = refused(
        &mut state,
        Command::DeleteGroup {
            name: gname("nope"),
        },
    );
    assert_eq!(
        unknown,
        CommandError::UnknownGroup {
            name: "nope".into()
        }
    );

    // Once its volume is gone, the group can go.
    let record = state.volumes[&vname("user")].clone();
    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("user"),
            with_snapshots: false,
        },
    );
    for replica in record.diskful() {
        apply_ok(
            &mut state,
            Command::ReplicaRemoved {
                volume: vname("user"),
                volume_id: record.id,
                node: replica.node,
            },
        );
    }
    apply_ok(&mut state, Command::DeleteGroup { name: gname("g") });
    assert!(!state.groups.contains_key(&gname("g")));
}

#[test]
fn growing_marks_diskful_replicas_pending_and_never_shrinks() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_with("v", Some(2), None, None)));
    report_all_ready(&mut state, "v");

    // Growing to the same size changes nothing.
    let before = state.clone();
    apply_ok(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: 10 * GIB,
        },
    );
    assert_eq!(state, before);

    let grown = created(apply_ok(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: 20 * GIB,
        },
    ));
    assert_eq!(grown.size_bytes, 20 * GIB);
    for replica in &grown.replicas {
        let expected = match replica.kind {
            ReplicaKind::Diskful => ReplicaObserved::Pending,
            _ => ReplicaObserved::Ready,
        };
        assert_eq!(replica.observed, expected, "{replica:?}");
    }

    let shrink = refused(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: GIB,
        },
    );
    assert_eq!(
        shrink,
        CommandError::ShrinkRefused {
            name: "v".into(),
            current: 20 * GIB,
            requested: GIB
        }
    );
    let unknown = refused(
        &mut state,
        Command::GrowVolume {
            name: vname("nope"),
            size_bytes: GIB,
        },
    );
    assert_eq!(
        unknown,
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );

    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: false,
        },
    );
    let deleting = refused(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: 30 * GIB,
        },
    );
    assert_eq!(deleting, CommandError::VolumeDeleting { name: "v".into() });
}

#[test]
fn a_deleted_volume_goes_once_every_diskful_replica_is_removed() {
    let mut state = cluster(&["za", "zb", "zc"]);
    let record = created(apply_ok(&mut state, create_with("v", Some(2), None, None)));
    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: false,
        },
    );
    let deleting = state.volumes[&vname("v")].clone();
    assert!(deleting.deleting);
    // The tiebreaker has no data to remove: it is dropped at once.
    assert!(deleting
        .replicas
        .iter()
        .all(|replica| replica.kind == ReplicaKind::Diskful));
    assert_eq!(deleting.replicas.len(), 2);

    let holders: Vec<NodeId> = diskful_nodes(&record).into_iter().collect();
    // A report about another volume id (an older "v") changes nothing.
    let before = state.clone();
    apply_ok(
        &mut state,
        Command::ReplicaRemoved {
            volume: vname("v"),
            volume_id: record.id + 100,
            node: holders[0],
        },
    );
    assert_eq!(state, before);

    apply_ok(
        &mut state,
        Command::ReplicaRemoved {
            volume: vname("v"),
            volume_id: record.id,
            node: holders[0],
        },
    );
    assert_eq!(state.volumes[&vname("v")].replicas.len(), 1);
    apply_ok(
        &mut state,
        Command::ReplicaRemoved {
            volume: vname("v"),
            volume_id: record.id,
            node: holders[1],
        },
    );
    assert!(!state.volumes.contains_key(&vname("v")));
    // A late report about the gone volume is harmless.
    apply_ok(
        &mut state,
        Command::ReplicaRemoved {
            volume: vname("v"),
            volume_id: record.id,
            node: holders[1],
        },
    );

    // The name is free again, under a new id.
    let again = created(apply_ok(&mut state, create_command("v", GIB)));
    assert!(again.id > record.id);
    let unknown = refused(
        &mut state,
        Command::DeleteVolume {
            name: vname("nope"),
            with_snapshots: false,
        },
    );
    assert_eq!(
        unknown,
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
}

#[test]
fn replica_reports_update_only_the_current_volume() {
    let mut state = cluster(&["za", "zb", "zc"]);
    let record = created(apply_ok(&mut state, create_with("v", Some(1), None, None)));
    let holder = record.replicas[0].node;
    apply_ok(
        &mut state,
        Command::ReportReplica {
            volume: vname("v"),
            volume_id: record.id,
            node: holder,
            observed: ReplicaObserved::Failed("disk on fire".into()),
            allocated_bytes: 7,
            size_bytes: None,
        },
    );
    let replica = state.volumes[&vname("v")].replica(holder).unwrap().clone();
    assert_eq!(
        replica.observed,
        ReplicaObserved::Failed("disk on fire".into())
    );
    assert_eq!(replica.allocated_bytes, 7);

    let before = state.clone();
    apply_ok(
        &mut state,
        Command::ReportReplica {
            volume: vname("v"),
            volume_id: record.id + 1,
            node: holder,
            observed: ReplicaObserved::Ready,
            allocated_bytes: 9,
            size_bytes: None,
        },
    );
    assert_eq!(
        state, before,
        "a report about another volume id changed the state"
    );
    let unknown = refused(
        &mut state,
        Command::ReportReplica {
            volume: vname("nope"),
            volume_id: 1,
            node: holder,
            observed: ReplicaObserved::Ready,
            allocated_bytes: 0,
            size_bytes: None,
        },
    );
    assert_eq!(
        unknown,
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
}

#[test]
fn a_node_holding_the_last_ready_replica_cannot_be_removed() {
    let mut state = cluster(&["za", "zb", "zc"]);
    let only = created(apply_ok(
        &mut state,
        create_with("only", None, Some(&["n2"]), None),
    ));
    assert_eq!(diskful_nodes(&only), BTreeSet::from([NodeId(2)]));
    report_all_ready(&mut state, "only");

    let error = refused(&mut state, Command::RemoveNode { node: NodeId(2) });
    assert_eq!(
        error,
        CommandError::LastReplica {
            node: "n2".into(),
            volumes: "only".into()
        }
    );
    let text = error.to_string();
    assert!(text.contains("'n2'") && text.contains("only"), "{text}");

    // With a second ready replica elsewhere the node may go, and its
    // replica goes with it.
    created(apply_ok(
        &mut state,
        create_with("pair", None, Some(&["n2", "n3"]), None),
    ));
    report_all_ready(&mut state, "pair");
    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("only"),
            with_snapshots: false,
        },
    );
    apply_ok(&mut state, Command::RemoveNode { node: NodeId(2) });
    assert!(!state.nodes.contains_key(&NodeId(2)));
    assert_eq!(
        diskful_nodes(&state.volumes[&vname("pair")]),
        BTreeSet::from([NodeId(3)])
    );
    // The deleting volume lost its last replica with the node: forgotten.
    assert!(!state.volumes.contains_key(&vname("only")));

    let unknown = refused(&mut state, Command::RemoveNode { node: NodeId(2) });
    assert_eq!(unknown, CommandError::UnknownNode { node: NodeId(2) });
}

#[test]
fn a_node_holding_the_only_copy_of_a_grown_volume_cannot_be_removed() {
    // A grow marks every diskful replica Pending until its node reports the
    // new size again, but the data is still there: the only copy must not
    // be dropped in that window.
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(
        &mut state,
        create_with("only", None, Some(&["n2"]), None),
    ));
    report_all_ready(&mut state, "only");
    apply_ok(
        &mut state,
        Command::GrowVolume {
            name: vname("only"),
            size_bytes: 20 * GIB,
        },
    );
    let error = refused(&mut state, Command::RemoveNode { node: NodeId(2) });
    assert!(
        matches!(error, CommandError::LastReplica { .. }),
        "{error:?}"
    );
}

#[test]
fn node_state_changes_record_their_time() {
    let mut state = cluster(&["za", "zb"]);
    apply_ok(
        &mut state,
        Command::SetNodeState {
            node: NodeId(2),
            state: NodeState::Offline,
            now_ms: T0 + 5,
        },
    );
    assert_eq!(state.nodes[&NodeId(2)].state, NodeState::Offline);
    assert_eq!(state.nodes[&NodeId(2)].state_since_ms, T0 + 5);
    // The same state again keeps the time it started.
    apply_ok(
        &mut state,
        Command::SetNodeState {
            node: NodeId(2),
            state: NodeState::Offline,
            now_ms: T0 + 9,
        },
    );
    assert_eq!(state.nodes[&NodeId(2)].state_since_ms, T0 + 5);
    let unknown = refused(
        &mut state,
        Command::SetNodeState {
            node: NodeId(7),
            state: NodeState::Online,
            now_ms: T0,
        },
    );
    assert_eq!(unknown, CommandError::UnknownNode { node: NodeId(7) });
}

#[test]
fn eviction_moves_replicas_away_and_keeps_label_rules() {
    // n1 and n5 share zone za; the group wants two distinct zones.
    let mut state = cluster(&["za", "zb", "zc", "zd", "za"]);
    apply_ok(
        &mut state,
        Command::CreateGroup {
            group: group("spread", 3, 3, &["zone"]),
        },
    );
    let record = created(apply_ok(
        &mut state,
        create_with("v", None, Some(&["n1", "n2", "n3"]), Some("spread")),
    ));
    report_all_ready(&mut state, "v");
    assert_eq!(
        diskful_nodes(&record),
        BTreeSet::from([NodeId(1), NodeId(2), NodeId(3)])
    );

    let online = refused(
        &mut state,
        Command::EvictNode {
            node: NodeId(2),
            now_ms: T0,
        },
    );
    assert!(
        matches!(&online, CommandError::Invalid(text) if text.contains("n2")),
        "{online:?}"
    );

    apply_ok(
        &mut state,
        Command::SetNodeState {
            node: NodeId(2),
            state: NodeState::Offline,
            now_ms: T0,
        },
    );
    let reply = apply_ok(
        &mut state,
        Command::EvictNode {
            node: NodeId(2),
            now_ms: T0 + 10,
        },
    );
    assert_eq!(
        reply,
        Reply::Evicted {
            replaced: vec![vname("v")],
            degraded: Vec::new()
        }
    );
    let node = &state.nodes[&NodeId(2)];
    assert_eq!(
        (node.state, node.state_since_ms),
        (NodeState::Evicted, T0 + 10)
    );

    let moved = &state.volumes[&vname("v")];
    assert!(moved.replica(NodeId(2)).is_none(), "{moved:?}");
    // n5 shares za with the kept n1: only n4 (zd) fits.
    assert_eq!(
        diskful_nodes(moved),
        BTreeSet::from([NodeId(1), NodeId(3), NodeId(4)])
    );
    // Kept replicas keep what their nodes reported; the new one waits.
    for replica in moved.diskful() {
        let expected = if replica.node == NodeId(4) {
            ReplicaObserved::Pending
        } else {
            ReplicaObserved::Ready
        };
        assert_eq!(replica.observed, expected, "{replica:?}");
    }
    let unknown = refused(
        &mut state,
        Command::EvictNode {
            node: NodeId(9),
            now_ms: T0,
        },
    );
    assert_eq!(unknown, CommandError::UnknownNode { node: NodeId(9) });
}

#[test]
fn eviction_without_a_place_to_go_leaves_the_volume_degraded() {
    let mut state = cluster(&["za", "zb", "zc"]);
    let record = created(apply_ok(&mut state, create_command("v", GIB)));
    assert_eq!(diskful_nodes(&record).len(), 3);
    apply_ok(
        &mut state,
        Command::SetNodeState {
            node: NodeId(3),
            state: NodeState::Offline,
            now_ms: T0,
        },
    );
    let reply = apply_ok(
        &mut state,
        Command::EvictNode {
            node: NodeId(3),
            now_ms: T0,
        },
    );
    assert_eq!(
        reply,
        Reply::Evicted {
            replaced: Vec::new(),
            degraded: vec![vname("v")]
        }
    );
    // Its data may come back with the node: the replica stays recorded.
    assert_eq!(state.volumes[&vname("v")], record);
    assert_eq!(state.nodes[&NodeId(3)].state, NodeState::Evicted);
}

#[test]
fn settings_are_replaced() {
    let mut state = cluster(&["za"]);
    let settings = ClusterSettings {
        eviction_enabled: true,
        eviction_delay_secs: 60,
        resync_rate_bytes_per_sec: 32 << 20,
    };
    apply_ok(
        &mut state,
        Command::SetSettings {
            settings: settings.clone(),
        },
    );
    assert_eq!(state.settings, settings);
    // A crawling resync would leave replicas outdated for days: refused,
    // and nothing changes.
    let error = refused(
        &mut state,
        Command::SetSettings {
            settings: ClusterSettings {
                resync_rate_bytes_per_sec: 1000,
                ..settings
            },
        },
    );
    assert!(error.to_string().contains("resync rate"), "{error}");
}

#[test]
fn a_state_without_a_resync_rate_loads_with_the_default() {
    let json = r#"{"eviction_enabled":true,"eviction_delay_secs":60}"#;
    let settings: ClusterSettings = serde_json::from_str(json).unwrap();
    assert_eq!(
        settings.resync_rate_bytes_per_sec,
        trireme_control::DEFAULT_RESYNC_RATE
    );
}

// ---------------------------------------------------------------------------
// Attach, detach, the generation and the in-sync set.
// ---------------------------------------------------------------------------

fn attach_command(volume: &str, node: u64, allow_two_primaries: bool) -> Command {
    Command::AttachVolume {
        name: vname(volume),
        node: NodeId(node),
        allow_two_primaries,
        force_takeover: false,
        now_ms: T0 + 1,
    }
}

fn detach_command(volume: &str, node: Option<u64>) -> Command {
    Command::DetachVolume {
        name: vname(volume),
        node: node.map(NodeId),
    }
}

fn outdated_command(volume: &str, generation: u64, node: u64, by: u64) -> Command {
    Command::MarkOutdated {
        name: vname(volume),
        generation: Generation(generation),
        node: NodeId(node),
        by: NodeId(by),
    }
}

fn in_sync_command(volume: &str, generation: u64, node: u64, by: u64) -> Command {
    Command::MarkInSync {
        name: vname(volume),
        generation: Generation(generation),
        node: NodeId(node),
        by: NodeId(by),
    }
}

fn add_replica_command(volume: &str, node: Option<u64>, pool: Option<&str>) -> Command {
    Command::AddReplica {
        name: vname(volume),
        node: node.map(NodeId),
        pool: pool.map(pname),
        now_ms: T0,
    }
}

fn remove_replica_command(volume: &str, node: u64) -> Command {
    Command::RemoveReplica {
        name: vname(volume),
        node: NodeId(node),
    }
}

#[track_caller]
fn generation_of(reply: Reply) -> Generation {
    match reply {
        Reply::Generation(generation) | Reply::Attached { generation, .. } => generation,
        other => panic!("expected a generation, got {other:?}"),
    }
}

fn ids(nodes: &[u64]) -> BTreeSet<NodeId> {
    nodes.iter().map(|node| NodeId(*node)).collect()
}

fn primaries(state: &ClusterState, volume: &str) -> Vec<NodeId> {
    state.volumes[&vname(volume)]
        .primaries
        .iter()
        .map(|primary| primary.node)
        .collect()
}

fn set_offline(state: &mut ClusterState, node: u64) {
    apply_ok(
        state,
        Command::SetNodeState {
            node: NodeId(node),
            state: NodeState::Offline,
            now_ms: T0,
        },
    );
}

#[test]
fn a_new_volume_starts_at_generation_one_with_every_replica_in_sync() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    let three = created(apply_ok(
        &mut state,
        create_with("three", None, Some(&["n1", "n2", "n3"]), None),
    ));
    assert_eq!(three.generation, Generation(1));
    assert!(three.primaries.is_empty());
    assert_eq!(three.in_sync, ids(&[1, 2, 3]));
    assert_eq!(three.voters(), vec![NodeId(1), NodeId(2), NodeId(3)]);
    assert_eq!(three.quorum_size(), 2);
    assert!(three.replicas.iter().all(|replica| replica.sync.is_none()));

    // Two diskful replicas and a tiebreaker: three voters, only two in sync.
    let two = created(apply_ok(
        &mut state,
        create_with("two", Some(2), None, None),
    ));
    assert_eq!(two.voters().len(), 3);
    assert_eq!(two.quorum_size(), 2);
    assert_eq!(two.in_sync, diskful_nodes(&two));
    assert!(!two.is_primary(NodeId(1)));
}

fn attach_with(
    volume: &str,
    node: u64,
    allow_two_primaries: bool,
    force_takeover: bool,
) -> Command {
    Command::AttachVolume {
        name: vname(volume),
        node: NodeId(node),
        allow_two_primaries,
        force_takeover,
        now_ms: T0 + 2,
    }
}

#[track_caller]
fn attached(reply: Reply) -> (Generation, Vec<FencedPrimary>) {
    match reply {
        Reply::Attached { generation, fenced } => (generation, fenced),
        other => panic!("expected an attach's reply, got {other:?}"),
    }
}

/// A failover in one step: attaching where the only primary's node is
/// offline (or evicted) takes the volume over, fences that primary with a
/// new generation, and says so; with two primaries allowed too, since a
/// node that is not online cannot be a migration's source.
#[test]
fn attach_takes_over_from_a_primary_whose_node_is_not_online() {
    for (down, two) in [
        (NodeState::Offline, false),
        (NodeState::Offline, true),
        (NodeState::Evicted, false),
    ] {
        let mut state = cluster(&["za", "zb", "zc"]);
        created(apply_ok(&mut state, create_command("v", GIB)));
        apply_ok(&mut state, attach_command("v", 1, false));
        state.nodes.get_mut(&NodeId(1)).unwrap().state = down;
        let (generation, fenced) = attached(apply_ok(&mut state, attach_with("v", 2, two, false)));
        assert_eq!(generation, Generation(3), "{down:?}");
        assert_eq!(
            fenced,
            vec![FencedPrimary {
                node: NodeId(1),
                state: down
            }]
        );
        assert_eq!(primaries(&state, "v"), vec![NodeId(2)]);
        assert_eq!(state.volumes[&vname("v")].primaries[0].since_ms, T0 + 2);
        assert_eq!(state.check_invariants(), Ok(()));
    }
}

/// While the primary's node is online, only --force-takeover takes over
/// (the admin knows the machine is dead before the cluster does).
#[test]
fn force_takeover_fences_a_primary_still_counted_online() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    apply_ok(&mut state, attach_command("v", 1, false));
    let (generation, fenced) = attached(apply_ok(&mut state, attach_with("v", 2, false, true)));
    assert_eq!(generation, Generation(3));
    assert_eq!(
        fenced,
        vec![FencedPrimary {
            node: NodeId(1),
            state: NodeState::Online
        }]
    );
    assert_eq!(primaries(&state, "v"), vec![NodeId(2)]);
    // Forcing where the node already is primary fences nobody.
    let before = state.clone();
    let (generation, fenced) = attached(apply_ok(&mut state, attach_with("v", 2, false, true)));
    assert_eq!((generation, fenced), (Generation(3), vec![]));
    assert_eq!(state, before);
    // Two primaries (a migration under way) are not taken over by force.
    apply_ok(&mut state, attach_with("v", 3, true, false));
    let error = refused(&mut state, attach_with("v", 1, false, true));
    assert!(
        matches!(error, CommandError::TwoPrimaries { .. }),
        "{error:?}"
    );
}

#[test]
fn the_first_attach_moves_the_generation_and_a_second_primary_shares_it() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));

    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 1, false))),
        Generation(2)
    );
    let volume = &state.volumes[&vname("v")];
    assert_eq!(
        volume.primaries,
        vec![PrimaryRecord {
            node: NodeId(1),
            since_ms: T0 + 1,
            resync_only: false,
        }]
    );
    assert!(volume.is_primary(NodeId(1)));

    // Attaching where it is attached changes nothing.
    let before = state.clone();
    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 1, true))),
        Generation(2)
    );
    assert_eq!(state, before);

    // A second node needs the explicit flag, and the error names the primary.
    let error = refused(&mut state, attach_command("v", 2, false));
    assert_eq!(
        error,
        CommandError::AlreadyAttached {
            name: "v".into(),
            primary: "n1".into()
        }
    );
    let text = error.to_string();
    assert!(
        text.contains("'n1'")
            && text.contains("still counts as online")
            && text.contains("--allow-two-primaries")
            && text.contains("--force-takeover")
            && text.contains("detach"),
        "{text}"
    );

    // A second primary shares the generation (a live migration).
    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 2, true))),
        Generation(2)
    );
    assert_eq!(primaries(&state, "v"), vec![NodeId(1), NodeId(2)]);
    let third = refused(&mut state, attach_command("v", 3, true));
    assert!(
        matches!(&third, CommandError::TwoPrimaries { primaries, .. } if primaries == "n1, n2"),
        "{third:?}"
    );

    // Detach: which one must be said while there are two.
    let which = refused(&mut state, detach_command("v", None));
    assert!(
        matches!(&which, CommandError::WhichPrimary { .. }),
        "{which:?}"
    );
    assert!(which.to_string().contains("--node"), "{which}");
    let not_primary = refused(&mut state, detach_command("v", Some(3)));
    assert_eq!(
        not_primary,
        CommandError::NotPrimary {
            name: "v".into(),
            node: "n3".into(),
            primaries: "n1, n2".into()
        }
    );
    apply_ok(&mut state, detach_command("v", Some(1)));
    assert_eq!(primaries(&state, "v"), vec![NodeId(2)]);
    apply_ok(&mut state, detach_command("v", None));
    assert!(primaries(&state, "v").is_empty());
    // Detaching keeps the generation.
    assert_eq!(state.volumes[&vname("v")].generation, Generation(2));
    let not_attached = refused(&mut state, detach_command("v", None));
    assert_eq!(not_attached.to_string(), "volume 'v' is not attached");
    let not_attached = refused(&mut state, detach_command("v", Some(1)));
    assert_eq!(not_attached, CommandError::NotAttached { name: "v".into() });

    // The next attach, with no primary, starts a new generation.
    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 3, false))),
        Generation(3)
    );
}

#[test]
fn attach_needs_a_live_volume_and_an_online_node() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));

    assert_eq!(
        refused(&mut state, attach_command("nope", 1, false)),
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
    assert_eq!(
        refused(&mut state, attach_command("v", 9, false)),
        CommandError::UnknownNode { node: NodeId(9) }
    );
    set_offline(&mut state, 2);
    let offline = refused(&mut state, attach_command("v", 2, false));
    assert_eq!(
        offline,
        CommandError::NodeNotOnline {
            node: "n2".into(),
            state: "offline".into()
        }
    );
    assert!(offline.to_string().contains("online node"), "{offline}");

    // An attached volume is not deleted under its primary.
    apply_ok(&mut state, attach_command("v", 1, false));
    let attached = refused(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: false,
        },
    );
    assert_eq!(
        attached,
        CommandError::VolumeAttached {
            name: "v".into(),
            primaries: "n1".into()
        }
    );
    assert!(
        attached.to_string().contains("detach it first"),
        "{attached}"
    );
    apply_ok(&mut state, detach_command("v", None));
    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: false,
        },
    );
    assert_eq!(
        refused(&mut state, attach_command("v", 1, false)),
        CommandError::VolumeDeleting { name: "v".into() }
    );
}

#[test]
fn reattach_moves_the_generation_of_a_primary_only() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    apply_ok(&mut state, attach_command("v", 1, false));
    let reattach = |node: u64| Command::ReattachVolume {
        name: vname("v"),
        node: NodeId(node),
        now_ms: T0 + 50,
    };
    assert_eq!(
        generation_of(apply_ok(&mut state, reattach(1))),
        Generation(3)
    );
    assert_eq!(
        state.volumes[&vname("v")].primaries,
        vec![PrimaryRecord {
            node: NodeId(1),
            since_ms: T0 + 50,
            resync_only: false,
        }]
    );
    assert_eq!(
        refused(&mut state, reattach(2)),
        CommandError::NotPrimary {
            name: "v".into(),
            node: "n2".into(),
            primaries: "n1".into()
        }
    );
    apply_ok(&mut state, detach_command("v", None));
    let detached = refused(&mut state, reattach(1));
    assert!(
        detached.to_string().contains("attached on: none"),
        "{detached}"
    );
}

#[test]
fn only_a_current_primary_at_the_current_generation_shrinks_the_in_sync_set() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    apply_ok(&mut state, attach_command("v", 1, false));
    // Generation 2 now.

    let stale = refused(&mut state, outdated_command("v", 1, 3, 1));
    assert_eq!(
        stale,
        CommandError::StaleGeneration {
            name: "v".into(),
            given: Generation(1),
            current: Generation(2)
        }
    );
    assert!(stale.to_string().contains("former primary"), "{stale}");
    let not_primary = refused(&mut state, outdated_command("v", 2, 3, 2));
    assert!(
        matches!(&not_primary, CommandError::NotPrimary { node, .. } if node == "n2"),
        "{not_primary:?}"
    );

    apply_ok(&mut state, outdated_command("v", 2, 3, 1));
    assert_eq!(state.volumes[&vname("v")].in_sync, ids(&[1, 2]));
    // Already outdated: nothing to do.
    let before = state.clone();
    apply_ok(&mut state, outdated_command("v", 2, 3, 1));
    assert_eq!(state, before);

    // A primary that restarted cannot use its former incarnation's generation.
    apply_ok(
        &mut state,
        Command::ReattachVolume {
            name: vname("v"),
            node: NodeId(1),
            now_ms: T0,
        },
    );
    refused(&mut state, outdated_command("v", 2, 2, 1));

    // A cut-off former primary: n1 loses the role to n2 (generation 4);
    // whatever n1 still proposes is refused.
    apply_ok(&mut state, detach_command("v", None));
    apply_ok(&mut state, attach_command("v", 2, false));
    assert_eq!(state.volumes[&vname("v")].generation, Generation(4));
    assert!(matches!(
        refused(&mut state, outdated_command("v", 3, 2, 1)),
        CommandError::StaleGeneration { .. }
    ));
    assert!(matches!(
        refused(&mut state, outdated_command("v", 4, 2, 1)),
        CommandError::NotPrimary { .. }
    ));

    // The set never empties.
    apply_ok(&mut state, outdated_command("v", 4, 1, 2));
    assert_eq!(state.volumes[&vname("v")].in_sync, ids(&[2]));
    let last = refused(&mut state, outdated_command("v", 4, 2, 2));
    assert_eq!(
        last,
        CommandError::LastInSync {
            name: "v".into(),
            node: "n2".into()
        }
    );
    assert_eq!(
        refused(&mut state, outdated_command("nope", 4, 2, 2)),
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
}

#[test]
fn resync_progress_is_recorded_until_the_replica_is_marked_in_sync() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    created(apply_ok(
        &mut state,
        create_with("v", Some(2), Some(&["n1", "n2"]), None),
    ));
    let tiebreaker = state.volumes[&vname("v")]
        .replicas
        .iter()
        .find(|replica| replica.kind == ReplicaKind::Tiebreaker)
        .map(|replica| replica.node)
        .expect("two diskful replicas get a tiebreaker");
    apply_ok(&mut state, attach_command("v", 1, false));
    apply_ok(&mut state, outdated_command("v", 2, 2, 1));

    let progress = SyncProgress {
        done_bytes: GIB / 4,
        total_bytes: GIB,
        rate_bytes_per_sec: 100 << 20,
        reported_ms: T0 + 5,
    };
    let report = |node: NodeId, progress: Option<SyncProgress>| Command::ReportSync {
        name: vname("v"),
        node,
        progress,
    };
    apply_ok(&mut state, report(NodeId(2), Some(progress.clone())));
    assert_eq!(
        state.volumes[&vname("v")].replica(NodeId(2)).unwrap().sync,
        Some(progress.clone())
    );
    let not_diskful = refused(&mut state, report(tiebreaker, Some(progress.clone())));
    assert!(
        matches!(&not_diskful, CommandError::NoDiskfulReplica { .. }),
        "{not_diskful:?}"
    );
    refused(&mut state, report(NodeId(9), None));
    assert_eq!(
        refused(
            &mut state,
            Command::ReportSync {
                name: vname("nope"),
                node: NodeId(2),
                progress: None
            }
        ),
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );

    // Marking in sync is fenced like marking outdated.
    assert!(matches!(
        refused(&mut state, in_sync_command("v", 1, 2, 1)),
        CommandError::StaleGeneration { .. }
    ));
    assert!(matches!(
        refused(&mut state, in_sync_command("v", 2, 2, 2)),
        CommandError::NotPrimary { .. }
    ));
    let tiebreaker_in_sync = refused(&mut state, in_sync_command("v", 2, tiebreaker.0, 1));
    assert!(
        tiebreaker_in_sync
            .to_string()
            .contains("no diskful replica"),
        "{tiebreaker_in_sync}"
    );
    apply_ok(&mut state, in_sync_command("v", 2, 2, 1));
    let volume = &state.volumes[&vname("v")];
    assert_eq!(volume.in_sync, ids(&[1, 2]));
    assert_eq!(volume.replica(NodeId(2)).unwrap().sync, None);
    // A stopped resync is reported as None.
    apply_ok(&mut state, report(NodeId(2), Some(progress)));
    apply_ok(&mut state, report(NodeId(2), None));
    assert_eq!(
        state.volumes[&vname("v")].replica(NodeId(2)).unwrap().sync,
        None
    );
}

#[test]
fn an_added_replica_follows_the_group_rules_and_waits_for_its_sync() {
    // n1 and n4 share zone za; the group spreads over zones.
    let mut state = cluster(&["za", "zb", "zc", "za"]);
    apply_ok(
        &mut state,
        Command::CreateGroup {
            group: group("spread", 3, 1, &["zone"]),
        },
    );
    created(apply_ok(
        &mut state,
        create_with("v", None, Some(&["n1"]), Some("spread")),
    ));
    report_all_ready(&mut state, "v");

    let conflict = refused(&mut state, add_replica_command("v", Some(4), None));
    assert!(
        matches!(&conflict, CommandError::Placement { reason, .. } if reason.contains("zone=za")),
        "{conflict:?}"
    );
    let exists = refused(&mut state, add_replica_command("v", Some(1), None));
    assert_eq!(
        exists,
        CommandError::ReplicaExists {
            name: "v".into(),
            node: "n1".into()
        }
    );
    assert_eq!(
        refused(&mut state, add_replica_command("v", Some(9), None)),
        CommandError::UnknownNode { node: NodeId(9) }
    );
    let pool = refused(&mut state, add_replica_command("v", None, Some("nope")));
    assert!(
        matches!(&pool, CommandError::Placement { reason, .. } if reason.contains("nope")),
        "{pool:?}"
    );

    // A second diskful replica: even, so a tiebreaker comes with it.
    let two = created(apply_ok(
        &mut state,
        add_replica_command("v", Some(2), None),
    ));
    assert_eq!(diskful_nodes(&two), ids(&[1, 2]));
    assert_eq!(two.in_sync, ids(&[1]), "an added replica is not in sync");
    let added = two.replica(NodeId(2)).unwrap();
    assert_eq!(added.observed, ReplicaObserved::Pending);
    // The kept replica keeps what its node reported.
    assert_eq!(
        two.replica(NodeId(1)).unwrap().observed,
        ReplicaObserved::Ready
    );
    // Only n3 (zc) may take the tiebreaker: n4 shares za with n1.
    let tiebreakers: Vec<NodeId> = two
        .replicas
        .iter()
        .filter(|replica| replica.kind == ReplicaKind::Tiebreaker)
        .map(|replica| replica.node)
        .collect();
    assert_eq!(tiebreakers, vec![NodeId(3)]);

    // A third (placed by the group: only zc is left): odd, no tiebreaker.
    let three = created(apply_ok(&mut state, add_replica_command("v", None, None)));
    assert_eq!(diskful_nodes(&three), ids(&[1, 2, 3]));
    assert!(three
        .replicas
        .iter()
        .all(|replica| replica.kind == ReplicaKind::Diskful));
    assert_eq!(three.in_sync, ids(&[1]));
    // No zone is left for a fourth.
    let full = refused(&mut state, add_replica_command("v", None, None));
    assert!(matches!(&full, CommandError::Placement { .. }), "{full:?}");
    assert_eq!(
        refused(&mut state, add_replica_command("nope", None, None)),
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
}

#[test]
fn removing_a_replica_keeps_an_up_to_date_majority() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    apply_ok(&mut state, attach_command("v", 1, false));
    apply_ok(&mut state, outdated_command("v", 2, 2, 1));

    // Without n3, n1 (in sync) and n2 (outdated) would be two voters with
    // one up to date, and no node is left for a tiebreaker.
    let quorum = refused(&mut state, remove_replica_command("v", 3));
    assert_eq!(
        quorum,
        CommandError::WouldLoseQuorum {
            name: "v".into(),
            node: "n3".into(),
            up_to_date: 1,
            voters: 2,
            majority: 2
        }
    );
    assert!(quorum.to_string().contains("without quorum"), "{quorum}");

    // The outdated replica may go; the node it leaves gets no tiebreaker.
    let two = created(apply_ok(&mut state, remove_replica_command("v", 2)));
    assert_eq!(diskful_nodes(&two), ids(&[1, 3]));
    assert!(two.replica(NodeId(2)).is_none(), "{two:?}");
    assert_eq!(two.in_sync, ids(&[1, 3]));

    // The primary gives up its data but stays attached, diskless.
    let one = created(apply_ok(&mut state, remove_replica_command("v", 1)));
    assert_eq!(diskful_nodes(&one), ids(&[3]));
    assert_eq!(one.in_sync, ids(&[3]));
    assert_eq!(
        one.replica(NodeId(1)).map(|replica| replica.kind),
        Some(ReplicaKind::Diskless)
    );
    assert!(one.is_primary(NodeId(1)));

    let last = refused(&mut state, remove_replica_command("v", 3));
    assert_eq!(
        last,
        CommandError::LastInSync {
            name: "v".into(),
            node: "n3".into()
        }
    );
    assert!(last.to_string().contains("replica add"), "{last}");
    assert_eq!(
        refused(&mut state, remove_replica_command("v", 1)),
        CommandError::NoDiskfulReplica {
            name: "v".into(),
            node: "n1".into()
        }
    );
    assert_eq!(
        refused(&mut state, remove_replica_command("nope", 1)),
        CommandError::UnknownVolume {
            name: "nope".into()
        }
    );
}

#[test]
fn removing_a_replica_keeps_the_tiebreaker_parity() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    let three = created(apply_ok(
        &mut state,
        create_with("v", None, Some(&["n1", "n2", "n3"]), None),
    ));
    assert_eq!(three.voters().len(), 3);
    let two = created(apply_ok(&mut state, remove_replica_command("v", 3)));
    assert_eq!(diskful_nodes(&two), ids(&[1, 2]));
    // Two diskful replicas get a tiebreaker, and not on the node that just
    // gave its replica up.
    let tiebreaker = two
        .replicas
        .iter()
        .find(|replica| replica.kind == ReplicaKind::Tiebreaker)
        .map(|replica| replica.node);
    assert_eq!(tiebreaker, Some(NodeId(4)));
    assert_eq!(two.quorum_size(), 2);
    // Adding one back makes three: the tiebreaker goes.
    let again = created(apply_ok(
        &mut state,
        add_replica_command("v", Some(3), None),
    ));
    assert_eq!(diskful_nodes(&again), ids(&[1, 2, 3]));
    assert_eq!(again.replicas.len(), 3);
    assert_eq!(again.in_sync, ids(&[1, 2]));
}

#[test]
fn eviction_takes_the_evicted_node_out_of_in_sync_and_primaries() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    created(apply_ok(
        &mut state,
        create_with("v", None, Some(&["n1", "n2", "n3"]), None),
    ));
    report_all_ready(&mut state, "v");
    apply_ok(&mut state, attach_command("v", 2, false));
    set_offline(&mut state, 2);
    apply_ok(
        &mut state,
        Command::EvictNode {
            node: NodeId(2),
            now_ms: T0,
        },
    );
    let volume = &state.volumes[&vname("v")];
    assert_eq!(diskful_nodes(volume), ids(&[1, 3, 4]));
    assert_eq!(volume.in_sync, ids(&[1, 3]), "the new replica is empty");
    assert!(volume.primaries.is_empty());
    // Attaching elsewhere starts a new generation, fencing n2.
    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 1, false))),
        Generation(3)
    );
}

#[test]
fn eviction_keeps_the_only_up_to_date_replica() {
    let mut state = cluster(&["za", "zb", "zc", "zd"]);
    created(apply_ok(
        &mut state,
        create_with("v", None, Some(&["n1", "n2", "n3"]), None),
    ));
    report_all_ready(&mut state, "v");
    apply_ok(&mut state, attach_command("v", 3, false));
    apply_ok(&mut state, outdated_command("v", 2, 1, 3));
    apply_ok(&mut state, outdated_command("v", 2, 2, 3));
    apply_ok(&mut state, detach_command("v", None));
    set_offline(&mut state, 3);
    let before = state.volumes[&vname("v")].clone();
    let reply = apply_ok(
        &mut state,
        Command::EvictNode {
            node: NodeId(3),
            now_ms: T0,
        },
    );
    // n1 and n2 are ready but outdated: n3 holds the only current data.
    assert_eq!(
        reply,
        Reply::Evicted {
            replaced: Vec::new(),
            degraded: vec![vname("v")]
        }
    );
    assert_eq!(state.volumes[&vname("v")], before);
}

#[test]
fn removing_a_node_guards_the_last_up_to_date_replica() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    report_all_ready(&mut state, "v");
    apply_ok(&mut state, attach_command("v", 1, false));
    apply_ok(&mut state, outdated_command("v", 2, 2, 1));
    // n1 goes (n3 is up to date): no longer primary nor in sync.
    apply_ok(&mut state, Command::RemoveNode { node: NodeId(1) });
    let volume = &state.volumes[&vname("v")];
    assert!(volume.primaries.is_empty());
    assert_eq!(volume.in_sync, ids(&[3]));
    // n3 holds the last up-to-date replica, though n2's is ready.
    let error = refused(&mut state, Command::RemoveNode { node: NodeId(3) });
    assert_eq!(
        error,
        CommandError::LastReplica {
            node: "n3".into(),
            volumes: "v".into()
        }
    );
}

#[test]
fn data_addresses_are_registered_and_updated() {
    let mut state = cluster(&["za"]);
    assert_eq!(state.nodes[&NodeId(1)].data_address, None);
    let mut joining = registration("n2", None);
    joining.data_address = Some("10.0.0.2:7451".into());
    let id = added(apply_ok(
        &mut state,
        Command::AddNode {
            node: joining,
            nonce: "n2".into(),
            now_ms: T0,
        },
    ));
    assert_eq!(
        state.nodes[&id].data_address.as_deref(),
        Some("10.0.0.2:7451")
    );
    apply_ok(
        &mut state,
        Command::SetDataAddress {
            node: NodeId(1),
            data_address: Some("10.0.0.1:7451".into()),
        },
    );
    assert_eq!(
        state.nodes[&NodeId(1)].data_address.as_deref(),
        Some("10.0.0.1:7451")
    );
    assert_eq!(
        refused(
            &mut state,
            Command::SetDataAddress {
                node: NodeId(9),
                data_address: None
            }
        ),
        CommandError::UnknownNode { node: NodeId(9) }
    );
}

#[test]
fn a_state_from_before_attach_loads_with_its_replicas_in_sync() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    let mut json = serde_json::to_value(&state).unwrap();
    // Remove what older versions did not write.
    for node in json["nodes"].as_object_mut().unwrap().values_mut() {
        node.as_object_mut().unwrap().remove("data_address");
    }
    let volume = json["volumes"]["v"].as_object_mut().unwrap();
    for field in ["generation", "primaries", "in_sync"] {
        assert!(volume.remove(field).is_some(), "{field}");
    }
    for replica in volume["replicas"].as_array_mut().unwrap() {
        replica.as_object_mut().unwrap().remove("sync");
    }
    let old: ClusterState = serde_json::from_value(json).unwrap();
    assert_eq!(old, state);
    assert_eq!(old.check_invariants(), Ok(()));
    let volume = &old.volumes[&vname("v")];
    assert_eq!(volume.generation, Generation(1));
    assert_eq!(volume.in_sync, diskful_nodes(volume));
}

// ---------------------------------------------------------------------------
// Random command sequences.
// ---------------------------------------------------------------------------

const VOLUMES: [&str; 5] = ["v0", "v1", "v2", "v3", "v4"];
const NODES: [&str; 6] = ["n1", "n2", "n3", "n4", "n5", "n6"];
const GROUPS: [&str; 3] = [DEFAULT_GROUP, "g1", "g2"];
const POOLS: [&str; 2] = ["p1", "p2"];
const ZONES: [&str; 3] = ["za", "zb", "zc"];
const CLASSES: [DeviceClass; 3] = [DeviceClass::Nvme, DeviceClass::Ssd, DeviceClass::Hdd];

/// Node ids a sequence may mention: every member ever added, and a few
/// more, so unknown ids are exercised too.
fn node_id() -> impl Strategy<Value = NodeId> {
    (1u64..9).prop_map(NodeId)
}

fn node_state() -> impl Strategy<Value = NodeState> {
    prop_oneof![
        3 => Just(NodeState::Online),
        2 => Just(NodeState::Offline),
        1 => Just(NodeState::Evicted),
    ]
}

fn pool_report() -> impl Strategy<Value = PoolReport> {
    (
        0..POOLS.len(),
        0..CLASSES.len(),
        0u64..(4 * TIB),
        any::<bool>(),
    )
        .prop_map(|(name, class, free, online)| PoolReport {
            name: pname(POOLS[name]),
            record: PoolRecord {
                class: CLASSES[class],
                capacity_bytes: 4 * TIB,
                free_bytes: free,
                online,
                reported_ms: T0,
            },
        })
}

fn resource_group() -> impl Strategy<Value = ResourceGroup> {
    (
        0..GROUPS.len(),
        0usize..5,
        0usize..5,
        prop::collection::vec(0..POOLS.len(), 0..2),
        prop::option::of(0..CLASSES.len()),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, place_count, min_place_count, pools, class, spread, diskless)| ResourceGroup {
                name: gname(GROUPS[name]),
                place_count,
                min_place_count,
                pools: pools.into_iter().map(|pool| pname(POOLS[pool])).collect(),
                class: class.map(|class| CLASSES[class]),
                replicas_on_different: if spread {
                    vec!["zone".to_string()]
                } else {
                    Vec::new()
                },
                diskless_on_remaining: diskless,
                on_no_quorum: QuorumPolicy::IoError,
            },
        )
}

fn observed() -> impl Strategy<Value = ReplicaObserved> {
    prop_oneof![
        Just(ReplicaObserved::Pending),
        Just(ReplicaObserved::Ready),
        Just(ReplicaObserved::Failed("io error".into())),
    ]
}

/// One random command; times come from the sequence's clock (`now`).
fn command(now: u64) -> impl Strategy<Value = Command> {
    let volume = (0..VOLUMES.len()).prop_map(|index| vname(VOLUMES[index]));
    let size =
        prop_oneof![1 => Just(0u64), 2 => Just(GIB), 2 => Just(10 * GIB), 4 => 1u64..(100 * GIB)];
    let base = prop_oneof![
        1 => (0..NODES.len(), prop::option::of(0..ZONES.len())).prop_map(move |(name, zone)| {
            Command::Bootstrap {
                cluster_id: "again".into(),
                join_secret: "s".into(),
                node: registration(NODES[name], zone.map(|zone| ZONES[zone])),
                now_ms: now,
            }
        }),
        4 => (0..NODES.len(), prop::option::of(0..ZONES.len()), 0u32..4).prop_map(
            move |(name, zone, nonce)| Command::AddNode {
                node: registration(NODES[name], zone.map(|zone| ZONES[zone])),
                nonce: format!("nonce-{nonce}"),
                now_ms: now,
            }
        ),
        1 => node_id().prop_map(|node| Command::RemoveNode { node }),
        2 => (node_id(), node_state()).prop_map(move |(node, state)| Command::SetNodeState {
            node,
            state,
            now_ms: now,
        }),
        4 => (node_id(), prop::collection::vec(pool_report(), 0..3))
            .prop_map(|(node, pools)| Command::ReportPools { node, pools }),
        2 => resource_group().prop_map(|group| Command::CreateGroup { group }),
        1 => (0..GROUPS.len()).prop_map(|name| Command::DeleteGroup {
            name: gname(GROUPS[name]),
        }),
        6 => (
            volume.clone(),
            size.clone(),
            prop::option::weighted(0.3, 0..GROUPS.len()),
            prop::option::weighted(0.3, 0usize..5),
            prop::option::weighted(0.2, prop::collection::vec(0..NODES.len(), 0..4)),
            prop::option::weighted(0.2, 0..POOLS.len()),
            prop::option::weighted(0.1, (node_id(), 0..POOLS.len())),
        )
            .prop_map(move |(name, size_bytes, group, replicas, nodes, pool, adopt)| {
                Command::CreateVolume {
                    name,
                    size_bytes,
                    group: group.map(|group| gname(GROUPS[group])),
                    replicas,
                    nodes: nodes.map(|nodes| {
                        nodes.into_iter().map(|node| nname(NODES[node])).collect()
                    }),
                    pool: pool.map(|pool| pname(POOLS[pool])),
                    adopt: adopt.map(|(node, pool)| (node, pname(POOLS[pool]))),
                    now_ms: now,
                }
            }),
        2 => (volume.clone(), size)
            .prop_map(|(name, size_bytes)| Command::GrowVolume { name, size_bytes }),
        2 => (volume.clone(), any::<bool>()).prop_map(|(name, with_snapshots)| {
            Command::DeleteVolume {
                name,
                with_snapshots,
            }
        }),
        1 => volume
            .clone()
            .prop_map(|name| Command::RestorePlacement { name }),
        4 => (volume.clone(), 1u64..6, node_id(), observed(), 0u64..GIB).prop_map(
            |(volume, volume_id, node, observed, allocated_bytes)| Command::ReportReplica {
                volume,
                volume_id,
                node,
                observed,
                allocated_bytes,
                size_bytes: None,
            }
        ),
        2 => (volume, 1u64..6, node_id()).prop_map(|(volume, volume_id, node)| {
            Command::ReplicaRemoved {
                volume,
                volume_id,
                node,
            }
        }),
        1 => (any::<bool>(), 0u64..10_000, 0u64..(1 << 30)).prop_map(
            |(eviction_enabled, eviction_delay_secs, resync_rate_bytes_per_sec)| {
                Command::SetSettings {
                    settings: ClusterSettings {
                        eviction_enabled,
                        eviction_delay_secs,
                        resync_rate_bytes_per_sec,
                    },
                }
            }
        ),
        2 => node_id().prop_map(move |node| Command::EvictNode { node, now_ms: now }),
        1 => (node_id(), prop::option::of(0u16..3)).prop_map(|(node, port)| {
            Command::SetDataAddress {
                node,
                data_address: port.map(|port| format!("10.0.0.{node}:{}", 7451 + port)),
            }
        }),
    ]
    .boxed();
    // Weighted as if all were one list: 35 for the commands above.
    prop::strategy::Union::new_weighted(vec![
        (35, base),
        (13, attach_command_strategy(now).boxed()),
        (6, replica_command_strategy(now).boxed()),
        (12, snapshot_command_strategy(now).boxed()),
    ])
}

const SNAPSHOTS: [&str; 3] = ["s0", "s1", "s2"];

/// Snapshots, their reports and deletes, rollbacks, clones, schedules and
/// fencing. Ids stay small so that existing snapshots are often hit.
fn snapshot_command_strategy(now: u64) -> impl Strategy<Value = Command> {
    let volume = (0..VOLUMES.len()).prop_map(|index| vname(VOLUMES[index]));
    let snapshot = (0..SNAPSHOTS.len()).prop_map(|index| snapshot_name(SNAPSHOTS[index]));
    let id = (1u64..8).prop_map(SnapshotId);
    let nodes = prop::collection::btree_set(node_id(), 0..4);
    prop_oneof![
        3 => (volume.clone(), snapshot.clone(), any::<bool>()).prop_map(
            move |(volume, name, scheduled)| Command::CreateSnapshot {
                volume,
                name,
                scheduled,
                now_ms: now,
            }
        ),
        4 => (volume.clone(), id.clone(), node_id(), nodes, prop::option::weighted(0.2, Just("disk failed".to_string()))).prop_map(
            |(volume, id, from, holders, error)| Command::ReportSnapshot {
                volume,
                id,
                from,
                holders,
                error,
            }
        ),
        2 => (volume.clone(), snapshot.clone())
            .prop_map(|(volume, name)| Command::DeleteSnapshot { volume, name }),
        2 => (volume.clone(), id.clone(), node_id())
            .prop_map(|(volume, id, node)| Command::SnapshotRemoved { volume, id, node }),
        1 => (volume.clone(), snapshot.clone())
            .prop_map(|(volume, snapshot)| Command::RollbackVolume { volume, snapshot }),
        1 => (volume.clone(), node_id(), id)
            .prop_map(|(volume, node, snapshot)| Command::RolledBack { volume, node, snapshot }),
        1 => (volume.clone(), prop::option::of((1u64..100_000, 0usize..200))).prop_map(
            move |(volume, schedule)| Command::SetSnapshotSchedule {
                volume,
                schedule,
                now_ms: now,
            }
        ),
        3 => (volume.clone(), node_id(), (1u64..6).prop_map(Generation)).prop_map(
            |(volume, node, generation)| Command::ReportFenced {
                volume,
                node,
                generation,
            }
        ),
        1 => (volume.clone(), volume, snapshot).prop_map(move |(name, source, snapshot)| {
            Command::CloneVolume {
                name,
                source,
                snapshot,
                group: None,
                now_ms: now,
            }
        }),
    ]
}

fn snapshot_name(name: &str) -> SnapshotName {
    SnapshotName::new(name).unwrap()
}

/// Attach, reattach, detach and the in-sync set. Generations stay small so
/// that the current one is often hit.
fn attach_command_strategy(now: u64) -> impl Strategy<Value = Command> {
    let volume = (0..VOLUMES.len()).prop_map(|index| vname(VOLUMES[index]));
    let generation = (1u64..6).prop_map(Generation);
    prop_oneof![
        4 => (volume.clone(), node_id(), prop::bool::weighted(0.3), prop::bool::weighted(0.1)).prop_map(
            move |(name, node, allow_two_primaries, force_takeover)| Command::AttachVolume {
                name,
                node,
                allow_two_primaries,
                force_takeover,
                now_ms: now,
            }
        ),
        1 => (volume.clone(), node_id()).prop_map(move |(name, node)| {
            Command::ReattachVolume {
                name,
                node,
                now_ms: now,
            }
        }),
        2 => (volume.clone(), prop::option::of(node_id()))
            .prop_map(|(name, node)| Command::DetachVolume { name, node }),
        3 => (volume.clone(), generation.clone(), node_id(), node_id()).prop_map(
            |(name, generation, node, by)| Command::MarkOutdated {
                name,
                generation,
                node,
                by,
            }
        ),
        3 => (volume, generation, node_id(), node_id()).prop_map(
            |(name, generation, node, by)| Command::MarkInSync {
                name,
                generation,
                node,
                by,
            }
        ),
    ]
}

/// Resync reports and adding or removing replicas.
fn replica_command_strategy(now: u64) -> impl Strategy<Value = Command> {
    let volume = (0..VOLUMES.len()).prop_map(|index| vname(VOLUMES[index]));
    let progress = (0u64..=GIB, 0u64..(1 << 30)).prop_map(move |(done_bytes, rate)| SyncProgress {
        done_bytes,
        total_bytes: GIB,
        rate_bytes_per_sec: rate,
        reported_ms: now,
    });
    prop_oneof![
        2 => (volume.clone(), node_id(), prop::option::of(progress)).prop_map(
            |(name, node, progress)| Command::ReportSync {
                name,
                node,
                progress,
            }
        ),
        2 => (
            volume.clone(),
            prop::option::of(node_id()),
            prop::option::weighted(0.2, 0..POOLS.len()),
        )
            .prop_map(move |(name, node, pool)| Command::AddReplica {
                name,
                node,
                pool: pool.map(|pool| pname(POOLS[pool])),
                now_ms: now,
            }),
        2 => (volume, node_id())
            .prop_map(|(name, node)| Command::RemoveReplica { name, node }),
    ]
}

/// A sequence of commands whose clock moves forward by random steps, some
/// past the join window so nonces get forgotten.
fn sequence() -> impl Strategy<Value = Vec<Command>> {
    let step = prop_oneof![Just(0u64), 1u64..60_000, Just(JOIN_WINDOW_MS + 1)];
    prop::collection::vec(step, 1..60).prop_flat_map(|steps| {
        let mut now = T0;
        let commands: Vec<_> = steps
            .into_iter()
            .map(|step| {
                now += step;
                command(now)
            })
            .collect();
        commands
    })
}

/// Where a random sequence starts. Most start from a cluster with pools,
/// so that volumes get placed and the later commands have something to act on.
#[derive(Debug, Clone, Copy)]
enum Start {
    Empty,
    Bootstrapped,
    Cluster,
}

impl Start {
    fn state(self) -> ClusterState {
        match self {
            Start::Empty => ClusterState::default(),
            Start::Bootstrapped => {
                let mut state = ClusterState::default();
                apply_ok(&mut state, bootstrap_command(Some("za")));
                state
            }
            Start::Cluster => cluster(&["za", "zb", "zc", "za"]),
        }
    }
}

/// A refused command changes nothing.
fn same_after_refusal(before: &ClusterState, after: &ClusterState, _command: &Command) -> bool {
    before == after
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_sequences_keep_the_invariants_and_are_deterministic(
        start in prop_oneof![1 => Just(Start::Empty), 2 => Just(Start::Bootstrapped), 7 => Just(Start::Cluster)],
        commands in sequence(),
    ) {
        let mut first = start.state();
        let mut second = start.state();
        for command in commands {
            // The log carries commands as JSON: a command must survive it.
            let encoded = serde_json::to_vec(&command).unwrap();
            let decoded: Command = serde_json::from_slice(&encoded).unwrap();
            prop_assert_eq!(&decoded, &command);

            let before = first.clone();
            let result = first.apply(command.clone());
            prop_assert_eq!(first.check_invariants(), Ok(()));
            if let Err(error) = &result {
                prop_assert!(
                    same_after_refusal(&before, &first, &command),
                    "refused {:?} ({}) changed the state", command, error
                );
            }
            let again = second.apply(command);
            prop_assert_eq!(&result, &again);
            prop_assert_eq!(&first, &second);
        }
        // Snapshots carry the state as JSON: it must come back equal.
        let encoded = serde_json::to_vec(&first).unwrap();
        let decoded: ClusterState = serde_json::from_slice(&encoded).unwrap();
        prop_assert_eq!(decoded, first);
    }
}

// ---------------------------------------------------------------------------
// Random attach / resync histories. The plain random commands above rarely
// name a volume's current primary and generation, so these sequences pick
// them from the state they are applied to: a command of the current primary
// at the current generation, or on purpose a stale or foreign one.
// ---------------------------------------------------------------------------

/// A command described relative to the state it will be applied to.
#[derive(Debug, Clone)]
enum Intent {
    Create {
        volume: usize,
        replicas: usize,
    },
    Delete {
        volume: usize,
    },
    ReportReady {
        volume: usize,
    },
    Attach {
        volume: usize,
        node: usize,
        two: bool,
        takeover: bool,
    },
    Reattach {
        volume: usize,
        node: usize,
    },
    Detach {
        volume: usize,
        node: Option<usize>,
    },
    /// `back` generations behind the current one; `by_primary` picks a
    /// current primary as the proposer, else any node.
    Outdate {
        volume: usize,
        replica: usize,
        back: u64,
        by_primary: bool,
        by: usize,
    },
    InSync {
        volume: usize,
        replica: usize,
        back: u64,
        by_primary: bool,
        by: usize,
    },
    Sync {
        volume: usize,
        replica: usize,
        done: Option<u64>,
    },
    AddReplica {
        volume: usize,
        node: Option<usize>,
    },
    RemoveReplica {
        volume: usize,
        node: usize,
    },
    SetState {
        node: usize,
        online: bool,
    },
    Evict {
        node: usize,
    },
    RemoveNode {
        node: usize,
    },
}

fn intent() -> impl Strategy<Value = Intent> {
    let volume = 0..3usize;
    let index = 0..8usize;
    let back = prop_oneof![6 => Just(0u64), 1 => 1u64..3];
    prop_oneof![
        3 => (volume.clone(), 1usize..4).prop_map(|(volume, replicas)| Intent::Create { volume, replicas }),
        1 => volume.clone().prop_map(|volume| Intent::Delete { volume }),
        2 => volume.clone().prop_map(|volume| Intent::ReportReady { volume }),
        4 => (volume.clone(), index.clone(), prop::bool::weighted(0.3), prop::bool::weighted(0.1))
            .prop_map(|(volume, node, two, takeover)| Intent::Attach { volume, node, two, takeover }),
        1 => (volume.clone(), index.clone()).prop_map(|(volume, node)| Intent::Reattach { volume, node }),
        2 => (volume.clone(), prop::option::of(index.clone()))
            .prop_map(|(volume, node)| Intent::Detach { volume, node }),
        4 => (volume.clone(), index.clone(), back.clone(), prop::bool::weighted(0.8), index.clone()).prop_map(
            |(volume, replica, back, by_primary, by)| Intent::Outdate { volume, replica, back, by_primary, by }
        ),
        3 => (volume.clone(), index.clone(), back, prop::bool::weighted(0.8), index.clone()).prop_map(
            |(volume, replica, back, by_primary, by)| Intent::InSync { volume, replica, back, by_primary, by }
        ),
        2 => (volume.clone(), index.clone(), prop::option::of(0u64..=GIB))
            .prop_map(|(volume, replica, done)| Intent::Sync { volume, replica, done }),
        2 => (volume.clone(), prop::option::of(index.clone()))
            .prop_map(|(volume, node)| Intent::AddReplica { volume, node }),
        2 => (volume, index.clone()).prop_map(|(volume, node)| Intent::RemoveReplica { volume, node }),
        2 => (index.clone(), any::<bool>()).prop_map(|(node, online)| Intent::SetState { node, online }),
        1 => index.clone().prop_map(|node| Intent::Evict { node }),
        1 => index.prop_map(|node| Intent::RemoveNode { node }),
    ]
}

/// Turns an intent into a command against `state`.
fn resolve(state: &ClusterState, intent: &Intent) -> Command {
    let pick = |list: &[NodeId], index: usize| {
        if list.is_empty() {
            NodeId(index as u64 + 1)
        } else {
            list[index % list.len()]
        }
    };
    let nodes: Vec<NodeId> = state.nodes.keys().copied().collect();
    let name = |volume: usize| vname(VOLUMES[volume]);
    let record = |volume: usize| state.volumes.get(&name(volume));
    let diskful = |volume: usize| -> Vec<NodeId> {
        record(volume)
            .map(|record| record.diskful().map(|replica| replica.node).collect())
            .unwrap_or_default()
    };
    let primaries = |volume: usize| -> Vec<NodeId> {
        record(volume)
            .map(|record| {
                record
                    .primaries
                    .iter()
                    .map(|primary| primary.node)
                    .collect()
            })
            .unwrap_or_default()
    };
    let generation = |volume: usize, back: u64| {
        let current = record(volume)
            .map(|record| record.generation.0)
            .unwrap_or(1);
        Generation(current.saturating_sub(back).max(1))
    };
    let by = |volume: usize, by_primary: bool, by: usize| {
        let primaries = primaries(volume);
        if by_primary && !primaries.is_empty() {
            pick(&primaries, by)
        } else {
            pick(&nodes, by)
        }
    };
    match intent.clone() {
        Intent::Create { volume, replicas } => {
            create_with(VOLUMES[volume], Some(replicas), None, None)
        }
        Intent::Delete { volume } => Command::DeleteVolume {
            name: name(volume),
            with_snapshots: false,
        },
        Intent::ReportReady { volume } => {
            let replica = diskful(volume).into_iter().find(|node| {
                record(volume)
                    .and_then(|record| record.replica(*node))
                    .is_some_and(|replica| replica.observed != ReplicaObserved::Ready)
            });
            Command::ReportReplica {
                volume: name(volume),
                volume_id: record(volume).map(|record| record.id).unwrap_or(1),
                node: replica.unwrap_or(NodeId(1)),
                observed: ReplicaObserved::Ready,
                allocated_bytes: 0,
                size_bytes: None,
            }
        }
        Intent::Attach {
            volume,
            node,
            two,
            takeover,
        } => Command::AttachVolume {
            name: name(volume),
            node: pick(&nodes, node),
            allow_two_primaries: two,
            force_takeover: takeover,
            now_ms: T0,
        },
        Intent::Reattach { volume, node } => Command::ReattachVolume {
            name: name(volume),
            node: pick(&primaries(volume), node),
            now_ms: T0,
        },
        Intent::Detach { volume, node } => Command::DetachVolume {
            name: name(volume),
            node: node.map(|node| pick(&primaries(volume), node)),
        },
        Intent::Outdate {
            volume,
            replica,
            back,
            by_primary,
            by: proposer,
        } => Command::MarkOutdated {
            name: name(volume),
            generation: generation(volume, back),
            node: pick(&diskful(volume), replica),
            by: by(volume, by_primary, proposer),
        },
        Intent::InSync {
            volume,
            replica,
            back,
            by_primary,
            by: proposer,
        } => Command::MarkInSync {
            name: name(volume),
            generation: generation(volume, back),
            node: pick(&diskful(volume), replica),
            by: by(volume, by_primary, proposer),
        },
        Intent::Sync {
            volume,
            replica,
            done,
        } => Command::ReportSync {
            name: name(volume),
            node: pick(&diskful(volume), replica),
            progress: done.map(|done_bytes| SyncProgress {
                done_bytes,
                total_bytes: GIB,
                rate_bytes_per_sec: 1 << 20,
                reported_ms: T0,
            }),
        },
        Intent::AddReplica { volume, node } => Command::AddReplica {
            name: name(volume),
            node: node.map(|node| pick(&nodes, node)),
            pool: None,
            now_ms: T0,
        },
        Intent::RemoveReplica { volume, node } => Command::RemoveReplica {
            name: name(volume),
            node: pick(&diskful(volume), node),
        },
        Intent::SetState { node, online } => Command::SetNodeState {
            node: pick(&nodes, node),
            state: if online {
                NodeState::Online
            } else {
                NodeState::Offline
            },
            now_ms: T0,
        },
        Intent::Evict { node } => Command::EvictNode {
            node: pick(&nodes, node),
            now_ms: T0,
        },
        Intent::RemoveNode { node } => Command::RemoveNode {
            node: pick(&nodes, node),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_attach_histories_keep_the_fence_and_the_invariants(
        intents in prop::collection::vec(intent(), 1..80),
    ) {
        let mut first = cluster(&["za", "zb", "zc", "zd", "ze"]);
        let mut second = first.clone();
        for intent in intents {
            let command = resolve(&first, &intent);
            let before = first.clone();
            let result = first.apply(command.clone());
            prop_assert_eq!(first.check_invariants(), Ok(()));
            if let Err(error) = &result {
                prop_assert_eq!(&before, &first, "refused {:?} ({}) changed the state", command, error);
            }
            prop_assert_eq!(&result, &second.apply(command.clone()));
            prop_assert_eq!(&first, &second);

            // Generations never go back, and move only by an attach with no
            // primary or a reattach, by one.
            for (name, after) in &first.volumes {
                let Some(earlier) = before.volumes.get(name).filter(|v| v.id == after.id) else {
                    continue;
                };
                let moved = after.generation.0 - earlier.generation.0;
                let allowed = match &command {
                    // An attach with no primary left from before: a first
                    // attach, or a takeover that fenced the only primary.
                    Command::AttachVolume { name: target, .. } if target == name
                        && !earlier.primaries.iter().any(|p| after.is_primary(p.node)) => 1,
                    Command::ReattachVolume { name: target, .. } if target == name => 1,
                    _ => 0,
                };
                prop_assert!(after.generation >= earlier.generation);
                prop_assert!(moved == allowed || (moved == 0 && result.is_err()),
                    "{:?} moved the generation of {} by {}", command, name, moved);
            }
            // A primary on an online node is taken over only by force.
            if let (Command::AttachVolume { name, force_takeover: false, .. }, Ok(_)) = (&command, &result) {
                for primary in &before.volumes[name].primaries {
                    if before.nodes.get(&primary.node).is_some_and(|n| n.state == NodeState::Online) {
                        prop_assert!(first.volumes[name].is_primary(primary.node),
                            "{:?} took over from online node {}", command, primary.node);
                    }
                }
            }
            // The fence: a stale generation or a non-primary never changes
            // the in-sync set.
            if let Command::MarkOutdated { name, generation, by, .. }
                | Command::MarkInSync { name, generation, by, .. } = &command
            {
                if let Some(volume) = before.volumes.get(name) {
                    if *generation != volume.generation {
                        let stale = matches!(result, Err(CommandError::StaleGeneration { .. }));
                        prop_assert!(stale, "{:?} gave {:?}", command, result);
                    } else if !volume.is_primary(*by) {
                        let foreign = matches!(result, Err(CommandError::NotPrimary { .. }));
                        prop_assert!(foreign, "{:?} gave {:?}", command, result);
                    }
                }
            }
        }
        let encoded = serde_json::to_vec(&first).unwrap();
        let decoded: ClusterState = serde_json::from_slice(&encoded).unwrap();
        prop_assert_eq!(decoded, first);
    }
}

// ---------------------------------------------------------------------------
// Resyncs of detached volumes.
// ---------------------------------------------------------------------------

fn start_resync(volume: &str, node: u64) -> Command {
    Command::StartResync {
        name: vname(volume),
        node: NodeId(node),
        now_ms: T0 + 7,
    }
}

#[test]
fn a_detached_volume_resyncs_through_a_resync_only_primary_that_gives_way() {
    let mut state = cluster(&["za", "zb", "zc"]);
    created(apply_ok(&mut state, create_command("v", GIB)));
    // Nothing to resync: every replica is up to date.
    refused(&mut state, start_resync("v", 1));
    // Attached on n1, n3 falls behind, then the VM stops.
    apply_ok(&mut state, attach_command("v", 1, false));
    apply_ok(&mut state, outdated_command("v", 2, 3, 1));
    apply_ok(&mut state, detach_command("v", None));
    // Only an up-to-date replica's node drives the resync.
    refused(&mut state, start_resync("v", 3));
    assert_eq!(
        generation_of(apply_ok(&mut state, start_resync("v", 2))),
        Generation(3),
        "a resync is a new history: it fences whatever ran before"
    );
    let volume = &state.volumes[&vname("v")];
    assert_eq!(volume.resync_driver(), Some(NodeId(2)));
    assert!(volume.is_primary(NodeId(2)) && !volume.is_attached_on(NodeId(2)));
    // A second one is refused, and a detach finds nothing attached.
    refused(&mut state, start_resync("v", 1));
    refused(&mut state, detach_command("v", None));
    // Its in-sync report is fenced like any primary's.
    apply_ok(&mut state, in_sync_command("v", 3, 3, 2));
    assert!(state.volumes[&vname("v")].is_in_sync(NodeId(3)));

    // An attach replaces it (even on the same node) at a new generation,
    // so the resync engine is fenced by every replica it reaches.
    apply_ok(&mut state, outdated_command("v", 3, 3, 2));
    assert_eq!(
        generation_of(apply_ok(&mut state, attach_command("v", 2, false))),
        Generation(4)
    );
    let volume = &state.volumes[&vname("v")];
    assert_eq!(volume.resync_driver(), None);
    assert!(volume.is_attached_on(NodeId(2)));
    // Its late reports are stale, and its end changes nothing.
    refused(&mut state, in_sync_command("v", 3, 3, 2));
    let before = state.clone();
    apply_ok(
        &mut state,
        Command::EndResync {
            name: vname("v"),
            node: NodeId(2),
            generation: Generation(3),
        },
    );
    assert_eq!(state, before);

    // Detached again, a resync that ends leaves the volume detached at
    // its generation.
    apply_ok(&mut state, detach_command("v", None));
    apply_ok(&mut state, start_resync("v", 1));
    apply_ok(
        &mut state,
        Command::EndResync {
            name: vname("v"),
            node: NodeId(1),
            generation: Generation(5),
        },
    );
    let volume = &state.volumes[&vname("v")];
    assert!(volume.primaries.is_empty());
    assert_eq!(volume.generation, Generation(5));
    // A delete is not refused by a running resync.
    apply_ok(&mut state, start_resync("v", 1));
    apply_ok(
        &mut state,
        Command::DeleteVolume {
            name: vname("v"),
            with_snapshots: false,
        },
    );
}

#[test]
fn a_ready_report_of_a_copy_smaller_than_the_volume_stays_pending() {
    let mut state = cluster(&["za", "zb", "zc"]);
    let record = created(apply_ok(&mut state, create_with("v", Some(1), None, None)));
    let holder = record.replicas[0].node;
    let report = |size_bytes: u64| Command::ReportReplica {
        volume: vname("v"),
        volume_id: record.id,
        node: holder,
        observed: ReplicaObserved::Ready,
        allocated_bytes: 0,
        size_bytes: Some(size_bytes),
    };
    apply_ok(&mut state, report(record.size_bytes));
    let grown = record.size_bytes * 2;
    apply_ok(
        &mut state,
        Command::GrowVolume {
            name: vname("v"),
            size_bytes: grown,
        },
    );
    let observed = |state: &ClusterState| {
        state.volumes[&vname("v")]
            .replica(holder)
            .unwrap()
            .observed
            .clone()
    };
    assert_eq!(observed(&state), ReplicaObserved::Pending);
    // Made before the grow committed: not ready at the new size.
    apply_ok(&mut state, report(record.size_bytes));
    assert_eq!(observed(&state), ReplicaObserved::Pending);
    apply_ok(&mut state, report(grown));
    assert_eq!(observed(&state), ReplicaObserved::Ready);
}
