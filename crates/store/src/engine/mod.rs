//! The engine: one per pool. It owns the device, the journal state, the
//! chunk maps, the checksum cache and the metadata database.
//!
//! - `write`: requests become journal records (admit → ack; flush).
//! - `journal_writer`: the thread that writes records to the journal.
//! - `read`: reads and block status, from pending records or in place.
//! - `apply`: the background thread: make durable, apply, checkpoint.
//! - `replay`: rebuild state from the journal when a pool opens.
//!
//! One mutex guards [`State`]; nothing slow happens while holding it except
//! loading a checksum page that is not cached. Device I/O on the hot path
//! (journal writes, reads of data) happens outside the lock.

mod active;
mod admission_queue;
mod apply;
mod journal_tail;
mod journal_writer;
mod read;
mod replay;
mod snapshot;
mod stalls;
mod steps;
mod write;
mod writeback;

pub use active::{Journaled, WritePathStats};
pub use apply::run_applier;
pub use journal_writer::run_journal_writer;
pub use read::View;
pub use replay::open_engine;
pub use stalls::{AdmissionWait, StallStats, WaitTotal};
pub use steps::Step;
pub use write::HeldWrite;
pub use writeback::run_writeback;
use writeback::WritebackQueue;

use crate::checksums::{ChecksumTable, CACHE_PAGES_MAX};
use crate::chunk_map::ChunkEntry;
use crate::chunk_map::{Allocator, VolumeMap};
use crate::disk::Disk;
use crate::layout::Layout;
use crate::metadata::{Metadata, SnapshotRecord, VolumeRecord};
use crate::overlay::Overlay;
use crate::record::Record;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use trireme_types::{PoolName, SnapshotId, TargetError, VolumeId};

/// Who does a pool's background work: writing admitted records to the
/// journal, applying durable ones in place, checkpointing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Background {
    /// Their own threads, woken by the write path and by timers
    /// (production).
    Threads,
    /// No threads: the owner runs each step when it chooses
    /// ([`crate::Pool::step`]), and a caller that would wait for one does
    /// it on its own thread. The simulator drives a pool this way, so one
    /// seed gives one order of events.
    Inline,
}

/// Data held back from the device: records not yet applied (their data in
/// memory, for reads and for the applier) and in-place data applied whose
/// write-back is not started yet. Writers wait when it is reached. Counting
/// the second part here, not only in the write-back queue, lets the
/// write-back thread give room back slice by slice as the device takes the
/// data, rather than the applier a whole pass at a time after blocking on a
/// full queue (docs/store-format.md, *Bounded write-back*).
pub const HELD_BYTES_MAX: u64 = 80 << 20;

/// One snapshot of a volume: its epoch, and the entries that the volume's
/// map no longer holds but that it (and no newer snapshot) reads.
pub struct SnapshotState {
    pub id: SnapshotId,
    pub record: SnapshotRecord,
    pub saved: VolumeMap,
}

pub struct VolumeState {
    pub record: VolumeRecord,
    pub map: VolumeMap,
    pub overlay: Overlay,
    pub deleted: bool,
    pub checksum_errors: u64,
    /// Oldest first (increasing epochs).
    pub snapshots: Vec<SnapshotState>,
    /// Snapshot records admitted and not yet applied: writes admitted
    /// meanwhile reserve a chunk for every chunk they touch, as the
    /// snapshot will make them copy-on-write.
    pub pending_snapshots: Vec<SnapshotId>,
    /// A rollback is under way: writes reserve like for a pending snapshot.
    pub rolling_back: bool,
    /// When this volume's client last asked for durability (FLUSH or FUA):
    /// its small writes are a synchronous writer's for a while after
    /// (`write::is_synchronous`).
    pub last_flush_request: Option<std::time::Instant>,
}

impl VolumeState {
    /// A volume as loaded or just created: nothing mapped, nothing pending.
    pub fn new(record: VolumeRecord) -> VolumeState {
        VolumeState {
            record,
            map: VolumeMap::default(),
            overlay: Overlay::default(),
            deleted: false,
            checksum_errors: 0,
            snapshots: Vec::new(),
            pending_snapshots: Vec::new(),
            rolling_back: false,
            last_flush_request: None,
        }
    }

    /// The newest snapshot's epoch: live entries born at or before it are
    /// read by that snapshot and must not be changed in place.
    pub fn newest_snapshot_epoch(&self) -> Option<u64> {
        self.snapshots.last().map(|snapshot| snapshot.record.epoch)
    }

