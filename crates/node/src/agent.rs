//! The agent: makes this node's storage match the cluster state, and
//! reports what it observed.
//!
//! On every change of the local state copy (and every few seconds):
//! - each diskful replica placed here gets its store volume (created or
//!   grown to the recorded size) and is reported ready, or failed with why
//!   (a full pool as `ReplicaFailure::NoSpace`, so the API can answer 507);
//! - each replica here of a volume being deleted is removed and reported;
//! - a local volume the cluster does not know (made before this node was in
//!   a cluster) is registered as a one-replica volume on this node;
//! - the node's pools (class, capacity, free) are reported when they change.
//!
//! The agent only reads the local copy of the state, so the volumes it
//! already serves keep being served while the cluster has no leader.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use trireme_control::{
    Command, PoolRecord, PoolReport, ReplicaFailure, ReplicaKind, ReplicaObserved, VolumeRecord,
};
use trireme_types::{PoolName, VolumeName};

use crate::cluster::{auth, was_removed, Cluster};
use crate::node::PoolStatus;
use crate::replicated::Replication;
use crate::{Node, NodeError};

/// Reconcile at least this often, even without state changes.
const RESYNC_INTERVAL: Duration = Duration::from_secs(5);
/// Report a pool's free bytes again when they moved by more than this
/// share of its capacity (1/64 ≈ 1.6%): placement needs a rough figure,
/// and the log should not grow with every write.
pub(crate) const FREE_BYTES_REPORT_SHARE: u64 = 64;

