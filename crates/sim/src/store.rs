//! The real store over simulated disks: one seed, one history.
//!
//! A run makes a pool with `trireme_store::Pool::create_on` on a
//! [`SimDisk`] (its metadata database on a second one, as the redb file
//! sits beside the device in production) and drives it with
//! [`Background::Inline`]: no threads, the run chooses when the journal
//! writer writes, when the device is flushed, when the applier applies and
//! when a checkpoint commits. Between those steps it writes, trims,
//! flushes, reads, takes and deletes snapshots, crashes both disks (losing,
//! tearing and reordering what was not synced) and reopens the pool, which
//! replays its journal; it injects EIO and flips bits in the data.
//!
//! It checks the store against a model of each block: the value a
//! completed flush (or FUA write, or snapshot) made durable, and the values
//! acknowledged since.
//! - A read between crashes returns the newest acknowledged value.
//! - After a crash, a block reads its last flushed value or one written
//!   after it: never older, never anything else.
//! - A block whose data or checksum was flipped reads an error or its
//!   value, never wrong data; a block on a latent sector error reads EIO
//!   until written; other errors only come with an injected one.
//! - The pool's own scan is clean after recovery (without flips).
//! - Nothing in the store panics (its assertions included).

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use trireme_store::active_set::REGION_BYTES;
use trireme_store::layout::Layout;
use trireme_store::{
    Background, BugSwitches, HeldWrite, Pool, PoolOnDisk, PoolOptions, Step, Volume,
};
use trireme_types::{BlockBuf, BlockTarget, DeviceClass, PoolId, PoolName, SnapshotId};
use trireme_types::{TargetError, VolumeName};

use crate::disk::{Faults, SimDisk, SimRedbBackend};

const BLOCK_BYTES: u64 = 4096;
const BLOCKS_PER_CHUNK: u64 = 16;

/// Idle checkpoints after which the store retires an active region, plus
/// one (`RETIRE_IDLE_CHECKPOINTS` in crates/store/src/engine/active.rs).
const RETIRE_CHECKPOINTS: usize = 11;

/// One run's shape, drawn from its seed by [`StoreSimConfig::for_seed`].
#[derive(Debug, Clone)]
pub struct StoreSimConfig {
    pub steps: usize,
    pub pool_bytes: u64,
    pub volumes: usize,
    pub volume_blocks: u64,
    /// Chance per step of a crash, per thousand.
    pub crash_per_thousand: u32,
    /// Chance per step of a flipped bit in the data or checksums, per
    /// thousand.
    pub flip_per_thousand: u32,
    /// Take and delete snapshots (copy-on-write, saved maps).
    pub snapshots: bool,
    /// Random EIO on both disks.
    pub faults: Faults,
    /// Rules the store breaks on purpose (all off but in the tests that
    /// show each is caught).
    pub bugs: BugSwitches,
    /// A synchronous writer's batches go to the device as whole blocks
    /// (`PoolOptions::direct_sync`): half the seeds, so both paths run.
    pub direct_sync: bool,
    /// Some writes come as a replica's link sends them to the store: the
    /// first admitted holding the writing role (`Volume::admit_now`), the
    /// next joining it (`HeldWrite::admit_also`), all written to the
    /// journal together when the holder finishes. Half the seeds.
    pub held_writes: bool,
    pub trace: bool,
}

