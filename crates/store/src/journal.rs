//! The journal's record format.
//!
//! A record is a 64-byte header followed by its data, padded to a multiple
//! of 64 bytes. Positions are logical and only grow; the byte on the device
//! is `journal_offset + position % journal_bytes`. A record never wraps: when
//! one would not fit before the end of the ring, a `Pad` record fills the rest
//! and the next record starts the next lap.
//!
//! A record is valid only when its header crc, pool salt, epoch, sequence
//! and data crc all match what replay expects; the first invalid record ends
//! the journal. See `docs/store-format.md`.

use crate::layout::{BLOCKS_PER_CHUNK, BLOCK_BYTES};

pub const HEADER_BYTES: u64 = 64;
pub const RECORD_ALIGN: u64 = 64;
/// Larger writes are cut into records of at most this much data, so that a
/// record always fits the smallest journal many times over.
pub const RECORD_MAX_DATA_BYTES: u64 = 1 << 20;
pub(crate) const RECORD_MAGIC: u32 = 0x5452_4a52; // "TRJR"

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// `block_count` blocks of data follow the header.
    Write = 1,
    /// The blocks read as zeros and give their space back.
    Zero = 2,
    /// Fills the end of a lap; the next record starts at the next lap.
    Pad = 3,
    /// Whole chunks written straight to freshly allocated chunks: the
    /// record carries their physical numbers and block crcs, not the data.
    Redirect = 4,
    /// A snapshot of the volume at this point of the sequence; the payload
    /// is [`SNAPSHOT_PAYLOAD_BYTES`]: snapshot id, creation time and the
    /// volume's size (u64 each), then zeros.
    Snapshot = 5,
    /// A write whose data went in place straight from the request (format
    /// 3): the payload is one u32 physical chunk per chunk the blocks span,
    /// then one u32 crc32c per block, as a redirect's. See `active_set`.
    Checksums = 6,
}

/// Chunks that `block_count` blocks from `first_block` span.
pub fn chunks_spanned(first_block: u64, block_count: u64) -> u64 {
    (first_block + block_count).div_ceil(BLOCKS_PER_CHUNK) - first_block / BLOCKS_PER_CHUNK
}

/// A checksum record's payload bytes.
pub fn checksums_payload_bytes(first_block: u64, block_count: u64) -> u64 {
    chunks_spanned(first_block, block_count) * 4 + block_count * 4
}

pub const SNAPSHOT_PAYLOAD_BYTES: u64 = 64;

/// A snapshot record's payload.
pub fn encode_snapshot_payload(id: u64, created_unix_seconds: u64, size_bytes: u64) -> Vec<u8> {
    let mut payload = vec![0u8; SNAPSHOT_PAYLOAD_BYTES as usize];
    payload[0..8].copy_from_slice(&id.to_le_bytes());
    payload[8..16].copy_from_slice(&created_unix_seconds.to_le_bytes());
    payload[16..24].copy_from_slice(&size_bytes.to_le_bytes());
    payload
}

/// (snapshot id, creation time, size) from a snapshot record's payload.
pub fn decode_snapshot_payload(payload: &[u8]) -> (u64, u64, u64) {
    let u64_at =
        |start: usize| u64::from_le_bytes(payload[start..start + 8].try_into().expect("8 bytes"));
    (u64_at(0), u64_at(8), u64_at(16))
}

