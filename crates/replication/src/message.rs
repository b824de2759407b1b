//! What a primary and a replica say to each other over a data link, and
//! its binary encoding.
//!
//! A link is one ordered, reliable byte stream (TCP) per volume and peer;
//! the protocol relies on that order: a FLUSH covers the writes sent
//! before it, and a resync write of a region lands after the application
//! writes sent before it. A link that breaks loses what was in flight and
//! is never resumed: the next one starts with a new `Hello`.

use crate::regions::RegionSet;
use std::sync::Arc;
use trireme_types::{BlockBuf, Generation, NodeId, SnapshotId};

/// The largest frame a peer accepts: a 32 MiB write plus headers. Larger
/// requests are split by the export before they get here.
pub const MAX_FRAME_BYTES: usize = 33 << 20;

/// A primary's read lease lasts this long from when it sent the messages
/// whose answers make it (docs/replication.md, rule 9).
pub const LEASE_MS: u64 = 2_000;
/// How long after admitting a message of a primary a replica welcomes no
/// primary of a newer generation. The primary counts its read lease
/// ([`LEASE_MS`]) from when it sent the message, which is before this
/// replica admitted it; the margin covers clocks that run at different
/// rates on the two nodes.
pub const LEASE_HOLD_MS: u64 = LEASE_MS + LEASE_MS / 4;

const _: () = assert!(LEASE_HOLD_MS > LEASE_MS);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Shared by the primary's links and its record of the write; in
    /// page-aligned memory, so the store can hand it to the device as it is.
    Data(Arc<BlockBuf>),
    /// Reads as zeros afterwards; `trim` lets the replica free the space.
    Zeroes { length: u64, trim: bool },
}

impl Payload {
    pub fn data(bytes: impl Into<BlockBuf>) -> Self {
        Payload::Data(Arc::new(bytes.into()))
    }

    pub fn length(&self) -> u64 {
        match self {
            Payload::Data(data) => data.len() as u64,
            Payload::Zeroes { length, .. } => *length,
        }
    }
}

/// Primary → replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToReplica {
    /// The first message of a link: who writes, at which generation.
    Hello {
        generation: Generation,
        primary: NodeId,
    },
    /// `settled`: every write with a lower sequence has completed on all
    /// the replicas that had to hold it, so the replica may forget them.
    Write {
        seq: u64,
        offset: u64,
        payload: Payload,
        fua: bool,
        settled: u64,
    },
    /// Makes every write received before it durable.
    Flush {
        seq: u64,
    },
    Read {
        id: u64,
        offset: u64,
        length: u64,
    },
    /// Take snapshot `snapshot` of the copy: it holds every write received
    /// before this message and none after; acknowledged once durable.
    Snapshot {
        seq: u64,
        snapshot: SnapshotId,
    },
    /// The fingerprint of every 4 KiB block of the range (`verify`).
    Hash {
        id: u64,
        offset: u64,
        length: u64,
    },
    /// The primary detaches: every write it sent is settled and flushed,
    /// so the replica's copy is clean and needs no reconciliation later.
    Goodbye,
    /// A keepalive: answered with a `Pong` carrying the same token (the
    /// primary's clock when it sent it). An idle link's answers keep the
    /// primary's read lease (docs/replication.md, rule 9).
    Ping {
        token: u64,
    },
}

/// A block's fingerprint for `verify`: replicas compare these instead of
/// the data. 128 bits of a cryptographic hash of the 4 KiB (holes hash as
/// zeros), so two different blocks never compare equal in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockHash {
    Hash(u128),
    /// The block failed its checksum on this replica: any readable copy is
    /// better.
    Unreadable,
}

/// The most blocks one `Hash` request may cover (one region).
pub const MAX_HASH_BLOCKS: u64 = crate::regions::REGION_BYTES / 4096;