impl StoreSimConfig {
    pub fn for_seed(seed: u64) -> StoreSimConfig {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7374_6f72_6521_2121);
        let faulty = rng.gen_bool(0.3);
        StoreSimConfig {
            steps: rng.gen_range(150..400),
            pool_bytes: 16 << 20,
            volumes: rng.gen_range(1..=2),
            volume_blocks: rng.gen_range(8..=48) * BLOCKS_PER_CHUNK,
            crash_per_thousand: rng.gen_range(5..40),
            flip_per_thousand: if rng.gen_bool(0.3) { 10 } else { 0 },
            snapshots: rng.gen_bool(0.5),
            faults: if faulty {
                Faults {
                    read_error_per_million: 300,
                    write_error_per_million: 300,
                    sync_error_per_million: 1000,
                }
            } else {
                Faults::default()
            },
            bugs: BugSwitches::default(),
            // Drawn last: the draws above give each seed what it had.
            direct_sync: rng.gen_bool(0.5),
            held_writes: rng.gen_bool(0.5),
            trace: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSimReport {
    pub writes: u64,
    pub trims: u64,
    pub flushes: u64,
    pub reads: u64,
    pub snapshots: u64,
    pub background_steps: u64,
    pub crashes: u64,
    pub pool_failures: u64,
    pub bits_flipped: u64,
    pub injected_errors: u64,
    pub blocks_checked: u64,
    pub sectors_dropped_by_crashes: u64,
    /// Writes that went in place once (checksum records), all sessions.
    pub direct_writes: u64,
    /// Blocks read after a crash as a sector mix of their flushed value
    /// and unflushed writes (a direct write torn by the crash).
    pub torn_blocks: u64,
}

/// A block's durable value as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Durable {
    /// The data of a tag (0 is zeros).
    Tag(u64),
    /// A sector mix of tags a crash left (an unflushed direct write torn
    /// at a sector), as read after that crash.
    Bytes(Arc<Vec<u8>>),
    /// Unknown since a read of it failed after corruption.
    Unknown,
}

/// A block's history as the model knows it.
#[derive(Debug, Clone)]
struct BlockModel {
    /// Made durable by a completed flush.
    flushed: Durable,
    /// Acknowledged (or maybe written, by a request that failed) since.
    later: Vec<u64>,
}

impl BlockModel {
    fn latest(&self) -> Durable {
        match self.later.last() {
            Some(tag) => Durable::Tag(*tag),
            None => self.flushed.clone(),
        }
    }

    /// True if `block` is exactly `value` (anything, when unknown).
    fn reads_as(value: &Durable, block: &[u8]) -> bool {
        match value {
            Durable::Tag(tag) => tag_of(block) == Some(*tag),
            Durable::Bytes(bytes) => bytes.as_slice() == block,
            Durable::Unknown => true,
        }
    }

    /// What a crash may leave: the flushed value, a later one, or each
    /// 512-byte sector from one of those (a torn unflushed write; no
    /// sector ever holds bytes that no write made). `Some(true)` for a
    /// whole value, `Some(false)` for a sector mix, `None` otherwise.
    fn after_crash(&self, block: &[u8]) -> Option<bool> {
        if self.flushed == Durable::Unknown {
            return Some(true);
        }
        if BlockModel::reads_as(&self.flushed, block)
            || self
                .later
                .iter()
                .any(|tag| BlockModel::reads_as(&Durable::Tag(*tag), block))
        {
            return Some(true);
        }
        let mut candidates: Vec<Vec<u8>> = self.later.iter().map(|tag| block_data(*tag)).collect();
        match &self.flushed {
            Durable::Tag(tag) => candidates.push(block_data(*tag)),
            Durable::Bytes(bytes) => candidates.push(bytes.to_vec()),
            Durable::Unknown => {}
        }
        let sector = 512;
        let mixed = (0..block.len()).step_by(sector).all(|at| {
            candidates
                .iter()
                .any(|candidate| candidate[at..at + sector] == block[at..at + sector])
        });
        mixed.then_some(false)
    }
}

/// The bytes of a block holding `tag`: the tag, then words derived from
/// it, so any other tag's block, zeros or a mix differ.
fn block_data(tag: u64) -> Vec<u8> {
    let mut data = Vec::with_capacity(BLOCK_BYTES as usize);
    if tag == 0 {
        data.resize(BLOCK_BYTES as usize, 0);
        return data;
    }
    let mut word = tag;
    data.extend_from_slice(&tag.to_le_bytes());
    while data.len() < BLOCK_BYTES as usize {
        // splitmix64
        word = word.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = word;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        data.extend_from_slice(&(mixed ^ (mixed >> 31)).to_le_bytes());
    }
    data
}

/// The tag a block holds, or `None` for bytes no write ever made.
fn tag_of(block: &[u8]) -> Option<u64> {
    if block.iter().all(|byte| *byte == 0) {
        return Some(0);
    }
    let tag = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    (block_data(tag) == block).then_some(tag)
}

struct Run {
    seed: u64,
    config: StoreSimConfig,
    rng: StdRng,
    pool_disk: SimDisk,
    metadata_disk: SimDisk,
    layout: Layout,
    pool: Option<Arc<Pool>>,
    volumes: Vec<(VolumeName, Arc<Volume>)>,
    models: Vec<Vec<BlockModel>>,
    /// Snapshots of each volume, oldest first.
    snapshot_ids: Vec<Vec<SnapshotId>>,
    next_snapshot: u64,
    next_tag: u64,
    /// Injected errors counted so far (both disks).
    errors_seen: u64,
    /// A bit was flipped in this run: reads may fail with a checksum error.
    corrupted: bool,
    /// Regions (of the data area) holding a flipped bit in their data.
    flipped_regions: std::collections::BTreeSet<u64>,
    /// A flipped bit lay in a region of the active set at a crash: replay
    /// may have adopted it as the block's data (see `docs/store-format.md`).
    adopted_rot: bool,
    /// A latent sector error was put in the data: reads may fail with a
    /// device error (counted as an injected one).
    unreadable: bool,
    report: StoreSimReport,
    step: usize,
    /// Ranges written lately: overwrites of them find their chunks mapped
    /// (and, after a checkpoint, take the direct path).
    recent_writes: Vec<(usize, u64, u64)>,
    /// Snapshots whose deletion failed (on an injected fault): they may be
    /// gone or not.
    maybe_deleted: std::collections::BTreeSet<SnapshotId>,
}

/// Runs one seed; `Err` describes the first broken rule.
pub fn run_store_sim(seed: u64, config: StoreSimConfig) -> Result<StoreSimReport, String> {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut run = Run::new(seed, config)?;
        run.run()?;
        Ok(run.report.clone())
    }));
    match outcome {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(format!("seed {seed}: panicked: {message}"))
        }
    }
}