impl RecordKind {
    fn from_byte(byte: u8) -> Option<RecordKind> {
        match byte {
            1 => Some(RecordKind::Write),
            2 => Some(RecordKind::Zero),
            3 => Some(RecordKind::Pad),
            4 => Some(RecordKind::Redirect),
            5 => Some(RecordKind::Snapshot),
            6 => Some(RecordKind::Checksums),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub pool_salt: u64,
    pub epoch: u64,
    pub sequence: u64,
    pub volume: u64,
    pub first_block: u64,
    pub block_count: u64,
    /// crc32c over the per-block crc32c values of the data (Write only).
    pub data_crc: u32,
}

impl RecordHeader {
    /// Bytes of payload after the header.
    pub fn data_bytes(&self) -> u64 {
        match self.kind {
            RecordKind::Write => self.block_count * BLOCK_BYTES,
            RecordKind::Redirect => redirect_payload_bytes(self.block_count),
            RecordKind::Snapshot => SNAPSHOT_PAYLOAD_BYTES,
            RecordKind::Checksums => checksums_payload_bytes(self.first_block, self.block_count),
            RecordKind::Zero | RecordKind::Pad => 0,
        }
    }

    /// Bytes the record takes in the ring, header and padding included.
    pub fn journal_bytes(&self) -> u64 {
        record_journal_bytes(self.data_bytes())
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES as usize] {
        let mut bytes = [0u8; HEADER_BYTES as usize];
        bytes[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        // 4..8: crc32c of the header with these bytes zero.
        bytes[8] = self.kind as u8;
        bytes[12..16].copy_from_slice(&self.data_crc.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.pool_salt.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[40..48].copy_from_slice(&self.volume.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.first_block.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.block_count.to_le_bytes());
        let crc = crc_fast::crc32_iscsi(&bytes);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes a header; `None` for anything that is not a whole, intact
    /// header (torn, never written, or from another pool's past).
    pub fn decode(bytes: &[u8]) -> Option<RecordHeader> {
        let bytes: &[u8; HEADER_BYTES as usize] =
            bytes.get(..HEADER_BYTES as usize)?.try_into().ok()?;
        let u32_at =
            |start: usize| u32::from_le_bytes(bytes[start..start + 4].try_into().expect("4"));
        let u64_at =
            |start: usize| u64::from_le_bytes(bytes[start..start + 8].try_into().expect("8"));
        if u32_at(0) != RECORD_MAGIC {
            return None;
        }
        let mut copy = *bytes;
        copy[4..8].fill(0);
        if crc_fast::crc32_iscsi(&copy) != u32_at(4) {
            return None;
        }
        let header = RecordHeader {
            kind: RecordKind::from_byte(bytes[8])?,
            data_crc: u32_at(12),
            pool_salt: u64_at(16),
            epoch: u64_at(24),
            sequence: u64_at(32),
            volume: u64_at(40),
            first_block: u64_at(48),
            block_count: u64_at(56),
        };
        let too_long = header.block_count * BLOCK_BYTES > RECORD_MAX_DATA_BYTES;
        match header.kind {
            RecordKind::Write | RecordKind::Checksums if too_long => return None,
            RecordKind::Redirect
                if too_long || !header.block_count.is_multiple_of(BLOCKS_PER_CHUNK) =>
            {
                return None
            }
            _ => {}
        }
        Some(header)
    }
}

/// A redirect's payload: one u32 physical chunk per chunk, then one u32
/// crc per block.
pub fn redirect_payload_bytes(block_count: u64) -> u64 {
    (block_count / BLOCKS_PER_CHUNK) * 4 + block_count * 4
}

pub fn encode_redirect_payload(fresh_chunks: &[u32], block_crcs: &[u32]) -> Vec<u8> {
    fresh_chunks
        .iter()
        .chain(block_crcs)
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

/// Splits a redirect payload back into chunks and block crcs.
pub fn decode_redirect_payload(payload: &[u8], block_count: u64) -> (Vec<u32>, Vec<u32>) {
    decode_chunks_and_crcs(payload, block_count / BLOCKS_PER_CHUNK)
}

/// Splits a payload of `chunk_count` u32 chunks then u32 crcs.
pub fn decode_chunks_and_crcs(payload: &[u8], chunk_count: u64) -> (Vec<u32>, Vec<u32>) {
    let values: Vec<u32> = payload
        .chunks_exact(4)
        .map(|four| u32::from_le_bytes(four.try_into().expect("4 bytes")))
        .collect();
    let chunk_count = chunk_count as usize;
    (
        values[..chunk_count].to_vec(),
        values[chunk_count..].to_vec(),
    )
}

pub fn record_journal_bytes(data_bytes: u64) -> u64 {
    (HEADER_BYTES + data_bytes).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// The crc32c of each 4 KiB block of `data`.
pub fn block_crcs(data: &[u8]) -> Vec<u32> {
    debug_assert!((data.len() as u64).is_multiple_of(BLOCK_BYTES));
    data.chunks_exact(BLOCK_BYTES as usize)
        .map(crc_fast::crc32_iscsi)
        .collect()
}

/// The record's data crc: a crc over the block crcs, so the per-block crcs
/// computed once on the write path also seal the journal record.
pub fn data_crc(block_crcs: &[u32]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut bytes = [0u8; 1024];
    for crcs in block_crcs.chunks(bytes.len() / 4) {
        for (four, crc) in bytes.chunks_exact_mut(4).zip(crcs) {
            four.copy_from_slice(&crc.to_le_bytes());
        }
        digest.update(&bytes[..crcs.len() * 4]);
    }
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Write,
            pool_salt: 7,
            epoch: 3,
            sequence: 99,
            volume: 1,
            first_block: 12,
            block_count: 2,
            data_crc: 0xdead_beef,
        }
    }

    #[test]
    fn header_round_trips() {
        let header = header();
        assert_eq!(RecordHeader::decode(&header.encode()), Some(header));
        assert_eq!(header.journal_bytes(), 64 + 8192);
    }

    #[test]
    fn any_damaged_byte_invalidates_a_header() {
        let bytes = header().encode();
        for index in 0..bytes.len() {
            let mut damaged = bytes;
            damaged[index] ^= 0x10;
            assert_eq!(RecordHeader::decode(&damaged), None, "byte {index}");
        }
        assert_eq!(RecordHeader::decode(&[0u8; 64]), None);
        assert_eq!(RecordHeader::decode(&bytes[..63]), None);
    }

    /// The crcs every pool on disk holds, as the crc32c crate computed
    /// them before the store moved to crc-fast: the format must not change
    /// with the crate.
    #[test]
    fn checksums_are_those_already_on_disk() {
        let zeros = vec![0u8; 4096];
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        let crcs = block_crcs(&[zeros.as_slice(), &pattern, &zeros].concat());
        assert_eq!(crcs, [0x98f9_4189, 0x6baf_c3fd, 0x98f9_4189]);
        assert_eq!(data_crc(&crcs), 0x262b_709c);
        // More block crcs than one digest update takes.
        let many: Vec<u32> = (0..700u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        assert_eq!(data_crc(&many), 0x569b_38a3);
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn data_crc_covers_every_block() {
        let mut data = vec![0u8; 8192];
        let before = data_crc(&block_crcs(&data));
        data[5000] = 1;
        assert_ne!(before, data_crc(&block_crcs(&data)));
    }
}