/// Why a replica could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaError {
    /// Data failed its checksum: this copy is bad, another may be good.
    Checksum(String),
    /// The device failed: this replica is out until it is replaced.
    Io(String),
    /// The replica's pool is full: the pool's name. An answer, not a fault
    /// of the replica, when every replica gives it.
    NoSpace(String),
    /// The replica refused (not found, stale generation, invalid).
    Refused(String),
}

impl std::fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaError::Checksum(message) => write!(f, "checksum mismatch: {message}"),
            ReplicaError::Io(message) => write!(f, "I/O error: {message}"),
            ReplicaError::NoSpace(pool) => write!(f, "no space left in pool '{pool}'"),
            ReplicaError::Refused(message) => write!(f, "refused: {message}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadData {
    Data(Vec<u8>),
    /// The range reads as zeros (a hole): nothing to copy.
    Zeroes,
}

/// Replica → primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromReplica {
    /// The replica accepted the generation.
    Welcome {
        /// The generation it had accepted before this hello.
        previous: Generation,
        /// It has run without a restart since it accepted `previous`, so
        /// everything it acknowledged is still there and `unsettled` is
        /// complete.
        intact: bool,
        /// Its node ran a primary at `previous`: it may hold writes no
        /// one else has.
        was_primary: bool,
        /// Regions of writes it received that were not settled.
        unsettled: RegionSet,
    },
    /// The replica has seen a newer generation: this primary is fenced.
    Refused { newer: Generation },
    Ack {
        seq: u64,
        result: Result<(), ReplicaError>,
    },
    ReadReply {
        id: u64,
        result: Result<ReadData, ReplicaError>,
    },
    /// One fingerprint per block of the range asked for.
    HashReply {
        id: u64,
        result: Result<Vec<BlockHash>, ReplicaError>,
    },
    /// The answer to a `Ping`, with its token.
    Pong { token: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame ends early")]
    Short,
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("bad field: {0}")]
    Bad(&'static str),
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, value: u8) {
        self.0.push(value);
    }
    fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }
    fn bytes(&mut self, value: &[u8]) {
        self.u64(value.len() as u64);
        self.0.extend_from_slice(value);
    }
    fn regions(&mut self, value: &RegionSet) {
        self.u64(value.len());
        for region in value.iter() {
            self.u64(region);
        }
    }
    fn hashes(&mut self, value: &[BlockHash]) {
        self.u64(value.len() as u64);
        for hash in value {
            match hash {
                BlockHash::Hash(hash) => {
                    self.u8(0);
                    self.0.extend_from_slice(&hash.to_le_bytes());
                }
                BlockHash::Unreadable => self.u8(1),
            }
        }
    }
    fn error(&mut self, error: &ReplicaError) {
        let (tag, message) = match error {
            ReplicaError::Checksum(message) => (1, message),
            ReplicaError::Io(message) => (2, message),
            ReplicaError::NoSpace(message) => (3, message),
            ReplicaError::Refused(message) => (4, message),
        };
        self.u8(tag);
        self.bytes(message.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < count {
            return Err(DecodeError::Short);
        }
        let (head, rest) = self.0.split_at(count);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Bad("boolean")),
        }
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let length = self.u64()?;
        if length > MAX_FRAME_BYTES as u64 {
            return Err(DecodeError::Bad("length"));
        }
        self.take(length as usize)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    fn regions(&mut self) -> Result<RegionSet, DecodeError> {
        let count = self.u64()?;
        if count > (self.0.len() / 8) as u64 {
            return Err(DecodeError::Short);
        }
        (0..count).map(|_| self.u64()).collect()
    }
    fn hashes(&mut self) -> Result<Vec<BlockHash>, DecodeError> {
        let count = self.u64()?;
        if count > MAX_HASH_BLOCKS || count > self.0.len() as u64 {
            return Err(DecodeError::Bad("hash count"));
        }
        (0..count)
            .map(|_| match self.u8()? {
                0 => Ok(BlockHash::Hash(u128::from_le_bytes(
                    self.take(16)?.try_into().expect("16 bytes"),
                ))),
                1 => Ok(BlockHash::Unreadable),
                _ => Err(DecodeError::Bad("hash kind")),
            })
            .collect()
    }
    fn error(&mut self) -> Result<ReplicaError, DecodeError> {
        let tag = self.u8()?;
        let message = self.string()?;
        Ok(match tag {
            1 => ReplicaError::Checksum(message),
            2 => ReplicaError::Io(message),
            3 => ReplicaError::NoSpace(message),
            4 => ReplicaError::Refused(message),
            _ => return Err(DecodeError::Bad("error kind")),
        })
    }
    fn finish(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Bad("trailing bytes"))
        }
    }
}

