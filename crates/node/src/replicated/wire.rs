//! Data links on the wire: length-prefixed frames, and the signed preamble
//! that opens a link.
//!
//! A primary opens one TCP connection per volume and replica node. Its
//! first frame is a [`LinkOpen`] (JSON) signed with the cluster secret, so
//! only members can write to a replica; the replica answers one frame, an
//! empty one for yes or a reason for no. After that, each frame is one
//! encoded `ToReplica` or `FromReplica` message.

use serde::{Deserialize, Serialize};
use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};
use trireme_replication::message::{DecodeError, WriteHead, MAX_FRAME_BYTES, WRITE_HEAD_BYTES};
use trireme_replication::ToReplica;
use trireme_types::{BlockBuf, NodeId};

use crate::cluster::auth;

/// A link's preamble may be this old (clock skew between nodes included).
const PREAMBLE_MAX_AGE_MS: u64 = 5 * 60 * 1000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkOpen {
    pub volume: String,
    pub from: NodeId,
    pub time_ms: u64,
    pub mac: String,
}

impl LinkOpen {
    pub fn signed(cluster_secret: &[u8], volume: &str, from: NodeId) -> LinkOpen {
        let time_ms = auth::now_ms();
        LinkOpen {
            volume: volume.to_string(),
            from,
            time_ms,
            mac: auth::sign_request(cluster_secret, from, "LINK", volume, time_ms, b""),
        }
    }

    pub fn verify(&self, cluster_secret: &[u8]) -> Result<(), String> {
        let age = auth::now_ms().abs_diff(self.time_ms);
        if age > PREAMBLE_MAX_AGE_MS {
            return Err(format!(
                "link preamble is {age} ms old; are the nodes' clocks far apart?"
            ));
        }
        if !auth::request_mac_matches(
            cluster_secret,
            self.from,
            "LINK",
            &self.volume,
            self.time_ms,
            b"",
            &self.mac,
        ) {
            return Err("link preamble has a bad signature".into());
        }
        Ok(())
    }
}

/// Appends a frame: its length (u32, little endian), then `body`.
pub fn push_frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let length = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&length.to_le_bytes());
}

/// Frames of `ToReplica` messages on their way to one link: the small
/// bytes (frame lengths, message fields) in one buffer, and each write's
/// data by reference to its own buffer, shared with the primary's record
/// of the write. They go to the socket with one vectored write, so a
/// write's data is never copied into a frame.
#[derive(Default)]
pub struct Frames {
    bytes: Vec<u8>,
    /// In sending order.
    pieces: Vec<Piece>,
    total_bytes: usize,
}

enum Piece {
    /// `bytes[start..end]`.
    Bytes {
        start: usize,
        end: usize,
    },
    Data(Arc<BlockBuf>),
}

/// At most this many buffers go to one vectored write (Linux's IOV_MAX).
pub const MAX_WRITE_SLICES: usize = 1024;

/// The buffers of one vectored write, at most [`MAX_WRITE_SLICES`]: an
/// array on the stack (16 KiB), so that a write allocates nothing.
pub struct WriteSlices<'a> {
    slices: [IoSlice<'a>; MAX_WRITE_SLICES],
    len: usize,
}

impl<'a> WriteSlices<'a> {
    pub fn new() -> WriteSlices<'a> {
        WriteSlices {
            slices: [IoSlice::new(&[]); MAX_WRITE_SLICES],
            len: 0,
        }
    }

    pub fn is_full(&self) -> bool {
        self.len == MAX_WRITE_SLICES
    }

    fn push(&mut self, bytes: &'a [u8]) {
        assert!(
            !self.is_full(),
            "a vectored write holds at most {MAX_WRITE_SLICES} buffers"
        );
        self.slices[self.len] = IoSlice::new(bytes);
        self.len += 1;
    }

    /// The buffers pushed, in order.
    pub fn as_slices(&self) -> &[IoSlice<'a>] {
        &self.slices[..self.len]
    }
}

impl Default for WriteSlices<'_> {
    fn default() -> Self {
        WriteSlices::new()
    }
}

