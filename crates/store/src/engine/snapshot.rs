//! Snapshots, clones, rollback and volume deletion: the map changes they
//! make (see `docs/snapshots.md`).
//!
//! Taking a snapshot is a journal record, ordered with the writes. Every
//! other operation here runs with the apply lock and the metadata lock held,
//! changes the maps, saved maps and reference counts in memory at the
//! applied position, and then checkpoints: the change and the checkpoint
//! commit in one redb transaction, so a crash leaves either all of it or
//! none of it, and the journal after the checkpoint replays on top of it.

use super::{Engine, FreeReason, State, VolumeState};
use crate::chunk_map::ChunkEntry;
use crate::metadata::VolumeRecord;
use crate::StoreError;
use std::sync::MutexGuard;
use trireme_types::{SnapshotId, TargetError, VolumeId, VolumeName};

/// Per snapshot of a volume: chunks it reads, and chunks that deleting it
/// would give back.
pub struct SnapshotUsage {
    pub id: SnapshotId,
    pub created_unix_seconds: u64,
    pub size_bytes: u64,
    pub chunks_read: u64,
    pub chunks_exclusive: u64,
}

fn now_unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn store_error(error: TargetError) -> StoreError {
    match error {
        TargetError::ShuttingDown => StoreError::ShutDown,
        other => StoreError::Fatal(other.to_string()),
    }
}

impl Engine {
    fn lock_apply(&self) -> MutexGuard<'_, ()> {
        self.apply_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_metadata(&self) -> MutexGuard<'_, ()> {
        self.metadata_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `change` on the state at the applied position, with no apply
    /// pass or checkpoint running, then commits it with a checkpoint.
    pub fn change_and_checkpoint<R>(
        &self,
        change: impl FnOnce(&mut State) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let _applying = self.lock_apply();
        let _metadata = self.lock_metadata();
        let result = {
            let mut state = self.lock();
            if let Some(reason) = &state.failed {
                return Err(StoreError::Fatal(reason.clone()));
            }
            change(&mut state)?
        };
        self.checkpoint_holding_locks()?;
        Ok(result)
    }

    /// Snapshot `id` of `volume`: holds every write admitted before the call
    /// and none after; returns once its record is durable and applied.
    pub fn take_snapshot(
        &self,
        volume: VolumeId,
        name: &VolumeName,
        id: SnapshotId,
    ) -> Result<(), StoreError> {
        let sequence = {
            let _creating = self
                .snapshot_lock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let size_bytes = {
                let state = self.lock();
                if let Some(reason) = &state.failed {
                    return Err(StoreError::Fatal(reason.clone()));
                }
                let volume_state = state
                    .live_volume(volume)
                    .map_err(|_| StoreError::VolumeNotFound(name.clone()))?;
                if volume_state.snapshot_index(id).is_some()
                    || volume_state.pending_snapshots.contains(&id)
                {
                    return Err(StoreError::SnapshotExists {
                        volume: name.clone(),
                        id,
                    });
                }
                volume_state.record.size_bytes
            };
            self.admit_snapshot(volume, id, now_unix_seconds(), size_bytes)
                .map_err(|error| match error {
                    TargetError::ShuttingDown => StoreError::VolumeNotFound(name.clone()),
                    other => store_error(other),
                })?
        };
        self.flush_to(sequence).map_err(store_error)?;
        // Applies every durable record, this one included, so the snapshot
        // can be read, cloned and listed as soon as this returns.
        self.apply_all(false)?;
        let state = self.lock();
        match state.volumes.get(&volume) {
            Some(volume_state) if volume_state.snapshot_index(id).is_some() => Ok(()),
            _ => Err(StoreError::VolumeNotFound(name.clone())),
        }
    }

