//! Chunk maps (logical chunk → physical chunk) and the free-chunk allocator.
//!
//! A chunk is allocated on the first write to any of its 16 blocks; its
//! `written` bitmap says which blocks hold data. Blocks not written read as
//! zeros, so a new chunk never needs zero-filling, and a chunk whose last
//! written block is trimmed goes back to the allocator.
//!
//! Each entry also carries its **birth epoch**: the volume's epoch when the
//! entry was made. A snapshot taken at epoch `e` reads every live entry born
//! at or before `e` (see `docs/snapshots.md`).

use std::collections::HashMap;

/// One mapped chunk: where it lives, which of its blocks hold data, and the
/// volume epoch it was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    pub physical: u32,
    pub written: u16,
    pub birth: u64,
}

impl ChunkEntry {
    /// `physical << 16 | written`; the birth epoch is stored beside it.
    pub fn pack(self) -> u64 {
        ((self.physical as u64) << 16) | self.written as u64
    }

    pub fn unpack(packed: u64, birth: u64) -> ChunkEntry {
        ChunkEntry {
            physical: (packed >> 16) as u32,
            written: packed as u16,
            birth,
        }
    }

    pub fn block_written(self, block_in_chunk: u64) -> bool {
        self.written & (1 << block_in_chunk) != 0
    }
}

/// The chunk map of one volume. Sparse: only chunks ever written are here.
#[derive(Debug, Default, Clone)]
pub struct VolumeMap {
    entries: HashMap<u64, ChunkEntry>,
}

impl VolumeMap {
    pub fn get(&self, logical: u64) -> Option<ChunkEntry> {
        self.entries.get(&logical).copied()
    }

    pub fn set(&mut self, logical: u64, entry: Option<ChunkEntry>) {
        match entry {
            Some(entry) => {
                assert!(entry.written != 0, "a mapped chunk has a written block");
                self.entries.insert(logical, entry);
            }
            None => {
                self.entries.remove(&logical);
            }
        }
    }

    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, ChunkEntry)> + '_ {
        self.entries
            .iter()
            .map(|(logical, entry)| (*logical, *entry))
    }

    /// Logical chunks in `[first, end)` that are mapped, cheaply for both
    /// small ranges of a big map and big ranges of a small map.
    pub fn mapped_in(&self, first: u64, end: u64) -> Vec<u64> {
        let mut found: Vec<u64> = if end - first <= self.entries.len() as u64 {
            (first..end)
                .filter(|logical| self.entries.contains_key(logical))
                .collect()
        } else {
            self.entries
                .keys()
                .copied()
                .filter(|logical| (first..end).contains(logical))
                .collect()
        };
        found.sort_unstable();
        found
    }
}

/// Free physical chunks, one bit each. Allocation takes the lowest free
/// chunk: chunks given back by overwrites, trims and deletions are reused
/// before any chunk never written, so a file-backed pool stays as compact
/// as its data (a cursor that moved on past them walked through the whole
/// device, and a sparse pool file grew to its full size on the host while
/// holding a fraction of it). In free space, consecutive allocations are
/// still consecutive chunks.
///
/// Except for *warm* chunks: free chunks whose space the pool file still
/// holds, because an overwrite replaced them and nothing gave their space
/// back (at most `WARM_CHUNKS_MAX`). They are handed out first, lowest
/// first (a sequential stream still gets consecutive chunks, written with
/// one system call per run; newest first gave them in descending order,
/// one call each, and J5 of bench/steady.sh lost a quarter). A stream of
/// whole-chunk overwrites then writes where the host file system has
/// blocks already, instead of punching a hole at each checkpoint and
/// filling it again (docs/store-format.md, *Giving space back*).
#[derive(Debug, Clone)]
pub struct Allocator {
    /// Warm chunks kept at most: `WARM_CHUNKS_MAX`, or a sixteenth of
    /// the chunks in a smaller pool.
    warm_max: usize,
    used: Vec<u64>,
    chunk_count: u64,
    free_count: u64,
    /// No chunk below this is free: the search for the lowest free chunk
    /// starts here.
    lowest_free: u64,
    /// Free chunks that still hold their space.
    warm: std::collections::BTreeSet<u32>,
}