pub async fn run(
    cluster: Arc<Cluster>,
    node: Arc<Node>,
    replication: Arc<Replication>,
    mut stop: watch::Receiver<bool>,
) {
    let mut changes = cluster.state.subscribe();
    loop {
        if let Err(error) = reconcile(&cluster, &node).await {
            tracing::warn!(%error, "reconciling this node's replicas failed; retrying");
        }
        if let Err(error) = replication.reconcile().await {
            tracing::warn!(%error, "starting the engines of volumes attached here failed; retrying");
        }
        if let Err(error) = replication.reconcile_snapshots().await {
            tracing::warn!(%error, "snapshot work on this node failed; retrying");
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(RESYNC_INTERVAL) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
    }
}

pub async fn reconcile(cluster: &Arc<Cluster>, node: &Arc<Node>) -> Result<(), NodeError> {
    let me = cluster.node_id();
    let (mine, known, recorded_pools): (
        Vec<VolumeRecord>,
        Vec<VolumeName>,
        BTreeMap<PoolName, PoolRecord>,
    ) = {
        let state = cluster.state.read();
        if !state.nodes.contains_key(&me) {
            // Not (yet, or no longer) a member: nothing is ours.
            if was_removed(&state, me) {
                cluster.peers.note_removed(
                    "this node's own copy of the cluster state records its removal".into(),
                );
            }
            return Ok(());
        }
        (
            state
                .volumes
                .values()
                .filter(|volume| {
                    volume
                        .replica(me)
                        .is_some_and(|replica| replica.kind == ReplicaKind::Diskful)
                })
                .cloned()
                .collect(),
            state.volumes.keys().cloned().collect(),
            state.nodes[&me].pools.clone(),
        )
    };
    let local = node.blocking(|node| node.volumes()).await?;
    let local_by_name: BTreeMap<VolumeName, trireme_store::VolumeInfo> = local
        .into_iter()
        .map(|info| (info.name.clone(), info))
        .collect();

    for volume in mine {
        let replica = volume.replica(me).expect("filtered above").clone();
        let existing = local_by_name.get(&volume.name);
        if volume.deleting {
            if existing.is_some() {
                let name = volume.name.clone();
                node.blocking(move |node| node.delete_volume(&name)).await?;
            }
            cluster
                .write(Command::ReplicaRemoved {
                    volume: volume.name.clone(),
                    volume_id: volume.id,
                    node: me,
                })
                .await
                .map_err(|error| NodeError::Internal(error.to_string()))?;
            continue;
        }
        let outcome = match existing {
            Some(info) if info.size_bytes >= volume.size_bytes => Ok(info.clone()),
            Some(_) => {
                let (name, size) = (volume.name.clone(), volume.size_bytes);
                node.blocking(move |node| node.grow_volume(&name, size))
                    .await
            }
            None => match volume
                .origin
                .as_ref()
                .filter(|origin| origin.holders.contains(&me))
            {
                // A clone's first copies are made from the snapshot's copy
                // here, sharing its chunks.
                Some(origin) => {
                    let (name, source, snapshot) =
                        (volume.name.clone(), origin.volume.clone(), origin.snapshot);
                    node.blocking(move |node| node.clone_volume(&source, snapshot, &name))
                        .await
                }
                None => {
                    let (name, size, pool) =
                        (volume.name.clone(), volume.size_bytes, replica.pool.clone());
                    node.blocking(move |node| node.create_volume(&name, size, pool.as_ref()))
                        .await
                }
            },
        };
        let (observed, allocated, size) = match outcome {
            Ok(info) => (
                ReplicaObserved::Ready,
                info.allocated_bytes,
                Some(info.size_bytes),
            ),
            Err(error) => {
                tracing::warn!(volume = %volume.name, %error, "cannot make the local replica");
                let pool = existing
                    .map(|info| info.pool.clone())
                    .or_else(|| replica.pool.clone());
                (
                    ReplicaObserved::Failed(replica_failure(&error, pool)),
                    0,
                    None,
                )
            }
        };
        // Small changes wait until they add up (each report is a Raft
        // commit), but a replica that got its first data, or lost all of
        // it, says so at once: `0 B` beside written data looks like loss.
        let allocated_moved = allocated.abs_diff(replica.allocated_bytes)
            > volume.size_bytes / FREE_BYTES_REPORT_SHARE
            || (allocated == 0) != (replica.allocated_bytes == 0);
        if observed != replica.observed || allocated_moved {
            cluster
                .write(Command::ReportReplica {
                    volume: volume.name.clone(),
                    volume_id: volume.id,
                    node: me,
                    observed,
                    allocated_bytes: allocated,
                    // The control plane takes a ready copy smaller than
                    // the volume (a grow committed meanwhile) as pending.
                    size_bytes: size,
                })
                .await
                .map_err(|error| NodeError::Internal(error.to_string()))?;
        }
    }

    // Volumes from before this node was in a cluster become cluster volumes.
    for (name, info) in &local_by_name {
        if known.contains(name) {
            continue;
        }
        tracing::info!(volume = %name, pool = %info.pool, "registering a local volume with the cluster");
        let result = cluster
            .write(Command::CreateVolume {
                name: name.clone(),
                size_bytes: info.size_bytes,
                group: None,
                replicas: None,
                nodes: None,
                pool: None,
                adopt: Some((me, info.pool.clone())),
                now_ms: auth::now_ms(),
            })
            .await;
        if let Err(error) = result {
            tracing::warn!(volume = %name, %error, "cannot register the local volume");
        }
    }

    report_pools(cluster, node, &recorded_pools).await
}

/// What the cluster is told about a replica this node could not make:
/// a full pool keeps its class (the API answers 507 for it), anything
/// else is its message.
pub(crate) fn replica_failure(error: &NodeError, pool: Option<PoolName>) -> ReplicaFailure {
    match pool {
        Some(pool) if error.is_out_of_space() => ReplicaFailure::NoSpace {
            message: format!("no space left in pool '{pool}': {error}"),
            pool,
        },
        _ => ReplicaFailure::Other(error.to_string()),
    }
}

/// Reports this node's pools if they differ from `recorded` (what the
/// state says): a new or deleted pool at once, free bytes when they moved.
pub async fn report_pools(
    cluster: &Arc<Cluster>,
    node: &Arc<Node>,
    recorded_pools: &BTreeMap<PoolName, PoolRecord>,
) -> Result<(), NodeError> {
    let me = cluster.node_id();
    let pools = node.blocking(|node| node.pools()).await?;
    let reports: Vec<PoolReport> = pools.iter().map(pool_report).collect();
    let changed = reports.len() != recorded_pools.len()
        || reports
            .iter()
            .any(|report| match recorded_pools.get(&report.name) {
                None => true,
                Some(recorded) => {
                    recorded.class != report.record.class
                        || recorded.online != report.record.online
                        || recorded.capacity_bytes != report.record.capacity_bytes
                        || recorded.free_bytes.abs_diff(report.record.free_bytes)
                            > report.record.capacity_bytes / FREE_BYTES_REPORT_SHARE
                }
            });
    if changed {
        cluster
            .write(Command::ReportPools {
                node: me,
                pools: reports,
            })
            .await
            .map_err(|error| NodeError::Internal(error.to_string()))?;
    }
    Ok(())
}

fn pool_report(status: &PoolStatus) -> PoolReport {
    let (capacity_bytes, free_bytes) = status
        .info
        .as_ref()
        .map(|info| (info.capacity_bytes, info.free_bytes))
        .unwrap_or((0, 0));
    PoolReport {
        name: status.record.name.clone(),
        record: PoolRecord {
            class: status.record.class,
            capacity_bytes,
            free_bytes,
            online: status.offline_reason.is_none(),
            reported_ms: auth::now_ms(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_store::StoreError;

    #[test]
    fn a_full_pool_is_told_by_its_os_error_not_its_text() {
        let pool = PoolName::new("fast").unwrap();
        let quota = NodeError::Io {
            context: "grow the pool file".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        match replica_failure(&quota, Some(pool.clone())) {
            ReplicaFailure::NoSpace {
                pool: named,
                message,
            } => {
                assert_eq!(named, pool);
                assert!(
                    message.starts_with("no space left in pool 'fast': "),
                    "{message}"
                );
            }
            other => panic!("a quota is a full pool: {other:?}"),
        }
        // Words alone do not make a full pool.
        let worded = NodeError::Store(StoreError::Fatal("No space, pool full".into()));
        assert!(matches!(
            replica_failure(&worded, Some(pool)),
            ReplicaFailure::Other(_)
        ));
    }
}
