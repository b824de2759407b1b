//! The journal's last partial block, kept in memory, so that a batch a
//! flush waits on can go to the device with `O_DIRECT` (see
//! `docs/store-format.md`, "Synchronous writers").
//!
//! `O_DIRECT` writes whole blocks only. A batch starts where the last one
//! ended, usually inside a block whose first bytes are records already
//! written: the direct write rewrites those bytes with what they already
//! hold (kept here), then the batch, then zeros to the block's end. The
//! page cache's write-back rewrites that block the same way, so a durable
//! record is never put at more risk than the buffered path puts it.

use crate::layout::BLOCK_BYTES;
use std::io::IoSlice;
use trireme_types::BlockBuf;

/// What the writing role knows of the block the journal's head is in.
/// Only the thread holding the writing role touches it.
#[derive(Default)]
pub(crate) struct JournalTail {
    /// The logical position of the head's block (a multiple of
    /// `BLOCK_BYTES`) and the bytes written in it before the head. `None`
    /// until a batch reaches a block boundary: after opening, the head's
    /// block holds bytes of records this session never wrote.
    known: Option<(u64, Vec<u8>)>,
    /// The aligned bytes of the last direct batch, kept to spare an
    /// allocation per batch.
    scratch: BlockBuf,
    /// Batches handed out as whole blocks since the pool opened (tests
    /// check that the direct path ran).
    pub(super) direct_batches: u64,
}

/// The largest batch (bytes of records) written with `O_DIRECT`: it is
/// copied behind the tail's bytes, which is cheap only for small ones, and
/// a synchronous writer's batches are a record or two.
pub(super) const DIRECT_BATCH_MAX_BYTES: u64 = 256 << 10;

