//! The overlay: for each volume, which blocks have a newer version in a
//! journal record that is not yet applied in place. Reads look here first.
//!
//! It is an interval map of non-overlapping block ranges, each pointing at
//! the newest record covering it. A newer record cuts older pieces; applying
//! a record removes the pieces that still point at it.

use crate::record::Record;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone)]
struct Piece {
    end: u64,
    record: Arc<Record>,
}

#[derive(Default)]
pub struct Overlay {
    pieces: BTreeMap<u64, Piece>,
}

/// A run of blocks `[start, end)` and the pending record that holds them,
/// or `None` where the applied state on disk is current.
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub record: Option<Arc<Record>>,
}

impl Overlay {
    pub fn insert(&mut self, record: Arc<Record>) {
        let (first, end) = (record.first_block, record.end_block());
        assert!(first < end, "empty record");
        if let Some((&start, piece)) = self.pieces.range(..first).next_back() {
            if piece.end > first {
                let piece = piece.clone();
                self.pieces.get_mut(&start).expect("present").end = first;
                if piece.end > end {
                    self.pieces.insert(end, piece);
                }
            }
        }
        let inside: Vec<u64> = self
            .pieces
            .range(first..end)
            .map(|(start, _)| *start)
            .collect();
        for start in inside {
            let piece = self.pieces.remove(&start).expect("present");
            if piece.end > end {
                self.pieces.insert(end, piece);
            }
        }
        self.pieces.insert(first, Piece { end, record });
    }

    /// Drops what is left of `record` once it is applied in place.
    pub fn remove(&mut self, record: &Record) {
        let owned: Vec<u64> = self
            .pieces
            .range(record.first_block..record.end_block())
            .filter(|(_, piece)| piece.record.sequence == record.sequence)
            .map(|(start, _)| *start)
            .collect();
        for start in owned {
            self.pieces.remove(&start);
        }
    }

    /// Covers `[first, end)` with segments, in order.
    pub fn lookup(&self, first: u64, end: u64) -> Vec<Segment> {
        let mut segments = Vec::new();
        let mut cursor = first;
        let before = self.pieces.range(..first).next_back();
        let overlapping = before
            .filter(|(_, piece)| piece.end > first)
            .into_iter()
            .chain(self.pieces.range(first..end));
        for (&start, piece) in overlapping {
            let start = start.max(first);
            if start > cursor {
                segments.push(Segment {
                    start: cursor,
                    end: start,
                    record: None,
                });
            }
            let piece_end = piece.end.min(end);
            segments.push(Segment {
                start,
                end: piece_end,
                record: Some(piece.record.clone()),
            });
            cursor = piece_end;
        }
        if cursor < end {
            segments.push(Segment {
                start: cursor,
                end,
                record: None,
            });
        }
        segments
    }

    /// True if a pending zero/trim record still shows in `[first, end)`:
    /// applying it may free a chunk that a later write then needs again.
    pub fn has_zero_in(&self, first: u64, end: u64) -> bool {
        let before = self.pieces.range(..first).next_back();
        let overlapping = before
            .filter(|(_, piece)| piece.end > first)
            .into_iter()
            .chain(self.pieces.range(first..end));
        for (_, piece) in overlapping {
            if matches!(piece.record.body, crate::record::RecordBody::Zero) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecordBody;
    use trireme_types::VolumeId;

    fn record(sequence: u64, first: u64, count: u64) -> Arc<Record> {
        Arc::new(Record::new(
            sequence,
            0,
            64,
            VolumeId(1),
            first,
            count,
            RecordBody::Zero,
            0,
        ))
    }

    fn owners(overlay: &Overlay, first: u64, end: u64) -> Vec<(u64, u64, u64)> {
        overlay
            .lookup(first, end)
            .into_iter()
            .map(|s| (s.start, s.end, s.record.map_or(0, |r| r.sequence)))
            .collect()
    }

    #[test]
    fn newer_records_cut_older_ones() {
        let mut overlay = Overlay::default();
        let first = record(1, 0, 10);
        overlay.insert(first.clone());
        overlay.insert(record(2, 3, 2));
        assert_eq!(
            owners(&overlay, 0, 12),
            vec![(0, 3, 1), (3, 5, 2), (5, 10, 1), (10, 12, 0)]
        );
        overlay.remove(&first);
        assert_eq!(
            owners(&overlay, 0, 12),
            vec![(0, 3, 0), (3, 5, 2), (5, 12, 0)]
        );
        assert_eq!(owners(&overlay, 4, 5), vec![(4, 5, 2)]);
    }

    proptest::proptest! {
        /// The overlay answers like a per-block array of "newest pending record".
        #[test]
        fn matches_a_per_block_model(operations in proptest::collection::vec((0u64..40, 1u64..12, proptest::bool::ANY), 1..60)) {
            let mut overlay = Overlay::default();
            let mut model = vec![0u64; 64];
            let mut records = Vec::new();
            for (index, (first, count, apply_oldest)) in operations.into_iter().enumerate() {
                let sequence = index as u64 + 1;
                let new = record(sequence, first, count);
                overlay.insert(new.clone());
                for block in first..first + count { model[block as usize] = sequence; }
                records.push(new);
                if apply_oldest && !records.is_empty() {
                    let oldest = records.remove(0);
                    overlay.remove(&oldest);
                    for owner in model.iter_mut() { if *owner == oldest.sequence { *owner = 0; } }
                }
                for block in 0..64u64 {
                    let segments = overlay.lookup(block, block + 1);
                    proptest::prop_assert_eq!(segments.len(), 1);
                    let owner = segments[0].record.as_ref().map_or(0, |r| r.sequence);
                    proptest::prop_assert_eq!(owner, model[block as usize]);
                }
            }
        }
    }
}