/// Warm chunks kept at most (256 MiB of 64 KiB chunks; a sixteenth of a
/// smaller pool's): what a pool file may hold beyond its data because
/// overwrites freed it.
pub const WARM_CHUNKS_MAX: usize = 4096;

impl Allocator {
    pub fn new(chunk_count: u64) -> Allocator {
        Allocator {
            used: vec![0; chunk_count.div_ceil(64) as usize],
            chunk_count,
            free_count: chunk_count,
            lowest_free: 0,
            warm: std::collections::BTreeSet::new(),
            warm_max: WARM_CHUNKS_MAX.min((chunk_count / 16) as usize),
        }
    }

    /// Free chunks that still hold their space (see the type).
    pub fn warm_count(&self) -> usize {
        self.warm.len()
    }

    /// How many more chunks may be freed warm.
    pub fn warm_room(&self) -> usize {
        self.warm_max - self.warm.len()
    }

    pub fn free_count(&self) -> u64 {
        self.free_count
    }

    pub fn used_count(&self) -> u64 {
        self.chunk_count - self.free_count
    }

    pub fn is_used(&self, physical: u32) -> bool {
        let physical = physical as u64;
        self.used[(physical / 64) as usize] & (1 << (physical % 64)) != 0
    }

    /// Marks a chunk used while loading maps; false if it already was,
    /// which means two map entries share it.
    pub fn mark_used(&mut self, physical: u32) -> bool {
        assert!(
            (physical as u64) < self.chunk_count,
            "physical chunk {physical} out of range"
        );
        if self.is_used(physical) {
            return false;
        }
        self.warm.remove(&physical);
        self.set_used(physical);
        true
    }

    fn set_used(&mut self, physical: u32) {
        let physical = physical as u64;
        self.used[(physical / 64) as usize] |= 1 << (physical % 64);
        self.free_count -= 1;
    }

    /// The lowest warm chunk, or else the lowest free chunk, now used.
    pub fn allocate(&mut self) -> Option<u32> {
        if self.free_count == 0 {
            return None;
        }
        if let Some(physical) = self.warm.pop_first() {
            assert!(!self.is_used(physical), "warm chunk {physical} is in use");
            self.set_used(physical);
            return Some(physical);
        }
        let first_word = (self.lowest_free / 64) as usize;
        for word_index in first_word..self.used.len() {
            let word = self.used[word_index];
            if word == u64::MAX {
                continue;
            }
            let bit = (!word).trailing_zeros() as u64;
            let physical = word_index as u64 * 64 + bit;
            assert!(
                physical < self.chunk_count,
                "free_count {} but the lowest free bit {physical} is past the last chunk",
                self.free_count
            );
            self.set_used(physical as u32);
            self.lowest_free = physical + 1;
            return Some(physical as u32);
        }
        unreachable!("free_count {} but no free bit", self.free_count)
    }

    pub fn free(&mut self, physical: u32) {
        assert!(self.is_used(physical), "freeing free chunk {physical}");
        let physical = physical as u64;
        self.used[(physical / 64) as usize] &= !(1 << (physical % 64));
        self.free_count += 1;
        self.lowest_free = self.lowest_free.min(physical);
    }

    /// Frees a chunk whose space the pool file still holds: it is handed
    /// out again before any other. False (and nothing freed) when the
    /// warm limit is reached: the caller gives its space back and frees
    /// it as usual.
    pub fn free_warm(&mut self, physical: u32) -> bool {
        if self.warm.len() >= self.warm_max {
            return false;
        }
        self.free(physical);
        self.warm.insert(physical);
        true
    }