fn label() -> &'static Path {
    Path::new("sim:pool")
}

/// The store's bug switches by name (`sim-store --bug NAME`).
pub const BUG_NAMES: [&str; 4] = [
    "ack-before-durable",
    "skip-read-checksum",
    "apply-before-durable",
    "direct-before-active",
];

fn bug_switch<'a>(bugs: &'a mut BugSwitches, name: &str) -> Option<&'a mut bool> {
    Some(match name {
        "ack-before-durable" => &mut bugs.ack_before_durable,
        "skip-read-checksum" => &mut bugs.skip_read_checksum,
        "apply-before-durable" => &mut bugs.apply_before_durable,
        "direct-before-active" => &mut bugs.direct_before_active,
        _ => return None,
    })
}

/// Turns on the bug switch called `name` (one of [`BUG_NAMES`]).
pub fn switch_on(bugs: &mut BugSwitches, name: &str) -> Result<(), String> {
    let switch = bug_switch(bugs, name)
        .ok_or_else(|| format!("no bug switch {name}; known: {}", BUG_NAMES.join(", ")))?;
    *switch = true;
    Ok(())
}

/// The names of the switches that are on.
pub fn switched_on(bugs: &BugSwitches) -> Vec<&'static str> {
    let mut copy = *bugs;
    BUG_NAMES
        .into_iter()
        .filter(|name| bug_switch(&mut copy, name).is_some_and(|on| *on))
        .collect()
}

fn options(config: &StoreSimConfig) -> PoolOptions {
    let mut options = PoolOptions::new(Background::Inline);
    options.bugs = config.bugs;
    options.direct_sync = config.direct_sync;
    options
}

impl Run {
    fn new(seed: u64, config: StoreSimConfig) -> Result<Run, String> {
        let pool_disk = SimDisk::new(config.pool_bytes, seed);
        let metadata_disk = SimDisk::new(0, seed ^ 0x6d65_7461);
        let layout = Layout::compute(config.pool_bytes).map_err(|error| error.to_string())?;
        let pool = Pool::create_on_with(
            Arc::new(pool_disk.clone()),
            SimRedbBackend(metadata_disk.clone()),
            label(),
            PoolOnDisk {
                name: PoolName::new("sim").expect("valid name"),
                id: PoolId(1),
                class: DeviceClass::Ssd,
                uuid: (seed as u128) << 64 | 0x5349_4d21,
            },
            options(&config),
        )
        .map_err(|error| format!("creating the pool: {error}"))?;
        let mut volumes = Vec::new();
        for index in 0..config.volumes {
            let name = VolumeName::new(format!("v{index}")).expect("valid name");
            pool.create_volume(&name, config.volume_blocks * BLOCK_BYTES)
                .map_err(|error| format!("creating volume {name}: {error}"))?;
            let volume = pool.open_volume(&name).map_err(|error| error.to_string())?;
            volumes.push((name, volume));
        }
        let blocks = config.volume_blocks as usize;
        let empty = BlockModel {
            flushed: Durable::Tag(0),
            later: Vec::new(),
        };
        pool_disk.set_faults(config.faults);
        metadata_disk.set_faults(config.faults);
        Ok(Run {
            seed,
            rng: StdRng::seed_from_u64(seed),
            models: vec![vec![empty; blocks]; config.volumes],
            snapshot_ids: vec![Vec::new(); config.volumes],
            config,
            pool_disk,
            metadata_disk,
            layout,
            pool: Some(pool),
            volumes,
            next_snapshot: 1,
            next_tag: 1,
            errors_seen: 0,
            corrupted: false,
            flipped_regions: Default::default(),
            adopted_rot: false,
            unreadable: false,
            report: StoreSimReport::default(),
            step: 0,
            recent_writes: Vec::new(),
            maybe_deleted: Default::default(),
        })
    }

