//! A simulated disk: an in-memory device with a volatile write cache,
//! driven by a seeded random source, for the real store
//! (`trireme_store::Disk`) and its redb metadata (`redb::StorageBackend`).
//!
//! It keeps two images: the **durable** one (what a power cut leaves) and
//! the **current** one (what reads see), and the writes made since the
//! last sync, in order. [`SimDisk::crash`] decides, for each 512-byte
//! sector those writes touched, how many of them reached the medium: a
//! prefix of that sector's writes, chosen per sector. So a crash
//! - loses unsynced writes (a prefix of none),
//! - tears a write at sector boundaries (some of its sectors got there),
//! - reorders unsynced writes (a later write's sector got there, an
//!   earlier one's did not),
//!
//! and never makes up data: every sector holds what it held at some moment
//! (sector writes are atomic, as on real devices). A sync makes everything
//! written before it durable.
//!
//! Faults on demand or at random ([`Faults`]): EIO from reads, writes and
//! syncs; latent sector errors (a sector that reads EIO until it is
//! written again); bit flips in durable data.
//!
//! After a crash the old handles answer EIO to everything (the machine that
//! held them is gone); [`SimDisk::reopen`] gives the handle a restarted
//! node opens the pool with.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The unit a device writes atomically.
pub const SECTOR_BYTES: u64 = 512;

/// Random faults, each a chance per million operations of its kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub read_error_per_million: u32,
    pub write_error_per_million: u32,
    pub sync_error_per_million: u32,
}

/// What a crash may keep of the unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKeeps {
    /// Each sector its own prefix of its writes: tears and reorders.
    AnySectors,
    /// The writes before a random point, whole, in order.
    WritesBefore,
    /// Nothing since the last sync.
    Nothing,
    /// Everything (the cache was written back just in time).
    Everything,
}

/// Counts of what the disk did, for reports and for telling an injected
/// failure from a real one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub crashes: u64,
    /// Unsynced writes seen by crashes, and how many sectors of them
    /// crashes kept and dropped.
    pub sectors_kept: u64,
    pub sectors_dropped: u64,
    /// Errors returned because of a fault, of any kind.
    pub injected_errors: u64,
    pub bits_flipped: u64,
}

struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

struct DiskState {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<PendingWrite>,
    /// Sectors that read EIO until written.
    latent: BTreeSet<u64>,
    rng: StdRng,
    faults: Faults,
    /// Bumped by a crash: handles of an older generation are dead.
    generation: u64,
    stats: DiskStats,
}

/// A handle on a simulated disk. Clones share the disk.
#[derive(Clone)]
pub struct SimDisk {
    shared: Arc<Mutex<DiskState>>,
    generation: u64,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        formatter
            .debug_struct("SimDisk")
            .field("bytes", &state.current.len())
            .field("pending_writes", &state.pending.len())
            .field("generation", &self.generation)
            .finish()
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO: {what}"))
}

