//! Which events a command leaves: the state before it ([`Before`]) and
//! after it are compared, so that only transitions are logged.

use std::collections::{BTreeMap, BTreeSet};
use trireme_types::{NodeId, VolumeName};

use super::{Command, Reply};
use crate::events::{Actor, Event, EventKind};
use crate::model::{ClusterState, NodeState, ReplicaObserved, VolumeRecord};

/// How people read who asked, e.g. `admin token via n2`.
fn describe_actor(actor: Actor, state: &ClusterState) -> String {
    match actor {
        Actor::Node(node) => format!("node {}", state.node_name(node)),
        Actor::AdminToken { via } => format!("admin token via {}", state.node_name(via)),
        Actor::Loopback { via } => format!("local client on {}", state.node_name(via)),
    }
}

/// What [`record`] compares the state after a command with: only what the
/// command can change, so that capturing it stays cheap.
pub(super) struct Before {
    node_states: BTreeMap<NodeId, NodeState>,
    /// Names of the nodes, for events about a node the command removes.
    node_names: BTreeMap<NodeId, String>,
    pools_online: BTreeMap<(NodeId, String), bool>,
    /// The named volume, as it was.
    volume: Option<VolumeRecord>,
    /// Whether each volume the command may touch had quorum.
    quorum: BTreeMap<VolumeName, bool>,
}

impl Before {
    pub(super) fn capture(state: &ClusterState, command: &Command) -> Before {
        let volume = command_volume(command).and_then(|name| state.volumes.get(name).cloned());
        let quorum = match (&volume, touches_nodes(command)) {
            (_, true) => state
                .volumes
                .values()
                .map(|volume| (volume.name.clone(), has_quorum(state, volume)))
                .collect(),
            (Some(volume), false) => {
                BTreeMap::from([(volume.name.clone(), has_quorum(state, volume))])
            }
            (None, false) => BTreeMap::new(),
        };
        Before {
            node_states: state
                .nodes
                .iter()
                .map(|(id, node)| (*id, node.state))
                .collect(),
            node_names: state
                .nodes
                .iter()
                .map(|(id, node)| (*id, node.name.to_string()))
                .collect(),
            pools_online: state
                .nodes
                .iter()
                .flat_map(|(id, node)| {
                    node.pools
                        .iter()
                        .map(move |(name, pool)| ((*id, name.to_string()), pool.online))
                })
                .collect(),
            volume,
            quorum,
        }
    }
}

fn has_quorum(state: &ClusterState, volume: &VolumeRecord) -> bool {
    volume.deleting || state.quorum_count(volume).has_quorum()
}

/// Commands that change nodes, and with them any volume's quorum.
fn touches_nodes(command: &Command) -> bool {
    matches!(
        command,
        Command::SetNodeState { .. }
            | Command::EvictNode { .. }
            | Command::RemoveNode { .. }
            | Command::ReportPools { .. }
    )
}

/// The volume a command is about, if one.
fn command_volume(command: &Command) -> Option<&VolumeName> {
    match command {
        Command::CreateVolume { name, .. }
        | Command::GrowVolume { name, .. }
        | Command::DeleteVolume { name, .. }
        | Command::AttachVolume { name, .. }
        | Command::ReattachVolume { name, .. }
        | Command::StartResync { name, .. }
        | Command::EndResync { name, .. }
        | Command::DetachVolume { name, .. }
        | Command::MarkOutdated { name, .. }
        | Command::MarkInSync { name, .. }
        | Command::ReportSync { name, .. }
        | Command::AddReplica { name, .. }
        | Command::RemoveReplica { name, .. }
        | Command::RestorePlacement { name }
        | Command::CloneVolume { name, .. } => Some(name),
        Command::ReportReplica { volume, .. }
        | Command::CreateSnapshot { volume, .. }
        | Command::ReportSnapshot { volume, .. }
        | Command::DeleteSnapshot { volume, .. }
        | Command::RollbackVolume { volume, .. }
        | Command::SetSnapshotSchedule { volume, .. } => Some(volume),
        Command::RecordEvent { event } => event.volume.as_ref(),
        _ => None,
    }
}

/// A draft of an event: kind, node, volume, message.
type Draft = (EventKind, Option<NodeId>, Option<VolumeName>, String);