    fn pool(&self) -> &Arc<Pool> {
        self.pool.as_ref().expect("the pool is open between steps")
    }

    fn trace(&self, what: impl FnOnce() -> String) {
        if self.config.trace {
            println!("[{}] {}", self.step, what());
        }
    }

    fn fail(&self, what: String) -> String {
        format!("seed {} step {}: {what}", self.seed, self.step)
    }

    /// True if a disk injected an error since the last call.
    fn injected_since_last_look(&mut self) -> bool {
        let now =
            self.pool_disk.stats().injected_errors + self.metadata_disk.stats().injected_errors;
        let new = now > self.errors_seen;
        self.errors_seen = now;
        new
    }

    fn run(&mut self) -> Result<(), String> {
        while self.step < self.config.steps {
            self.step += 1;
            self.one_step()?;
        }
        // The end: everything flushed reads back, before and after a crash.
        self.config.faults = Faults::default();
        self.pool_disk.set_faults(Faults::default());
        self.metadata_disk.set_faults(Faults::default());
        if self.pool().info().failed.is_some() {
            self.crash_and_reopen()?;
        }
        self.flush()?;
        self.check_all_latest()?;
        self.crash_and_reopen()?;
        if !self.corrupted && !self.unreadable {
            let scan = self
                .pool()
                .scan()
                .map_err(|error| self.fail(format!("scan: {error}")))?;
            if !scan.is_clean() {
                return Err(self.fail(format!("the scan found problems: {scan:?}")));
            }
        }
        if let Some(pool) = self.pool.take() {
            self.volumes.clear();
            self.report.direct_writes += pool.direct_writes();
            pool.shutdown()
                .map_err(|error| self.fail(format!("shutdown: {error}")))?;
        }
        self.report.injected_errors =
            self.pool_disk.stats().injected_errors + self.metadata_disk.stats().injected_errors;
        self.report.bits_flipped = self.pool_disk.stats().bits_flipped;
        Ok(())
    }

    fn one_step(&mut self) -> Result<(), String> {
        if self.pool().info().failed.is_some() {
            self.report.pool_failures += 1;
            if !self.injected_since_last_look() && self.errors_seen == 0 {
                return Err(self.fail(format!(
                    "the pool failed without an injected fault: {:?}",
                    self.pool().info().failed
                )));
            }
            return self.crash_and_reopen();
        }
        let roll = self.rng.gen_range(0..1000u32);
        if roll < self.config.crash_per_thousand {
            return self.crash_and_reopen();
        }
        if roll < self.config.crash_per_thousand + self.config.flip_per_thousand {
            return self.flip();
        }
        match self.rng.gen_range(0..100) {
            // No draw without `held_writes`: those seeds run as before.
            0..=34 if self.config.held_writes && self.rng.gen_bool(0.3) => self.held_writes(),
            0..=34 => self.write(),
            35..=42 => self.trim(),
            43..=50 => self.flush(),
            51..=64 => self.read(),
            65..=67 if self.config.snapshots => self.snapshot(),
            _ => self.background(),
        }
    }

    /// A range of blocks of a random volume: often whole chunks.
    fn pick_range(&mut self) -> (usize, u64, u64) {
        let volume = self.rng.gen_range(0..self.config.volumes);
        let blocks = self.config.volume_blocks;
        if self.rng.gen_bool(0.3) {
            let chunks = self.rng.gen_range(1..=2);
            let first =
                self.rng.gen_range(0..=blocks / BLOCKS_PER_CHUNK - chunks) * BLOCKS_PER_CHUNK;
            (volume, first, chunks * BLOCKS_PER_CHUNK)
        } else {
            let count = self.rng.gen_range(1..=8);
            let first = self.rng.gen_range(0..=blocks - count);
            (volume, first, count)
        }
    }

    /// An error from a request: fine only if a fault explains it.
    fn request_failed(&mut self, what: &str, error: &TargetError) -> Result<(), String> {
        let injected = self.injected_since_last_look();
        let pool_failed = self.pool().info().failed.is_some();
        let checksum = matches!(error, TargetError::Checksum { .. });
        if injected || (pool_failed && self.errors_seen > 0) || (checksum && self.corrupted) {
            self.trace(|| format!("{what} failed (explained): {error}"));
            return Ok(());
        }
        Err(self.fail(format!("{what} failed without an injected fault: {error}")))
    }

