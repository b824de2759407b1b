//! The pool's metadata in redb: what the pool is, its volumes, their chunk
//! maps and the journal checkpoint.
//!
//! Chunk maps, saved maps, snapshots and reference counts are written only
//! at checkpoints, in one transaction with the checkpoint that retires the
//! journal records they came from, so what is on disk always describes
//! exactly the records before the checkpoint. Snapshot deletion, clones,
//! rollback and volume deletion change them in memory and then checkpoint,
//! so each of them commits in that same single transaction.

use crate::chunk_map::ChunkEntry;
use crate::StoreError;
use redb::{Builder, Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use trireme_types::{DeviceClass, PoolId, PoolName, SnapshotId, VolumeId, VolumeName};

const POOL: TableDefinition<&str, &[u8]> = TableDefinition::new("pool");
const VOLUMES: TableDefinition<u64, &[u8]> = TableDefinition::new("volumes");
/// (volume id, logical chunk) → (packed [`ChunkEntry`], birth epoch).
const CHUNKS: TableDefinition<(u64, u64), (u64, u64)> = TableDefinition::new("chunk_map");
/// (volume id, snapshot id) → JSON [`SnapshotRecord`].
const SNAPSHOTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("snapshots");
/// (volume id, snapshot id, logical chunk) → (packed entry, birth epoch):
/// the snapshot's saved map.
const SAVED: TableDefinition<(u64, u64, u64), (u64, u64)> = TableDefinition::new("saved_map");
/// Physical chunk → number of map entries (live and saved, of every volume)
/// that point at it; only chunks with more than one are stored.
const REFCOUNTS: TableDefinition<u64, u64> = TableDefinition::new("refcounts");

const KEY_POOL: &str = "pool";
const KEY_CHECKPOINT: &str = "checkpoint";
const KEY_NEXT_VOLUME_ID: &str = "next_volume_id";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolRecord {
    pub uuid: u128,
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    pub device_path: PathBuf,
    /// The pool created its device file, so deleting the pool deletes it.
    pub created_file: bool,
    /// The file's space was reserved at creation (`--preallocate`), so
    /// freed chunks keep it; absent in pools made before it was recorded.
    #[serde(default)]
    pub preallocated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: VolumeName,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
    /// The epoch new map entries are born in; a snapshot takes the current
    /// one and moves the volume to the next.
    #[serde(default = "first_epoch")]
    pub epoch: u64,
}

fn first_epoch() -> u64 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The volume's epoch when it was taken: it reads entries born at or
    /// before it.
    pub epoch: u64,
    pub created_unix_seconds: u64,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
}

/// Where replay starts: the first journal position and sequence not yet
/// reflected in the chunk maps and checksums on disk, and the epoch of the
/// records that may follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub epoch: u64,
    pub position: u64,
    pub next_sequence: u64,
}

impl Checkpoint {
    fn encode(&self) -> [u8; 24] {
        let mut bytes = [0u8; 24];
        bytes[0..8].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.position.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.next_sequence.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let u64_at = |start: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(start..start + 8)?.try_into().ok()?,
            ))
        };
        Some(Checkpoint {
            epoch: u64_at(0)?,
            position: u64_at(8)?,
            next_sequence: u64_at(16)?,
        })
    }
}

/// Everything loaded from the database when a pool opens.
pub struct Loaded {
    pub pool: PoolRecord,
    pub checkpoint: Checkpoint,
    pub volumes: Vec<(VolumeId, VolumeRecord)>,
    pub chunks: Vec<(VolumeId, u64, ChunkEntry)>,
    pub snapshots: Vec<(VolumeId, SnapshotId, SnapshotRecord)>,
    pub saved: Vec<(VolumeId, SnapshotId, u64, ChunkEntry)>,
    pub refcounts: Vec<(u32, u32)>,
}

/// The change to one map entry that a checkpoint writes.
pub type ChunkChange = ((VolumeId, u64), Option<ChunkEntry>);
/// The change to one saved-map entry.
pub type SavedChange = ((VolumeId, SnapshotId, u64), Option<ChunkEntry>);

/// Everything a checkpoint commits besides the journal position.
#[derive(Default)]
pub struct Changes {
    pub chunks: Vec<ChunkChange>,
    pub saved: Vec<SavedChange>,
    /// Physical chunk → reference count (1 or less: the row is removed).
    pub refcounts: Vec<(u32, u32)>,
    /// A volume record to write, or `None`: the volume is gone with its
    /// maps, snapshots and saved maps.
    pub volumes: Vec<(VolumeId, Option<VolumeRecord>)>,
    /// A snapshot record to write, or `None`: gone with its saved map.
    pub snapshots: Vec<((VolumeId, SnapshotId), Option<SnapshotRecord>)>,
}

