//! The superblock and the regions of a pool device.
//!
//! ```text
//! 0                      superblock (4 KiB)
//! active_set_offset      the active set: two 4 KiB slots (version 3)
//! journal_offset         journal ring (journal_bytes)
//! checksum_offset        crc32c of every data block, 4 bytes each, indexed by
//!                        physical block number (checksum_bytes)
//! data_offset            chunk_count chunks of CHUNK_BYTES
//! ```
//! Every field is little-endian; `docs/store-format.md` has the byte table.

use crate::StoreError;
use std::path::Path;

pub const SUPERBLOCK_BYTES: u64 = 4096;
pub const MAGIC: &[u8; 8] = b"TRIREME1";
/// 3: small overwrites written once (the active set, carved from the
/// first 8 KiB of version 2's journal; checksum records, journal kind 6).
/// 2: snapshots (journal record kind 5, birth epochs, saved maps and
/// reference counts in the metadata). Pools of version 2 are upgraded when
/// opened; version 1 is refused.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest version this trireme opens (and upgrades).
pub const FORMAT_VERSION_UPGRADABLE: u32 = 2;
/// The active set's two slots (see `active_set`), at the start of what
/// version 2 had as its journal.
pub const ACTIVE_SET_BYTES: u64 = 8192;

/// Allocation and copy-on-write unit. 64 KiB: a 4 KiB write to a shared
/// chunk copies 16x its size (not 256x as 1 MiB would), TRIM of 64 KiB
/// returns space, and a TiB of data needs 16 M map entries, which the
/// in-memory maps (16 bytes each) and redb hold comfortably.
pub const CHUNK_BYTES: u64 = 64 * 1024;
pub const BLOCK_BYTES: u64 = trireme_types::BLOCK_SIZE;
pub const BLOCKS_PER_CHUNK: u64 = CHUNK_BYTES / BLOCK_BYTES;
const _: () = assert!(BLOCKS_PER_CHUNK == 16, "a chunk's written-bitmap is a u16");

pub const JOURNAL_MIN_BYTES: u64 = 4 << 20;
pub const JOURNAL_MAX_BYTES: u64 = 256 << 20;
/// The smallest pool: a minimal journal and a handful of chunks.
pub const POOL_MIN_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub device_bytes: u64,
    /// 0 in a version 2 layout (no active set).
    pub active_set_bytes: u64,
    pub journal_offset: u64,
    pub journal_bytes: u64,
    pub checksum_offset: u64,
    pub checksum_bytes: u64,
    pub data_offset: u64,
    pub chunk_count: u64,
}

fn round_up(value: u64, unit: u64) -> u64 {
    value.div_ceil(unit) * unit
}

impl Layout {
    /// Cuts a device of `device_bytes` into regions: a journal of 1/16 of
    /// the device (4 MiB to 256 MiB), checksums for every chunk, the rest data.
    pub fn compute(device_bytes: u64) -> Result<Layout, StoreError> {
        Layout::compute_version(device_bytes, FORMAT_VERSION)
    }

    /// The layout of format `version` (2 or 3): version 3 is version 2
    /// with the active set in the first 8 KiB of its journal, so a version
    /// 2 pool becomes one of version 3 by rewriting those 8 KiB and the
    /// superblock, once its journal is empty.
    pub fn compute_version(device_bytes: u64, version: u32) -> Result<Layout, StoreError> {
        let active_set_bytes = if version >= 3 { ACTIVE_SET_BYTES } else { 0 };
        if device_bytes < POOL_MIN_BYTES {
            return Err(StoreError::PoolTooSmall {
                size_bytes: device_bytes,
                minimum_bytes: POOL_MIN_BYTES,
            });
        }
        let journal_bytes = (device_bytes / 16 / BLOCK_BYTES * BLOCK_BYTES)
            .clamp(JOURNAL_MIN_BYTES, JOURNAL_MAX_BYTES);
        let checksum_offset = SUPERBLOCK_BYTES + journal_bytes;
        let journal_offset = SUPERBLOCK_BYTES + active_set_bytes;
        let journal_bytes = journal_bytes - active_set_bytes;
        // Each chunk costs its data plus 4 bytes per block of checksums.
        let remaining = device_bytes - checksum_offset;
        let per_chunk = CHUNK_BYTES + BLOCKS_PER_CHUNK * 4;
        let mut chunk_count = remaining / per_chunk;
        loop {
            let checksum_bytes = round_up(chunk_count * BLOCKS_PER_CHUNK * 4, BLOCK_BYTES);
            let data_offset = round_up(checksum_offset + checksum_bytes, CHUNK_BYTES);
            if data_offset + chunk_count * CHUNK_BYTES <= device_bytes {
                let layout = Layout {
                    device_bytes,
                    active_set_bytes,
                    journal_offset,
                    journal_bytes,
                    checksum_offset,
                    checksum_bytes,
                    data_offset,
                    chunk_count,
                };
                layout.validate();
                return Ok(layout);
            }
            chunk_count -= 1;
        }
    }

