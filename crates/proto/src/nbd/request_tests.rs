//! Exact-bytes tests of the request decoder and of request validation.

use super::*;
use crate::nbd::ExportInfo;

fn header(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

fn negotiated(size_bytes: u64, read_only: bool, block_status: bool) -> Negotiated {
    let export = ExportInfo {
        size_bytes,
        read_only,
    };
    Negotiated {
        export_name: "disk".into(),
        export,
        transmission_flags: export.transmission_flags(),
        structured_replies: block_status,
        base_allocation_context_id: block_status.then_some(BASE_ALLOCATION_CONTEXT_ID),
    }
}

#[test]
fn decodes_every_command() {
    let mut input = BytesMut::new();
    input.extend_from_slice(&header(0, CMD_READ, 1, 4096, 512));
    input.extend_from_slice(&header(CMD_FLAG_FUA, CMD_WRITE, 2, 0, 3));
    input.extend_from_slice(b"abc");
    input.extend_from_slice(&header(0, CMD_FLUSH, 3, 0, 0));
    input.extend_from_slice(&header(0, CMD_TRIM, 4, 8, 9));
    input.extend_from_slice(&header(
        CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_WRITE_ZEROES,
        5,
        1,
        2,
    ));
    input.extend_from_slice(&header(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 6, 0, 100));
    input.extend_from_slice(&header(0, CMD_DISCONNECT, 7, 0, 0));
    let mut decoder = RequestDecoder::new();
    let mut kinds = Vec::new();
    while let Some(request) = decoder.decode(&mut input).unwrap() {
        kinds.push((request.cookie, request.fua(), request.kind));
    }
    assert!(input.is_empty());
    assert_eq!(
        kinds,
        [
            (
                1,
                false,
                RequestKind::Read {
                    offset: 4096,
                    length: 512
                }
            ),
            (
                2,
                true,
                RequestKind::Write {
                    offset: 0,
                    data: b"abc".to_vec().into()
                }
            ),
            (3, false, RequestKind::Flush),
            (
                4,
                false,
                RequestKind::Trim {
                    offset: 8,
                    length: 9
                }
            ),
            (
                5,
                false,
                RequestKind::WriteZeroes {
                    offset: 1,
                    length: 2,
                    no_hole: true,
                    fast_zero: true
                }
            ),
            (
                6,
                false,
                RequestKind::BlockStatus {
                    offset: 0,
                    length: 100,
                    req_one: true
                }
            ),
            (7, false, RequestKind::Disconnect),
        ]
    );
}

#[test]
fn partial_input_waits_and_payload_streams() {
    let mut stream = header(0, CMD_WRITE, 9, 512, 1000);
    stream.extend(vec![0xab; 1000]);
    let mut decoder = RequestDecoder::new();
    let mut input = BytesMut::new();
    for (index, chunk) in stream.chunks(7).enumerate() {
        input.extend_from_slice(chunk);
        let decoded = decoder.decode(&mut input).unwrap();
        let last = (index + 1) * 7 >= stream.len();
        assert_eq!(decoded.is_some(), last, "chunk {index}");
        if let Some(request) = decoded {
            assert_eq!(
                request.kind,
                RequestKind::Write {
                    offset: 512,
                    data: vec![0xab; 1000].into()
                }
            );
        }
        // Payload bytes never pile up in the input buffer.
        assert!(input.len() < REQUEST_HEADER_BYTES);
    }
}

#[test]
fn bad_magic_is_fatal_and_poisons() {
    let mut input = BytesMut::from(&[0u8; REQUEST_HEADER_BYTES][..]);
    let mut decoder = RequestDecoder::new();
    let error = decoder.decode(&mut input).unwrap_err();
    assert_eq!(error, DecodeError::BadMagic { magic: 0 });
    assert!(error.is_fatal());
    input.extend_from_slice(&header(0, CMD_FLUSH, 1, 0, 0));
    assert_eq!(decoder.decode(&mut input), Err(DecodeError::Poisoned));
}

#[test]
fn oversized_write_is_fatal() {
    let mut input = BytesMut::from(&header(0, CMD_WRITE, 4, 0, MAX_PAYLOAD_BYTES + 1)[..]);
    let error = RequestDecoder::new().decode(&mut input).unwrap_err();
    assert_eq!(
        error,
        DecodeError::PayloadTooLarge {
            cookie: 4,
            length_bytes: MAX_PAYLOAD_BYTES + 1
        }
    );
    assert!(error.is_fatal());
}

#[test]
fn unknown_command_is_not_fatal() {
    let mut input = BytesMut::from(&header(0, 77, 4, 0, 0)[..]);
    input.extend_from_slice(&header(0, CMD_FLUSH, 5, 0, 0));
    let mut decoder = RequestDecoder::new();
    let error = decoder.decode(&mut input).unwrap_err();
    assert_eq!(
        error,
        DecodeError::UnknownCommand {
            cookie: 4,
            command: 77
        }
    );
    assert!(!error.is_fatal());
    let next = decoder.decode(&mut input).unwrap().unwrap();
    assert_eq!((next.cookie, next.kind), (5, RequestKind::Flush));
}

fn request(flags: u16, kind: RequestKind) -> Request {
    Request {
        cookie: 1,
        flags,
        kind,
    }
}

#[test]
fn validation_ranges_permissions_and_flags() {
    let rw = negotiated(8192, false, true);
    let ro = negotiated(8192, true, false);
    let read = |offset, length| RequestKind::Read { offset, length };
    assert_eq!(validate_request(&request(0, read(4096, 4096)), &rw), Ok(()));
    assert_eq!(
        validate_request(&request(0, read(4096, 4097)), &rw),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        validate_request(&request(0, read(u64::MAX, 2)), &rw),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        validate_request(&request(CMD_FLAG_FUA, read(0, 1)), &rw),
        Ok(())
    );
    assert_eq!(
        validate_request(&request(CMD_FLAG_DF, read(0, 1)), &rw),
        Err(ErrorCode::Invalid)
    );
    assert_eq!(
        validate_request(&request(1 << 9, RequestKind::Flush), &rw),
        Err(ErrorCode::Invalid)
    );

    let write = RequestKind::Write {
        offset: 8190,
        data: vec![0; 4].into(),
    };
    assert_eq!(
        validate_request(&request(0, write.clone()), &rw),
        Err(ErrorCode::NoSpace)
    );
    assert_eq!(
        validate_request(&request(0, write), &ro),
        Err(ErrorCode::Perm)
    );
    let zeroes = RequestKind::WriteZeroes {
        offset: 8000,
        length: 1000,
        no_hole: false,
        fast_zero: false,
    };
    assert_eq!(
        validate_request(&request(0, zeroes), &rw),
        Err(ErrorCode::NoSpace)
    );
    let trim = RequestKind::Trim {
        offset: 8000,
        length: 1000,
    };
    assert_eq!(
        validate_request(&request(0, trim), &rw),
        Err(ErrorCode::Invalid)
    );
    let trim = RequestKind::Trim {
        offset: 0,
        length: 1000,
    };
    assert_eq!(
        validate_request(&request(CMD_FLAG_NO_HOLE, trim), &rw),
        Err(ErrorCode::Invalid)
    );

    let status = RequestKind::BlockStatus {
        offset: 0,
        length: 8192,
        req_one: true,
    };
    assert_eq!(
        validate_request(&request(CMD_FLAG_REQ_ONE, status.clone()), &rw),
        Ok(())
    );
    assert_eq!(
        validate_request(&request(CMD_FLAG_REQ_ONE, status), &ro),
        Err(ErrorCode::Invalid)
    );
    let empty_status = RequestKind::BlockStatus {
        offset: 0,
        length: 0,
        req_one: false,
    };
    assert_eq!(
        validate_request(&request(0, empty_status), &rw),
        Err(ErrorCode::Invalid)
    );

    let big = negotiated(u64::MAX, false, false);
    assert_eq!(
        validate_request(&request(0, read(0, MAX_PAYLOAD_BYTES + 1)), &big),
        Err(ErrorCode::Invalid)
    );
}

#[test]
fn a_payload_read_straight_into_its_buffer_completes_the_write() {
    let mut input = BytesMut::new();
    input.extend_from_slice(&header(0, CMD_WRITE, 9, 4096, 6));
    input.extend_from_slice(b"ab");
    let mut decoder = RequestDecoder::new();
    assert_eq!(decoder.decode(&mut input).unwrap(), None);
    assert!(input.is_empty());
    let (payload, missing) = decoder
        .payload_buffer()
        .expect("a payload is being gathered");
    assert_eq!(missing, 4);
    payload.extend_from_slice(b"cd");
    assert_eq!(
        decoder.decode(&mut input).unwrap(),
        None,
        "two bytes still missing"
    );
    let (payload, missing) = decoder.payload_buffer().expect("still gathering");
    assert_eq!(missing, 2);
    payload.extend_from_slice(b"ef");
    let request = decoder
        .decode(&mut input)
        .unwrap()
        .expect("the write is whole");
    assert_eq!(
        request.kind,
        RequestKind::Write {
            offset: 4096,
            data: b"abcdef".to_vec().into()
        }
    );
    assert!(
        decoder.payload_buffer().is_none(),
        "the next header is awaited"
    );
}

/// The store writes whole chunks to the device with `O_DIRECT` straight
/// from the decoded payload, which needs page-aligned memory: whether the
/// payload came through the input buffer or was read into the decoder's
/// buffer, in one piece or several.
#[test]
fn write_payloads_come_out_page_aligned() {
    let chunk = vec![0x5a; 128 * 1024];
    let mut decoder = RequestDecoder::new();
    let mut input = BytesMut::new();
    input.extend_from_slice(&header(0, CMD_WRITE, 1, 0, chunk.len() as u32));
    input.extend_from_slice(&chunk);
    input.extend_from_slice(&header(0, CMD_WRITE, 2, 0, chunk.len() as u32));
    input.extend_from_slice(&chunk[..1000]);
    let first = decoder.decode(&mut input).unwrap().expect("whole");
    assert_eq!(decoder.decode(&mut input).unwrap(), None);
    let (payload, missing) = decoder.payload_buffer().expect("gathering");
    payload.extend_from_slice(&chunk[1000..1000 + missing]);
    let second = decoder.decode(&mut input).unwrap().expect("whole");
    for request in [first, second] {
        let RequestKind::Write { data, .. } = request.kind else {
            panic!("a write")
        };
        assert_eq!(&data[..], &chunk[..]);
        assert_eq!(data.as_ptr() as usize % trireme_types::BlockBuf::ALIGN, 0);
    }
}