/// The bytes of a `Write` with data that come before the data: tag, seq,
/// offset, fua, settled, payload kind and data length (see
/// [`ToReplica::encode_head`], [`WriteHead`]).
pub const WRITE_HEAD_BYTES: usize = 1 + 8 + 8 + 1 + 8 + 1 + 8;

/// A write's fields, read from the first [`WRITE_HEAD_BYTES`] of its
/// frame, before its data: a link reads the data straight into the
/// page-aligned buffer the store keeps, instead of into a frame and then
/// out of it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteHead {
    pub seq: u64,
    pub offset: u64,
    pub fua: bool,
    pub settled: u64,
    /// The data that follows: the rest of the frame.
    pub data_bytes: usize,
}

impl WriteHead {
    /// The head of a write whose data is the rest of a frame of
    /// `frame_bytes`, if `head` (the frame's first [`WRITE_HEAD_BYTES`]) is
    /// one; `None` for anything else, which is then decoded whole
    /// ([`ToReplica::decode`]), errors included.
    pub fn decode(head: &[u8], frame_bytes: usize) -> Option<WriteHead> {
        if head.len() != WRITE_HEAD_BYTES {
            return None;
        }
        let mut r = Reader(head);
        if r.u8().ok()? != 2 {
            return None;
        }
        let seq = r.u64().ok()?;
        let offset = r.u64().ok()?;
        let fua = r.bool().ok()?;
        let settled = r.u64().ok()?;
        if r.u8().ok()? != 0 {
            return None;
        }
        let data_bytes = r.u64().ok()?;
        // `decode` would refuse the frame: let it say why.
        if data_bytes > MAX_FRAME_BYTES as u64
            || frame_bytes.checked_sub(WRITE_HEAD_BYTES)? as u64 != data_bytes
        {
            return None;
        }
        Some(WriteHead {
            seq,
            offset,
            fua,
            settled,
            data_bytes: data_bytes as usize,
        })
    }

    /// The write, with the data read after its head.
    pub fn with_data(self, data: BlockBuf) -> ToReplica {
        assert_eq!(
            data.len(),
            self.data_bytes,
            "a write's data is the length its head gives"
        );
        ToReplica::Write {
            seq: self.seq,
            offset: self.offset,
            payload: Payload::Data(Arc::new(data)),
            fua: self.fua,
            settled: self.settled,
        }
    }
}

