//! Small overwrites written once: which writes may go in place straight
//! from the request, and the active set that keeps their checksums honest
//! across a crash (`crate::active_set`, `docs/store-format.md`).

use super::{bug, Engine, State};
use crate::active_set::{
    choose, encode_slot, region_of, slot_offset, ACTIVE_REGIONS_MAX, SLOT_BYTES,
};
use crate::layout::{BLOCKS_PER_CHUNK, BLOCK_BYTES};
use crate::StoreError;
use std::collections::{BTreeSet, HashMap};
use trireme_types::VolumeId;

/// A durable active set: its generation and regions.
pub(super) type DurableSet = (u64, BTreeSet<u32>);

impl Engine {
    /// The physical chunks a write of whole blocks may go to directly (one
    /// per chunk spanned), or `None` when it must take the journal: the
    /// pool has no active set, a snapshot or rollback of the volume is
    /// pending, a chunk is unmapped, a block is not written yet, a chunk
    /// is shared, filled by a redirect or
    /// written in place by a journaled record or a copy since the last
    /// checkpoint (replay would write that older data over this write's),
    /// or being copied, a record other than a direct write is
    /// pending in a chunk (a trim or redirect may remap it, and a journaled
    /// write applied later would overwrite this one's data in place), or a
    /// region is not active (then it asks for it, and this write takes the
    /// journal).
    pub(super) fn direct_chunks(
        &self,
        state: &mut State,
        volume: VolumeId,
        first_block: u64,
        block_count: u64,
    ) -> Option<Vec<u32>> {
        self.layout.active_set_offset()?;
        if !self.direct_writes {
            return None;
        }
        let volume_state = state.volumes.get(&volume)?;
        if !volume_state.pending_snapshots.is_empty() || volume_state.rolling_back {
            return None;
        }
        let first_chunk = first_block / BLOCKS_PER_CHUNK;
        let end_chunk = (first_block + block_count).div_ceil(BLOCKS_PER_CHUNK);
        let pending = volume_state
            .overlay
            .lookup(first_chunk * BLOCKS_PER_CHUNK, end_chunk * BLOCKS_PER_CHUNK);
        if pending.iter().any(|segment| {
            segment
                .record
                .as_ref()
                .is_some_and(|record| !record.is_direct())
        }) {
            return None;
        }
        let mut chunks = Vec::new();
        let mut inactive = Vec::new();
        for chunk in first_chunk..end_chunk {
            let entry = volume_state.map.get(chunk)?;
            let physical = entry.physical;
            // Only blocks written already: an unwritten block's device
            // bytes are stale (a chunk's earlier life), and a torn write
            // there would leave some of them behind.
            let chunk_first = chunk * BLOCKS_PER_CHUNK;
            let from = first_block.max(chunk_first) - chunk_first;
            let to = (first_block + block_count).min(chunk_first + BLOCKS_PER_CHUNK) - chunk_first;
            let mask = (((1u32 << to) - 1) & !((1u32 << from) - 1)) as u16;
            if entry.written & mask != mask {
                return None;
            }
            if state.is_shared(volume_state, entry)
                || state.fresh_since_checkpoint.contains(&physical)
                || state.replayed_in_place.contains(&physical)
                || state.copying.contains_key(&physical)
                || state.copying.values().any(|source| *source == physical)
            {
                return None;
            }
            let region = region_of(physical);
            if !state.active_regions.contains(&region) && !bug!(self, direct_before_active) {
                inactive.push(region);
            }
            chunks.push(physical);
        }
        if !inactive.is_empty() {
            for region in inactive {
                if state.active_regions.len() + state.activation_wanted.len() < ACTIVE_REGIONS_MAX {
                    state.activation_wanted.insert(region);
                }
            }
            return None;
        }
        Some(chunks)
    }

    /// Notes a direct write's regions (admitted with `sequence`).
    pub(super) fn note_direct(state: &mut State, chunks: &[u32], sequence: u64) {
        state.direct_writes += 1;
        for physical in chunks {
            let region = region_of(*physical);
            state.regions_used.insert(region);
            state.region_last_direct.insert(region, sequence);
        }
    }