    pub fn validate(&self) {
        assert!(self.journal_offset >= SUPERBLOCK_BYTES + self.active_set_bytes);
        assert!(
            self.journal_bytes.is_multiple_of(BLOCK_BYTES)
                && self.journal_bytes + self.active_set_bytes >= JOURNAL_MIN_BYTES
        );
        assert!(self.checksum_offset >= self.journal_offset + self.journal_bytes);
        assert!(self.checksum_bytes >= self.chunk_count * BLOCKS_PER_CHUNK * 4);
        assert!(self.data_offset >= self.checksum_offset + self.checksum_bytes);
        assert!(self.data_offset.is_multiple_of(CHUNK_BYTES));
        assert!(self.data_offset + self.chunk_count * CHUNK_BYTES <= self.device_bytes);
        assert!(
            self.chunk_count <= u32::MAX as u64,
            "physical chunk ids are u32"
        );
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.chunk_count * CHUNK_BYTES
    }

    /// Byte offset of physical block `block` (chunk * 16 + block in chunk).
    pub fn data_block_offset(&self, physical_block: u64) -> u64 {
        self.data_offset + physical_block * BLOCK_BYTES
    }

    /// Where the active set's slots start; `None` in a version 2 layout.
    pub fn active_set_offset(&self) -> Option<u64> {
        (self.active_set_bytes > 0).then_some(SUPERBLOCK_BYTES)
    }

    pub fn version(&self) -> u32 {
        if self.active_set_bytes > 0 {
            3
        } else {
            2
        }
    }
}

