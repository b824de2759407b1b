//! Exact-bytes tests of the handshake state machine.

use super::*;

struct Catalog;

const DISK_SIZE: u64 = 1 << 20;

impl ExportCatalog for Catalog {
    fn lookup(&self, name: &str) -> Result<ExportInfo, String> {
        match name {
            "disk" => Ok(ExportInfo {
                size_bytes: DISK_SIZE,
                read_only: false,
            }),
            "ro" => Ok(ExportInfo {
                size_bytes: 4096,
                read_only: true,
            }),
            _ => Err(format!("export '{name}' is not available")),
        }
    }
    fn names(&self) -> Vec<String> {
        vec!["disk".into(), "ro".into()]
    }
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&reply_type.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// A handshake past the greeting and the client flags.
fn started(client_flags: u32) -> Handshake {
    let mut handshake = Handshake::new();
    let greeting = handshake.take_output();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(&greeting[16..], &[0, 3]);
    assert_eq!(
        handshake.receive(&client_flags.to_be_bytes(), &Catalog),
        HandshakeStep::NeedMore
    );
    assert!(handshake.take_output().is_empty());
    handshake
}

fn info_export_reply(option_code: u32, size: u64, flags: u16) -> Vec<u8> {
    let mut info = INFO_EXPORT.to_be_bytes().to_vec();
    info.extend_from_slice(&size.to_be_bytes());
    info.extend_from_slice(&flags.to_be_bytes());
    reply(option_code, REP_INFO, &info)
}

fn block_size_reply(option_code: u32) -> Vec<u8> {
    let mut info = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for value in [1u32, 4096, 32 * 1024 * 1024] {
        info.extend_from_slice(&value.to_be_bytes());
    }
    reply(option_code, REP_INFO, &info)
}

const RW_FLAGS: u16 = 0b1001_0110_1101; // HAS_FLAGS FLUSH FUA TRIM WZ MULTI_CONN FAST_ZERO

#[test]
fn client_without_fixed_newstyle_is_closed() {
    let mut handshake = Handshake::new();
    let step = handshake.receive(&0u32.to_be_bytes(), &Catalog);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::MissingFixedNewstyle { flags: 0 })
    );
}

#[test]
fn client_with_unknown_flags_is_closed() {
    let mut handshake = Handshake::new();
    let step = handshake.receive(&5u32.to_be_bytes(), &Catalog);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::UnknownClientFlags { flags: 5 })
    );
}

#[test]
fn export_name_with_zeroes_and_without() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let step = handshake.receive(&option(OPT_EXPORT_NAME, b"disk"), &Catalog);
    let HandshakeStep::Transmission(negotiated) = step else {
        panic!("{step:?}")
    };
    assert_eq!(negotiated.export_name, "disk");
    assert!(!negotiated.structured_replies);
    let mut expected = DISK_SIZE.to_be_bytes().to_vec();
    expected.extend_from_slice(&RW_FLAGS.to_be_bytes());
    expected.extend_from_slice(&[0; 124]);
    assert_eq!(handshake.take_output(), expected);

    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
    let step = handshake.receive(&option(OPT_EXPORT_NAME, b"ro"), &Catalog);
    assert!(matches!(step, HandshakeStep::Transmission(_)));
    let mut expected = 4096u64.to_be_bytes().to_vec();
    expected.extend_from_slice(&(RW_FLAGS | TRANSMISSION_READ_ONLY).to_be_bytes());
    assert_eq!(handshake.take_output(), expected);
}

#[test]
fn export_name_unknown_closes() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let step = handshake.receive(&option(OPT_EXPORT_NAME, b""), &Catalog);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::UnknownExport {
            name: String::new()
        })
    );
}

#[test]
fn go_sends_info_then_ack_and_keeps_leftover() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let mut bytes = option(OPT_GO, &go_data("disk", &[INFO_BLOCK_SIZE]));
    bytes.extend_from_slice(b"next");
    let step = handshake.receive(&bytes, &Catalog);
    assert!(matches!(step, HandshakeStep::Transmission(_)));
    let mut expected = info_export_reply(OPT_GO, DISK_SIZE, RW_FLAGS);
    expected.extend(block_size_reply(OPT_GO));
    expected.extend(reply(OPT_GO, REP_ACK, &[]));
    assert_eq!(handshake.take_output(), expected);
    assert_eq!(handshake.take_leftover(), b"next");
    assert_eq!(
        handshake.receive(b"x", &Catalog),
        HandshakeStep::Close(CloseReason::AlreadyFinished)
    );
}

#[test]
fn info_unknown_export_and_malformed_go_keep_going() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    assert_eq!(
        handshake.receive(&option(OPT_INFO, &go_data("nope", &[])), &Catalog),
        HandshakeStep::NeedMore
    );
    assert_eq!(
        handshake.take_output(),
        reply(OPT_INFO, REP_ERR_UNKNOWN, b"export 'nope' is not available")
    );
    // Name length claims more bytes than the option holds.
    let mut data = go_data("disk", &[]);
    data[3] = 200;
    assert_eq!(
        handshake.receive(&option(OPT_GO, &data), &Catalog),
        HandshakeStep::NeedMore
    );
    let output = handshake.take_output();
    assert_eq!(&output[12..16], &REP_ERR_INVALID.to_be_bytes());
    // INFO on a good export answers but does not end the handshake.
    assert_eq!(
        handshake.receive(&option(OPT_INFO, &go_data("ro", &[])), &Catalog),
        HandshakeStep::NeedMore
    );
    let mut expected = info_export_reply(OPT_INFO, 4096, RW_FLAGS | TRANSMISSION_READ_ONLY);
    expected.extend(block_size_reply(OPT_INFO));
    expected.extend(reply(OPT_INFO, REP_ACK, &[]));
    assert_eq!(handshake.take_output(), expected);
}

