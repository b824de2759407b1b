//! Reply encoders: simple replies and structured reply chunks, appended to
//! an output `Vec`. Read data is never copied in here: the encoders write the
//! header and the runtime sends the data buffer right after it.

use super::constants::*;
use super::handshake::truncate_utf8;

/// One `base:allocation` descriptor of a BLOCK_STATUS chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatusDescriptor {
    pub length_bytes: u32,
    /// `STATE_HOLE` | `STATE_ZERO`.
    pub flags: u32,
}

/// A simple reply header. On a successful READ the data follows it.
pub fn simple_reply(out: &mut Vec<u8>, cookie: u64, error: Option<ErrorCode>) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.map_or(0, ErrorCode::as_u32).to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

fn structured_header(out: &mut Vec<u8>, flags: u16, reply_type: u16, cookie: u64, length: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
}

fn done_flag(done: bool) -> u16 {
    if done {
        REPLY_FLAG_DONE
    } else {
        0
    }
}

/// NBD_REPLY_TYPE_NONE with DONE: success with nothing to say.
pub fn structured_none_done(out: &mut Vec<u8>, cookie: u64) {
    structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
}

/// Header of an NBD_REPLY_TYPE_OFFSET_DATA chunk; `data_length_bytes` bytes
/// of data must follow. Data is capped at [`MAX_PAYLOAD_BYTES`] by
/// validation, so the chunk length always fits.
pub fn offset_data_header(
    out: &mut Vec<u8>,
    cookie: u64,
    offset: u64,
    data_length_bytes: u32,
    done: bool,
) {
    debug_assert!(data_length_bytes > 0, "the spec forbids empty data chunks");
    debug_assert!(data_length_bytes <= MAX_PAYLOAD_BYTES);
    let length = data_length_bytes.saturating_add(8);
    structured_header(out, done_flag(done), REPLY_TYPE_OFFSET_DATA, cookie, length);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// NBD_REPLY_TYPE_ERROR with DONE; the message is cut to
/// [`MAX_ERROR_MESSAGE_BYTES`].
pub fn structured_error(out: &mut Vec<u8>, cookie: u64, error: ErrorCode, message: &str) {
    let message = truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES);
    // Both fit: the message is capped far below u16::MAX.
    let message_length = message.len() as u16;
    let length = 4 + 2 + u32::from(message_length);
    structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, length);
    out.extend_from_slice(&error.as_u32().to_be_bytes());
    out.extend_from_slice(&message_length.to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// NBD_REPLY_TYPE_BLOCK_STATUS: the context id, then (length, flags) pairs.
pub fn block_status_chunk(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    descriptors: &[BlockStatusDescriptor],
    done: bool,
) {
    debug_assert!(!descriptors.is_empty() && descriptors.len() <= MAX_DESCRIPTORS_PER_REPLY);
    let descriptors = &descriptors[..descriptors.len().min(MAX_DESCRIPTORS_PER_REPLY)];
    // At most 4 + 8 * 65536 bytes: fits u32.
    let length = (4 + 8 * descriptors.len()) as u32;
    structured_header(
        out,
        done_flag(done),
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        length,
    );
    out.extend_from_slice(&context_id.to_be_bytes());
    for descriptor in descriptors {
        out.extend_from_slice(&descriptor.length_bytes.to_be_bytes());
        out.extend_from_slice(&descriptor.flags.to_be_bytes());
    }
}

/// Turns (length, flags) extents into wire descriptors for a query of
/// `request_length_bytes`: clamps the total to the request, splits extents
/// longer than a u32 can say, drops empty ones, keeps one with `req_one`,
/// and caps the count at [`MAX_DESCRIPTORS_PER_REPLY`]. Never empty: with no
/// usable extent it reports the whole range as allocated data (flags 0),
/// which the spec says is always a safe answer.
pub fn descriptors_from_extents(
    extents: impl IntoIterator<Item = (u64, u32)>,
    request_length_bytes: u32,
    req_one: bool,
) -> Vec<BlockStatusDescriptor> {
    let mut descriptors = Vec::new();
    let mut remaining = u64::from(request_length_bytes);
    'extents: for (length_bytes, flags) in extents {
        let mut length_bytes = length_bytes.min(remaining);
        while length_bytes > 0 {
            let piece = length_bytes.min(u64::from(MAX_DESCRIPTOR_LENGTH_BYTES));
            // piece <= MAX_DESCRIPTOR_LENGTH_BYTES, so it fits a u32.
            descriptors.push(BlockStatusDescriptor {
                length_bytes: piece as u32,
                flags,
            });
            length_bytes -= piece;
            remaining -= piece;
            if req_one || descriptors.len() == MAX_DESCRIPTORS_PER_REPLY {
                break 'extents;
            }
        }
        if remaining == 0 {
            break;
        }
    }
    if descriptors.is_empty() && request_length_bytes > 0 {
        let length_bytes = request_length_bytes.min(MAX_DESCRIPTOR_LENGTH_BYTES);
        descriptors.push(BlockStatusDescriptor {
            length_bytes,
            flags: 0,
        });
    }
    descriptors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_reply_bytes() {
        let mut out = Vec::new();
        simple_reply(&mut out, 0x0102_0304_0506_0708, Some(ErrorCode::NoSpace));
        assert_eq!(
            out,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 28, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(out.len(), SIMPLE_REPLY_HEADER_BYTES);
    }

    #[test]
    fn offset_data_header_bytes() {
        let mut out = Vec::new();
        offset_data_header(&mut out, 7, 0x1000, 512, true);
        let mut expected = vec![0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 1];
        expected.extend_from_slice(&7u64.to_be_bytes());
        expected.extend_from_slice(&520u32.to_be_bytes());
        expected.extend_from_slice(&0x1000u64.to_be_bytes());
        assert_eq!(out, expected);
    }

    #[test]
    fn none_and_error_chunks() {
        let mut out = Vec::new();
        structured_none_done(&mut out, 9);
        let mut expected = vec![0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 0];
        expected.extend_from_slice(&9u64.to_be_bytes());
        expected.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(out, expected);

        out.clear();
        structured_error(&mut out, 9, ErrorCode::Io, "bad");
        let mut expected = vec![0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80, 0x01];
        expected.extend_from_slice(&9u64.to_be_bytes());
        expected.extend_from_slice(&9u32.to_be_bytes());
        expected.extend_from_slice(&5u32.to_be_bytes());
        expected.extend_from_slice(&3u16.to_be_bytes());
        expected.extend_from_slice(b"bad");
        assert_eq!(out, expected);
    }

    #[test]
    fn error_message_is_capped_on_a_char_boundary() {
        let mut out = Vec::new();
        let message = "é".repeat(MAX_ERROR_MESSAGE_BYTES);
        structured_error(&mut out, 1, ErrorCode::Io, &message);
        let length = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(length - 6 <= MAX_ERROR_MESSAGE_BYTES);
        assert!(std::str::from_utf8(&out[26..]).is_ok());
    }

    #[test]
    fn block_status_chunk_bytes() {
        let mut out = Vec::new();
        let descriptors = [
            BlockStatusDescriptor {
                length_bytes: 4096,
                flags: 0,
            },
            BlockStatusDescriptor {
                length_bytes: 8192,
                flags: STATE_HOLE | STATE_ZERO,
            },
        ];
        block_status_chunk(&mut out, 3, 1, &descriptors, true);
        let mut expected = vec![0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 5];
        expected.extend_from_slice(&3u64.to_be_bytes());
        expected.extend_from_slice(&20u32.to_be_bytes());
        for word in [1u32, 4096, 0, 8192, 3] {
            expected.extend_from_slice(&word.to_be_bytes());
        }
        assert_eq!(out, expected);
    }

    #[test]
    fn descriptors_are_clamped_split_and_never_empty() {
        let got = descriptors_from_extents([(10_000, 0), (u64::MAX, 3)], 20_000, false);
        assert_eq!(
            got,
            [
                BlockStatusDescriptor {
                    length_bytes: 10_000,
                    flags: 0
                },
                BlockStatusDescriptor {
                    length_bytes: 10_000,
                    flags: 3
                },
            ]
        );
        let got = descriptors_from_extents([(10_000, 0), (10_000, 3)], 20_000, true);
        assert_eq!(
            got,
            [BlockStatusDescriptor {
                length_bytes: 10_000,
                flags: 0
            }]
        );
        let got = descriptors_from_extents([(0, 3)], 512, false);
        assert_eq!(
            got,
            [BlockStatusDescriptor {
                length_bytes: 512,
                flags: 0
            }]
        );
        let got = descriptors_from_extents([(u64::MAX, 1)], u32::MAX, false);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].length_bytes, MAX_DESCRIPTOR_LENGTH_BYTES);
        assert_eq!(
            u64::from(got[0].length_bytes) + u64::from(got[1].length_bytes),
            u64::from(u32::MAX)
        );
    }
}
