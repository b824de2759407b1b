//! The pool's metadata in redb: what the pool is, its volumes, their chunk
//! maps and the journal checkpoint.
//!
//! Chunk maps are written only at checkpoints, in one transaction with the
//! checkpoint that retires the journal records they came from, so the maps
//! on disk always describe exactly the records before the checkpoint.

use crate::chunk_map::ChunkEntry;
use crate::StoreError;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use trireme_types::{DeviceClass, PoolId, PoolName, VolumeId, VolumeName};

const POOL: TableDefinition<&str, &[u8]> = TableDefinition::new("pool");
const VOLUMES: TableDefinition<u64, &[u8]> = TableDefinition::new("volumes");
/// (volume id, logical chunk) → packed [`ChunkEntry`].
const CHUNKS: TableDefinition<(u64, u64), u64> = TableDefinition::new("chunks");

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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: VolumeName,
    pub size_bytes: u64,
    pub created_unix_seconds: u64,
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
}

/// The change to one map entry that a checkpoint writes.
pub type ChunkChange = ((VolumeId, u64), Option<ChunkEntry>);

pub struct Metadata {
    database: Database,
    path: PathBuf,
}

fn failed(context: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |error| StoreError::metadata(context, error)
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

    fn load(&self) -> Result<Loaded, StoreError> {
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
            chunks.push((VolumeId(volume), logical, ChunkEntry::unpack(value.value())));
        }
        Ok(Loaded {
            pool,
            checkpoint,
            volumes,
            chunks,
        })
    }

    /// Adds a volume and takes the next id, in one transaction.
    pub fn add_volume(&self, record: &VolumeRecord) -> Result<VolumeId, StoreError> {
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
            let mut volume_table = db!("open volume table", transaction.open_table(VOLUMES));
            let bytes = serde_json::to_vec(record).expect("volume record serializes");
            db!("write volume", volume_table.insert(id, bytes.as_slice()));
        }
        db!("commit volume create", transaction.commit());
        Ok(VolumeId(id))
    }

    pub fn update_volume(&self, id: VolumeId, record: &VolumeRecord) -> Result<(), StoreError> {
        let transaction = db!("begin volume update", self.database.begin_write());
        {
            let mut volume_table = db!("open volume table", transaction.open_table(VOLUMES));
            let bytes = serde_json::to_vec(record).expect("volume record serializes");
            db!("write volume", volume_table.insert(id.0, bytes.as_slice()));
        }
        db!("commit volume update", transaction.commit());
        Ok(())
    }

    /// Removes a volume and every chunk-map entry of it.
    pub fn remove_volume(&self, id: VolumeId) -> Result<(), StoreError> {
        let transaction = db!("begin volume delete", self.database.begin_write());
        {
            let mut volume_table = db!("open volume table", transaction.open_table(VOLUMES));
            db!("remove volume", volume_table.remove(id.0));
            let mut chunk_table = db!("open chunk table", transaction.open_table(CHUNKS));
            db!(
                "remove chunks",
                chunk_table.retain_in((id.0, 0)..=(id.0, u64::MAX), |_, _| false)
            );
        }
        db!("commit volume delete", transaction.commit());
        Ok(())
    }

    /// Writes the chunk-map changes and the new checkpoint in one transaction.
    pub fn checkpoint(
        &self,
        changes: &[ChunkChange],
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        let transaction = db!("begin checkpoint", self.database.begin_write());
        {
            let mut chunk_table = db!("open chunk table", transaction.open_table(CHUNKS));
            for ((volume, logical), entry) in changes {
                match entry {
                    Some(entry) => {
                        db!(
                            "write chunk",
                            chunk_table.insert((volume.0, *logical), entry.pack())
                        );
                    }
                    None => {
                        db!("remove chunk", chunk_table.remove((volume.0, *logical)));
                    }
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

    /// Every chunk-map entry as stored: for the consistency scan.
    pub fn stored_chunks(&self) -> Result<Vec<(VolumeId, u64, ChunkEntry)>, StoreError> {
        Ok(self.load()?.chunks)
    }
}
