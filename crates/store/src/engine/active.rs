//! Small overwrites written once: which writes may go in place straight
//! from the request, and the active set that keeps their checksums honest
//! across a crash (`crate::active_set`, `docs/store-format.md`).

use super::{bug, Engine, State};
use crate::active_set::{
    choose, encode_slot, region_of, slot_offset, ACTIVE_REGIONS_MAX, SLOT_BYTES,
};
use crate::layout::{Layout, BLOCKS_PER_CHUNK, BLOCK_BYTES};
use crate::record::Record;
use crate::StoreError;
use std::collections::{BTreeSet, HashMap, HashSet};
use trireme_types::VolumeId;

/// A durable active set: its generation and regions.
pub(super) type DurableSet = (u64, BTreeSet<u32>);

/// Why a write of whole blocks took the journal instead of going in place
/// once: the first rule of `Engine::direct_chunks` that it broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Journaled {
    /// Direct writes are off (`TRIREME_DIRECT_WRITES=0`), or the pool
    /// has no active set.
    Off,
    /// Not whole blocks (a sub-block write, merged with what is there),
    /// or zeroes written to stay allocated.
    NotWholeBlocks,
    /// A snapshot of the volume is pending, or a rollback runs.
    Snapshot,
    /// A chunk it spans is not mapped (the first write there).
    Unmapped,
    /// A block it writes was never written (stale bytes on the device).
    Unwritten,
    /// A chunk is shared with a snapshot or a clone.
    Shared,
    /// A chunk was filled by a redirect since the last checkpoint.
    RedirectedSinceCheckpoint,
    /// A chunk was written in place by an applied journaled record or a
    /// copy since the last checkpoint.
    InPlaceSinceCheckpoint,
    /// A chunk is being copied (copy-on-write under way).
    Copying,
    /// A record other than a direct write is pending in a chunk.
    PendingRecord,
    /// A region is not in the durable active set yet (asked for).
    RegionInactive,
    /// A synchronous writer's (its volume's client flushed in the last
    /// 50 ms): its record, data included, goes to the device in one
    /// `O_DIRECT` write, where in place it would take two (see
    /// `journal_writer::BatchPath`).
    Synchronous,
}

impl Journaled {
    pub const ALL: [Journaled; 12] = [
        Journaled::Off,
        Journaled::NotWholeBlocks,
        Journaled::Snapshot,
        Journaled::Unmapped,
        Journaled::Unwritten,
        Journaled::Shared,
        Journaled::RedirectedSinceCheckpoint,
        Journaled::InPlaceSinceCheckpoint,
        Journaled::Copying,
        Journaled::PendingRecord,
        Journaled::RegionInactive,
        Journaled::Synchronous,
    ];

    /// Its name in metrics (`reason` label).
    pub fn name(self) -> &'static str {
        match self {
            Journaled::Off => "off",
            Journaled::NotWholeBlocks => "not_whole_blocks",
            Journaled::Snapshot => "snapshot",
            Journaled::Unmapped => "unmapped",
            Journaled::Unwritten => "unwritten",
            Journaled::Shared => "shared",
            Journaled::RedirectedSinceCheckpoint => "redirected_since_checkpoint",
            Journaled::InPlaceSinceCheckpoint => "in_place_since_checkpoint",
            Journaled::Copying => "copying",
            Journaled::PendingRecord => "pending_record",
            Journaled::RegionInactive => "region_inactive",
            Journaled::Synchronous => "synchronous",
        }
    }
}

/// How the small writes (whole blocks, not whole chunks) of a pool went,
/// since it opened: in place once, or through the journal and why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WritePathStats {
    pub direct: u64,
    /// Indexed like [`Journaled::ALL`].
    pub journaled: [u64; 12],
}

impl WritePathStats {
    pub fn count(&mut self, outcome: Result<(), Journaled>) {
        match outcome {
            Ok(()) => self.direct += 1,
            Err(reason) => self.journaled[reason as usize] += 1,
        }
    }

    /// Writes that took the journal for `reason`.
    pub fn journaled(&self, reason: Journaled) -> u64 {
        self.journaled[reason as usize]
    }
}