    pub fn snapshot_index(&self, id: SnapshotId) -> Option<usize> {
        self.snapshots.iter().position(|snapshot| snapshot.id == id)
    }

    /// What snapshot `index` holds at `chunk`: the first entry in its own
    /// saved map or a newer snapshot's, oldest first, else the live entry;
    /// it is the snapshot's if born at or before the snapshot's epoch.
    pub fn snapshot_entry(&self, index: usize, chunk: u64) -> Option<ChunkEntry> {
        let epoch = self.snapshots[index].record.epoch;
        for snapshot in &self.snapshots[index..] {
            if let Some(entry) = snapshot.saved.get(chunk) {
                return (entry.birth <= epoch).then_some(entry);
            }
        }
        self.map.get(chunk).filter(|entry| entry.birth <= epoch)
    }

    /// Every entry snapshot `index` holds: one pass over the saved maps of
    /// it and the newer snapshots, then the live map.
    pub fn snapshot_view(&self, index: usize) -> HashMap<u64, ChunkEntry> {
        let epoch = self.snapshots[index].record.epoch;
        let mut view: HashMap<u64, ChunkEntry> = HashMap::new();
        for snapshot in &self.snapshots[index..] {
            for (chunk, entry) in snapshot.saved.iter() {
                view.entry(chunk).or_insert(entry);
            }
        }
        for (chunk, entry) in self.map.iter() {
            view.entry(chunk).or_insert(entry);
        }
        view.retain(|_, entry| entry.birth <= epoch);
        view
    }
}