    /// `count` blocks, each holding a new tag: the tags and the data.
    fn tagged_blocks(&mut self, count: u64) -> (Vec<u64>, BlockBuf) {
        let tags: Vec<u64> = (0..count)
            .map(|_| {
                self.next_tag += 1;
                self.next_tag
            })
            .collect();
        let mut data = BlockBuf::zeroed((count * BLOCK_BYTES) as usize);
        for (index, tag) in tags.iter().enumerate() {
            let at = index * BLOCK_BYTES as usize;
            data[at..at + BLOCK_BYTES as usize].copy_from_slice(&block_data(*tag));
        }
        (tags, data)
    }

    /// A write from block `first` of `volume` was acknowledged (or may have
    /// been admitted): until a flush, its blocks may read its tags.
    fn model_written(&mut self, volume: usize, first: u64, tags: &[u64]) {
        for (index, tag) in tags.iter().enumerate() {
            self.models[volume][first as usize + index].later.push(*tag);
        }
    }

    fn write(&mut self) -> Result<(), String> {
        let (volume, first, count) = if !self.recent_writes.is_empty() && self.rng.gen_bool(0.4) {
            let (volume, first, count) =
                self.recent_writes[self.rng.gen_range(0..self.recent_writes.len())];
            // Often a part of it: other blocks of the same chunks.
            let skip = self.rng.gen_range(0..count);
            let first = (first + skip).min(self.config.volume_blocks - 1);
            let count = self
                .rng
                .gen_range(1..=count - skip)
                .min(self.config.volume_blocks - first);
            (volume, first, count)
        } else {
            self.pick_range()
        };
        if self.recent_writes.len() >= 8 {
            let index = self.rng.gen_range(0..self.recent_writes.len());
            self.recent_writes.swap_remove(index);
        }
        self.recent_writes.push((volume, first, count));
        let fua = self.rng.gen_bool(0.1);
        let (tags, data) = self.tagged_blocks(count);
        self.trace(|| format!("write v{volume} blocks {first}+{count} fua={fua}"));
        let result = self.volumes[volume].1.write(first * BLOCK_BYTES, data, fua);
        match result {
            Ok(()) => {
                self.report.writes += 1;
                self.model_written(volume, first, &tags);
                if fua {
                    // A FUA write waits for a flush through its own record,
                    // which covers every record before it.
                    self.model_flushed();
                }
                Ok(())
            }
            Err(TargetError::NoSpace { .. }) => Ok(()),
            Err(error) => {
                // Admitted and then failed (a FUA whose flush failed): it
                // may be durable or not.
                self.model_written(volume, first, &tags);
                self.request_failed("write", &error)
            }
        }
    }

    /// Up to six small writes to one volume as a replica's link hands
    /// them to the store (`Volume::admit_joining`): each acknowledged once
    /// admitted, the first holding the writing role, the next ones joining
    /// it, and all written to the journal together at the end; a write
    /// that cannot join is admitted after the ones held are written.
    fn held_writes(&mut self) -> Result<(), String> {
        let volume = self.rng.gen_range(0..self.config.volumes);
        let handle = self.volumes[volume].1.clone();
        let count = self.rng.gen_range(1..=6);
        let mut held: Option<HeldWrite<'_>> = None;
        let mut outcome = Ok(());
        for _ in 0..count {
            let blocks = self.rng.gen_range(1..=8u64.min(self.config.volume_blocks));
            let first = self.rng.gen_range(0..=self.config.volume_blocks - blocks);
            let (tags, data) = self.tagged_blocks(blocks);
            let joined = held.is_some();
            self.trace(|| format!("held write v{volume} blocks {first}+{blocks} joining={joined}"));
            let offset = first * BLOCK_BYTES;
            let result = handle.admit_joining(&mut held, offset, Arc::new(data));
            match result {
                Ok(()) => {
                    self.report.writes += 1;
                    self.model_written(volume, first, &tags);
                }
                Err(TargetError::NoSpace { .. }) => {}
                Err(error) => {
                    // As in `write`: it may have been admitted.
                    self.model_written(volume, first, &tags);
                    outcome = self.request_failed("held write", &error);
                    break;
                }
            }
        }
        if let Some(held) = held.take() {
            if let Err(error) = held.finish() {
                outcome = outcome.and(self.request_failed("held writes", &error));
            }
        }
        outcome
    }