/// A command's single event.
fn one(
    kind: EventKind,
    node: Option<NodeId>,
    volume: Option<&VolumeName>,
    message: String,
) -> Vec<Draft> {
    vec![(kind, node, volume.cloned(), message)]
}

/// Logs what `command` (applied, with `reply`) did, on behalf of `actor`
/// at `time_ms`.
pub(super) fn record(
    state: &mut ClusterState,
    before: Before,
    command: &Command,
    reply: &Reply,
    actor: Actor,
    time_ms: u64,
) {
    let mut drafts = describe(state, &before, command, reply);
    drafts.extend(quorum_changes(state, &before));
    let actor = describe_actor(actor, state);
    for (kind, node, volume, message) in drafts {
        let node = node.map(|node| {
            state
                .nodes
                .get(&node)
                .map(|record| record.name.to_string())
                .unwrap_or_else(|| before_name(&before, node))
        });
        state.events.push(Event {
            seq: 0,
            time_ms,
            kind,
            node,
            volume,
            actor: actor.clone(),
            message,
        });
    }
}

fn before_name(before: &Before, node: NodeId) -> String {
    before
        .node_names
        .get(&node)
        .cloned()
        .unwrap_or_else(|| format!("node-{node}"))
}

fn quorum_changes(state: &ClusterState, before: &Before) -> Vec<Draft> {
    let mut drafts = Vec::new();
    for (name, had) in &before.quorum {
        let Some(volume) = state.volumes.get(name) else {
            continue;
        };
        let count = state.quorum_count(volume);
        let has = has_quorum(state, volume);
        let counted = format!(
            "{} of {} voters up to date and online, {} needed",
            count.up_to_date, count.voters, count.majority
        );
        match (had, has) {
            (true, false) => drafts.push((
                EventKind::QuorumLost,
                None,
                Some(name.clone()),
                format!("volume {name} lost quorum: {counted}"),
            )),
            (false, true) => drafts.push((
                EventKind::QuorumRegained,
                None,
                Some(name.clone()),
                format!("volume {name} has quorum again: {counted}"),
            )),
            _ => {}
        }
    }
    drafts
}

/// The events of `command`, by what it is about.
fn describe(state: &ClusterState, before: &Before, command: &Command, reply: &Reply) -> Vec<Draft> {
    cluster_events(state, before, command, reply)
        .or_else(|| volume_events(state, before, command, reply))
        .or_else(|| replica_events(state, before, command, reply))
        .or_else(|| snapshot_events(state, command))
        .unwrap_or_default()
}