    /// Writes the active set with the regions writers asked for, and
    /// flushes, before any direct write may go there. Once per region per
    /// checkpoint interval at most (a region stays active while written).
    pub(super) fn activate_wanted(&self) {
        let Some(offset) = self.layout.active_set_offset() else {
            return;
        };
        let _writing = self
            .active_set_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (generation, set, wanted) = {
            let mut state = self.lock();
            if state.activation_wanted.is_empty() || state.failed.is_some() {
                return;
            }
            let wanted = std::mem::take(&mut state.activation_wanted);
            let mut set = state.active_regions.clone();
            set.extend(&wanted);
            (stage_active_set(&mut state, set.clone()), set, wanted)
        };
        let result = self.write_active_set(offset, generation, &set);
        let mut state = self.lock();
        match result {
            Ok(()) => {
                settle_active_set(&mut state, set);
                // Counted as used: a region is not retired at the first
                // checkpoint after its activation, before writes came.
                state.regions_used.extend(&wanted);
                state.active_regions.extend(wanted)
            }
            Err(error) => {
                self.fail(
                    &mut state,
                    format!("writing the active set failed: {error}"),
                );
            }
        }
    }

    /// After a checkpoint whose records end before `next_sequence`: drops
    /// the regions no direct write used since the checkpoint before and
    /// whose direct writes are all checkpointed (their checksums durable,
    /// matching their data), and writes the smaller set, flushed: so at
    /// most one slot is ever unflushed, and a crash that tears it leaves
    /// the other, a superset.
    pub(super) fn retire_regions(&self, next_sequence: u64) -> Result<(), StoreError> {
        let Some(offset) = self.layout.active_set_offset() else {
            return Ok(());
        };
        let _writing = self
            .active_set_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (generation, set) = {
            let mut state = self.lock();
            let used = std::mem::take(&mut state.regions_used);
            let retired: Vec<u32> = state
                .active_regions
                .iter()
                .filter(|region| {
                    !used.contains(region)
                        && state
                            .region_last_direct
                            .get(region)
                            .is_none_or(|last| *last < next_sequence)
                })
                .copied()
                .collect();
            if retired.is_empty() {
                return Ok(());
            }
            for region in &retired {
                state.active_regions.remove(region);
                state.region_last_direct.remove(region);
            }
            let set = state.active_regions.clone();
            (stage_active_set(&mut state, set.clone()), set)
        };
        let result = self.write_active_set(offset, generation, &set);
        let mut state = self.lock();
        match result {
            Ok(()) => {
                settle_active_set(&mut state, set);
                Ok(())
            }
            Err(error) => {
                self.fail(
                    &mut state,
                    format!("writing the active set failed: {error}"),
                );
                Err(StoreError::io("writing the active set", error))
            }
        }
    }

    /// Writes `set` as generation `generation` into its slot, and flushes.
    fn write_active_set(
        &self,
        offset: u64,
        generation: u64,
        set: &BTreeSet<u32>,
    ) -> std::io::Result<()> {
        self.disk
            .write_at(
                &encode_slot(generation, set),
                slot_offset(offset, generation),
            )
            .and_then(|()| self.disk.sync_data())
    }

    /// Reads the durable active set: `Some(None)` when neither slot is
    /// valid (every region counts), `None` for a pool without one.
    pub(super) fn load_active_set(&self) -> Result<Option<Option<DurableSet>>, StoreError> {
        let Some(offset) = self.layout.active_set_offset() else {
            return Ok(None);
        };
        let mut slots = vec![0u8; 2 * SLOT_BYTES as usize];
        self.disk
            .read_at(&mut slots, offset)
            .map_err(|error| StoreError::io("reading the active set", error))?;
        let (first, second) = slots.split_at(SLOT_BYTES as usize);
        Ok(Some(choose([first, second])))
    }