impl SimDisk {
    /// A zeroed disk of `size_bytes`, its random choices drawn from `seed`.
    pub fn new(size_bytes: u64, seed: u64) -> SimDisk {
        let image = vec![0u8; size_bytes as usize];
        SimDisk {
            shared: Arc::new(Mutex::new(DiskState {
                durable: image.clone(),
                current: image,
                pending: Vec::new(),
                latent: BTreeSet::new(),
                rng: StdRng::seed_from_u64(seed ^ 0x6469_736b_2121_2121),
                faults: Faults::default(),
                generation: 0,
                stats: DiskStats::default(),
            })),
            generation: 0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The disk's state, if this handle is still alive.
    fn alive(&self) -> io::Result<MutexGuard<'_, DiskState>> {
        let state = self.lock();
        if state.generation != self.generation {
            return Err(eio("the node holding this handle crashed"));
        }
        Ok(state)
    }

    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// Bytes written and not yet synced.
    pub fn pending_writes(&self) -> usize {
        self.lock().pending.len()
    }

    /// A power cut: keeps what `keeps` says of the unsynced writes, drops
    /// the rest, and kills every handle. Returns the sectors kept and
    /// dropped.
    pub fn crash(&self, keeps: CrashKeeps) -> (u64, u64) {
        let mut state = self.lock();
        let state = &mut *state;
        let pending = std::mem::take(&mut state.pending);
        // The writes touching each sector, in the order they were made.
        let mut sectors: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (index, write) in pending.iter().enumerate() {
            if write.data.is_empty() {
                continue;
            }
            let first = write.offset / SECTOR_BYTES;
            let last = (write.offset + write.data.len() as u64 - 1) / SECTOR_BYTES;
            for sector in first..=last {
                sectors.entry(sector).or_default().push(index);
            }
        }
        let cut = match keeps {
            CrashKeeps::WritesBefore => state.rng.gen_range(0..=pending.len()),
            _ => 0,
        };
        let (mut kept, mut dropped) = (0, 0);
        for (sector, writes) in &sectors {
            let count = match keeps {
                CrashKeeps::AnySectors => state.rng.gen_range(0..=writes.len()),
                CrashKeeps::WritesBefore => writes.iter().filter(|index| **index < cut).count(),
                CrashKeeps::Nothing => 0,
                CrashKeeps::Everything => writes.len(),
            };
            kept += (count > 0) as u64;
            dropped += (count < writes.len()) as u64;
            let start = sector * SECTOR_BYTES;
            let end = (start + SECTOR_BYTES).min(state.durable.len() as u64);
            for index in &writes[..count] {
                let write = &pending[*index];
                let from = start.max(write.offset);
                let to = end.min(write.offset + write.data.len() as u64);
                state.durable[from as usize..to as usize].copy_from_slice(
                    &write.data[(from - write.offset) as usize..(to - write.offset) as usize],
                );
            }
        }
        state.current.clone_from(&state.durable);
        state.generation += 1;
        state.stats.crashes += 1;
        state.stats.sectors_kept += kept;
        state.stats.sectors_dropped += dropped;
        (kept, dropped)
    }

    /// A crash whose kind is drawn from the disk's random source.
    pub fn crash_randomly(&self) -> (u64, u64) {
        let keeps = match self.lock().rng.gen_range(0..6) {
            0..=2 => CrashKeeps::AnySectors,
            3 => CrashKeeps::WritesBefore,
            4 => CrashKeeps::Nothing,
            _ => CrashKeeps::Everything,
        };
        self.crash(keeps)
    }

    /// A live handle after a crash (the restarted node's).
    pub fn reopen(&self) -> SimDisk {
        SimDisk {
            shared: self.shared.clone(),
            generation: self.lock().generation,
        }
    }

    /// Flips one bit of durable (and current) data: rot on the medium.
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut state = self.lock();
        state.durable[offset as usize] ^= 1 << (bit % 8);
        state.current[offset as usize] ^= 1 << (bit % 8);
        for write in &mut state.pending {
            if write.offset <= offset && offset < write.offset + write.data.len() as u64 {
                // A later write-back of a cached copy would undo the rot;
                // keep the cache and the medium the same.
                write.data[(offset - write.offset) as usize] ^= 1 << (bit % 8);
            }
        }
        state.stats.bits_flipped += 1;
    }

    /// Flips a random bit in `[from, to)`; returns its byte offset.
    pub fn flip_random_bit(&self, from: u64, to: u64) -> u64 {
        let (offset, bit) = {
            let mut state = self.lock();
            (state.rng.gen_range(from..to), state.rng.gen_range(0..8u8))
        };
        self.flip_bit(offset, bit);
        offset
    }

    /// The sector holding `offset` reads EIO until it is written again.
    pub fn add_latent_error(&self, offset: u64) {
        self.lock().latent.insert(offset / SECTOR_BYTES);
    }

    /// A random number from the disk's source, for callers that choose
    /// where to put faults.
    pub fn random_below(&self, bound: u64) -> u64 {
        self.lock().rng.gen_range(0..bound)
    }

    fn chance(state: &mut DiskState, per_million: u32) -> bool {
        per_million > 0 && state.rng.gen_range(0..1_000_000) < per_million
    }

