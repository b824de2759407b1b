//! `DATA/replication.redb`: what this node must remember about replication
//! across restarts.
//!
//! - per volume, its replica's state: the newest generation it accepted
//!   (so a restart cannot unfence a former primary), the generation at which
//!   this node last ran a primary, and whether the copy was left clean;
//! - per volume and peer, the dirty map a primary here keeps for that peer.
//!
//! Each update is one redb transaction, durable when it returns. They are
//! rare: once per hello, per detach, and per region that becomes dirty
//! while a peer is away — never per write.

use redb::{Database, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use trireme_replication::{DirtyMap, RegionSet};
use trireme_types::{Generation, NodeId, VolumeName};

use crate::NodeError;

pub const META_FILE: &str = "replication.redb";

const REPLICAS: TableDefinition<&str, &[u8]> = TableDefinition::new("replicas");
/// Key: `VOLUME/PEER_ID`.
const DIRTY: TableDefinition<&str, &[u8]> = TableDefinition::new("dirty_maps");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMeta {
    pub accepted: Generation,
    pub primary_at: Option<Generation>,
    pub clean: bool,
    /// Primaries of this generation and older are refused: the volume was
    /// detached at it. Absent in states from before fencing.
    #[serde(default = "unfenced")]
    pub fenced: Generation,
}

fn unfenced() -> Generation {
    Generation(0)
}

impl Default for ReplicaMeta {
    /// A new copy: nothing accepted yet, and clean (it is all zeros, like
    /// every other new copy).
    fn default() -> Self {
        ReplicaMeta {
            accepted: Generation(0),
            primary_at: None,
            clean: true,
            fenced: Generation(0),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredMap {
    since: Generation,
    full: bool,
    regions: Vec<u64>,
}

pub struct ReplicationMeta {
    db: Database,
}

fn meta_error(what: &str, error: impl std::fmt::Display) -> NodeError {
    NodeError::Internal(format!("replication metadata: {what}: {error}"))
}

impl ReplicationMeta {
    pub fn open(data_dir: &Path) -> Result<ReplicationMeta, NodeError> {
        let path = data_dir.join(META_FILE);
        let db = Database::create(&path).map_err(|error| meta_error("open", error))?;
        let txn = db
            .begin_write()
            .map_err(|error| meta_error("begin", error))?;
        txn.open_table(REPLICAS)
            .map_err(|error| meta_error("create table", error))?;
        txn.open_table(DIRTY)
            .map_err(|error| meta_error("create table", error))?;
        txn.commit().map_err(|error| meta_error("commit", error))?;
        Ok(ReplicationMeta { db })
    }

    pub fn replica(&self, volume: &VolumeName) -> Result<ReplicaMeta, NodeError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|error| meta_error("begin", error))?;
        let table = txn
            .open_table(REPLICAS)
            .map_err(|error| meta_error("open table", error))?;
        match table
            .get(volume.as_str())
            .map_err(|error| meta_error("read", error))?
        {
            Some(value) => serde_json::from_slice(value.value())
                .map_err(|error| meta_error("decode replica state", error)),
            None => Ok(ReplicaMeta::default()),
        }
    }

    pub fn set_replica(&self, volume: &VolumeName, meta: &ReplicaMeta) -> Result<(), NodeError> {
        let bytes = serde_json::to_vec(meta).expect("serialisable");
        let txn = self
            .db
            .begin_write()
            .map_err(|error| meta_error("begin", error))?;
        {
            let mut table = txn
                .open_table(REPLICAS)
                .map_err(|error| meta_error("open table", error))?;
            table
                .insert(volume.as_str(), bytes.as_slice())
                .map_err(|error| meta_error("write", error))?;
        }
        txn.commit().map_err(|error| meta_error("commit", error))
    }

    pub fn dirty_maps(&self, volume: &VolumeName) -> Result<BTreeMap<NodeId, DirtyMap>, NodeError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|error| meta_error("begin", error))?;
        let table = txn
            .open_table(DIRTY)
            .map_err(|error| meta_error("open table", error))?;
        let prefix = format!("{volume}/");
        let mut maps = BTreeMap::new();
        for entry in table
            .range(prefix.as_str()..)
            .map_err(|error| meta_error("read", error))?
        {
            let (key, value) = entry.map_err(|error| meta_error("read", error))?;
            let Some(peer) = key.value().strip_prefix(&prefix) else {
                break;
            };
            let Ok(peer) = peer.parse::<u64>() else {
                continue;
            };
            let stored: StoredMap = serde_json::from_slice(value.value())
                .map_err(|error| meta_error("decode dirty map", error))?;
            maps.insert(
                NodeId(peer),
                DirtyMap {
                    since: stored.since,
                    full: stored.full,
                    regions: stored.regions.into_iter().collect::<RegionSet>(),
                },
            );
        }
        Ok(maps)
    }

    /// Replaces the map for `peer` (`None` forgets it).
    pub fn set_dirty_map(
        &self,
        volume: &VolumeName,
        peer: NodeId,
        map: Option<&DirtyMap>,
    ) -> Result<(), NodeError> {
        let key = format!("{volume}/{peer}");
        let txn = self
            .db
            .begin_write()
            .map_err(|error| meta_error("begin", error))?;
        {
            let mut table = txn
                .open_table(DIRTY)
                .map_err(|error| meta_error("open table", error))?;
            match map {
                Some(map) => {
                    let bytes = serde_json::to_vec(&StoredMap {
                        since: map.since,
                        full: map.full,
                        regions: map.regions.iter().collect(),
                    })
                    .expect("serialisable");
                    table
                        .insert(key.as_str(), bytes.as_slice())
                        .map_err(|error| meta_error("write", error))?;
                }
                None => {
                    table
                        .remove(key.as_str())
                        .map_err(|error| meta_error("write", error))?;
                }
            }
        }
        txn.commit().map_err(|error| meta_error("commit", error))
    }

    /// Forgets everything about a deleted volume.
    pub fn forget_volume(&self, volume: &VolumeName) -> Result<(), NodeError> {
        let maps = self.dirty_maps(volume)?;
        for peer in maps.keys() {
            self.set_dirty_map(volume, *peer, None)?;
        }
        let txn = self
            .db
            .begin_write()
            .map_err(|error| meta_error("begin", error))?;
        {
            let mut table = txn
                .open_table(REPLICAS)
                .map_err(|error| meta_error("open table", error))?;
            table
                .remove(volume.as_str())
                .map_err(|error| meta_error("write", error))?;
        }
        txn.commit().map_err(|error| meta_error("commit", error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_state_and_dirty_maps_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let volume = VolumeName::new("vol").unwrap();
        {
            let meta = ReplicationMeta::open(dir.path()).unwrap();
            assert_eq!(meta.replica(&volume).unwrap(), ReplicaMeta::default());
            meta.set_replica(
                &volume,
                &ReplicaMeta {
                    accepted: Generation(4),
                    primary_at: Some(Generation(3)),
                    clean: false,
                    fenced: Generation(2),
                },
            )
            .unwrap();
            let map = DirtyMap {
                since: Generation(4),
                full: false,
                regions: [1, 7].into_iter().collect(),
            };
            meta.set_dirty_map(&volume, NodeId(2), Some(&map)).unwrap();
            meta.set_dirty_map(&volume, NodeId(3), Some(&map)).unwrap();
            meta.set_dirty_map(&volume, NodeId(3), None).unwrap();
        }
        let meta = ReplicationMeta::open(dir.path()).unwrap();
        assert_eq!(meta.replica(&volume).unwrap().accepted, Generation(4));
        let maps = meta.dirty_maps(&volume).unwrap();
        assert_eq!(maps.len(), 1);
        assert_eq!(
            maps[&NodeId(2)].regions.iter().collect::<Vec<_>>(),
            vec![1, 7]
        );
        meta.forget_volume(&volume).unwrap();
        assert!(meta.dirty_maps(&volume).unwrap().is_empty());
    }
}
