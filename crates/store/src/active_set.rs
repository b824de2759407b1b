//! The active set: the regions of the data area where small overwrites may
//! have been written in place ahead of their checksums (format version 3).
//!
//! A write that goes in place straight from the request (`O_DIRECT`) is
//! journaled only as a checksum record; until a checkpoint has made its
//! checksum durable, a crash can leave its data on the device without the
//! record, or the record without the data, or the data torn at a sector.
//! Replay therefore re-derives the checksum of every written block of every
//! region of the durable active set whose data does not match. A region is
//! added (one slot write and one device flush) before the first such write
//! into it, and dropped at a checkpoint once its writes are checkpointed
//! and none came since the checkpoint before.
//!
//! On the device: two 4 KiB slots written alternately (generation parity),
//! each `magic u32, crc32c u32 (of the slot with this field zero),
//! generation u64, count u32, count × region u32`, the rest zero. The valid
//! slot with the highest generation is the set; a torn write leaves the
//! other slot, an older superset. With neither valid, every region counts
//! as active (replay then checks every written block).

use std::collections::BTreeSet;

use crate::layout::CHUNK_BYTES;

/// 4 MiB of data per region: 64 chunks.
pub const REGION_BYTES: u64 = 4 << 20;
pub const REGION_CHUNKS: u64 = REGION_BYTES / CHUNK_BYTES;
pub const SLOT_BYTES: u64 = 4096;
const SLOT_HEADER_BYTES: usize = 20;
/// At most this many regions are active (about 4 GiB of data, which a
/// replay after a crash reads once); writes to others take the journal.
pub const ACTIVE_REGIONS_MAX: usize = 1000;
const _: () = assert!(SLOT_HEADER_BYTES + ACTIVE_REGIONS_MAX * 4 <= SLOT_BYTES as usize);
pub(crate) const SLOT_MAGIC: u32 = 0x5452_4153; // "TRAS"

/// The region of physical chunk `physical`.
pub fn region_of(physical: u32) -> u32 {
    (physical as u64 / REGION_CHUNKS) as u32
}

/// The slot of `generation`, encoded.
pub fn encode_slot(generation: u64, regions: &BTreeSet<u32>) -> Vec<u8> {
    assert!(regions.len() <= ACTIVE_REGIONS_MAX, "active set overfull");
    let mut slot = vec![0u8; SLOT_BYTES as usize];
    slot[0..4].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
    slot[8..16].copy_from_slice(&generation.to_le_bytes());
    slot[16..20].copy_from_slice(&(regions.len() as u32).to_le_bytes());
    for (index, region) in regions.iter().enumerate() {
        let at = SLOT_HEADER_BYTES + index * 4;
        slot[at..at + 4].copy_from_slice(&region.to_le_bytes());
    }
    let crc = crc_fast::crc32_iscsi(&slot);
    slot[4..8].copy_from_slice(&crc.to_le_bytes());
    slot
}

/// A slot's generation and regions, or `None` if it is not a whole, valid
/// slot (never written, torn, or left from version 2's journal).
pub fn decode_slot(slot: &[u8]) -> Option<(u64, BTreeSet<u32>)> {
    if slot.len() < SLOT_BYTES as usize {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
    if u32_at(0) != SLOT_MAGIC {
        return None;
    }
    let mut copy = slot[..SLOT_BYTES as usize].to_vec();
    copy[4..8].fill(0);
    if crc_fast::crc32_iscsi(&copy) != u32_at(4) {
        return None;
    }
    let generation = u64::from_le_bytes(slot[8..16].try_into().expect("8 bytes"));
    let count = u32_at(16) as usize;
    if count > ACTIVE_REGIONS_MAX {
        return None;
    }
    let regions = (0..count)
        .map(|index| u32_at(SLOT_HEADER_BYTES + index * 4))
        .collect();
    Some((generation, regions))
}

/// The durable set from both slots: the valid one with the highest
/// generation, or `None` when neither is valid (every region counts).
pub fn choose(slots: [&[u8]; 2]) -> Option<(u64, BTreeSet<u32>)> {
    slots
        .into_iter()
        .filter_map(decode_slot)
        .max_by_key(|(generation, _)| *generation)
}

/// The byte offset of the slot that `generation` is written to.
pub fn slot_offset(active_set_offset: u64, generation: u64) -> u64 {
    active_set_offset + (generation % 2) * SLOT_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_the_newest_valid_one_wins() {
        let older: BTreeSet<u32> = [1, 5, 9].into();
        let newer: BTreeSet<u32> = [5].into();
        let (a, b) = (encode_slot(6, &older), encode_slot(7, &newer));
        assert_eq!(decode_slot(&a), Some((6, older.clone())));
        assert_eq!(choose([&a, &b]), Some((7, newer)));
        // A torn newer slot leaves the older one.
        let mut torn = b.clone();
        torn[512..1024].copy_from_slice(&a[512..1024]);
        torn[20] ^= 1;
        assert_eq!(choose([&a, &torn]), Some((6, older)));
        assert_eq!(choose([&[0u8; 4096], &[0u8; 4096]]), None);
    }

    #[test]
    fn regions_are_64_chunks() {
        assert_eq!(region_of(0), 0);
        assert_eq!(region_of(63), 0);
        assert_eq!(region_of(64), 1);
    }
}