pub struct Metadata {
    database: Database,
    path: PathBuf,
}

/// A failed metadata operation. An I/O error stays one (with its OS
/// error), so a full file system is told apart from a damaged database by
/// its type, not by searching the message.
fn failed(context: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |error| match error {
        redb::Error::Io(source) => StoreError::io(format!("metadata database {context}"), source),
        error => StoreError::metadata(context, error),
    }
}

macro_rules! db {
    ($context:literal, $expression:expr) => {
        $expression.map_err(|error| failed($context)(error.into()))?
    };
}

impl Metadata {
    pub fn create(path: &Path, pool: &PoolRecord) -> Result<Metadata, StoreError> {
        if path.exists() {
            return Err(StoreError::metadata(
                format!("at {}", path.display()),
                "already exists; a new pool needs a new metadata path",
            ));
        }
        let database = db!("create", Database::create(path));
        Metadata::initialise(database, path, pool)
    }

    /// A new database on `backend` (a simulated disk), which must be empty;
    /// `label` names it in messages.
    pub fn create_on(
        backend: impl redb::StorageBackend,
        label: &Path,
        pool: &PoolRecord,
    ) -> Result<Metadata, StoreError> {
        let database = db!("create", Builder::new().create_with_backend(backend));
        Metadata::initialise(database, label, pool)
    }

    /// Writes a new pool's tables: its record and the first checkpoint.
    fn initialise(
        database: Database,
        path: &Path,
        pool: &PoolRecord,
    ) -> Result<Metadata, StoreError> {
        let metadata = Metadata {
            database,
            path: path.to_path_buf(),
        };
        let transaction = db!("begin create", metadata.database.begin_write());
        {
            let mut table = db!("open pool table", transaction.open_table(POOL));
            let record = serde_json::to_vec(pool).expect("pool record serializes");
            db!(
                "write pool record",
                table.insert(KEY_POOL, record.as_slice())
            );
            let checkpoint = Checkpoint {
                epoch: 1,
                position: 0,
                next_sequence: 1,
            };
            db!(
                "write checkpoint",
                table.insert(KEY_CHECKPOINT, checkpoint.encode().as_slice())
            );
            db!(
                "write volume counter",
                table.insert(KEY_NEXT_VOLUME_ID, 1u64.to_le_bytes().as_slice())
            );
            db!("create volume table", transaction.open_table(VOLUMES));
            db!("create chunk table", transaction.open_table(CHUNKS));
            db!("create snapshot table", transaction.open_table(SNAPSHOTS));
            db!("create saved-map table", transaction.open_table(SAVED));
            db!("create refcount table", transaction.open_table(REFCOUNTS));
        }
        db!("commit create", transaction.commit());
        Ok(metadata)
    }

    pub fn open(path: &Path) -> Result<(Metadata, Loaded), StoreError> {
        if !path.exists() {
            return Err(StoreError::metadata(
                format!("at {}", path.display()),
                "does not exist",
            ));
        }
        let database = db!("open", Database::open(path));
        Metadata::load_from(database, path)
    }

    /// Opens the database on `backend` (a simulated disk).
    pub fn open_on(
        backend: impl redb::StorageBackend,
        label: &Path,
    ) -> Result<(Metadata, Loaded), StoreError> {
        let database = db!("open", Builder::new().create_with_backend(backend));
        Metadata::load_from(database, label)
    }

