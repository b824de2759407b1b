//! A journal record in memory: what a write, trim or zero request became.

use crate::journal::{RecordHeader, RecordKind};
use std::sync::Arc;
use trireme_types::{BlockBuf, VolumeId};

pub enum RecordBody {
    /// With `fresh_chunks` empty, the data goes through the journal and is
    /// applied in place. A write of whole chunks instead gets fresh chunks at
    /// admission, its data is written there once, and the journal record
    /// only names them (kind `Redirect`); applying it swaps the map entries.
    /// `data` of a redirect replayed from the journal is empty: it is on disk.
    Write {
        /// Shared with the writer, who may keep it (a replicated write's
        /// primary does, to send it again); never written to.
        data: Arc<BlockBuf>,
        block_crcs: Vec<u32>,
        fresh_chunks: Vec<u32>,
        /// Not empty: the data goes in place straight from `data`
        /// (`O_DIRECT`), to these physical chunks (one per chunk the
        /// blocks span, all mapped and not shared when admitted), and the
        /// journal gets only a checksum record (kind `Checksums`). `data`
        /// of one replayed from the journal is empty.
        direct: Vec<u32>,
    },
    Zero,
    Pad,
    /// Snapshot `id` of the record's volume: every record before it is in
    /// the snapshot, none after. Covers no blocks.
    Snapshot {
        id: trireme_types::SnapshotId,
        created_unix_seconds: u64,
        size_bytes: u64,
    },
}

pub struct Record {
    pub sequence: u64,
    /// Logical journal position of the header.
    pub position: u64,
    /// Bytes taken in the ring: header, data and padding (a pad: the rest
    /// of its lap).
    pub journal_bytes: u64,
    pub volume: VolumeId,
    pub first_block: u64,
    pub block_count: u64,
    pub body: RecordBody,
    /// Chunks set aside for this record's allocations, returned when applied.
    pub reserved_chunks: u64,
}

impl Record {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sequence: u64,
        position: u64,
        journal_bytes: u64,
        volume: VolumeId,
        first_block: u64,
        block_count: u64,
        body: RecordBody,
        reserved_chunks: u64,
    ) -> Record {
        Record {
            sequence,
            position,
            journal_bytes,
            volume,
            first_block,
            block_count,
            body,
            reserved_chunks,
        }
    }

    pub fn end_block(&self) -> u64 {
        self.first_block + self.block_count
    }

    pub fn kind(&self) -> RecordKind {
        match &self.body {
            RecordBody::Write { fresh_chunks, .. } if !fresh_chunks.is_empty() => {
                RecordKind::Redirect
            }
            RecordBody::Write { direct, .. } if !direct.is_empty() => RecordKind::Checksums,
            RecordBody::Write { .. } => RecordKind::Write,
            RecordBody::Zero => RecordKind::Zero,
            RecordBody::Pad => RecordKind::Pad,
            RecordBody::Snapshot { .. } => RecordKind::Snapshot,
        }
    }

    pub fn header(&self, pool_salt: u64, epoch: u64) -> RecordHeader {
        let data_crc = match &self.body {
            RecordBody::Write {
                block_crcs,
                fresh_chunks,
                ..
            } if !fresh_chunks.is_empty() => crc_fast::crc32_iscsi(
                &crate::journal::encode_redirect_payload(fresh_chunks, block_crcs),
            ),
            RecordBody::Write {
                block_crcs, direct, ..
            } if !direct.is_empty() => {
                crc_fast::crc32_iscsi(&crate::journal::encode_redirect_payload(direct, block_crcs))
            }
            RecordBody::Write { block_crcs, .. } => crate::journal::data_crc(block_crcs),
            RecordBody::Snapshot { .. } => crc_fast::crc32_iscsi(&self.snapshot_payload()),
            _ => 0,
        };
        RecordHeader {
            kind: self.kind(),
            pool_salt,
            epoch,
            sequence: self.sequence,
            volume: self.volume.0,
            first_block: self.first_block,
            block_count: self.block_count,
            data_crc,
        }
    }

    /// The payload of a snapshot record (empty for other kinds).
    pub fn snapshot_payload(&self) -> Vec<u8> {
        match &self.body {
            RecordBody::Snapshot {
                id,
                created_unix_seconds,
                size_bytes,
            } => crate::journal::encode_snapshot_payload(id.0, *created_unix_seconds, *size_bytes),
            _ => Vec::new(),
        }
    }

    pub fn is_snapshot(&self) -> bool {
        matches!(self.body, RecordBody::Snapshot { .. })
    }

    pub fn is_redirect(&self) -> bool {
        matches!(&self.body, RecordBody::Write { fresh_chunks, .. } if !fresh_chunks.is_empty())
    }

    /// A write whose data goes in place from the request (see `direct`).
    pub fn is_direct(&self) -> bool {
        matches!(&self.body, RecordBody::Write { direct, .. } if !direct.is_empty())
    }

    /// A direct write of whole, aligned chunks: its data goes to the
    /// device with `O_DIRECT`, after the batch's buffered direct data
    /// (docs/store-format.md, *Which writes*).
    pub fn is_direct_whole_chunks(&self) -> bool {
        self.is_direct() && self.covers_whole_chunks()
    }

    /// Starts and ends on chunk boundaries (and covers something).
    pub fn covers_whole_chunks(&self) -> bool {
        use crate::layout::BLOCKS_PER_CHUNK;
        self.block_count > 0
            && self.first_block.is_multiple_of(BLOCKS_PER_CHUNK)
            && self.block_count.is_multiple_of(BLOCKS_PER_CHUNK)
    }

    /// A record whose apply writes nothing over data a crash could still
    /// need, so it may be applied once it is in the journal file, before a
    /// device flush makes it durable: a redirect fills fresh chunks no map
    /// points at yet, and a direct write's data is in place already (its
    /// region is active, so replay re-derives the checksums it carries).
    pub fn applies_once_written(&self) -> bool {
        self.is_redirect() || self.is_direct()
    }

    pub fn data_bytes(&self) -> u64 {
        match &self.body {
            RecordBody::Write { data, .. } => data.len() as u64,
            _ => 0,
        }
    }
}