impl Frames {
    /// Appends `message` as one frame (the encoding of [`push_frame`]).
    pub fn push(&mut self, message: &ToReplica) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        let data = message.encode_head(&mut self.bytes);
        let data_bytes = data.map_or(0, |data| data.len());
        let length = self.bytes.len() - start - 4 + data_bytes;
        self.bytes[start..start + 4].copy_from_slice(&(length as u32).to_le_bytes());
        self.extend_bytes(start);
        if let Some(data) = data {
            if !data.is_empty() {
                self.pieces.push(Piece::Data(data.clone()));
            }
        }
        self.total_bytes += length + 4;
    }

    /// The bytes from `start` to the end of `bytes` are the next piece.
    fn extend_bytes(&mut self, start: usize) {
        let end = self.bytes.len();
        match self.pieces.last_mut() {
            Some(Piece::Bytes { end: last_end, .. }) if *last_end == start => *last_end = end,
            _ => self.pieces.push(Piece::Bytes { start, end }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.total_bytes == 0
    }

    /// Bytes the frames take on the wire.
    pub fn len(&self) -> usize {
        self.total_bytes
    }

    /// Appends to `slices` the buffers that hold these frames' bytes from
    /// `skip` on, until `slices` is full.
    pub fn slices<'a>(&'a self, mut skip: usize, slices: &mut WriteSlices<'a>) {
        for piece in &self.pieces {
            if slices.is_full() {
                return;
            }
            let bytes: &[u8] = match piece {
                Piece::Bytes { start, end } => &self.bytes[*start..*end],
                Piece::Data(data) => data,
            };
            if skip >= bytes.len() {
                skip -= bytes.len();
                continue;
            }
            slices.push(&bytes[skip..]);
            skip = 0;
        }
    }
}

/// Reads one frame holding a `ToReplica` message (blocking). A write's
/// data goes from `reader` straight into the page-aligned buffer the
/// store keeps; any other message is read into `frame` and decoded there.
/// The outer error is the link's (the stream failed); the inner one, the
/// message's.
pub fn read_to_replica(
    reader: &mut impl Read,
    frame: &mut Vec<u8>,
) -> io::Result<Result<ToReplica, DecodeError>> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length)?;
    let length = u32::from_le_bytes(length) as usize;
    check_length(length)?;
    frame.clear();
    if length >= WRITE_HEAD_BYTES {
        let mut head = [0u8; WRITE_HEAD_BYTES];
        reader.read_exact(&mut head)?;
        if let Some(write) = WriteHead::decode(&head, length) {
            let mut data = BlockBuf::zeroed(write.data_bytes);
            reader.read_exact(&mut data)?;
            return Ok(Ok(write.with_data(data)));
        }
        frame.extend_from_slice(&head);
    }
    let start = frame.len();
    frame.resize(length, 0);
    reader.read_exact(&mut frame[start..])?;
    Ok(ToReplica::decode(frame))
}

/// Whether `buffered`, bytes read from a link and not consumed yet, starts
/// with a whole frame: reading it then takes no wait on the sender.
pub fn frame_buffered(buffered: &[u8]) -> bool {
    match buffered.get(..4) {
        Some(length) => {
            let length = u32::from_le_bytes(length.try_into().expect("four bytes")) as usize;
            buffered.len() - 4 >= length
        }
        None => false,
    }
}

fn check_length(length: usize) -> io::Result<()> {
    if length > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    Ok(())
}

/// Reads one frame into `buffer` (blocking).
pub fn read_frame(reader: &mut impl Read, buffer: &mut Vec<u8>) -> io::Result<()> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length)?;
    let length = u32::from_le_bytes(length) as usize;
    check_length(length)?;
    buffer.clear();
    buffer.resize(length, 0);
    reader.read_exact(buffer)
}

pub fn write_frame(writer: &mut impl Write, body: &[u8]) -> io::Result<()> {
    writer.write_all(&(body.len() as u32).to_le_bytes())?;
    writer.write_all(body)
}