    /// Replay's last step for direct writes: every written block of the
    /// durable active set's regions (all regions if no slot was valid)
    /// whose data does not match its checksum gets the checksum of its
    /// data. Such a block was written in place by a direct write that no
    /// completed flush covered (a flush covers the data and the checksum
    /// record together): its data reached the device and its record did
    /// not, or a later direct write's did, or it was torn at a sector.
    /// Returns the number of blocks repaired.
    pub(super) fn repair_active_regions(
        &self,
        active: &Option<BTreeSet<u32>>,
    ) -> Result<u64, StoreError> {
        let in_set = |physical: u32| {
            active
                .as_ref()
                .is_none_or(|set| set.contains(&region_of(physical)))
        };
        // Written blocks per physical chunk, over every live and saved entry.
        let mut written: HashMap<u32, u16> = HashMap::new();
        {
            let state = self.lock();
            for volume in state.volumes.values().filter(|volume| !volume.deleted) {
                let entries = volume.map.iter().map(|(_, entry)| entry).chain(
                    volume
                        .snapshots
                        .iter()
                        .flat_map(|snapshot| snapshot.saved.iter().map(|(_, entry)| entry)),
                );
                for entry in entries.filter(|entry| in_set(entry.physical)) {
                    *written.entry(entry.physical).or_default() |= entry.written;
                }
            }
        }
        let mut chunks: Vec<(u32, u16)> = written.into_iter().collect();
        chunks.sort_unstable();
        let mut repaired = 0;
        let mut data = vec![0u8; BLOCK_BYTES as usize];
        for (physical, bits) in chunks {
            for bit in 0..BLOCKS_PER_CHUNK {
                if bits & (1 << bit) == 0 {
                    continue;
                }
                let physical_block = physical as u64 * BLOCKS_PER_CHUNK + bit;
                if let Err(error) = self
                    .disk
                    .read_at(&mut data, self.layout.data_block_offset(physical_block))
                {
                    // Unreadable: reads of it fail the same way; nothing to
                    // compare.
                    tracing::warn!(pool = %self.pool_name, physical_block, %error, "cannot read a block of an active region");
                    continue;
                }
                let crc = crc32c::crc32c(&data);
                let mut state = self.lock();
                let state = &mut *state;
                let stored = state
                    .checksums
                    .get(&*self.disk, &self.layout, physical_block)
                    .map_err(|error| StoreError::io("reading checksums", error))?;
                if stored != crc {
                    state
                        .checksums
                        .set(&*self.disk, &self.layout, physical_block, crc)
                        .map_err(|error| StoreError::io("reading checksums", error))?;
                    repaired += 1;
                }
            }
        }
        Ok(repaired)
    }

    /// After replay and its checkpoint (every active region's checksums
    /// now match their data, durably): starts the session with an empty
    /// active set, written and flushed, in the generation after `loaded`.
    pub fn reset_active_set(&self, loaded: u64) -> Result<(), StoreError> {
        let Some(offset) = self.layout.active_set_offset() else {
            return Ok(());
        };
        let generation = loaded + 1;
        self.write_active_set(offset, generation, &BTreeSet::new())
            .map_err(|error| StoreError::io("writing the active set", error))?;
        let mut state = self.lock();
        state.active_set_generation = generation;
        state.active_regions.clear();
        state.recent_active_sets[2] = BTreeSet::new();
        Ok(())
    }

    /// Regions a crash now could leave in the durable active set (the
    /// simulator keeps injected corruption out of them: replay adopts what
    /// it finds there).
    pub fn regions_maybe_active(&self) -> BTreeSet<u32> {
        let state = self.lock();
        let mut regions = state.active_regions.clone();
        for set in &state.recent_active_sets {
            regions.extend(set);
        }
        regions
    }
}

/// Makes `set` the next generation of the active set, not yet durable: a
/// crash until its slot is flushed may leave it or the sets before it
/// (`recent_active_sets`, newest last). Returns its generation.
fn stage_active_set(state: &mut State, set: BTreeSet<u32>) -> u64 {
    state.active_set_generation += 1;
    state.recent_active_sets.rotate_left(1);
    state.recent_active_sets[2] = set;
    state.active_set_generation
}

/// `set`'s slot is durable: nothing older can come back.
fn settle_active_set(state: &mut State, set: BTreeSet<u32>) {
    state.recent_active_sets = [set.clone(), set.clone(), set];
}