    fn check_range(state: &DiskState, offset: u64, length: usize) -> io::Result<()> {
        if offset + length as u64 > state.current.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{length} bytes at {offset} are past the end of the disk ({} bytes)",
                    state.current.len()
                ),
            ));
        }
        Ok(())
    }

    fn read(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        let mut state = self.alive()?;
        Self::check_range(&state, offset, buffer.len())?;
        state.stats.reads += 1;
        let read_error = state.faults.read_error_per_million;
        if Self::chance(&mut state, read_error) {
            state.stats.injected_errors += 1;
            return Err(eio("read"));
        }
        if !buffer.is_empty() {
            let first = offset / SECTOR_BYTES;
            let last = (offset + buffer.len() as u64 - 1) / SECTOR_BYTES;
            if state.latent.range(first..=last).next().is_some() {
                state.stats.injected_errors += 1;
                return Err(eio("latent sector error"));
            }
        }
        buffer.copy_from_slice(&state.current[offset as usize..offset as usize + buffer.len()]);
        Ok(())
    }

    fn write(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.alive()?;
        Self::check_range(&state, offset, data.len())?;
        state.stats.writes += 1;
        let write_error = state.faults.write_error_per_million;
        if Self::chance(&mut state, write_error) {
            state.stats.injected_errors += 1;
            return Err(eio("write"));
        }
        if data.is_empty() {
            return Ok(());
        }
        state.current[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        // A sector written whole is remapped: its latent error is gone.
        let first_whole = offset.div_ceil(SECTOR_BYTES);
        let end_whole = (offset + data.len() as u64) / SECTOR_BYTES;
        if end_whole > first_whole {
            let healed: Vec<u64> = state
                .latent
                .range(first_whole..end_whole)
                .copied()
                .collect();
            for sector in healed {
                state.latent.remove(&sector);
            }
        }
        state.pending.push(PendingWrite {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn write_slices(&self, slices: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        // One write of the slices joined: a crash tears it like any other.
        let joined: Vec<u8> = slices
            .iter()
            .flat_map(|slice| slice.iter().copied())
            .collect();
        self.write(&joined, offset)
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.alive()?;
        state.stats.syncs += 1;
        let sync_error = state.faults.sync_error_per_million;
        if Self::chance(&mut state, sync_error) {
            state.stats.injected_errors += 1;
            // Like Linux after a failed fsync: what was cached may or may
            // not have reached the medium, and will not be retried.
            let keep_each = state.rng.gen_bool(0.5);
            let pending = std::mem::take(&mut state.pending);
            for write in pending {
                if keep_each {
                    let at = write.offset as usize;
                    state.durable[at..at + write.data.len()].copy_from_slice(&write.data);
                }
            }
            return Err(eio("sync"));
        }
        let pending = std::mem::take(&mut state.pending);
        for write in pending {
            let at = write.offset as usize;
            state.durable[at..at + write.data.len()].copy_from_slice(&write.data);
        }
        Ok(())
    }

    fn length(&self) -> u64 {
        self.lock().current.len() as u64
    }

    /// Grows or shrinks the disk (redb's file). Immediately durable: the
    /// size is file-system metadata, which the simulation does not lose.
    fn resize(&self, length: u64) -> io::Result<()> {
        let mut state = self.alive()?;
        let length = length as usize;
        state.current.resize(length, 0);
        state.durable.resize(length, 0);
        state
            .pending
            .retain(|write| write.offset as usize + write.data.len() <= length);
        Ok(())
    }
}

impl trireme_store::Disk for SimDisk {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        self.read(buffer, offset)
    }

    fn try_read_at_nowait(&self, _buffer: &mut [u8], _offset: u64) -> bool {
        // No page cache: every read takes the blocking path, which is
        // where faults are injected.
        false
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.write(data, offset)
    }

    fn write_vectored_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.write_slices(slices, offset)
    }

    fn write_direct_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.write_slices(slices, offset)
    }

    fn parallel_direct_writes(&self) -> bool {
        // Helper threads would make a run depend on their scheduling.
        false
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.length())
    }

    fn host_bytes(&self) -> io::Result<u64> {
        Ok(self.length())
    }

    fn can_punch_holes(&self) -> bool {
        true
    }

    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()> {
        // Reads zeros from now on; like a write, not durable before a sync.
        self.write(&vec![0u8; length as usize], offset)
    }

    fn start_writeback(&self, _from: u64, _to: u64) -> io::Result<()> {
        self.alive().map(|_| ())
    }

    fn wait_writeback(&self, _from: u64, _to: u64) -> io::Result<()> {
        self.alive().map(|_| ())
    }
}