    /// Deletes a snapshot: each saved entry that the next older snapshot
    /// reads moves to its saved map; the others lose their reference.
    pub fn delete_snapshot(
        &self,
        volume: VolumeId,
        name: &VolumeName,
        id: SnapshotId,
    ) -> Result<(), StoreError> {
        self.change_and_checkpoint(|state| {
            let volume_state = state
                .volumes
                .get_mut(&volume)
                .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))?;
            let index =
                volume_state
                    .snapshot_index(id)
                    .ok_or_else(|| StoreError::SnapshotNotFound {
                        volume: name.clone(),
                        id,
                    })?;
            let removed = volume_state.snapshots.remove(index);
            let mut dropped = Vec::new();
            let mut moved = Vec::new();
            let older = index
                .checked_sub(1)
                .map(|older| &mut volume_state.snapshots[older]);
            match older {
                Some(older) => {
                    for (chunk, entry) in removed.saved.iter() {
                        if entry.birth <= older.record.epoch {
                            assert!(
                                older.saved.get(chunk).is_none(),
                                "the older snapshot reads this entry, so it saved none"
                            );
                            older.saved.set(chunk, Some(entry));
                            moved.push((older.id, chunk));
                        } else {
                            dropped.push(entry.physical);
                        }
                    }
                }
                None => dropped.extend(removed.saved.iter().map(|(_, entry)| entry.physical)),
            }
            for (older, chunk) in moved {
                state.dirty_saved.insert((volume, older, chunk));
            }
            for physical in dropped {
                state.drop_reference(physical, FreeReason::Released);
            }
            state.dirty_snapshots.insert((volume, id));
            Ok(())
        })
    }

    /// A new volume whose map is the snapshot's view, every chunk shared.
    pub fn clone_snapshot(
        &self,
        source: VolumeId,
        source_name: &VolumeName,
        id: SnapshotId,
        name: &VolumeName,
    ) -> Result<VolumeId, StoreError> {
        self.change_and_checkpoint(|state| {
            if state
                .volumes
                .values()
                .any(|volume| !volume.deleted && &volume.record.name == name)
            {
                return Err(StoreError::VolumeExists(name.clone()));
            }
            let volume_state = state
                .volumes
                .get(&source)
                .ok_or_else(|| StoreError::VolumeNotFound(source_name.clone()))?;
            let index =
                volume_state
                    .snapshot_index(id)
                    .ok_or_else(|| StoreError::SnapshotNotFound {
                        volume: source_name.clone(),
                        id,
                    })?;
            let view = volume_state.snapshot_view(index);
            let record = VolumeRecord {
                name: name.clone(),
                size_bytes: volume_state.snapshots[index].record.size_bytes,
                created_unix_seconds: now_unix_seconds(),
                epoch: 1,
            };
            // The id only: the record is written with the map, by the
            // checkpoint. A crash in between wastes an id, never reused.
            let clone = self.metadata.add_volume(None)?;
            let mut clone_state = VolumeState::new(record);
            for (chunk, entry) in view {
                clone_state
                    .map
                    .set(chunk, Some(ChunkEntry { birth: 0, ..entry }));
                state.add_reference(entry.physical);
                state.dirty_chunks.insert((clone, chunk));
            }
            state.volumes.insert(clone, clone_state);
            state.dirty_volumes.insert(clone);
            Ok(clone)
        })
    }

    /// The volume's map becomes the snapshot's view again. Entries the
    /// snapshot reads from the live map stay as they are; every other live
    /// entry is released (saved by the newest snapshot if it reads it), and
    /// the snapshot's other entries come back with one more reference.
    pub fn rollback(
        &self,
        volume: VolumeId,
        name: &VolumeName,
        id: SnapshotId,
    ) -> Result<(), StoreError> {
        {
            let mut state = self.lock();
            let volume_state = state
                .volumes
                .get_mut(&volume)
                .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))?;
            volume_state.rolling_back = true;
        }
        // Writes admitted before the rollback are part of what it undoes.
        let result = self.apply_all(true).and_then(|()| {
            self.change_and_checkpoint(|state| self.rollback_maps(state, volume, name, id))
        });
        if let Some(volume_state) = self.lock().volumes.get_mut(&volume) {
            volume_state.rolling_back = false;
        }
        result
    }

    fn rollback_maps(
        &self,
        state: &mut State,
        volume: VolumeId,
        name: &VolumeName,
        id: SnapshotId,
    ) -> Result<(), StoreError> {
        let volume_state = state
            .volumes
            .get(&volume)
            .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))?;
        let index =
            volume_state
                .snapshot_index(id)
                .ok_or_else(|| StoreError::SnapshotNotFound {
                    volume: name.clone(),
                    id,
                })?;
        let epoch = volume_state.snapshots[index].record.epoch;
        let birth = volume_state.record.epoch;
        let mut view = volume_state.snapshot_view(index);
        let mut released = Vec::new();
        for (chunk, entry) in volume_state.map.iter() {
            let snapshot_reads_it = entry.birth <= epoch
                && volume_state.snapshots[index..]
                    .iter()
                    .all(|snapshot| snapshot.saved.get(chunk).is_none());
            if snapshot_reads_it {
                view.remove(&chunk);
            } else {
                released.push((chunk, entry));
            }
        }
        let size_bytes = volume_state
            .record
            .size_bytes
            .max(volume_state.snapshots[index].record.size_bytes);
        for (chunk, entry) in released {
            state
                .volumes
                .get_mut(&volume)
                .expect("found")
                .map
                .set(chunk, None);
            state.release_entry(volume, chunk, entry, FreeReason::Released);
            state.dirty_chunks.insert((volume, chunk));
        }
        for (chunk, entry) in view {
            state.add_reference(entry.physical);
            state
                .volumes
                .get_mut(&volume)
                .expect("found")
                .map
                .set(chunk, Some(ChunkEntry { birth, ..entry }));
            state.dirty_chunks.insert((volume, chunk));
        }
        let volume_state = state.volumes.get_mut(&volume).expect("found");
        if volume_state.record.size_bytes != size_bytes {
            volume_state.record.size_bytes = size_bytes;
            state.dirty_volumes.insert(volume);
        }
        Ok(())
    }

    /// Deletes a volume with its snapshots: every entry of its map and saved
    /// maps loses its reference (chunks shared with clones stay).
    pub fn delete_volume(&self, volume: VolumeId, name: &VolumeName) -> Result<(), StoreError> {
        // A direct write of the volume not yet in the journal would put its
        // data in place later, into chunks this frees (and a later write
        // may be given): the deletion waits until every such write is
        // written, which a flush does.
        loop {
            let target = self.lock().next_sequence - 1;
            self.flush_to(target)
                .map_err(|error| StoreError::Fatal(error.to_string()))?;
            let deleted = self.change_and_checkpoint(|state| {
                let direct_unwritten = state.unapplied.iter().any(|record| {
                    record.sequence > state.written_sequence
                        && record.volume == volume
                        && record.is_direct()
                });
                if direct_unwritten {
                    return Ok(false);
                }
                self.remove_volume(state, volume, name)?;
                Ok(true)
            })?;
            if deleted {
                return Ok(());
            }
        }
    }

    fn remove_volume(
        &self,
        state: &mut State,
        volume: VolumeId,
        name: &VolumeName,
    ) -> Result<(), StoreError> {
        {
            let removed = state
                .volumes
                .remove(&volume)
                .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))?;
            for (_, entry) in removed.map.iter() {
                state.drop_reference(entry.physical, FreeReason::Released);
            }
            for snapshot in &removed.snapshots {
                for (_, entry) in snapshot.saved.iter() {
                    state.drop_reference(entry.physical, FreeReason::Released);
                }
            }
            state.dirty_chunks.retain(|(owner, _)| *owner != volume);
            state.dirty_saved.retain(|(owner, _, _)| *owner != volume);
            state.dirty_snapshots.retain(|(owner, _)| *owner != volume);
            state.dirty_volumes.insert(volume);
            self.changed.notify_all();
            Ok(())
        }
    }

    /// A volume's snapshots with the chunks each reads and holds alone, in
    /// one pass over its maps.
    pub fn snapshot_usage(&self, volume: VolumeId) -> Option<Vec<SnapshotUsage>> {
        let state = self.lock();
        let volume_state = state.live_volume(volume).ok()?;
        let snapshots = &volume_state.snapshots;
        let epochs: Vec<u64> = snapshots.iter().map(|s| s.record.epoch).collect();
        // An entry born at `birth` is read by the snapshots from the first
        // with an epoch at or after it up to `last` (its saved map's, or the
        // newest for live entries): a difference array over the snapshots.
        let mut starts = vec![0i64; snapshots.len() + 1];
        let mut add = |birth: u64, last: usize| {
            let first = epochs.partition_point(|epoch| *epoch < birth);
            if first <= last {
                starts[first] += 1;
                starts[last + 1] -= 1;
            }
        };
        if let Some(newest) = snapshots.len().checked_sub(1) {
            for (_, entry) in volume_state.map.iter() {
                add(entry.birth, newest);
            }
        }
        let mut usage = Vec::with_capacity(snapshots.len());
        for (index, snapshot) in snapshots.iter().enumerate() {
            let mut exclusive = 0;
            for (_, entry) in snapshot.saved.iter() {
                add(entry.birth, index);
                let older_reads = index > 0 && entry.birth <= epochs[index - 1];
                if !older_reads && !state.refcounts.contains_key(&entry.physical) {
                    exclusive += 1;
                }
            }
            usage.push(SnapshotUsage {
                id: snapshot.id,
                created_unix_seconds: snapshot.record.created_unix_seconds,
                size_bytes: snapshot.record.size_bytes,
                chunks_read: 0,
                chunks_exclusive: exclusive,
            });
        }
        let mut running = 0i64;
        for (index, item) in usage.iter_mut().enumerate() {
            running += starts[index];
            item.chunks_read = running as u64;
        }
        Some(usage)
    }
}