impl JournalTail {
    /// The batch `slices`, to be written at logical position `start`, as
    /// whole blocks: the head block's earlier bytes, the batch, zeros to
    /// the next block boundary. Returns the first block's logical position
    /// and the bytes, or `None` when the head block's earlier bytes are not
    /// known, the batch is larger than [`DIRECT_BATCH_MAX_BYTES`], or the
    /// zeros would reach `limit` (journal space still in use a lap behind).
    pub(super) fn whole_blocks(
        &mut self,
        start: u64,
        slices: &[IoSlice<'_>],
        limit: u64,
    ) -> Option<(u64, &[u8])> {
        let (block, prefix) = self.known.as_ref()?;
        let length: u64 = slices.iter().map(|slice| slice.len() as u64).sum();
        let end = (start + length).next_multiple_of(BLOCK_BYTES);
        if *block + prefix.len() as u64 != start || length > DIRECT_BATCH_MAX_BYTES || end > limit {
            return None;
        }
        self.scratch.truncate(0);
        self.scratch.extend_from_slice(prefix);
        for slice in slices {
            self.scratch.extend_from_slice(slice);
        }
        let zeros = (end - start - length) as usize;
        self.scratch.extend_from_slice(&ZEROS[..zeros]);
        debug_assert_eq!(self.scratch.len() as u64, end - block);
        self.direct_batches += 1;
        Some((*block, &self.scratch))
    }

    /// Notes that `slices` were written at `start` and the next record
    /// goes at `next`: the batch's end, or the next lap's start after a
    /// pad (which writes nothing).
    pub(super) fn advance(&mut self, start: u64, slices: &[IoSlice<'_>], next: u64) {
        let length: u64 = slices.iter().map(|slice| slice.len() as u64).sum();
        let end = start + length;
        if next != end {
            debug_assert!(next > end && next.is_multiple_of(BLOCK_BYTES));
            self.known = Some((next, Vec::new()));
            return;
        }
        let block = end / BLOCK_BYTES * BLOCK_BYTES;
        match &mut self.known {
            // The batch stays in the block the tail knows.
            Some((known_block, bytes))
                if block < start
                    && *known_block == block
                    && *known_block + bytes.len() as u64 == start =>
            {
                for slice in slices {
                    bytes.extend_from_slice(slice);
                }
            }
            // The batch ends in another block, or it started where the
            // tail knows nothing: known only if it filled the block from
            // its start.
            known => {
                if block < start {
                    *known = None;
                    return;
                }
                let mut bytes = known.take().map(|(_, bytes)| bytes).unwrap_or_default();
                bytes.clear();
                let skip = (block - start) as usize;
                let mut seen = 0;
                for slice in slices {
                    let from = skip.saturating_sub(seen).min(slice.len());
                    bytes.extend_from_slice(&slice[from..]);
                    seen += slice.len();
                }
                *known = Some((block, bytes));
            }
        }
    }

    /// Forgets the head block's bytes (a failed write left them unknown).
    pub(super) fn forget(&mut self) {
        self.known = None;
    }
}

static ZEROS: [u8; BLOCK_BYTES as usize] = [0; BLOCK_BYTES as usize];

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(bytes: &[u8]) -> [IoSlice<'_>; 1] {
        [IoSlice::new(bytes)]
    }

    #[test]
    fn nothing_is_known_until_a_batch_reaches_a_block_boundary() {
        let mut tail = JournalTail::default();
        // After opening, the head sits at 200 in a block of earlier records.
        assert!(tail
            .whole_blocks(200, &batch(&[1; 100]), u64::MAX)
            .is_none());
        tail.advance(200, &batch(&[1; 100]), 300);
        assert!(tail
            .whole_blocks(300, &batch(&[2; 100]), u64::MAX)
            .is_none());
        // This batch crosses into the second block: its bytes there are known.
        tail.advance(300, &batch(&[2; 4000]), 4300);
        let (block, bytes) = tail.whole_blocks(4300, &batch(&[3; 8]), u64::MAX).unwrap();
        assert_eq!(block, 4096);
        assert_eq!(bytes.len(), 4096);
        assert!(bytes[..204].iter().all(|byte| *byte == 2));
        assert!(bytes[204..212].iter().all(|byte| *byte == 3));
        assert!(bytes[212..].iter().all(|byte| *byte == 0));
    }

    #[test]
    fn a_direct_batch_rewrites_the_blocks_earlier_bytes_and_pads_with_zeros() {
        let mut tail = JournalTail::default();
        tail.advance(0, &batch(&[7; 64]), 64);
        let second = [IoSlice::new(&[8; 64]), IoSlice::new(&[9; 4096])];
        let (block, bytes) = tail.whole_blocks(64, &second, u64::MAX).unwrap();
        assert_eq!((block, bytes.len()), (0, 8192));
        let expected: Vec<u8> = [
            vec![7; 64],
            vec![8; 64],
            vec![9; 4096],
            vec![0; 8192 - 4224],
        ]
        .concat();
        assert_eq!(bytes, &expected[..]);
        tail.advance(64, &second, 4224);
        let (block, bytes) = tail.whole_blocks(4224, &batch(&[1; 64]), u64::MAX).unwrap();
        assert_eq!(block, 4096);
        assert!(bytes[..128].iter().all(|byte| *byte == 9));
        assert_eq!(&bytes[128..192], &[1; 64]);
    }

    #[test]
    fn zeros_never_reach_space_a_lap_behind_still_uses() {
        let mut tail = JournalTail::default();
        tail.advance(0, &batch(&[7; 64]), 64);
        assert!(tail.whole_blocks(64, &batch(&[8; 64]), 4095).is_none());
        assert!(tail.whole_blocks(64, &batch(&[8; 64]), 4096).is_some());
    }

    #[test]
    fn a_pad_starts_the_next_lap_at_a_known_empty_block() {
        let mut tail = JournalTail::default();
        tail.advance(100, &batch(&[5; 64]), 16384);
        let (block, bytes) = tail
            .whole_blocks(16384, &batch(&[6; 64]), u64::MAX)
            .unwrap();
        assert_eq!((block, bytes.len()), (16384, 4096));
        assert_eq!(&bytes[..64], &[6; 64]);
    }

    #[test]
    fn a_batch_not_where_the_tail_ends_or_too_large_is_not_direct() {
        let mut tail = JournalTail::default();
        tail.advance(0, &batch(&[7; 64]), 64);
        assert!(tail.whole_blocks(128, &batch(&[8; 64]), u64::MAX).is_none());
        let large = vec![0u8; DIRECT_BATCH_MAX_BYTES as usize + 64];
        assert!(tail.whole_blocks(64, &batch(&large), u64::MAX).is_none());
        tail.forget();
        assert!(tail.whole_blocks(64, &batch(&[8; 64]), u64::MAX).is_none());
    }
}