    fn load_from(database: Database, path: &Path) -> Result<(Metadata, Loaded), StoreError> {
        let metadata = Metadata {
            database,
            path: path.to_path_buf(),
        };
        let loaded = metadata.load()?;
        Ok((metadata, loaded))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let corrupt =
            |what: &str| StoreError::metadata("load", format!("{what} is missing or damaged"));
        let transaction = db!("begin load", self.database.begin_read());
        let pool_table = db!("open pool table", transaction.open_table(POOL));
        let pool_bytes = db!("read pool record", pool_table.get(KEY_POOL))
            .ok_or_else(|| corrupt("pool record"))?;
        let pool: PoolRecord =
            serde_json::from_slice(pool_bytes.value()).map_err(|_| corrupt("pool record"))?;
        let checkpoint_bytes = db!("read checkpoint", pool_table.get(KEY_CHECKPOINT))
            .ok_or_else(|| corrupt("checkpoint"))?;
        let checkpoint =
            Checkpoint::decode(checkpoint_bytes.value()).ok_or_else(|| corrupt("checkpoint"))?;
        let mut volumes = Vec::new();
        let volume_table = db!("open volume table", transaction.open_table(VOLUMES));
        for item in db!("list volumes", volume_table.iter()) {
            let (key, value) = db!("read volume", item);
            let record: VolumeRecord =
                serde_json::from_slice(value.value()).map_err(|_| corrupt("a volume record"))?;
            volumes.push((VolumeId(key.value()), record));
        }
        let mut chunks = Vec::new();
        let chunk_table = db!("open chunk table", transaction.open_table(CHUNKS));
        for item in db!("list chunks", chunk_table.iter()) {
            let (key, value) = db!("read chunk", item);
            let (volume, logical) = key.value();
            let (packed, birth) = value.value();
            chunks.push((VolumeId(volume), logical, ChunkEntry::unpack(packed, birth)));
        }
        let mut snapshots = Vec::new();
        let snapshot_table = db!("open snapshot table", transaction.open_table(SNAPSHOTS));
        for item in db!("list snapshots", snapshot_table.iter()) {
            let (key, value) = db!("read snapshot", item);
            let (volume, snapshot) = key.value();
            let record: SnapshotRecord =
                serde_json::from_slice(value.value()).map_err(|_| corrupt("a snapshot record"))?;
            snapshots.push((VolumeId(volume), SnapshotId(snapshot), record));
        }
        let mut saved = Vec::new();
        let saved_table = db!("open saved-map table", transaction.open_table(SAVED));
        for item in db!("list saved maps", saved_table.iter()) {
            let (key, value) = db!("read saved map", item);
            let (volume, snapshot, logical) = key.value();
            let (packed, birth) = value.value();
            saved.push((
                VolumeId(volume),
                SnapshotId(snapshot),
                logical,
                ChunkEntry::unpack(packed, birth),
            ));
        }
        let mut refcounts = Vec::new();
        let refcount_table = db!("open refcount table", transaction.open_table(REFCOUNTS));
        for item in db!("list refcounts", refcount_table.iter()) {
            let (key, value) = db!("read refcount", item);
            let physical = u32::try_from(key.value()).map_err(|_| corrupt("a refcount"))?;
            let count = u32::try_from(value.value()).map_err(|_| corrupt("a refcount"))?;
            refcounts.push((physical, count));
        }
        Ok(Loaded {
            pool,
            checkpoint,
            volumes,
            chunks,
            snapshots,
            saved,
            refcounts,
        })
    }

    /// Adds a volume and takes the next id, in one transaction; with no
    /// record, only takes the id (a clone's record is written by the
    /// checkpoint that commits its map).
    pub fn add_volume(&self, record: Option<&VolumeRecord>) -> Result<VolumeId, StoreError> {
        let transaction = db!("begin volume create", self.database.begin_write());
        let id;
        {
            let mut pool_table = db!("open pool table", transaction.open_table(POOL));
            let counter = db!("read volume counter", pool_table.get(KEY_NEXT_VOLUME_ID))
                .map(|value| value.value().to_vec())
                .ok_or_else(|| StoreError::metadata("volume create", "volume counter missing"))?;
            id =
                u64::from_le_bytes(counter.try_into().map_err(|_| {
                    StoreError::metadata("volume create", "volume counter damaged")
                })?);
            db!(
                "bump volume counter",
                pool_table.insert(KEY_NEXT_VOLUME_ID, (id + 1).to_le_bytes().as_slice())
            );
            if let Some(record) = record {
                let mut volume_table = db!("open volume table", transaction.open_table(VOLUMES));
                let bytes = serde_json::to_vec(record).expect("volume record serializes");
                db!("write volume", volume_table.insert(id, bytes.as_slice()));
            }
        }
        db!("commit volume create", transaction.commit());
        Ok(VolumeId(id))
    }

    /// Removes the rows of a volume that no longer exists (left by an older
    /// version that deleted volumes outside a checkpoint).
    pub fn remove_orphans(&self, id: VolumeId) -> Result<(), StoreError> {
        let transaction = db!("begin volume delete", self.database.begin_write());
        remove_volume_rows(&transaction, id)?;
        db!("commit volume delete", transaction.commit());
        Ok(())
    }

