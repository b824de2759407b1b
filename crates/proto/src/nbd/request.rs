//! Transmission-phase requests: an incremental decoder and the checks a
//! server applies before touching the export.
//!
//! The decoder is fed a [`BytesMut`] the runtime reads into. A request comes
//! out once its header (and, for WRITE, its whole payload) has arrived.
//! Payload bytes move from the input into the request's own [`BlockBuf`]
//! as they arrive, so the input buffer stays at socket-read size and the
//! payload is copied once; a caller may also read the rest of a payload
//! straight into that buffer ([`RequestDecoder::payload_buffer`]). Its
//! memory is page-aligned, so the store can hand it to the device as it is.

use bytes::{Buf, BytesMut};
use trireme_types::BlockBuf;

use super::constants::*;
use super::handshake::Negotiated;

/// One decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Raw command flags (checked by [`validate_request`]).
    pub flags: u16,
    pub kind: RequestKind,
}

impl Request {
    /// Durable before the reply (NBD_CMD_FLAG_FUA).
    pub fn fua(&self) -> bool {
        self.flags & CMD_FLAG_FUA != 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        data: BlockBuf,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        no_hole: bool,
        fast_zero: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
    Disconnect,
}

/// Why the decoder could not produce a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The stream is out of step; nothing after this can be trusted.
    #[error("request has magic {magic:#x}, expected {REQUEST_MAGIC:#x}")]
    BadMagic { magic: u32 },
    /// A WRITE longer than [`MAX_PAYLOAD_BYTES`]: skipping it would mean
    /// reading it, so the connection closes.
    #[error("write of {length_bytes} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte payload limit")]
    PayloadTooLarge { cookie: u64, length_bytes: u32 },
    /// The server answers EINVAL and goes on. The spec cannot tell whether a
    /// payload follows; we assume none, and if one did, the next header
    /// fails its magic check and the connection closes.
    #[error("unknown command type {command}")]
    UnknownCommand { cookie: u64, command: u16 },
    /// `decode` was called again after a fatal error.
    #[error("decoder already failed")]
    Poisoned,
}

impl DecodeError {
    /// A fatal error ends the connection; a non-fatal one gets an EINVAL reply.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, DecodeError::UnknownCommand { .. })
    }
}

#[derive(Debug, Clone, Copy)]
struct Header {
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
}

#[derive(Debug)]
enum State {
    Header,
    /// A WRITE header arrived; its payload is being gathered.
    Payload {
        header: Header,
        data: BlockBuf,
    },
    Poisoned,
}

/// First allocation for a WRITE payload still in flight; it grows as bytes
/// arrive, so a header that lies about its length costs little memory.
const PAYLOAD_INITIAL_CAPACITY_BYTES: usize = 1024 * 1024;

/// Turns a transmission-phase byte stream into [`Request`]s.
#[derive(Debug)]
pub struct RequestDecoder {
    state: State,
}

impl Default for RequestDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestDecoder {
    pub fn new() -> Self {
        RequestDecoder {
            state: State::Header,
        }
    }

    /// Payload bytes held for a WRITE not yet complete.
    pub fn buffered_payload_bytes(&self) -> usize {
        match &self.state {
            State::Payload { data, .. } => data.len(),
            _ => 0,
        }
    }

    /// The WRITE payload being gathered and how many bytes it still lacks,
    /// so that the caller can read them from the socket straight into it
    /// rather than through the input buffer (one copy fewer per byte).
    /// Bytes appended there count as received; the next `decode` returns
    /// the request once the payload is whole. Never grow it past `missing`.
    pub fn payload_buffer(&mut self) -> Option<(&mut BlockBuf, usize)> {
        match &mut self.state {
            State::Payload { header, data } => {
                let missing = header.length as usize - data.len();
                Some((data, missing))
            }
            _ => None,
        }
    }