impl ToReplica {
    /// Appends the message (without a frame length) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let Some(data) = self.encode_head(out) {
            out.extend_from_slice(data);
        }
    }

    /// Appends the message to `out` as [`ToReplica::encode`] does, except a
    /// write's data, which is returned instead: sent right after these
    /// bytes from its own buffer, it makes the same encoding without a
    /// copy.
    pub fn encode_head(&self, out: &mut Vec<u8>) -> Option<&Arc<BlockBuf>> {
        let mut w = Writer(out);
        match self {
            ToReplica::Hello {
                generation,
                primary,
            } => {
                w.u8(1);
                w.u64(generation.0);
                w.u64(primary.0);
            }
            ToReplica::Write {
                seq,
                offset,
                payload,
                fua,
                settled,
            } => {
                w.u8(2);
                w.u64(*seq);
                w.u64(*offset);
                w.u8(*fua as u8);
                w.u64(*settled);
                match payload {
                    Payload::Data(data) => {
                        w.u8(0);
                        w.u64(data.len() as u64);
                        return Some(data);
                    }
                    Payload::Zeroes { length, trim } => {
                        w.u8(1 + *trim as u8);
                        w.u64(*length);
                    }
                }
            }
            ToReplica::Flush { seq } => {
                w.u8(3);
                w.u64(*seq);
            }
            ToReplica::Read { id, offset, length } => {
                w.u8(4);
                w.u64(*id);
                w.u64(*offset);
                w.u64(*length);
            }
            ToReplica::Goodbye => w.u8(5),
            ToReplica::Snapshot { seq, snapshot } => {
                w.u8(7);
                w.u64(*seq);
                w.u64(snapshot.0);
            }
            ToReplica::Hash { id, offset, length } => {
                w.u8(6);
                w.u64(*id);
                w.u64(*offset);
                w.u64(*length);
            }
            ToReplica::Ping { token } => {
                w.u8(8);
                w.u64(*token);
            }
        }
        None
    }

    pub fn decode(frame: &[u8]) -> Result<ToReplica, DecodeError> {
        let mut r = Reader(frame);
        let message = match r.u8()? {
            1 => ToReplica::Hello {
                generation: Generation(r.u64()?),
                primary: NodeId(r.u64()?),
            },
            2 => {
                let seq = r.u64()?;
                let offset = r.u64()?;
                let fua = r.bool()?;
                let settled = r.u64()?;
                let payload = match r.u8()? {
                    0 => Payload::data(r.bytes()?),
                    kind @ (1 | 2) => Payload::Zeroes {
                        length: r.u64()?,
                        trim: kind == 2,
                    },
                    _ => return Err(DecodeError::Bad("payload kind")),
                };
                ToReplica::Write {
                    seq,
                    offset,
                    payload,
                    fua,
                    settled,
                }
            }
            3 => ToReplica::Flush { seq: r.u64()? },
            4 => ToReplica::Read {
                id: r.u64()?,
                offset: r.u64()?,
                length: r.u64()?,
            },
            5 => ToReplica::Goodbye,
            7 => ToReplica::Snapshot {
                seq: r.u64()?,
                snapshot: SnapshotId(r.u64()?),
            },
            6 => ToReplica::Hash {
                id: r.u64()?,
                offset: r.u64()?,
                length: r.u64()?,
            },
            8 => ToReplica::Ping { token: r.u64()? },
            tag => return Err(DecodeError::UnknownTag(tag)),
        };
        r.finish()?;
        Ok(message)
    }
}