/// Nodes, pools, groups and settings.
fn cluster_events(
    state: &ClusterState,
    before: &Before,
    command: &Command,
    reply: &Reply,
) -> Option<Vec<Draft>> {
    let name_of = |node: NodeId| state.node_name(node);
    Some(match command {
        Command::Bootstrap { node, .. } => one(
            EventKind::NodeJoined,
            Some(NodeId(1)),
            None,
            format!("cluster created with node {}", node.name),
        ),
        Command::AddNode { node, .. } => {
            let id = match reply {
                Reply::NodeAdded { node } => Some(*node),
                _ => None,
            };
            one(
                EventKind::NodeJoined,
                id,
                None,
                format!("node {} joined at {}", node.name, node.api_address),
            )
        }
        Command::RemoveNode { node } => one(
            EventKind::NodeRemoved,
            Some(*node),
            None,
            format!(
                "node {} removed from the cluster",
                before_name(before, *node)
            ),
        ),
        Command::SetNodeState {
            node, state: new, ..
        } => {
            let old = before.node_states.get(node).copied();
            if old == Some(*new) {
                return Some(Vec::new());
            }
            let kind = match new {
                NodeState::Online => EventKind::NodeOnline,
                NodeState::Offline => EventKind::NodeOffline,
                NodeState::Evicted => EventKind::NodeEvicted,
            };
            let was = old.map_or("unknown", NodeState::as_str);
            one(
                kind,
                Some(*node),
                None,
                format!("node {} is {} (was {was})", name_of(*node), new.as_str()),
            )
        }
        Command::EvictNode { node, .. } => {
            let detail = match reply {
                Reply::Evicted { replaced, degraded } => format!(
                    ": replicas placed again for {}; left degraded: {}",
                    names(replaced),
                    names(degraded)
                ),
                _ => String::new(),
            };
            one(
                EventKind::NodeEvicted,
                Some(*node),
                None,
                format!("node {} evicted{detail}", name_of(*node)),
            )
        }
        Command::SetNodeLabels { node, labels } => one(
            EventKind::NodeLabelsChanged,
            Some(*node),
            None,
            format!("labels of node {} set to {labels:?}", name_of(*node)),
        ),
        Command::ReportPools { node, pools } => pools
            .iter()
            .filter_map(|pool| {
                let was = before
                    .pools_online
                    .get(&(*node, pool.name.to_string()))
                    .copied();
                let now = pool.record.online;
                // A new pool that starts online is not news; one that
                // starts offline, or a change, is.
                if was == Some(now) || (was.is_none() && now) {
                    return None;
                }
                let (kind, word) = if now {
                    (EventKind::PoolOnline, "online again")
                } else {
                    (
                        EventKind::PoolOffline,
                        "offline (its device failed or is missing)",
                    )
                };
                Some((
                    kind,
                    Some(*node),
                    None,
                    format!("pool {} on {} is {word}", pool.name, name_of(*node)),
                ))
            })
            .collect(),
        Command::CreateGroup { group } => one(
            EventKind::GroupCreated,
            None,
            None,
            format!("resource group {} created", group.name),
        ),
        Command::ModifyGroup { group } => one(
            EventKind::GroupChanged,
            None,
            None,
            format!("resource group {} changed", group.name),
        ),
        Command::DeleteGroup { name } => one(
            EventKind::GroupDeleted,
            None,
            None,
            format!("resource group {name} deleted"),
        ),
        Command::SetSettings { settings } => one(
            EventKind::SettingsChanged,
            None,
            None,
            format!(
                "cluster settings: eviction {} after {} s, resync rate {} MiB/s",
                if settings.eviction_enabled {
                    "on"
                } else {
                    "off"
                },
                settings.eviction_delay_secs,
                settings.resync_rate_bytes_per_sec >> 20
            ),
        ),
        _ => return None,
    })
}