pub struct State {
    /// Set when the device failed in a way that leaves the journal or the
    /// in-place data uncertain: the pool refuses all I/O from then on.
    pub failed: Option<String>,
    pub shutting_down: bool,
    /// Set by a waiter that needs the applier now (journal or memory full,
    /// space that pending trims may free, a sync request).
    pub urgent: bool,
    /// A writer found fresh chunks short while freed ones wait for a
    /// checkpoint (see [`Engine::frees_waiting`]); the applier was woken.
    pub checkpoint_wanted: bool,
    /// Tests hold the applier back to leave records unapplied on purpose.
    pub applier_paused: bool,
    pub next_sequence: u64,
    /// Next free logical journal position.
    pub head: u64,
    /// Journal space before this position is free (checkpointed).
    pub tail: u64,
    pub applied_position: u64,
    pub applied_sequence: u64,
    /// Every record up to here is in the journal file.
    pub written_sequence: u64,
    /// Every record up to here is durable (a device flush covered it).
    pub durable_sequence: u64,
    pub flushing: bool,
    /// When a caller last asked for a flush: while flushes come often, the
    /// journal writer flushes each batch as soon as it is written (see
    /// `journal_writer`).
    pub last_flush_request: Option<std::time::Instant>,
    /// The journal writer waits for records (and must be woken).
    pub journal_idle: bool,
    /// The applier sleeps until woken or its timeout, and nobody has woken
    /// it since it went to sleep: see [`Engine::wake_applier_for_records`].
    pub applier_asleep: bool,
    /// A thread is writing records to the journal: the journal writer, or
    /// a caller of `write_now` that found it idle. Only one at a time, so
    /// records reach the file in sequence order.
    pub writing: bool,
    /// Batches the journal writer started while an earlier one's records
    /// were not written yet (`journal_writer`, pipelined).
    pub batches_started_ahead: u64,
    /// Records after `applied_sequence`, in sequence order.
    pub unapplied: VecDeque<Arc<Record>>,
    pub unapplied_bytes: u64,
    /// In-place data applied and handed to the write-back thread, not yet
    /// started towards the device: still held against `HELD_BYTES_MAX`.
    pub unstarted_bytes: u64,
    pub volumes: BTreeMap<VolumeId, VolumeState>,
    pub allocator: Allocator,
    /// Chunks promised to unapplied records; never more than free.
    pub reserved_chunks: u64,
    pub checksums: ChecksumTable,
    /// Chunks no longer mapped, returned to the allocator only after the
    /// next checkpoint commits maps without them: a crash before it replays
    /// from maps that still point there, so they must keep their data.
    pub deferred_frees: Vec<DeferredFree>,
    /// Chunks filled by redirects applied since the last checkpoint: no
    /// in-place write may touch them before the next one.
    pub fresh_since_checkpoint: HashSet<u32>,
    /// Chunks that records applied since the last checkpoint wrote in
    /// place (journaled writes, copy-on-write copies): replay redoes those
    /// writes, so a direct write there would be overwritten by older data.
    pub replayed_in_place: HashSet<u32>,
    /// Copies of the apply pass under way: private chunk → the shared chunk
    /// it is being copied from. The maps point at the private chunk (and its
    /// checksums are set) before its data is there, so reads of the copied
    /// blocks go to the shared chunk, which no write of the pass changes,
    /// until the pass ends.
    pub copying: HashMap<u32, u32>,
    /// The epoch the next checkpoint records: the old one while replaying
    /// (the records after it are the old epoch's), this session's after.
    pub checkpoint_epoch: u64,
    /// Map entries changed since the last checkpoint.
    pub dirty_chunks: HashSet<(VolumeId, u64)>,
    /// Regions in the durable active set that direct writes may use (see
    /// `active_set`): added once the slot naming them is durable, removed
    /// before the slot without them is written.
    pub active_regions: BTreeSet<u32>,
    /// Regions a write found inactive; the journal writer activates them.
    pub activation_wanted: BTreeSet<u32>,
    /// Regions that took a direct write since the last checkpoint.
    pub regions_used: HashSet<u32>,
    /// The sequence of the last direct write into each active region.
    pub region_last_direct: HashMap<u32, u64>,
    /// Checkpoints since each active region was last used (retired when
    /// cold, see `retire_regions`).
    pub region_idle: HashMap<u32, u32>,
    /// Direct writes admitted in this session (for tests and the simulator).
    pub direct_writes: u64,
    /// Small writes admitted in this session: in place once, or journaled
    /// and why (for metrics).
    pub write_path: WritePathStats,
    /// Where writers and the applier waited (for metrics).
    pub stalls: StallStats,
    /// Writes waiting for journal space or the unapplied-data budget, in
    /// the order they are admitted.
    pub admission: admission_queue::AdmissionQueue,
    /// Generation of the last active-set slot written.
    pub active_set_generation: u64,
    /// The sets of the last two slots written (and the one replay used):
    /// what a crash now may leave as the durable set.
    pub recent_active_sets: [BTreeSet<u32>; 3],
    /// Physical chunk → number of map entries (live and saved, of every
    /// volume) pointing at it, for chunks with more than one. A chunk
    /// listed here is never written in place.
    pub refcounts: HashMap<u32, u32>,
    /// Saved-map entries, reference counts, volume records and snapshot
    /// records changed since the last checkpoint.
    pub dirty_saved: HashSet<(VolumeId, SnapshotId, u64)>,
    pub dirty_refcounts: HashSet<u32>,
    pub dirty_volumes: HashSet<VolumeId>,
    pub dirty_snapshots: HashSet<(VolumeId, SnapshotId)>,
}

impl State {
    pub fn new(layout: &Layout) -> State {
        State {
            failed: None,
            shutting_down: false,
            urgent: false,
            checkpoint_wanted: false,
            applier_paused: false,
            next_sequence: 1,
            head: 0,
            tail: 0,
            applied_position: 0,
            applied_sequence: 0,
            written_sequence: 0,
            durable_sequence: 0,
            flushing: false,
            last_flush_request: None,
            journal_idle: false,
            applier_asleep: false,
            writing: false,
            batches_started_ahead: 0,
            unapplied: VecDeque::new(),
            unapplied_bytes: 0,
            unstarted_bytes: 0,
            volumes: BTreeMap::new(),
            allocator: Allocator::new(layout.chunk_count),
            reserved_chunks: 0,
            checksums: ChecksumTable::new(CACHE_PAGES_MAX),
            deferred_frees: Vec::new(),
            fresh_since_checkpoint: HashSet::new(),
            copying: HashMap::new(),
            replayed_in_place: HashSet::new(),
            active_regions: BTreeSet::new(),
            activation_wanted: BTreeSet::new(),
            regions_used: HashSet::new(),
            region_last_direct: HashMap::new(),
            region_idle: HashMap::new(),
            direct_writes: 0,
            write_path: WritePathStats::default(),
            stalls: StallStats::default(),
            admission: Default::default(),
            active_set_generation: 0,
            recent_active_sets: Default::default(),
            checkpoint_epoch: 0,
            dirty_chunks: HashSet::new(),
            refcounts: HashMap::new(),
            dirty_saved: HashSet::new(),
            dirty_refcounts: HashSet::new(),
            dirty_volumes: HashSet::new(),
            dirty_snapshots: HashSet::new(),
        }
    }