    /// Writes every change and the new checkpoint in one transaction.
    pub fn checkpoint(&self, changes: &Changes, checkpoint: Checkpoint) -> Result<(), StoreError> {
        let transaction = db!("begin checkpoint", self.database.begin_write());
        {
            let mut chunk_table = db!("open chunk table", transaction.open_table(CHUNKS));
            for ((volume, logical), entry) in &changes.chunks {
                match entry {
                    Some(entry) => {
                        db!(
                            "write chunk",
                            chunk_table.insert((volume.0, *logical), (entry.pack(), entry.birth))
                        );
                    }
                    None => {
                        db!("remove chunk", chunk_table.remove((volume.0, *logical)));
                    }
                }
            }
            drop(chunk_table);
            let mut saved_table = db!("open saved-map table", transaction.open_table(SAVED));
            for ((volume, snapshot, logical), entry) in &changes.saved {
                let key = (volume.0, snapshot.0, *logical);
                match entry {
                    Some(entry) => {
                        db!(
                            "write saved entry",
                            saved_table.insert(key, (entry.pack(), entry.birth))
                        );
                    }
                    None => {
                        db!("remove saved entry", saved_table.remove(key));
                    }
                }
            }
            drop(saved_table);
            let mut refcount_table = db!("open refcount table", transaction.open_table(REFCOUNTS));
            for (physical, count) in &changes.refcounts {
                if *count > 1 {
                    db!(
                        "write refcount",
                        refcount_table.insert(*physical as u64, *count as u64)
                    );
                } else {
                    db!("remove refcount", refcount_table.remove(*physical as u64));
                }
            }
            drop(refcount_table);
            {
                let mut snapshot_table =
                    db!("open snapshot table", transaction.open_table(SNAPSHOTS));
                let mut saved_table = db!("open saved-map table", transaction.open_table(SAVED));
                for ((volume, snapshot), record) in &changes.snapshots {
                    match record {
                        Some(record) => {
                            let bytes =
                                serde_json::to_vec(record).expect("snapshot record serializes");
                            db!(
                                "write snapshot",
                                snapshot_table.insert((volume.0, snapshot.0), bytes.as_slice())
                            );
                        }
                        None => {
                            db!(
                                "remove snapshot",
                                snapshot_table.remove((volume.0, snapshot.0))
                            );
                            db!(
                                "remove saved map",
                                saved_table.retain_in(
                                    (volume.0, snapshot.0, 0)..=(volume.0, snapshot.0, u64::MAX),
                                    |_, _| false
                                )
                            );
                        }
                    }
                }
            }
            for (volume, record) in &changes.volumes {
                match record {
                    Some(record) => {
                        let mut volume_table =
                            db!("open volume table", transaction.open_table(VOLUMES));
                        let bytes = serde_json::to_vec(record).expect("volume record serializes");
                        db!(
                            "write volume",
                            volume_table.insert(volume.0, bytes.as_slice())
                        );
                    }
                    None => remove_volume_rows(&transaction, *volume)?,
                }
            }
            let mut pool_table = db!("open pool table", transaction.open_table(POOL));
            db!(
                "write checkpoint",
                pool_table.insert(KEY_CHECKPOINT, checkpoint.encode().as_slice())
            );
        }
        db!("commit checkpoint", transaction.commit());
        Ok(())
    }

    /// Everything as stored: for the consistency scan.
    pub fn stored(&self) -> Result<Loaded, StoreError> {
        self.load()
    }
}

/// Removes a volume's record, chunk map, snapshots and saved maps.
fn remove_volume_rows(
    transaction: &redb::WriteTransaction,
    id: VolumeId,
) -> Result<(), StoreError> {
    let mut volume_table = db!("open volume table", transaction.open_table(VOLUMES));
    db!("remove volume", volume_table.remove(id.0));
    let mut chunk_table = db!("open chunk table", transaction.open_table(CHUNKS));
    db!(
        "remove chunks",
        chunk_table.retain_in((id.0, 0)..=(id.0, u64::MAX), |_, _| false)
    );
    let mut snapshot_table = db!("open snapshot table", transaction.open_table(SNAPSHOTS));
    db!(
        "remove snapshots",
        snapshot_table.retain_in((id.0, 0)..=(id.0, u64::MAX), |_, _| false)
    );
    let mut saved_table = db!("open saved-map table", transaction.open_table(SAVED));
    db!(
        "remove saved maps",
        saved_table.retain_in((id.0, 0, 0)..=(id.0, u64::MAX, u64::MAX), |_, _| false)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_of_the_database_keeps_its_os_error() {
        let full = redb::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        match failed("commit volume create")(full) {
            StoreError::Io { context, source } => {
                assert_eq!(context, "metadata database commit volume create");
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        let damaged = redb::Error::Corrupted("bad page".into());
        assert!(matches!(
            failed("load")(damaged),
            StoreError::Metadata { .. }
        ));
    }
}