    /// The free chunks as runs `(first, count)`, lowest first.
    pub fn free_runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        let mut extend = |physical: u64, count: u64| match runs.last_mut() {
            Some((first, length)) if (*first + *length) as u64 == physical => {
                *length += count as u32
            }
            _ => runs.push((physical as u32, count as u32)),
        };
        for (word_index, word) in self.used.iter().enumerate() {
            let base = word_index as u64 * 64;
            let bits = (self.chunk_count - base).min(64);
            match *word {
                u64::MAX => {}
                0 => extend(base, bits),
                word => {
                    for bit in (0..bits).filter(|bit| word & (1 << bit) == 0) {
                        extend(base + bit, 1);
                    }
                }
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_pack() {
        let entry = ChunkEntry {
            physical: 0xfedc_ba98,
            written: 0x8001,
            birth: 7,
        };
        assert_eq!(ChunkEntry::unpack(entry.pack(), 7), entry);
        assert!(entry.block_written(0) && entry.block_written(15) && !entry.block_written(1));
    }

    #[test]
    fn warm_chunks_are_handed_out_first_lowest_first_and_up_to_their_limit() {
        let mut allocator = Allocator::new(WARM_CHUNKS_MAX as u64 * 16);
        while allocator.allocate().is_some() {}
        allocator.free(3);
        assert!(allocator.free_warm(150));
        assert!(allocator.free_warm(90));
        assert_eq!(allocator.warm_count(), 2);
        assert_eq!(allocator.free_count(), 3);
        // Warm ones first, lowest first, though 3 is lower still.
        assert_eq!(allocator.allocate(), Some(90));
        assert_eq!(allocator.allocate(), Some(150));
        assert_eq!(allocator.allocate(), Some(3));
        assert_eq!(allocator.allocate(), None);
        // At the limit a chunk is not freed: its space must be given back.
        for physical in 0..WARM_CHUNKS_MAX as u32 {
            assert!(allocator.free_warm(physical));
        }
        assert!(!allocator.free_warm(WARM_CHUNKS_MAX as u32));
        assert!(allocator.is_used(WARM_CHUNKS_MAX as u32));
        assert_eq!(allocator.free_count(), WARM_CHUNKS_MAX as u64);
    }

    #[test]
    fn allocator_hands_out_every_chunk_once() {
        let mut allocator = Allocator::new(130);
        let mut seen = std::collections::HashSet::new();
        while let Some(physical) = allocator.allocate() {
            assert!(seen.insert(physical));
            assert!(physical < 130);
        }
        assert_eq!(seen.len(), 130);
        assert_eq!(allocator.free_count(), 0);
        allocator.free(77);
        assert_eq!(allocator.allocate(), Some(77));
        assert!(!allocator.mark_used(77));
    }

    #[test]
    fn allocator_reuses_the_lowest_freed_chunk_first() {
        let mut allocator = Allocator::new(200);
        for expected in 0..100 {
            assert_eq!(allocator.allocate(), Some(expected));
        }
        // Freed behind the last allocation: taken again before chunk 100,
        // lowest first.
        for physical in [70, 3, 64, 99] {
            allocator.free(physical);
        }
        assert_eq!(allocator.allocate(), Some(3));
        assert_eq!(allocator.allocate(), Some(64));
        assert_eq!(allocator.allocate(), Some(70));
        assert_eq!(allocator.allocate(), Some(99));
        assert_eq!(allocator.allocate(), Some(100));
        assert_eq!(allocator.free_runs(), vec![(101, 99)]);
        allocator.free(5);
        allocator.free(6);
        allocator.free(63);
        allocator.free(64);
        assert_eq!(allocator.free_runs(), vec![(5, 2), (63, 2), (101, 99)]);
    }

    #[test]
    fn mapped_in_finds_ranges_both_ways() {
        let mut map = VolumeMap::default();
        for logical in [3, 10, 1000] {
            map.set(
                logical,
                Some(ChunkEntry {
                    physical: 1,
                    written: 1,
                    birth: 0,
                }),
            );
        }
        assert_eq!(map.mapped_in(0, 11), vec![3, 10]);
        assert_eq!(map.mapped_in(4, 2000), vec![10, 1000]);
        assert_eq!(map.mapped_in(0, 1), Vec::<u64>::new());
    }
}