#[test]
fn list_unknown_and_structured_reply_options() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let mut bytes = option(OPT_LIST, &[]);
    bytes.extend(option(OPT_LIST, b"x"));
    bytes.extend(option(99, b"ignored"));
    bytes.extend(option(OPT_STRUCTURED_REPLY, &[]));
    assert_eq!(handshake.receive(&bytes, &Catalog), HandshakeStep::NeedMore);
    let mut expected = reply(OPT_LIST, REP_SERVER, b"\0\0\0\x04disk");
    expected.extend(reply(OPT_LIST, REP_SERVER, b"\0\0\0\x02ro"));
    expected.extend(reply(OPT_LIST, REP_ACK, &[]));
    expected.extend(reply(
        OPT_LIST,
        REP_ERR_INVALID,
        b"NBD_OPT_LIST takes no data",
    ));
    expected.extend(reply(
        99,
        REP_ERR_UNSUP,
        b"option is not supported by this server",
    ));
    expected.extend(reply(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
    assert_eq!(handshake.take_output(), expected);
}

#[test]
fn abort_acks_and_closes() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let step = handshake.receive(&option(OPT_ABORT, &[]), &Catalog);
    assert_eq!(step, HandshakeStep::Close(CloseReason::ClientAborted));
    assert_eq!(handshake.take_output(), reply(OPT_ABORT, REP_ACK, &[]));
}

#[test]
fn oversized_option_and_bad_magic_close() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let mut header = IHAVEOPT_MAGIC.to_be_bytes().to_vec();
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&(MAX_OPTION_BYTES + 1).to_be_bytes());
    let step = handshake.receive(&header, &Catalog);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::OptionTooLong {
            option: OPT_GO,
            length_bytes: MAX_OPTION_BYTES + 1
        })
    );
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let step = handshake.receive(&[0u8; 16], &Catalog);
    assert_eq!(
        step,
        HandshakeStep::Close(CloseReason::BadOptionMagic { magic: 0 })
    );
}

#[test]
fn meta_context_requires_structured_replies() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    let data = meta_data("disk", &[BASE_ALLOCATION]);
    handshake.receive(&option(OPT_SET_META_CONTEXT, &data), &Catalog);
    let output = handshake.take_output();
    assert_eq!(&output[12..16], &REP_ERR_INVALID.to_be_bytes());
}

#[test]
fn set_meta_context_then_go_selects_base_allocation() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    handshake.receive(&option(OPT_STRUCTURED_REPLY, &[]), &Catalog);
    handshake.take_output();

    handshake.receive(
        &option(OPT_LIST_META_CONTEXT, &meta_data("disk", &[])),
        &Catalog,
    );
    let mut expected = reply(
        OPT_LIST_META_CONTEXT,
        REP_META_CONTEXT,
        b"\0\0\0\0base:allocation",
    );
    expected.extend(reply(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
    assert_eq!(handshake.take_output(), expected);

    let data = meta_data("disk", &["x-other:thing", BASE_ALLOCATION]);
    handshake.receive(&option(OPT_SET_META_CONTEXT, &data), &Catalog);
    let mut expected = reply(
        OPT_SET_META_CONTEXT,
        REP_META_CONTEXT,
        b"\0\0\0\x01base:allocation",
    );
    expected.extend(reply(OPT_SET_META_CONTEXT, REP_ACK, &[]));
    assert_eq!(handshake.take_output(), expected);

    let step = handshake.receive(&option(OPT_GO, &go_data("disk", &[])), &Catalog);
    let HandshakeStep::Transmission(negotiated) = step else {
        panic!("{step:?}")
    };
    assert!(negotiated.structured_replies);
    assert_eq!(
        negotiated.base_allocation_context_id,
        Some(BASE_ALLOCATION_CONTEXT_ID)
    );
}

#[test]
fn meta_context_for_another_export_does_not_apply() {
    let mut handshake = started(CLIENT_FLAG_FIXED_NEWSTYLE);
    handshake.receive(&option(OPT_STRUCTURED_REPLY, &[]), &Catalog);
    handshake.receive(
        &option(OPT_SET_META_CONTEXT, &meta_data("ro", &[BASE_ALLOCATION])),
        &Catalog,
    );
    let step = handshake.receive(&option(OPT_GO, &go_data("disk", &[])), &Catalog);
    let HandshakeStep::Transmission(negotiated) = step else {
        panic!("{step:?}")
    };
    assert_eq!(negotiated.base_allocation_context_id, None);
}

#[test]
fn byte_at_a_time_equals_all_at_once() {
    let mut stream = CLIENT_FLAG_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    stream.extend(option(OPT_STRUCTURED_REPLY, &[]));
    stream.extend(option(OPT_LIST, &[]));
    stream.extend(option(OPT_GO, &go_data("disk", &[])));

    let mut whole = Handshake::new();
    let whole_step = whole.receive(&stream, &Catalog);
    let mut split = Handshake::new();
    let mut split_step = HandshakeStep::NeedMore;
    for byte in &stream {
        split_step = split.receive(std::slice::from_ref(byte), &Catalog);
    }
    assert_eq!(whole_step, split_step);
    assert_eq!(whole.take_output(), split.take_output());
}