    /// True if the entry must not be written in place: the volume's newest
    /// snapshot reads it, or another map entry points at its chunk.
    pub fn is_shared(&self, volume: &VolumeState, entry: ChunkEntry) -> bool {
        volume
            .newest_snapshot_epoch()
            .is_some_and(|epoch| entry.birth <= epoch)
            || (!self.refcounts.is_empty() && self.refcounts.contains_key(&entry.physical))
    }

    /// One more map entry points at `physical`.
    pub fn add_reference(&mut self, physical: u32) {
        let count = self.refcounts.entry(physical).or_insert(1);
        *count += 1;
        self.dirty_refcounts.insert(physical);
    }

    /// One map entry fewer points at `physical`; the last one gives the
    /// chunk back after the next checkpoint.
    pub fn drop_reference(&mut self, physical: u32, why: FreeReason) {
        match self.refcounts.get_mut(&physical) {
            Some(count) => {
                *count -= 1;
                if *count <= 1 {
                    self.refcounts.remove(&physical);
                }
                self.dirty_refcounts.insert(physical);
            }
            None => self.deferred_frees.push(DeferredFree { physical, why }),
        }
    }

    /// A live entry leaves `volume`'s map at `chunk` (overwritten by a
    /// copy, redirected, trimmed, rolled back): the newest snapshot keeps
    /// it in its saved map if it reads it, otherwise its reference goes.
    pub fn release_entry(
        &mut self,
        volume: VolumeId,
        chunk: u64,
        entry: ChunkEntry,
        why: FreeReason,
    ) {
        let volume_state = self.volumes.get_mut(&volume).expect("live volume");
        match volume_state.snapshots.last_mut() {
            Some(newest) if entry.birth <= newest.record.epoch => {
                assert!(
                    newest.saved.get(chunk).is_none(),
                    "a saved map holds one entry per chunk"
                );
                newest.saved.set(chunk, Some(entry));
                let id = newest.id;
                self.dirty_saved.insert((volume, id, chunk));
            }
            _ => self.drop_reference(entry.physical, why),
        }
    }

    /// The invariants between the journal counters. Cheap; called after
    /// every change of them.
    pub fn validate(&self, journal_bytes: u64) {
        // Redirects may be applied once written, before they are durable;
        // everything else only once durable (see `apply`).
        assert!(self.applied_sequence <= self.written_sequence);
        assert!(self.durable_sequence <= self.written_sequence);
        assert!(self.written_sequence < self.next_sequence);
        assert!(self.tail <= self.applied_position && self.applied_position <= self.head);
        assert!(self.head - self.tail <= journal_bytes, "journal overfull");
        assert!(
            self.reserved_chunks <= self.allocator.free_count(),
            "reservations exceed free chunks"
        );
        if let Some(front) = self.unapplied.front() {
            assert_eq!(front.sequence, self.applied_sequence + 1);
            assert_eq!(front.position, self.applied_position);
        }
        assert_eq!(
            self.applied_sequence + self.unapplied.len() as u64 + 1,
            self.next_sequence
        );
    }

    /// The answer a flush of every record up to `sequence` has without
    /// waiting: an error on a failed pool, success once they are durable.
    pub fn flushed_to(&self, sequence: u64) -> Option<Result<(), TargetError>> {
        if let Some(reason) = &self.failed {
            return Some(Err(TargetError::Device(format!(
                "pool is offline: {reason}"
            ))));
        }
        (self.durable_sequence >= sequence).then_some(Ok(()))
    }

    pub fn check_usable(&self) -> Result<(), TargetError> {
        if let Some(reason) = &self.failed {
            return Err(TargetError::Device(format!("pool is offline: {reason}")));
        }
        if self.shutting_down {
            return Err(TargetError::ShuttingDown);
        }
        Ok(())
    }

    pub fn live_volume(&self, volume: VolumeId) -> Result<&VolumeState, TargetError> {
        match self.volumes.get(&volume) {
            Some(state) if !state.deleted => Ok(state),
            _ => Err(TargetError::ShuttingDown),
        }
    }
}

