//! Property tests: arbitrary bytes, and arbitrary splits of valid streams,
//! never panic the handshake or the request decoder and never make them
//! buffer more than the protocol limits allow.

use bytes::BytesMut;
use proptest::prelude::*;
use trireme_proto::nbd::constants::*;
use trireme_proto::nbd::{
    ExportCatalog, ExportInfo, Handshake, HandshakeStep, RequestDecoder, RequestKind,
};

struct Catalog;

impl ExportCatalog for Catalog {
    fn lookup(&self, name: &str) -> Result<ExportInfo, String> {
        (name == "disk")
            .then_some(ExportInfo {
                size_bytes: 1 << 30,
                read_only: false,
            })
            .ok_or_else(|| format!("no export '{name}'"))
    }
    fn names(&self) -> Vec<String> {
        vec!["disk".into()]
    }
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn request(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

/// Cuts `stream` at the given points (taken modulo its length).
fn split(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut % (stream.len() + 1)).collect();
    points.push(0);
    points.push(stream.len());
    points.sort_unstable();
    points
        .windows(2)
        .map(|pair| stream[pair[0]..pair[1]].to_vec())
        .collect()
}

/// Largest input the handshake may hold between calls: one option header
/// and its body, plus what the last call handed in.
const HANDSHAKE_BUFFER_BOUND: usize = 16 + MAX_OPTION_BYTES as usize;

fn drive_handshake(chunks: &[Vec<u8>]) -> (HandshakeStep, Vec<u8>) {
    let mut handshake = Handshake::new();
    let mut output = handshake.take_output();
    let mut step = HandshakeStep::NeedMore;
    for chunk in chunks {
        step = handshake.receive(chunk, &Catalog);
        output.extend(handshake.take_output());
        if step != HandshakeStep::NeedMore {
            break;
        }
        assert!(handshake.buffered_input_bytes() <= HANDSHAKE_BUFFER_BOUND + chunk.len());
    }
    (step, output)
}

fn valid_handshake_stream() -> Vec<u8> {
    let mut stream = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    stream.extend(option(OPT_STRUCTURED_REPLY, &[]));
    stream.extend(option(OPT_LIST, &[]));
    stream.extend(option(77, b"unknown"));
    let mut meta = 4u32.to_be_bytes().to_vec();
    meta.extend_from_slice(b"disk");
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
    meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
    stream.extend(option(OPT_SET_META_CONTEXT, &meta));
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"disk");
    go.extend_from_slice(&0u16.to_be_bytes());
    stream.extend(option(OPT_GO, &go));
    stream
}

fn valid_request_stream() -> Vec<u8> {
    let mut stream = request(0, CMD_READ, 1, 0, 4096);
    stream.extend(request(CMD_FLAG_FUA, CMD_WRITE, 2, 512, 300));
    stream.extend(vec![7u8; 300]);
    stream.extend(request(0, CMD_FLUSH, 3, 0, 0));
    stream.extend(request(0, CMD_BLOCK_STATUS, 4, 0, 1 << 20));
    stream.extend(request(0, CMD_DISCONNECT, 5, 0, 0));
    stream
}

fn decode_all(chunks: &[Vec<u8>]) -> Vec<RequestKind> {
    let mut decoder = RequestDecoder::new();
    let mut input = BytesMut::new();
    let mut kinds = Vec::new();
    for chunk in chunks {
        input.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(request)) => kinds.push(request.kind),
                Ok(None) => break,
                Err(error) if error.is_fatal() => return kinds,
                Err(_) => {}
            }
            // A payload moves out of the input as it arrives.
            assert!(decoder.buffered_payload_bytes() <= MAX_PAYLOAD_BYTES as usize);
        }
        assert!(input.len() < REQUEST_HEADER_BYTES);
    }
    kinds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn handshake_survives_arbitrary_bytes(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..32),
    ) {
        drive_handshake(&chunks);
    }

    #[test]
    fn handshake_survives_arbitrary_options(
        flags in 0u32..4,
        options in proptest::collection::vec((0u32..16, proptest::collection::vec(any::<u8>(), 0..48)), 0..16),
    ) {
        let mut stream = flags.to_be_bytes().to_vec();
        for (code, data) in &options {
            stream.extend(option(*code, data));
        }
        drive_handshake(&[stream]);
    }

    #[test]
    fn handshake_result_does_not_depend_on_splits(
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let stream = valid_handshake_stream();
        let whole = drive_handshake(std::slice::from_ref(&stream));
        let pieces = drive_handshake(&split(&stream, &cuts));
        prop_assert_eq!(&whole, &pieces);
        let HandshakeStep::Transmission(negotiated) = whole.0 else {
            panic!("valid stream did not negotiate: {:?}", whole.0);
        };
        prop_assert!(negotiated.base_allocation_context_id.is_some());
    }

    #[test]
    fn decoder_survives_arbitrary_bytes(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 0..32),
    ) {
        decode_all(&chunks);
    }

    #[test]
    fn decoder_survives_headers_with_arbitrary_fields(
        fields in proptest::collection::vec((any::<u16>(), 0u16..12, any::<u64>(), any::<u32>()), 0..8),
    ) {
        let mut stream = Vec::new();
        for (flags, command, offset, length) in fields {
            // Keep writes small so the test does not need 32 MiB of input.
            let length = if command == CMD_WRITE { length % 64 } else { length };
            stream.extend(request(flags, command, 1, offset, length));
            if command == CMD_WRITE {
                stream.extend(vec![0u8; length as usize]);
            }
        }
        decode_all(&[stream]);
    }

    #[test]
    fn decoder_result_does_not_depend_on_splits(
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let stream = valid_request_stream();
        let whole = decode_all(std::slice::from_ref(&stream));
        prop_assert_eq!(whole.len(), 5);
        prop_assert_eq!(whole, decode_all(&split(&stream, &cuts)));
    }
}