/// redb's metadata database on a simulated disk: its commits lose, tear
/// and reorder unsynced writes like the pool's journal does.
#[derive(Debug)]
pub struct SimRedbBackend(pub SimDisk);

impl redb::StorageBackend for SimRedbBackend {
    fn len(&self) -> Result<u64, io::Error> {
        drop(self.0.alive()?);
        Ok(self.0.length())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.0.read(out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.0.resize(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.0.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.0.write(data, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_store::Disk;

    const SECTOR: usize = SECTOR_BYTES as usize;

    fn read(disk: &SimDisk, offset: u64, length: usize) -> Vec<u8> {
        let mut buffer = vec![0u8; length];
        disk.read_at(&mut buffer, offset).unwrap();
        buffer
    }

    #[test]
    fn synced_writes_survive_a_crash_and_unsynced_ones_are_lost() {
        let disk = SimDisk::new(64 * 1024, 1);
        disk.write_at(&[1; 4096], 0).unwrap();
        disk.sync_data().unwrap();
        disk.write_at(&[2; 4096], 0).unwrap();
        disk.write_at(&[3; 4096], 8192).unwrap();
        assert_eq!(read(&disk, 0, 4096), vec![2; 4096], "reads see the cache");
        disk.crash(CrashKeeps::Nothing);
        let disk = disk.reopen();
        assert_eq!(read(&disk, 0, 4096), vec![1; 4096]);
        assert_eq!(read(&disk, 8192, 4096), vec![0; 4096]);
    }

    #[test]
    fn a_crash_tears_writes_at_sector_boundaries_only() {
        let mut torn_seen = false;
        for seed in 0..50 {
            let disk = SimDisk::new(64 * 1024, seed);
            disk.write_at(&[7; 8 * SECTOR], 0).unwrap();
            disk.crash(CrashKeeps::AnySectors);
            let back = read(&disk.reopen(), 0, 8 * SECTOR);
            for sector in back.chunks(SECTOR) {
                let first = sector[0];
                assert!(first == 0 || first == 7);
                assert!(
                    sector.iter().all(|byte| *byte == first),
                    "a sector is atomic"
                );
            }
            let sevens = back.chunks(SECTOR).filter(|sector| sector[0] == 7).count();
            torn_seen |= sevens > 0 && sevens < 8;
        }
        assert!(torn_seen, "some crash in 50 tore the write");
    }

    #[test]
    fn a_crash_can_keep_a_later_write_and_lose_an_earlier_one() {
        let mut reordered = false;
        for seed in 0..100 {
            let disk = SimDisk::new(64 * 1024, seed);
            disk.write_at(&[1; SECTOR], 0).unwrap();
            disk.write_at(&[2; SECTOR], 4096).unwrap();
            disk.crash(CrashKeeps::AnySectors);
            let disk = disk.reopen();
            reordered |= read(&disk, 0, 1)[0] == 0 && read(&disk, 4096, 1)[0] == 2;
        }
        assert!(reordered);
    }

    #[test]
    fn a_sector_holds_a_prefix_of_its_writes_never_a_mix() {
        for seed in 0..100 {
            let disk = SimDisk::new(64 * 1024, seed);
            // Three writes into one sector, at different bytes.
            disk.write_at(&[1; 64], 0).unwrap();
            disk.write_at(&[2; 64], 64).unwrap();
            disk.write_at(&[3; 64], 128).unwrap();
            disk.crash(CrashKeeps::AnySectors);
            let back = read(&disk.reopen(), 0, 192);
            let kept: Vec<bool> = [1u8, 2, 3]
                .iter()
                .enumerate()
                .map(|(index, value)| back[index * 64] == *value)
                .collect();
            let prefixes = [
                [false, false, false],
                [true, false, false],
                [true, true, false],
                [true, true, true],
            ];
            assert!(prefixes.contains(&[kept[0], kept[1], kept[2]]), "{kept:?}");
        }
    }

    #[test]
    fn a_crash_kills_the_old_handles() {
        let disk = SimDisk::new(4096, 1);
        let old = disk.clone();
        disk.crash(CrashKeeps::Everything);
        assert!(old.write_at(&[1], 0).is_err());
        assert!(old.sync_data().is_err());
        assert!(disk.reopen().write_at(&[1], 0).is_ok());
    }

    #[test]
    fn injected_errors_fail_reads_writes_and_syncs() {
        let disk = SimDisk::new(4096, 1);
        disk.set_faults(Faults {
            read_error_per_million: 1_000_000,
            write_error_per_million: 1_000_000,
            sync_error_per_million: 1_000_000,
        });
        assert!(disk.read_at(&mut [0; 16], 0).is_err());
        assert!(disk.write_at(&[1; 16], 0).is_err());
        assert!(disk.sync_data().is_err());
        assert_eq!(disk.stats().injected_errors, 3);
        disk.set_faults(Faults::default());
        assert_eq!(
            read(&disk, 0, 16),
            vec![0; 16],
            "the failed write wrote nothing"
        );
    }

    #[test]
    fn a_latent_sector_reads_eio_until_written_whole() {
        let disk = SimDisk::new(8192, 1);
        disk.write_at(&[5; 8192], 0).unwrap();
        disk.add_latent_error(1000);
        assert!(disk.read_at(&mut [0; 16], 512).is_err());
        assert_eq!(read(&disk, 0, 512), vec![5; 512], "other sectors read");
        disk.write_at(&[6; 16], 512).unwrap();
        assert!(
            disk.read_at(&mut [0; 16], 512).is_err(),
            "a partial write does not heal"
        );
        disk.write_at(&[6; 512], 512).unwrap();
        assert_eq!(read(&disk, 512, 512), vec![6; 512]);
    }

    #[test]
    fn a_flipped_bit_survives_crashes_and_syncs() {
        let disk = SimDisk::new(8192, 1);
        disk.write_at(&[0xff; 4096], 0).unwrap();
        disk.sync_data().unwrap();
        disk.flip_bit(100, 3);
        assert_eq!(read(&disk, 100, 1), vec![0xf7]);
        disk.crash(CrashKeeps::Everything);
        assert_eq!(read(&disk.reopen(), 100, 1), vec![0xf7]);
    }

    #[test]
    fn redb_commits_survive_crashes_on_a_simulated_disk() {
        const TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
        for seed in 0..20 {
            let disk = SimDisk::new(0, seed);
            let database = redb::Builder::new()
                .create_with_backend(SimRedbBackend(disk.clone()))
                .unwrap();
            for value in 0..5u64 {
                let transaction = database.begin_write().unwrap();
                transaction
                    .open_table(TABLE)
                    .unwrap()
                    .insert(1, value)
                    .unwrap();
                transaction.commit().unwrap();
            }
            // An uncommitted transaction's writes may reach the disk.
            let transaction = database.begin_write().unwrap();
            transaction
                .open_table(TABLE)
                .unwrap()
                .insert(1, 99)
                .unwrap();
            drop(transaction);
            disk.crash_randomly();
            drop(database);
            let database = redb::Builder::new()
                .create_with_backend(SimRedbBackend(disk.reopen()))
                .unwrap();
            let read = database.begin_read().unwrap();
            use redb::ReadableDatabase;
            let value = read
                .open_table(TABLE)
                .unwrap()
                .get(1)
                .unwrap()
                .unwrap()
                .value();
            assert_eq!(value, 4, "seed {seed}: the last commit survives");
        }
    }
}