impl FromReplica {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            FromReplica::Welcome {
                previous,
                intact,
                was_primary,
                unsettled,
            } => {
                w.u8(1);
                w.u64(previous.0);
                w.u8(*intact as u8);
                w.u8(*was_primary as u8);
                w.regions(unsettled);
            }
            FromReplica::Refused { newer } => {
                w.u8(2);
                w.u64(newer.0);
            }
            FromReplica::Ack { seq, result } => {
                w.u8(3);
                w.u64(*seq);
                match result {
                    Ok(()) => w.u8(0),
                    Err(error) => {
                        w.u8(1);
                        w.error(error);
                    }
                }
            }
            FromReplica::ReadReply { id, result } => {
                w.u8(4);
                w.u64(*id);
                match result {
                    Ok(ReadData::Data(data)) => {
                        w.u8(0);
                        w.bytes(data);
                    }
                    Ok(ReadData::Zeroes) => w.u8(1),
                    Err(error) => {
                        w.u8(2);
                        w.error(error);
                    }
                }
            }
            FromReplica::HashReply { id, result } => {
                w.u8(5);
                w.u64(*id);
                match result {
                    Ok(hashes) => {
                        w.u8(0);
                        w.hashes(hashes);
                    }
                    Err(error) => {
                        w.u8(1);
                        w.error(error);
                    }
                }
            }
            FromReplica::Pong { token } => {
                w.u8(6);
                w.u64(*token);
            }
        }
    }

    pub fn decode(frame: &[u8]) -> Result<FromReplica, DecodeError> {
        let mut r = Reader(frame);
        let message = match r.u8()? {
            1 => FromReplica::Welcome {
                previous: Generation(r.u64()?),
                intact: r.bool()?,
                was_primary: r.bool()?,
                unsettled: r.regions()?,
            },
            2 => FromReplica::Refused {
                newer: Generation(r.u64()?),
            },
            3 => FromReplica::Ack {
                seq: r.u64()?,
                result: match r.u8()? {
                    0 => Ok(()),
                    1 => Err(r.error()?),
                    _ => return Err(DecodeError::Bad("result")),
                },
            },
            4 => FromReplica::ReadReply {
                id: r.u64()?,
                result: match r.u8()? {
                    0 => Ok(ReadData::Data(r.bytes()?.to_vec())),
                    1 => Ok(ReadData::Zeroes),
                    2 => Err(r.error()?),
                    _ => return Err(DecodeError::Bad("result")),
                },
            },
            5 => FromReplica::HashReply {
                id: r.u64()?,
                result: match r.u8()? {
                    0 => Ok(r.hashes()?),
                    1 => Err(r.error()?),
                    _ => return Err(DecodeError::Bad("result")),
                },
            },
            6 => FromReplica::Pong { token: r.u64()? },
            tag => return Err(DecodeError::UnknownTag(tag)),
        };
        r.finish()?;
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip_to(message: ToReplica) {
        let mut out = Vec::new();
        message.encode(&mut out);
        assert_eq!(ToReplica::decode(&out).unwrap(), message);
    }

    /// A decoded write's data is in page-aligned memory, which the store
    /// keeps as it is.
    #[test]
    fn decoded_write_data_is_page_aligned() {
        let mut out = Vec::new();
        ToReplica::Write {
            seq: 1,
            offset: 0,
            payload: Payload::data(vec![3u8; 8192]),
            fua: false,
            settled: 0,
        }
        .encode(&mut out);
        let ToReplica::Write {
            payload: Payload::Data(data),
            ..
        } = ToReplica::decode(&out).unwrap()
        else {
            panic!("a write with data")
        };
        assert_eq!(data.as_ptr() as usize % BlockBuf::ALIGN, 0);
        assert_eq!(data.len(), 8192);
    }

    fn round_trip_from(message: FromReplica) {
        let mut out = Vec::new();
        message.encode(&mut out);
        assert_eq!(FromReplica::decode(&out).unwrap(), message);
    }

    #[test]
    fn every_message_round_trips() {
        round_trip_to(ToReplica::Hello {
            generation: Generation(7),
            primary: NodeId(2),
        });
        round_trip_to(ToReplica::Write {
            seq: 9,
            offset: 4096,
            payload: Payload::data(vec![7u8; 4096]),
            fua: true,
            settled: 3,
        });
        round_trip_to(ToReplica::Write {
            seq: 10,
            offset: 0,
            payload: Payload::Zeroes {
                length: 1 << 20,
                trim: true,
            },
            fua: false,
            settled: 3,
        });
        round_trip_to(ToReplica::Flush { seq: 11 });
        round_trip_to(ToReplica::Goodbye);
        round_trip_to(ToReplica::Read {
            id: 1,
            offset: 8192,
            length: 4096,
        });
        round_trip_from(FromReplica::Welcome {
            previous: Generation(3),
            intact: true,
            was_primary: false,
            unsettled: [1, 5, 9].into_iter().collect(),
        });
        round_trip_from(FromReplica::Refused {
            newer: Generation(8),
        });
        round_trip_from(FromReplica::Ack {
            seq: 4,
            result: Err(ReplicaError::NoSpace("a".into())),
        });
        round_trip_from(FromReplica::ReadReply {
            id: 4,
            result: Ok(ReadData::Data(vec![1, 2, 3])),
        });
        round_trip_from(FromReplica::ReadReply {
            id: 5,
            result: Err(ReplicaError::Checksum("block 3".into())),
        });
        round_trip_to(ToReplica::Snapshot {
            seq: 12,
            snapshot: SnapshotId(3),
        });
        round_trip_to(ToReplica::Hash {
            id: 6,
            offset: 1 << 20,
            length: 1 << 20,
        });
        round_trip_from(FromReplica::HashReply {
            id: 6,
            result: Ok(vec![BlockHash::Hash(u128::MAX - 7), BlockHash::Unreadable]),
        });
        round_trip_from(FromReplica::HashReply {
            id: 7,
            result: Err(ReplicaError::Io("disk".into())),
        });
        round_trip_to(ToReplica::Ping { token: 123_456 });
        round_trip_from(FromReplica::Pong { token: u64::MAX });
    }

    /// The encoder hands a write's data over as the payload's own buffer
    /// (sent from there, never copied into the frame), and the two pieces
    /// make exactly the bytes of the whole encoding.
    #[test]
    fn a_write_encodes_in_two_pieces_without_copying_its_data() {
        let payload = Payload::data(vec![5u8; 4096]);
        let Payload::Data(data) = &payload else {
            unreachable!()
        };
        let message = ToReplica::Write {
            seq: 12,
            offset: 1 << 30,
            payload: payload.clone(),
            fua: false,
            settled: 11,
        };
        let mut head = Vec::new();
        let handed = message.encode_head(&mut head).expect("a write has data");
        assert!(Arc::ptr_eq(handed, data), "the payload's own buffer");
        assert_eq!(head.len(), WRITE_HEAD_BYTES);
        let mut whole = Vec::new();
        message.encode(&mut whole);
        assert_eq!([&head[..], &handed[..]].concat(), whole);

        for other in [
            ToReplica::Flush { seq: 1 },
            ToReplica::Write {
                seq: 2,
                offset: 0,
                payload: Payload::Zeroes {
                    length: 4096,
                    trim: false,
                },
                fua: true,
                settled: 1,
            },
        ] {
            let mut head = Vec::new();
            assert!(other.encode_head(&mut head).is_none());
            let mut whole = Vec::new();
            other.encode(&mut whole);
            assert_eq!(head, whole);
        }
    }

    proptest! {
        /// A write read head first, then its data, is the write decoded
        /// from the whole frame.
        #[test]
        fn a_write_decodes_from_its_head_and_data(seq: u64, offset: u64, fua: bool, settled: u64, length in 0usize..9000) {
            let data: Vec<u8> = (0..length).map(|index| index as u8).collect();
            let message = ToReplica::Write { seq, offset, payload: Payload::data(data.clone()), fua, settled };
            let mut frame = Vec::new();
            message.encode(&mut frame);
            let head = WriteHead::decode(&frame[..WRITE_HEAD_BYTES], frame.len()).expect("a write head");
            prop_assert_eq!(head.data_bytes, length);
            prop_assert_eq!(head.with_data(BlockBuf::from(&frame[WRITE_HEAD_BYTES..])), message);
        }

        /// Whatever a frame holds, a head that decodes promises the same
        /// message as the whole frame; anything else is left to `decode`.
        #[test]
        fn a_write_head_agrees_with_the_whole_decoder(mut bytes in proptest::collection::vec(any::<u8>(), WRITE_HEAD_BYTES..WRITE_HEAD_BYTES + 64), tag_is_write: bool, fua_valid: bool, data_kind: bool) {
            if tag_is_write {
                bytes[0] = 2;
            }
            if fua_valid {
                bytes[17] &= 1;
            }
            if data_kind {
                bytes[26] = 0;
                let data_bytes = (bytes.len() - WRITE_HEAD_BYTES) as u64;
                bytes[27..35].copy_from_slice(&data_bytes.to_le_bytes());
            }
            if let Some(head) = WriteHead::decode(&bytes[..WRITE_HEAD_BYTES], bytes.len()) {
                let split = head.with_data(BlockBuf::from(&bytes[WRITE_HEAD_BYTES..]));
                prop_assert_eq!(ToReplica::decode(&bytes), Ok(split));
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ToReplica::decode(&bytes);
            let _ = FromReplica::decode(&bytes);
        }
    }
}