    /// Consumes bytes from `input`; `Ok(None)` means more bytes are needed.
    pub fn decode(&mut self, input: &mut BytesMut) -> Result<Option<Request>, DecodeError> {
        loop {
            match &mut self.state {
                State::Poisoned => return Err(DecodeError::Poisoned),
                State::Header => {
                    if input.len() < REQUEST_HEADER_BYTES {
                        return Ok(None);
                    }
                    let magic = input.get_u32();
                    let flags = input.get_u16();
                    let command = input.get_u16();
                    let header = Header {
                        flags,
                        cookie: input.get_u64(),
                        offset: input.get_u64(),
                        length: input.get_u32(),
                    };
                    if magic != REQUEST_MAGIC {
                        self.state = State::Poisoned;
                        return Err(DecodeError::BadMagic { magic });
                    }
                    if command == CMD_WRITE {
                        if header.length > MAX_PAYLOAD_BYTES {
                            self.state = State::Poisoned;
                            return Err(DecodeError::PayloadTooLarge {
                                cookie: header.cookie,
                                length_bytes: header.length,
                            });
                        }
                        let capacity = (header.length as usize)
                            .min(PAYLOAD_INITIAL_CAPACITY_BYTES.max(input.len()));
                        self.state = State::Payload {
                            header,
                            data: BlockBuf::with_capacity(capacity),
                        };
                        continue;
                    }
                    return request_without_payload(command, header).map(Some);
                }
                State::Payload { header, data } => {
                    let missing = header.length as usize - data.len();
                    let available = missing.min(input.len());
                    data.extend_from_slice(&input[..available]);
                    input.advance(available);
                    if data.len() < header.length as usize {
                        return Ok(None);
                    }
                    let header = *header;
                    let data = std::mem::take(data);
                    self.state = State::Header;
                    return Ok(Some(Request {
                        cookie: header.cookie,
                        flags: header.flags,
                        kind: RequestKind::Write {
                            offset: header.offset,
                            data,
                        },
                    }));
                }
            }
        }
    }
}

fn request_without_payload(command: u16, header: Header) -> Result<Request, DecodeError> {
    let Header {
        flags,
        cookie,
        offset,
        length,
    } = header;
    let kind = match command {
        CMD_READ => RequestKind::Read { offset, length },
        CMD_DISCONNECT => RequestKind::Disconnect,
        CMD_FLUSH => RequestKind::Flush,
        CMD_TRIM => RequestKind::Trim { offset, length },
        CMD_WRITE_ZEROES => RequestKind::WriteZeroes {
            offset,
            length,
            no_hole: flags & CMD_FLAG_NO_HOLE != 0,
            fast_zero: flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_BLOCK_STATUS => RequestKind::BlockStatus {
            offset,
            length,
            req_one: flags & CMD_FLAG_REQ_ONE != 0,
        },
        command => return Err(DecodeError::UnknownCommand { cookie, command }),
    };
    Ok(Request {
        cookie,
        flags,
        kind,
    })
}

/// Checks flags, permissions and range before the export is touched.
/// The error is what the reply carries (the spec's SHOULDs: ENOSPC for
/// writes past the end, EINVAL for reads, trims and block status past it,
/// EPERM for writes to a read-only export, EINVAL for unknown flags).
pub fn validate_request(request: &Request, negotiated: &Negotiated) -> Result<(), ErrorCode> {
    let export = &negotiated.export;
    let (command_flags, writes, offset, length) = match &request.kind {
        RequestKind::Read { offset, length } => (0, false, *offset, u64::from(*length)),
        RequestKind::Write { offset, data } => (0, true, *offset, data.len() as u64),
        RequestKind::Trim { offset, length } => (0, true, *offset, u64::from(*length)),
        RequestKind::WriteZeroes { offset, length, .. } => (
            CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            true,
            *offset,
            u64::from(*length),
        ),
        RequestKind::BlockStatus { offset, length, .. } => {
            (CMD_FLAG_REQ_ONE, false, *offset, u64::from(*length))
        }
        RequestKind::Flush | RequestKind::Disconnect => (0, false, 0, 0),
    };
    // FUA is valid on every command once advertised (clients set it widely).
    if request.flags & !(CMD_FLAG_FUA | command_flags) != 0 {
        return Err(ErrorCode::Invalid);
    }
    if writes && export.read_only {
        return Err(ErrorCode::Perm);
    }
    let in_range = offset
        .checked_add(length)
        .is_some_and(|end| end <= export.size_bytes);
    if !in_range {
        let is_write = matches!(
            request.kind,
            RequestKind::Write { .. } | RequestKind::WriteZeroes { .. }
        );
        return Err(if is_write {
            ErrorCode::NoSpace
        } else {
            ErrorCode::Invalid
        });
    }
    match &request.kind {
        RequestKind::Read { length, .. } if *length > MAX_PAYLOAD_BYTES => Err(ErrorCode::Invalid),
        RequestKind::BlockStatus { length, .. } => {
            // A zero-length query cannot be answered with the mandatory
            // non-empty descriptor.
            if negotiated.base_allocation_context_id.is_none() || *length == 0 {
                Err(ErrorCode::Invalid)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