/// Reads one frame (async).
pub async fn read_frame_async(
    reader: &mut (impl AsyncRead + Unpin),
    buffer: &mut Vec<u8>,
) -> io::Result<()> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length).await?;
    let length = u32::from_le_bytes(length) as usize;
    check_length(length)?;
    buffer.clear();
    buffer.resize(length, 0);
    reader.read_exact(buffer).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_counts_as_buffered_only_when_all_of_it_is() {
        let mut out = Vec::new();
        push_frame(&mut out, |body| body.extend_from_slice(b"hello"));
        push_frame(&mut out, |body| body.extend_from_slice(b"more"));
        let first = 4 + 5;
        assert!(!frame_buffered(&[]));
        assert!(!frame_buffered(&out[..3]), "the length itself cut off");
        assert!(!frame_buffered(&out[..4]));
        assert!(!frame_buffered(&out[..first - 1]), "one byte short");
        assert!(frame_buffered(&out[..first]));
        assert!(frame_buffered(&out), "with another whole one behind it");
        assert!(!frame_buffered(&out[first..out.len() - 1]));
        assert!(frame_buffered(&out[first..]));
    }

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut out = Vec::new();
        push_frame(&mut out, |body| body.extend_from_slice(b"hello"));
        let mut buffer = Vec::new();
        read_frame(&mut out.as_slice(), &mut buffer).unwrap();
        assert_eq!(buffer, b"hello");
        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice(), &mut buffer).is_err());
    }

    fn messages() -> Vec<ToReplica> {
        use trireme_replication::Payload;
        vec![
            ToReplica::Flush { seq: 1 },
            ToReplica::Write {
                seq: 2,
                offset: 4096,
                payload: Payload::data(vec![7u8; 4096]),
                fua: false,
                settled: 1,
            },
            ToReplica::Write {
                seq: 3,
                offset: 0,
                payload: Payload::data(vec![9u8; 512]),
                fua: true,
                settled: 1,
            },
            ToReplica::Ping { token: 5 },
            ToReplica::Write {
                seq: 4,
                offset: 8192,
                payload: Payload::Zeroes {
                    length: 1 << 20,
                    trim: true,
                },
                fua: false,
                settled: 3,
            },
            ToReplica::Write {
                seq: 5,
                offset: 0,
                payload: Payload::data(Vec::new()),
                fua: false,
                settled: 3,
            },
        ]
    }

    /// Frames carry each write's data as its own buffer (no copy), and
    /// their slices, from any point on, are the bytes `push_frame` makes:
    /// the wire format is unchanged.
    #[test]
    fn frames_send_write_data_from_its_own_buffer_in_the_wire_format() {
        let messages = messages();
        let mut frames = Frames::default();
        let mut expected = Vec::new();
        for message in &messages {
            frames.push(message);
            push_frame(&mut expected, |body| message.encode(body));
        }
        assert_eq!(frames.len(), expected.len());
        for skip in [0, 1, 4, 40, 4100, expected.len() - 1, expected.len()] {
            let mut slices = WriteSlices::new();
            frames.slices(skip, &mut slices);
            let sent: Vec<u8> = slices
                .as_slices()
                .iter()
                .flat_map(|slice| slice.iter().copied())
                .collect();
            assert_eq!(sent, expected[skip..], "from byte {skip}");
        }
        let mut slices = WriteSlices::new();
        frames.slices(0, &mut slices);
        for message in &messages {
            if let ToReplica::Write {
                payload: trireme_replication::Payload::Data(data),
                ..
            } = message
            {
                if !data.is_empty() {
                    assert!(
                        slices
                            .as_slices()
                            .iter()
                            .any(|slice| slice.as_ptr() == data.as_ptr()),
                        "the data of a {}-byte write is sent from its own buffer",
                        data.len()
                    );
                }
            }
        }
    }

    /// What frames send, the replica reads back as the same messages; a
    /// write's data lands in page-aligned memory.
    #[test]
    fn the_replica_reads_what_frames_send() {
        let messages = messages();
        let mut frames = Frames::default();
        for message in &messages {
            frames.push(message);
        }
        let mut slices = WriteSlices::new();
        frames.slices(0, &mut slices);
        let sent: Vec<u8> = slices
            .as_slices()
            .iter()
            .flat_map(|slice| slice.iter().copied())
            .collect();
        let mut reader = sent.as_slice();
        let mut frame = Vec::new();
        for message in &messages {
            let read = read_to_replica(&mut reader, &mut frame).unwrap().unwrap();
            if let ToReplica::Write {
                payload: trireme_replication::Payload::Data(data),
                ..
            } = &read
            {
                if !data.is_empty() {
                    assert_eq!(data.as_ptr() as usize % BlockBuf::ALIGN, 0);
                }
            }
            assert_eq!(&read, message);
        }
        assert!(reader.is_empty());
        // A frame that is not a valid message is the message's error, and
        // the stream goes on after it.
        let mut bad = Vec::new();
        push_frame(&mut bad, |body| body.extend_from_slice(&[99; 40]));
        push_frame(&mut bad, |body| ToReplica::Flush { seq: 8 }.encode(body));
        let mut reader = bad.as_slice();
        assert!(read_to_replica(&mut reader, &mut frame).unwrap().is_err());
        assert_eq!(
            read_to_replica(&mut reader, &mut frame).unwrap(),
            Ok(ToReplica::Flush { seq: 8 })
        );
    }

    #[test]
    fn a_preamble_signed_with_another_secret_is_refused() {
        let open = LinkOpen::signed(b"secret-a", "vol", NodeId(2));
        assert!(open.verify(b"secret-a").is_ok());
        assert!(open.verify(b"secret-b").is_err());
    }
}
