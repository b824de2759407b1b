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
    ClusterSettings, ClusterState, Command, CommandError, NodeRegistration, NodeState, PoolRecord,
    PoolReport, QuorumPolicy, ReplicaKind, ReplicaObserved, Reply, ResourceGroup, VolumeRecord,
    DEFAULT_GROUP, JOIN_WINDOW_MS,
};
use trireme_types::{DeviceClass, GroupName, NodeId, NodeName, PoolName, VolumeName};

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
        matches!(&zero, CommandError::Invalid(text) if text.contains("v3")),
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

    apply_ok(&mut state, Command::DeleteVolume { name: vname("v") });
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
    apply_ok(&mut state, Command::DeleteVolume { name: vname("v") });
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
    };
    apply_ok(
        &mut state,
        Command::SetSettings {
            settings: settings.clone(),
        },
    );
    assert_eq!(state.settings, settings);
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
    prop_oneof![
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
        2 => volume.clone().prop_map(|name| Command::DeleteVolume { name }),
        4 => (volume.clone(), 1u64..6, node_id(), observed(), 0u64..GIB).prop_map(
            |(volume, volume_id, node, observed, allocated_bytes)| Command::ReportReplica {
                volume,
                volume_id,
                node,
                observed,
                allocated_bytes,
            }
        ),
        2 => (volume, 1u64..6, node_id()).prop_map(|(volume, volume_id, node)| {
            Command::ReplicaRemoved {
                volume,
                volume_id,
                node,
            }
        }),
        1 => (any::<bool>(), 0u64..10_000).prop_map(|(eviction_enabled, eviction_delay_secs)| {
            Command::SetSettings {
                settings: ClusterSettings {
                    eviction_enabled,
                    eviction_delay_secs,
                },
            }
        }),
        2 => node_id().prop_map(move |node| Command::EvictNode { node, now_ms: now }),
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