/// The first 4 KiB of a pool device. Written once at creation; a pool is
/// a pool exactly when this block carries the magic and a valid crc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub pool_uuid: u128,
    pub layout: Layout,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; SUPERBLOCK_BYTES as usize];
        block[0..8].copy_from_slice(MAGIC);
        block[8..12].copy_from_slice(&self.layout.version().to_le_bytes());
        // 12..16: crc32c of the whole block with these four bytes zero.
        block[16..32].copy_from_slice(&self.pool_uuid.to_le_bytes());
        block[32..36].copy_from_slice(&(CHUNK_BYTES as u32).to_le_bytes());
        block[36..40].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        let layout = &self.layout;
        let mut fields = vec![
            layout.device_bytes,
            layout.journal_offset,
            layout.journal_bytes,
            layout.checksum_offset,
            layout.checksum_bytes,
            layout.data_offset,
            layout.chunk_count,
        ];
        if layout.active_set_bytes > 0 {
            fields.push(SUPERBLOCK_BYTES);
            fields.push(layout.active_set_bytes);
        }
        for (index, value) in fields.iter().enumerate() {
            let start = 40 + index * 8;
            block[start..start + 8].copy_from_slice(&value.to_le_bytes());
        }
        let crc = crc_fast::crc32_iscsi(&block);
        block[12..16].copy_from_slice(&crc.to_le_bytes());
        block
    }

    pub fn decode(path: &Path, block: &[u8]) -> Result<Superblock, StoreError> {
        let not_a_pool = |reason: &str| StoreError::NotAPool {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        if block.len() < SUPERBLOCK_BYTES as usize {
            return Err(not_a_pool("shorter than a superblock"));
        }
        if &block[0..8] != MAGIC {
            return Err(not_a_pool("no trireme superblock at offset 0"));
        }
        let u32_at =
            |start: usize| u32::from_le_bytes(block[start..start + 4].try_into().expect("4 bytes"));
        let u64_at =
            |start: usize| u64::from_le_bytes(block[start..start + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if !(FORMAT_VERSION_UPGRADABLE..=FORMAT_VERSION).contains(&version) {
            return Err(StoreError::UnsupportedVersion {
                path: path.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let stored_crc = u32_at(12);
        let mut copy = block[..SUPERBLOCK_BYTES as usize].to_vec();
        copy[12..16].fill(0);
        if crc_fast::crc32_iscsi(&copy) != stored_crc {
            return Err(not_a_pool("superblock checksum mismatch"));
        }
        if u32_at(32) as u64 != CHUNK_BYTES || u32_at(36) as u64 != BLOCK_BYTES {
            return Err(not_a_pool("unsupported chunk or block size"));
        }
        let pool_uuid = u128::from_le_bytes(block[16..32].try_into().expect("16 bytes"));
        let active_set_bytes = if version >= 3 {
            if u64_at(96) != SUPERBLOCK_BYTES {
                return Err(not_a_pool("superblock layout is inconsistent"));
            }
            u64_at(104)
        } else {
            0
        };
        let layout = Layout {
            device_bytes: u64_at(40),
            active_set_bytes,
            journal_offset: u64_at(48),
            journal_bytes: u64_at(56),
            checksum_offset: u64_at(64),
            checksum_bytes: u64_at(72),
            data_offset: u64_at(80),
            chunk_count: u64_at(88),
        };
        if layout != Layout::compute_version(layout.device_bytes, version)? {
            return Err(not_a_pool("superblock layout is inconsistent"));
        }
        Ok(Superblock { pool_uuid, layout })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_their_device() {
        for size in [
            POOL_MIN_BYTES,
            17 << 20,
            1 << 30,
            64 << 30,
            (4 << 40) + 12345,
        ] {
            let layout = Layout::compute(size).unwrap();
            layout.validate();
            assert!(layout.chunk_count > 0);
            // No more than one chunk's worth of slack at the end.
            let end = layout.data_offset + layout.chunk_count * CHUNK_BYTES;
            assert!(
                size - end < CHUNK_BYTES + BLOCKS_PER_CHUNK * 4 + CHUNK_BYTES,
                "{size}"
            );
        }
        assert!(Layout::compute(POOL_MIN_BYTES - 1).is_err());
    }

    #[test]
    fn version_3_is_version_2_with_the_active_set_cut_from_the_journal() {
        for size in [POOL_MIN_BYTES, 1 << 30, 64 << 30] {
            let (old, new) = (
                Layout::compute_version(size, 2).unwrap(),
                Layout::compute(size).unwrap(),
            );
            assert_eq!(new.journal_offset, old.journal_offset + ACTIVE_SET_BYTES);
            assert_eq!(new.journal_bytes + ACTIVE_SET_BYTES, old.journal_bytes);
            assert_eq!(
                (new.checksum_offset, new.data_offset, new.chunk_count),
                (old.checksum_offset, old.data_offset, old.chunk_count)
            );
        }
    }

    #[test]
    fn superblock_round_trips_and_detects_damage() {
        let superblock = Superblock {
            pool_uuid: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            layout: Layout::compute(1 << 30).unwrap(),
        };
        let mut bytes = superblock.encode();
        let path = Path::new("/dev/test");
        assert_eq!(Superblock::decode(path, &bytes).unwrap(), superblock);
        let old = Superblock {
            layout: Layout::compute_version(1 << 30, 2).unwrap(),
            ..superblock.clone()
        };
        assert_eq!(Superblock::decode(path, &old.encode()).unwrap(), old);
        bytes[100] ^= 1;
        assert!(matches!(
            Superblock::decode(path, &bytes),
            Err(StoreError::NotAPool { .. })
        ));
        assert!(matches!(
            Superblock::decode(path, &[0u8; 4096]),
            Err(StoreError::NotAPool { .. })
        ));
    }
}