pub struct Engine {
    pub pool_name: PoolName,
    /// The device: every read, write and flush of it goes through here.
    pub disk: Arc<dyn Disk>,
    /// Who runs the journal writer and the applier: their threads, or
    /// the caller (the simulator, and waits in the write path).
    pub background: Background,
    pub layout: Layout,
    /// Ties journal records to this pool, so records left on a reused
    /// device by an earlier pool never replay.
    pub pool_salt: u64,
    /// Every record written in this session carries it; see `replay`.
    pub epoch: u64,
    pub metadata: Metadata,
    /// Chunks freed by a checkpoint give their space back to the host file
    /// system: a file pool that was not preallocated, on a file system
    /// that punches holes (turned off at the first refusal).
    pub punch_holes: AtomicBool,
    pub state: Mutex<State>,
    /// Signalled on every change a waiter may want: journal space, written
    /// and durable sequences, applied records, urgent work, shutdown.
    pub changed: Condvar,
    /// Wakes the applier only: when work crosses its batch threshold, when
    /// someone waits on it, or at shutdown. Writes do not wake it one by one.
    pub applier_wake: Condvar,
    /// Wakes the journal writer when it is idle and a record is admitted.
    pub journal_wake: Condvar,
    /// Serialises read-modify-write of partial blocks, so two sub-block
    /// writes to different bytes of one block both survive.
    pub partial_block_lock: Mutex<()>,
    /// Serialises metadata transactions that must not interleave
    /// (checkpoints against volume deletion).
    pub metadata_lock: Mutex<()>,
    /// Only one thread applies at a time: the applier, or a caller that
    /// needs everything applied now (scan, shutdown).
    pub apply_lock: Mutex<()>,
    /// In-place data handed to the write-back thread, and what it started
    /// and has not waited for (see `writeback`).
    pub writeback: WritebackQueue,
    /// Serialises snapshot creation (the duplicate check and the admission).
    pub snapshot_lock: Mutex<()>,
    /// Serialises writes of the active set, so slots are written in
    /// generation order, each with the set as it is when written.
    pub active_set_lock: Mutex<()>,
    /// Small overwrites may go in place once (`EngineOptions::direct_writes`).
    pub direct_writes: bool,
    /// A synchronous writer's batches go to the device with `O_DIRECT`
    /// (`EngineOptions::direct_sync`).
    pub direct_sync: bool,
    /// The journal writer starts a batch's whole chunks before it writes
    /// the records of the batch before (`EngineOptions::pipeline_batches`).
    pub pipeline_batches: bool,
    /// The journal's last partial block, for those direct batches; only
    /// the thread holding the writing role locks it.
    pub(crate) journal_tail: Mutex<journal_tail::JournalTail>,
    pub checksum_errors: AtomicU64,
    /// Rules broken on purpose, to show the simulator catches it.
    #[cfg(feature = "bug-switches")]
    pub bugs: BugSwitches,
}

/// Switches that each break one rule of the store, for the simulator's
/// proof that it catches the breakage (issue 22, item 4). Off by default;
/// compiled only with the `bug-switches` feature, never in production.
#[cfg(feature = "bug-switches")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BugSwitches {
    /// FLUSH and FUA are acknowledged once records are in the journal
    /// file, without the device flush that makes them durable.
    pub ack_before_durable: bool,
    /// Reads do not compare data with its checksum.
    pub skip_read_checksum: bool,
    /// The applier writes records in place once written, before they are
    /// durable.
    pub apply_before_durable: bool,
    /// Direct writes go in place into regions that are not in the durable
    /// active set.
    pub direct_before_active: bool,
}

/// True if bug switch `$field` is on (always false without the feature).
macro_rules! bug {
    ($engine:expr, $field:ident) => {{
        #[cfg(feature = "bug-switches")]
        let on = $engine.bugs.$field;
        #[cfg(not(feature = "bug-switches"))]
        let on = false;
        on
    }};
}
pub(crate) use bug;