/// Volumes: created, grown, deleted, attached, detached, resynced while detached.
fn volume_events(
    state: &ClusterState,
    before: &Before,
    command: &Command,
    reply: &Reply,
) -> Option<Vec<Draft>> {
    let name_of = |node: NodeId| state.node_name(node);
    Some(match command {
        Command::CreateVolume {
            name, size_bytes, ..
        } => {
            let placed = state
                .volumes
                .get(name)
                .map(|volume| {
                    volume
                        .diskful()
                        .map(|replica| name_of(replica.node))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            one(
                EventKind::VolumeCreated,
                None,
                Some(name),
                format!("volume {name} created, {size_bytes} bytes, replicas on {placed}"),
            )
        }
        Command::CloneVolume {
            name,
            source,
            snapshot,
            ..
        } => one(
            EventKind::VolumeCloned,
            None,
            Some(name),
            format!("volume {name} cloned from snapshot {snapshot} of {source}"),
        ),
        Command::GrowVolume { name, size_bytes } => one(
            EventKind::VolumeGrown,
            None,
            Some(name),
            format!("volume {name} grown to {size_bytes} bytes"),
        ),
        Command::DeleteVolume { name, .. } => one(
            EventKind::VolumeDeleted,
            None,
            Some(name),
            format!("volume {name} deleted"),
        ),
        Command::AttachVolume { name, node, .. } => attach_events(state, name, *node, reply),
        Command::ReattachVolume { name, node, .. } => {
            let generation = match reply {
                Reply::Generation(generation) => generation.0,
                _ => 0,
            };
            one(
                EventKind::Reattached,
                Some(*node),
                Some(name),
                format!(
                    "the engine of volume {name} restarted on {} (generation {generation})",
                    name_of(*node)
                ),
            )
        }
        Command::StartResync { name, node, .. } => one(
            EventKind::ResyncStarted,
            Some(*node),
            Some(name),
            format!(
                "{} resyncs the outdated replicas of detached volume {name}",
                name_of(*node)
            ),
        ),
        Command::EndResync { name, node, .. } => {
            let was_driver =
                before.volume.as_ref().and_then(VolumeRecord::resync_driver) == Some(*node);
            let still = state
                .volumes
                .get(name)
                .and_then(VolumeRecord::resync_driver)
                == Some(*node);
            if !was_driver || still {
                return Some(Vec::new());
            }
            one(
                EventKind::ResyncFinished,
                Some(*node),
                Some(name),
                format!(
                    "resync of detached volume {name} by {} ended",
                    name_of(*node)
                ),
            )
        }
        Command::DetachVolume { name, .. } => {
            let before_primaries: BTreeSet<NodeId> = before
                .volume
                .iter()
                .flat_map(|volume| {
                    volume
                        .primaries
                        .iter()
                        .filter(|p| !p.resync_only)
                        .map(|p| p.node)
                })
                .collect();
            let after: BTreeSet<NodeId> = state
                .volumes
                .get(name)
                .map(|volume| volume.primaries.iter().map(|p| p.node).collect())
                .unwrap_or_default();
            before_primaries
                .difference(&after)
                .map(|node| {
                    (
                        EventKind::Detached,
                        Some(*node),
                        Some(name.clone()),
                        format!("volume {name} detached from {}", name_of(*node)),
                    )
                })
                .collect()
        }
        _ => return None,
    })
}

/// Replicas: outdated, resynced, failed, added, removed, placed again.
fn replica_events(
    state: &ClusterState,
    before: &Before,
    command: &Command,
    reply: &Reply,
) -> Option<Vec<Draft>> {
    let name_of = |node: NodeId| state.node_name(node);
    Some(match command {
        Command::MarkOutdated { name, node, .. } => {
            let was = before
                .volume
                .as_ref()
                .is_some_and(|volume| volume.is_in_sync(*node));
            if !was {
                return Some(Vec::new());
            }
            one(
                EventKind::ReplicaOutdated,
                Some(*node),
                Some(name),
                format!(
                    "the replica of volume {name} on {} missed writes: outdated until resynced",
                    name_of(*node)
                ),
            )
        }
        Command::MarkInSync { name, node, .. } => {
            let was = before
                .volume
                .as_ref()
                .is_some_and(|volume| volume.is_in_sync(*node));
            let now = state
                .volumes
                .get(name)
                .is_some_and(|volume| volume.is_in_sync(*node));
            if was || !now {
                return Some(Vec::new());
            }
            one(
                EventKind::ResyncFinished,
                Some(*node),
                Some(name),
                format!(
                    "the replica of volume {name} on {} is up to date again",
                    name_of(*node)
                ),
            )
        }
        Command::ReportSync {
            name,
            node,
            progress,
        } => {
            let was_syncing = before
                .volume
                .as_ref()
                .and_then(|volume| volume.replica(*node))
                .is_some_and(|replica| replica.sync.is_some());
            match progress {
                Some(progress) if !was_syncing => one(
                    EventKind::ResyncStarted,
                    Some(*node),
                    Some(name),
                    format!(
                        "resync of the replica of volume {name} on {} started: {} bytes to copy",
                        name_of(*node),
                        progress.total_bytes
                    ),
                ),
                _ => Vec::new(),
            }
        }
        Command::ReportReplica {
            volume,
            node,
            observed,
            ..
        } => {
            let was_failed = before
                .volume
                .as_ref()
                .and_then(|record| record.replica(*node))
                .is_some_and(|replica| matches!(replica.observed, ReplicaObserved::Failed(_)));
            match observed {
                ReplicaObserved::Failed(reason) if !was_failed => one(
                    EventKind::ReplicaFailed,
                    Some(*node),
                    Some(volume),
                    format!(
                        "the replica of volume {volume} on {} failed: {reason}",
                        name_of(*node)
                    ),
                ),
                _ => Vec::new(),
            }
        }
        Command::AddReplica { name, .. } => {
            let new: Vec<String> = state
                .volumes
                .get(name)
                .into_iter()
                .flat_map(|volume| volume.diskful())
                .filter(|replica| {
                    !before
                        .volume
                        .as_ref()
                        .is_some_and(|old| old.is_diskful_on(replica.node))
                })
                .map(|replica| name_of(replica.node))
                .collect();
            one(
                EventKind::ReplicaAdded,
                None,
                Some(name),
                format!("replica of volume {name} added on {}", new.join(", ")),
            )
        }
        Command::RemoveReplica { name, node } => one(
            EventKind::ReplicaRemoved,
            Some(*node),
            Some(name),
            format!("replica of volume {name} removed from {}", name_of(*node)),
        ),
        Command::RestorePlacement { name } => match reply {
            Reply::Volume(volume) => {
                let placed: Vec<String> = volume
                    .replicas
                    .iter()
                    .map(|r| format!("{} ({})", name_of(r.node), r.kind.as_str()))
                    .collect();
                one(
                    EventKind::PlacementRestored,
                    None,
                    Some(name),
                    format!("volume {name} placed again: {}", placed.join(", ")),
                )
            }
            _ => Vec::new(),
        },
        _ => return None,
    })
}

/// Snapshots, rollbacks, schedules, and what nodes report themselves.
fn snapshot_events(state: &ClusterState, command: &Command) -> Option<Vec<Draft>> {
    let name_of = |node: NodeId| state.node_name(node);
    Some(match command {
        Command::CreateSnapshot {
            volume,
            name,
            scheduled,
            ..
        } => one(
            EventKind::SnapshotCreated,
            None,
            Some(volume),
            format!(
                "snapshot {name} of volume {volume} requested{}",
                if *scheduled { " by its schedule" } else { "" }
            ),
        ),
        Command::ReportSnapshot {
            volume,
            id,
            from,
            holders,
            error,
        } => {
            let snapshot = state
                .volumes
                .get(volume)
                .and_then(|record| record.snapshots.iter().find(|snapshot| snapshot.id == *id))
                .map(|snapshot| snapshot.name.to_string())
                .unwrap_or_else(|| format!("#{id}"));
            match error {
                Some(error) => one(
                    EventKind::SnapshotFailed,
                    Some(*from),
                    Some(volume),
                    format!(
                        "snapshot {snapshot} of volume {volume} failed on {}: {error}",
                        name_of(*from)
                    ),
                ),
                None => {
                    let on: Vec<String> = holders.iter().map(|node| name_of(*node)).collect();
                    one(
                        EventKind::SnapshotTaken,
                        Some(*from),
                        Some(volume),
                        format!(
                            "snapshot {snapshot} of volume {volume} taken on {}",
                            on.join(", ")
                        ),
                    )
                }
            }
        }
        Command::DeleteSnapshot { volume, name } => one(
            EventKind::SnapshotDeleted,
            None,
            Some(volume),
            format!("snapshot {name} of volume {volume} deleted"),
        ),
        Command::RollbackVolume { volume, snapshot } => one(
            EventKind::RolledBack,
            None,
            Some(volume),
            format!("volume {volume} rolled back to snapshot {snapshot}"),
        ),
        Command::SetSnapshotSchedule {
            volume, schedule, ..
        } => one(
            EventKind::ScheduleChanged,
            None,
            Some(volume),
            match schedule {
                Some((every, keep)) => {
                    format!("volume {volume}: a snapshot every {every} s, keeping {keep}")
                }
                None => format!("volume {volume}: snapshot schedule removed"),
            },
        ),
        Command::RecordEvent { event } => vec![(
            event.kind,
            event.node,
            event.volume.clone(),
            event.message.clone(),
        )],
        // Reports of progress and bookkeeping between nodes: no news.
        _ => return None,
    })
}

fn attach_events(
    state: &ClusterState,
    name: &VolumeName,
    node: NodeId,
    reply: &Reply,
) -> Vec<Draft> {
    let Reply::Attached { generation, fenced } = reply else {
        return Vec::new();
    };
    let node_name = state.node_name(node);
    if fenced.is_empty() {
        return vec![(
            EventKind::Attached,
            Some(node),
            Some(name.clone()),
            format!(
                "volume {name} attached on {node_name} (generation {})",
                generation.0
            ),
        )];
    }
    let from: Vec<String> = fenced
        .iter()
        .map(|primary| {
            format!(
                "{} ({})",
                state.node_name(primary.node),
                primary.state.as_str()
            )
        })
        .collect();
    vec![(
        EventKind::PrimaryChanged,
        Some(node),
        Some(name.clone()),
        format!(
            "volume {name} taken over by {node_name} from {}, which is fenced (generation {})",
            from.join(", "),
            generation.0
        ),
    )]
}

fn names(volumes: &[VolumeName]) -> String {
    if volumes.is_empty() {
        return "none".into();
    }
    volumes
        .iter()
        .map(|name| name.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