/// A direct write's blocks as runs, one per chunk it spans: the device
/// offset of each and its byte range in the record's data.
pub(super) fn direct_runs<'a>(
    layout: &'a Layout,
    record: &'a Record,
    direct: &'a [u32],
) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> + 'a {
    let first_chunk = record.first_block / BLOCKS_PER_CHUNK;
    direct.iter().enumerate().map(move |(index, physical)| {
        let chunk_first = (first_chunk + index as u64) * BLOCKS_PER_CHUNK;
        let from = record.first_block.max(chunk_first);
        let to = record.end_block().min(chunk_first + BLOCKS_PER_CHUNK);
        let physical_block = *physical as u64 * BLOCKS_PER_CHUNK + from - chunk_first;
        let start = ((from - record.first_block) * BLOCK_BYTES) as usize;
        let end = ((to - record.first_block) * BLOCK_BYTES) as usize;
        (layout.data_block_offset(physical_block), start..end)
    })
}

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
    /// write applied later would overwrite this one's data in place), a
    /// whole-chunk direct write is pending in a chunk this write covers
    /// only in part (its data reaches the device after this one's), or a
    /// region is not active (then it asks for it, and this write takes the
    /// journal).
    pub(super) fn direct_chunks(
        &self,
        state: &mut State,
        volume: VolumeId,
        first_block: u64,
        block_count: u64,
    ) -> Result<Vec<u32>, Journaled> {
        if self.layout.active_set_offset().is_none() || !self.direct_writes {
            return Err(Journaled::Off);
        }
        let volume_state = state.volumes.get(&volume).ok_or(Journaled::Unmapped)?;
        if !volume_state.pending_snapshots.is_empty() || volume_state.rolling_back {
            return Err(Journaled::Snapshot);
        }
        let first_chunk = first_block / BLOCKS_PER_CHUNK;
        let end_chunk = (first_block + block_count).div_ceil(BLOCKS_PER_CHUNK);
        let pending = volume_state
            .overlay
            .lookup(first_chunk * BLOCKS_PER_CHUNK, end_chunk * BLOCKS_PER_CHUNK);
        // A pending whole-chunk direct write goes to the device after the
        // buffered direct data of its batch: a later write that is not
        // whole chunks would end up under it.
        let whole_chunks = first_block.is_multiple_of(BLOCKS_PER_CHUNK)
            && block_count.is_multiple_of(BLOCKS_PER_CHUNK);
        if pending.iter().any(|segment| {
            segment.record.as_ref().is_some_and(|record| {
                !record.is_direct() || (!whole_chunks && record.is_direct_whole_chunks())
            })
        }) {
            return Err(Journaled::PendingRecord);
        }
        let mut chunks = Vec::new();
        let mut inactive = Vec::new();
        for chunk in first_chunk..end_chunk {
            let entry = volume_state.map.get(chunk).ok_or(Journaled::Unmapped)?;
            let physical = entry.physical;
            // Only blocks written already: an unwritten block's device
            // bytes are stale (a chunk's earlier life), and a torn write
            // there would leave some of them behind.
            let chunk_first = chunk * BLOCKS_PER_CHUNK;
            let from = first_block.max(chunk_first) - chunk_first;
            let to = (first_block + block_count).min(chunk_first + BLOCKS_PER_CHUNK) - chunk_first;
            let mask = (((1u32 << to) - 1) & !((1u32 << from) - 1)) as u16;
            if entry.written & mask != mask {
                return Err(Journaled::Unwritten);
            }
            if state.is_shared(volume_state, entry) {
                return Err(Journaled::Shared);
            }
            if state.fresh_since_checkpoint.contains(&physical) {
                return Err(Journaled::RedirectedSinceCheckpoint);
            }
            if state.replayed_in_place.contains(&physical) {
                return Err(Journaled::InPlaceSinceCheckpoint);
            }
            if state.copying.contains_key(&physical)
                || state.copying.values().any(|source| *source == physical)
            {
                return Err(Journaled::Copying);
            }
            let region = region_of(physical);
            if !state.active_regions.contains(&region) && !bug!(self, direct_before_active) {
                inactive.push(region);
            }
            chunks.push(physical);
        }
        if !inactive.is_empty() {
            for region in inactive {
                if state.active_regions.len() + state.activation_wanted.len() < ACTIVE_REGIONS_MAX
                    && state.activation_wanted.insert(region)
                {
                    // The applier activates it (see `activate_wanted`).
                    self.applier_wake.notify_all();
                }
            }
            return Err(Journaled::RegionInactive);
        }
        Ok(chunks)
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
    /// flushes, before any direct write may go there: the kernel may write
    /// a direct write's page back at any moment after its `pwrite`, so its
    /// region must be durable in the set first. Runs on the applier's
    /// thread (never the journal writer's); every region asked for since
    /// the last time goes in one slot write and one flush. True if it
    /// activated any.
    pub(super) fn activate_wanted(&self) -> bool {
        let Some(offset) = self.layout.active_set_offset() else {
            return false;
        };
        let _writing = self
            .active_set_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (generation, set, wanted) = {
            let mut state = self.lock();
            if state.activation_wanted.is_empty() || state.failed.is_some() {
                return false;
            }
            let wanted = std::mem::take(&mut state.activation_wanted);
            let mut set = state.active_regions.clone();
            set.extend(&wanted);
            (stage_active_set(&mut state, set.clone()), set, wanted)
        };
        let since = std::time::Instant::now();
        let result = self.write_active_set(offset, generation, &set);
        let mut state = self.lock();
        state.stalls.activations.add(since.elapsed());
        match result {
            Ok(()) => {
                settle_active_set(&mut state, set);
                // Counted as used: a region is not retired at the first
                // checkpoint after its activation, before writes came.
                state.regions_used.extend(&wanted);
                state.active_regions.extend(wanted);
                true
            }
            Err(error) => {
                self.fail(
                    &mut state,
                    format!("writing the active set failed: {error}"),
                );
                false
            }
        }
    }

    /// After a checkpoint whose records end before `next_sequence`: drops
    /// the cold regions (no direct write used them for
    /// `RETIRE_IDLE_CHECKPOINTS` checkpoints, or for one when the set is
    /// full) whose direct writes are all checkpointed (their checksums
    /// durable, matching their data), and writes the smaller set, flushed:
    /// so at most one slot is ever unflushed, and a crash that tears it
    /// leaves the other, a superset. A region in use stays: retiring it
    /// would send its next writes to the journal for an interval and cost
    /// a flush to bring it back.
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
            let state = &mut *state;
            let used = std::mem::take(&mut state.regions_used);
            for region in &state.active_regions {
                let idle = state.region_idle.entry(*region).or_default();
                *idle = if used.contains(region) { 0 } else { *idle + 1 };
            }
            // A full set (writers' requests included) makes room: every
            // region idle for an interval may go, not only cold ones.
            let crowded =
                state.active_regions.len() + state.activation_wanted.len() >= ACTIVE_REGIONS_MAX;
            let idle_enough = if crowded { 1 } else { RETIRE_IDLE_CHECKPOINTS };
            let retired: Vec<u32> = state
                .active_regions
                .iter()
                .filter(|region| {
                    state
                        .region_idle
                        .get(region)
                        .is_some_and(|idle| *idle >= idle_enough)
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
                state.region_idle.remove(region);
            }
            let set = state.active_regions.clone();
            (stage_active_set(state, set.clone()), set)
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
    ///
    /// Only chunks in `mapped_at_checkpoint`: no direct write since the
    /// checkpoint went anywhere else (docs/store-format.md, *Replay* under
    /// *Small overwrites written once*), and replay wrote the others with
    /// their true checksums. A copy-on-write copy among them carries its
    /// source's checksum: re-deriving it would adopt rot in the source.
    pub(super) fn repair_active_regions(
        &self,
        active: &Option<BTreeSet<u32>>,
        mapped_at_checkpoint: &HashSet<u32>,
    ) -> Result<u64, StoreError> {
        let in_set = |physical: u32| {
            mapped_at_checkpoint.contains(&physical)
                && active
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
                let crc = crc_fast::crc32_iscsi(&data);
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
        state.region_idle.clear();
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

/// Checkpoints (about a second each) a region stays active without a
/// direct write before it is retired.
const RETIRE_IDLE_CHECKPOINTS: u32 = 10;

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