    fn trim(&mut self) -> Result<(), String> {
        let (volume, first, count) = self.pick_range();
        self.trace(|| format!("trim v{volume} blocks {first}+{count}"));
        match self.volumes[volume]
            .1
            .trim(first * BLOCK_BYTES, count * BLOCK_BYTES, false)
        {
            Ok(()) => {
                self.report.trims += 1;
                for block in first..first + count {
                    self.models[volume][block as usize].later.push(0);
                }
                Ok(())
            }
            Err(TargetError::NoSpace { .. }) => Ok(()),
            Err(error) => {
                for block in first..first + count {
                    self.models[volume][block as usize].later.push(0);
                }
                self.request_failed("trim", &error)
            }
        }
    }

    /// Every acknowledged write is durable now.
    fn model_flushed(&mut self) {
        for blocks in &mut self.models {
            for block in blocks {
                if let Some(latest) = block.later.last() {
                    block.flushed = Durable::Tag(*latest);
                    block.later.clear();
                }
            }
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        self.trace(|| "flush".into());
        let volume = self.rng.gen_range(0..self.config.volumes);
        match self.volumes[volume].1.flush() {
            Ok(()) => {
                self.report.flushes += 1;
                self.model_flushed();
                Ok(())
            }
            Err(error) => self.request_failed("flush", &error),
        }
    }

    fn read(&mut self) -> Result<(), String> {
        let (volume, first, count) = self.pick_range();
        self.trace(|| format!("read v{volume} blocks {first}+{count}"));
        let mut buffer = vec![0u8; (count * BLOCK_BYTES) as usize];
        match self.volumes[volume]
            .1
            .read(first * BLOCK_BYTES, &mut buffer)
        {
            Ok(()) => {
                self.report.reads += 1;
                for index in 0..count {
                    let block = (first + index) as usize;
                    let at = (index * BLOCK_BYTES) as usize;
                    let data = &buffer[at..at + BLOCK_BYTES as usize];
                    let found = tag_of(data);
                    let model = &self.models[volume][block];
                    let expected = model.latest();
                    // Unknown since a failed read after corruption: any
                    // tag, never garbage.
                    let fine = match expected {
                        Durable::Unknown => found.is_some(),
                        _ => BlockModel::reads_as(&expected, data),
                    };
                    if !fine {
                        return Err(self.fail(format!(
                            "v{volume} block {block} reads {found:?}, expected {expected:?} (the newest acknowledged)"
                        )));
                    }
                    self.report.blocks_checked += 1;
                }
                Ok(())
            }
            Err(error) => self.request_failed("read", &error),
        }
    }

    fn snapshot(&mut self) -> Result<(), String> {
        let volume = self.rng.gen_range(0..self.config.volumes);
        let name = self.volumes[volume].0.clone();
        if self.snapshot_ids[volume].len() >= 3 || self.rng.gen_bool(0.3) {
            let Some(oldest) = self.snapshot_ids[volume].first().copied() else {
                return Ok(());
            };
            self.trace(|| format!("delete snapshot {oldest} of v{volume}"));
            return match self.pool().delete_snapshot(&name, oldest) {
                Ok(()) => {
                    self.snapshot_ids[volume].remove(0);
                    Ok(())
                }
                // An earlier deletion failed on a fault after its commit
                // may have reached the disk: it may be gone.
                Err(error)
                    if self.maybe_deleted.contains(&oldest)
                        && error.to_string().contains("has no snapshot") =>
                {
                    self.snapshot_ids[volume].remove(0);
                    Ok(())
                }
                Err(error) => {
                    self.maybe_deleted.insert(oldest);
                    self.store_failed("deleting a snapshot", error.to_string())
                }
            };
        }
        let id = SnapshotId(self.next_snapshot);
        self.next_snapshot += 1;
        self.trace(|| format!("snapshot {id} of v{volume}"));
        match self.volumes[volume].1.snapshot(id) {
            Ok(()) => {
                self.report.snapshots += 1;
                self.snapshot_ids[volume].push(id);
                // A snapshot waits for its record to be durable, and every
                // record before it with it.
                self.model_flushed();
                Ok(())
            }
            Err(error) => self.store_failed("a snapshot", error.to_string()),
        }
    }

    /// An error from a pool operation: fine only if a fault explains it
    /// (the operation's outcome is then unknown until recovery; the models
    /// of the snapshots are not checked).
    fn store_failed(&mut self, what: &str, error: String) -> Result<(), String> {
        let injected = self.injected_since_last_look();
        if injected || (self.errors_seen > 0 && self.pool().info().failed.is_some()) {
            self.trace(|| format!("{what} failed (explained): {error}"));
            return Ok(());
        }
        if error.contains("no space") || error.contains("is full") {
            return Ok(());
        }
        Err(self.fail(format!("{what} failed without an injected fault: {error}")))
    }

    fn background(&mut self) -> Result<(), String> {
        let step = match self.rng.gen_range(0..10) {
            0..=3 => Step::WriteJournal,
            4..=5 => Step::Sync,
            6..=8 => Step::Apply,
            _ => Step::Checkpoint,
        };
        self.trace(|| format!("background {step:?}"));
        self.report.background_steps += 1;
        match self.pool().step(step) {
            Ok(_) => Ok(()),
            Err(error) => self.store_failed("a background step", error.to_string()),
        }
    }

    /// Rot in the data or checksum region, at a moment when the journal
    /// is empty: replay never reads what is flipped (a redirect's chunk
    /// flipped before its replay would end the journal there, which no
    /// store without redundancy can tell from a torn write).
    fn flip(&mut self) -> Result<(), String> {
        for step in [Step::WriteJournal, Step::Apply, Step::Checkpoint] {
            loop {
                match self.pool().step(step) {
                    Ok(true) if step == Step::WriteJournal => continue,
                    Ok(_) => break,
                    Err(error) => {
                        return self.store_failed("emptying the journal", error.to_string())
                    }
                }
            }
        }
        // Regions retire only when cold (ten idle checkpoints): idle ones
        // then leave the active set, so there is somewhere to flip.
        for _ in 0..RETIRE_CHECKPOINTS {
            if let Err(error) = self.pool().step(Step::Checkpoint) {
                return self.store_failed("retiring active regions", error.to_string());
            }
        }
        if self.pool().journal_stats().journal_used_bytes != 0 {
            return Ok(());
        }
        // Without snapshots no apply pass reads data (copy-on-write does),
        // so a latent error there only fails the reads of its blocks.
        if !self.config.snapshots && self.rng.gen_bool(0.5) {
            let data_bytes = self.config.pool_bytes - self.layout.data_offset;
            let offset = self.layout.data_offset + self.pool_disk.random_below(data_bytes);
            self.pool_disk.add_latent_error(offset);
            self.trace(|| format!("latent sector error at byte {offset}"));
            self.unreadable = true;
            return Ok(());
        }
        // Replay takes the checksums of the active regions' blocks from
        // their data (writes there went in place ahead of their checksum
        // records): rot there in the crash window is adopted, not
        // detected, so it is put only outside them.
        let active = self.pool().regions_maybe_active();
        let from = self.layout.checksum_offset;
        let offset = from + self.pool_disk.random_below(self.config.pool_bytes - from);
        let region = if offset >= self.layout.data_offset {
            (offset - self.layout.data_offset) / REGION_BYTES
        } else {
            (offset - from) / 4 / BLOCKS_PER_CHUNK * trireme_store::layout::CHUNK_BYTES
                / REGION_BYTES
        };
        if active.contains(&(region as u32)) {
            self.trace(|| format!("no flip: byte {offset} is in active region {region}"));
            return Ok(());
        }
        self.pool_disk
            .flip_bit(offset, self.pool_disk.random_below(8) as u8);
        if offset >= self.layout.data_offset {
            self.flipped_regions.insert(region);
        }
        self.trace(|| format!("flipped a bit at byte {offset}"));
        self.corrupted = true;
        Ok(())
    }

    fn crash_and_reopen(&mut self) -> Result<(), String> {
        self.report.crashes += 1;
        let (_, dropped_pool) = self.pool_disk.crash_randomly();
        let (_, dropped_metadata) = self.metadata_disk.crash_randomly();
        self.report.sectors_dropped_by_crashes += dropped_pool + dropped_metadata;
        self.trace(|| {
            format!("crash: {dropped_pool} pool and {dropped_metadata} metadata sectors lost")
        });
        // The old pool's handles are dead: dropping it writes nothing.
        self.adopted_rot = false;
        if let Some(pool) = &self.pool {
            self.report.direct_writes += pool.direct_writes();
            let active = pool.regions_maybe_active();
            self.adopted_rot = self
                .flipped_regions
                .iter()
                .any(|region| active.contains(&(*region as u32)));
        }
        self.volumes.clear();
        drop(self.pool.take());
        // Recovery runs without injected errors: a fault there only stops
        // the open, which says nothing about what survived.
        self.pool_disk.set_faults(Faults::default());
        self.metadata_disk.set_faults(Faults::default());
        let pool = Pool::open_on_with(
            Arc::new(self.pool_disk.reopen()),
            SimRedbBackend(self.metadata_disk.reopen()),
            label(),
            options(&self.config),
        )
        .map_err(|error| self.fail(format!("reopening after a crash: {error}")))?;
        for index in 0..self.config.volumes {
            let name = VolumeName::new(format!("v{index}")).expect("valid name");
            let volume = pool
                .open_volume(&name)
                .map_err(|error| self.fail(format!("opening {name} after a crash: {error}")))?;
            self.volumes.push((name, volume));
        }
        self.pool = Some(pool);
        self.check_after_crash()?;
        self.pool_disk.set_faults(self.config.faults);
        self.metadata_disk.set_faults(self.config.faults);
        self.injected_since_last_look();
        Ok(())
    }

    /// Every block reads its last flushed value or a later one; the model
    /// then starts again from what was read (recovery made it durable).
    fn check_after_crash(&mut self) -> Result<(), String> {
        let blocks = self.config.volume_blocks;
        for volume in 0..self.config.volumes {
            let mut buffer = vec![0u8; BLOCK_BYTES as usize];
            for block in 0..blocks as usize {
                let result = self.volumes[volume]
                    .1
                    .read(block as u64 * BLOCK_BYTES, &mut buffer);
                let model = &self.models[volume][block];
                match result {
                    Ok(()) => {
                        let found = tag_of(&buffer);
                        let allowed = match model.flushed {
                            Durable::Unknown => found.is_some(),
                            _ => model.after_crash(&buffer).is_some(),
                        } || (found.is_none() && self.adopted_rot);
                        if !allowed {
                            return Err(self.fail(format!(
                                "after a crash v{volume} block {block} reads {found:?}; flushed {:?}, written since {:?}",
                                model.flushed, model.later
                            )));
                        }
                        let flushed = match found {
                            Some(tag) => Durable::Tag(tag),
                            None => {
                                self.report.torn_blocks += 1;
                                Durable::Bytes(Arc::new(buffer.clone()))
                            }
                        };
                        self.models[volume][block] = BlockModel {
                            flushed,
                            later: Vec::new(),
                        };
                    }
                    Err(TargetError::Checksum { .. }) if self.corrupted => {
                        self.models[volume][block] = BlockModel {
                            flushed: Durable::Unknown,
                            later: Vec::new(),
                        };
                    }
                    Err(TargetError::Device(_))
                        if self.unreadable && self.injected_since_last_look() =>
                    {
                        self.models[volume][block] = BlockModel {
                            flushed: Durable::Unknown,
                            later: Vec::new(),
                        };
                    }
                    Err(error) => {
                        return Err(self.fail(format!(
                            "after a crash v{volume} block {block} fails to read: {error}"
                        )))
                    }
                }
                self.report.blocks_checked += 1;
            }
        }
        Ok(())
    }

    /// Between crashes every block reads its newest acknowledged value.
    fn check_all_latest(&mut self) -> Result<(), String> {
        let blocks = self.config.volume_blocks;
        let mut buffer = vec![0u8; BLOCK_BYTES as usize];
        for volume in 0..self.config.volumes {
            for block in 0..blocks as usize {
                let result = self.volumes[volume]
                    .1
                    .read(block as u64 * BLOCK_BYTES, &mut buffer);
                let expected = self.models[volume][block].latest();
                match result {
                    Ok(()) => {
                        let found = tag_of(&buffer);
                        let fine = match &expected {
                            Durable::Unknown => found.is_some(),
                            _ => BlockModel::reads_as(&expected, &buffer),
                        };
                        if !fine {
                            return Err(self.fail(format!(
                                "v{volume} block {block} reads {found:?}, expected {expected:?}"
                            )));
                        }
                    }
                    Err(TargetError::Checksum { .. }) if self.corrupted => {}
                    Err(TargetError::Device(_))
                        if self.unreadable && self.injected_since_last_look() => {}
                    Err(error) => {
                        return Err(
                            self.fail(format!("v{volume} block {block} fails to read: {error}"))
                        )
                    }
                }
                self.report.blocks_checked += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_s_tag_reads_back_and_anything_else_does_not() {
        assert_eq!(tag_of(&block_data(0)), Some(0));
        assert_eq!(tag_of(&block_data(77)), Some(77));
        let mut torn = block_data(77);
        torn[2048..].copy_from_slice(&block_data(78)[2048..]);
        assert_eq!(tag_of(&torn), None);
        let mut flipped = block_data(77);
        flipped[100] ^= 1;
        assert_eq!(tag_of(&flipped), None);
    }
}