/// How a pool's engine runs: who does the background work, and (for the
/// simulator) which rules it breaks on purpose.
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    pub background: Background,
    /// Small overwrites written once (see `active`). On by default;
    /// `TRIREME_DIRECT_WRITES=0` turns it off in a node (every small
    /// write then takes the journal, as before).
    pub direct_writes: bool,
    /// A synchronous writer's batches (a flush came in the last 50 ms) go
    /// to the device with `O_DIRECT` (see `journal_writer::BatchPath`). On
    /// by default; `TRIREME_DIRECT_SYNC=0` turns it off in a node.
    pub direct_sync: bool,
    /// The journal writer's helpers write the next batch's whole chunks
    /// while it writes the records of the batch before, so the device
    /// never waits for a batch to end (see `journal_writer`). On by
    /// default; `TRIREME_PIPELINE=0` turns it off in a node.
    pub pipeline_batches: bool,
    #[cfg(feature = "bug-switches")]
    pub bugs: BugSwitches,
}

impl EngineOptions {
    /// A node's pool: direct writes unless `TRIREME_DIRECT_WRITES=0`.
    pub fn production() -> EngineOptions {
        EngineOptions {
            direct_writes: std::env::var("TRIREME_DIRECT_WRITES").as_deref() != Ok("0"),
            direct_sync: std::env::var("TRIREME_DIRECT_SYNC").as_deref() != Ok("0"),
            pipeline_batches: std::env::var("TRIREME_PIPELINE").as_deref() != Ok("0"),
            ..EngineOptions::new(Background::Threads)
        }
    }

    pub fn new(background: Background) -> EngineOptions {
        EngineOptions {
            background,
            direct_writes: true,
            // Off unless asked for: tests of direct writes that flush keep
            // them (the simulator turns it on for half its seeds).
            direct_sync: false,
            // Only the journal writer thread with helpers (a file's pool,
            // `Background::Threads`) pipelines.
            pipeline_batches: true,
            #[cfg(feature = "bug-switches")]
            bugs: BugSwitches::default(),
        }
    }
}

impl Engine {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the pool offline: from now on every request fails with EIO.
    pub fn fail(&self, state: &mut State, reason: String) {
        if state.failed.is_none() {
            tracing::error!(pool = %self.pool_name, %reason, "pool taken offline");
            state.failed = Some(reason);
        }
        self.changed.notify_all();
        self.applier_wake.notify_all();
        self.journal_wake.notify_all();
    }

    /// Chunks given back by overwrites and trims wait for the next
    /// checkpoint, and more of them wait than are free: a stream of
    /// whole-chunk writes (each redirected to a fresh chunk) is about to
    /// run out of fresh chunks and fall back to the journal, so the applier
    /// checkpoints early rather than at its interval.
    pub fn frees_waiting(state: &State) -> bool {
        !state.deferred_frees.is_empty()
            && state.deferred_frees.len() as u64
                > state.allocator.free_count() - state.reserved_chunks
    }

    /// Wakes a sleeping applier when enough written records wait for it
    /// to make a pass worth it. Records only become applicable once
    /// written, so the journal writer calls this after each batch, and an
    /// admission only when written records already wait. Waking it on
    /// every admission over the threshold, as before, cost a futex call
    /// per write and woke the applier for records not yet written: in a
    /// stream of 128 KiB writes it woke about once per write (10k times a
    /// second) to find nothing to apply, and contended the pool lock with
    /// the writers.
    pub fn wake_applier_for_records(&self, state: &mut State) {
        if state.applier_asleep
            && state.written_sequence > state.applied_sequence
            && state.unapplied_bytes >= apply::APPLY_BATCH_MIN_BYTES
        {
            state.applier_asleep = false;
            self.applier_wake.notify_all();
        }
    }

    /// Asks the applier to run now.
    pub fn wake_applier(&self, state: &mut State) {
        state.urgent = true;
        self.applier_wake.notify_all();
    }

    pub fn journal_physical(&self, position: u64) -> u64 {
        self.layout.journal_offset + position % self.layout.journal_bytes
    }
}

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod in_place_tests;
#[cfg(test)]
mod replay_tests;
#[cfg(test)]
mod sync_writer_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod write_now_tests;

/// A chunk no map needs any more, waiting for the checkpoint that commits
/// maps without it (`State::deferred_frees`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferredFree {
    pub physical: u32,
    pub why: FreeReason,
}

/// Why a chunk was freed, which decides where its space goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeReason {
    /// A redirect put a fresh chunk in its place (an overwrite): its space
    /// may stay in the pool file as a warm chunk
    /// ([`crate::chunk_map::Allocator`]), since the stream that freed it is
    /// about to need as many.
    Replaced,
    /// Trimmed, copied away, deleted or left by a deleted volume: its space
    /// goes back to the host.
    Released,
}
