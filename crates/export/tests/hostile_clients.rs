//! Raw-socket clients that break the protocol, vanish, or push hard. After
//! each, the server must still serve a well-behaved client.

mod common;

use std::collections::HashSet;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISCONNECT: u16 = 2;
const CMD_FLUSH: u16 = 3;
const EPERM: u32 = 1;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;

#[tokio::test]
async fn client_without_fixed_newstyle_is_closed() {
    let server = TestServer::start().await;
    let mut stream = connect(server.address).await;
    stream.write_all(&0u32.to_be_bytes()).await.unwrap();
    assert!(is_closed(&mut stream).await);
    assert_still_serving(server.address).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_option_is_closed() {
    let server = TestServer::start().await;
    let mut stream = connect(server.address).await;
    stream.write_all(&1u32.to_be_bytes()).await.unwrap();
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&7u32.to_be_bytes());
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    stream.write_all(&header).await.unwrap();
    assert!(is_closed(&mut stream).await);
    assert_still_serving(server.address).await;
    server.stop().await;
}

#[tokio::test]
async fn unknown_export_gets_an_error_then_abort_is_acked() {
    let server = TestServer::start().await;
    let mut stream = connect(server.address).await;
    stream.write_all(&1u32.to_be_bytes()).await.unwrap();
    stream
        .write_all(&option(7, &go_data("nope")))
        .await
        .unwrap();
    let (option_code, reply_type, message) = read_option_reply(&mut stream).await;
    assert_eq!((option_code, reply_type), (7, (1 << 31) + 6));
    assert!(String::from_utf8_lossy(&message).contains("nope"));
    stream.write_all(&option(2, &[])).await.unwrap();
    assert_eq!(read_option_reply(&mut stream).await, (2, 1, vec![]));
    assert!(is_closed(&mut stream).await);

    // The old EXPORT_NAME option cannot carry an error: the server closes.
    let mut stream = connect(server.address).await;
    stream.write_all(&1u32.to_be_bytes()).await.unwrap();
    stream.write_all(&option(1, b"nope")).await.unwrap();
    assert!(is_closed(&mut stream).await);
    assert_still_serving(server.address).await;
    server.stop().await;
}

#[tokio::test]
async fn bad_request_magic_closes() {
    let server = TestServer::start().await;
    let mut stream = connect_go(server.address, "disk").await;
    stream.write_all(&[0xee; 28]).await.unwrap();
    assert!(is_closed(&mut stream).await);
    assert_still_serving(server.address).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_write_closes() {
    let server = TestServer::start().await;
    let mut stream = connect_go(server.address, "disk").await;
    stream
        .write_all(&request(0, CMD_WRITE, 1, 0, 64 * 1024 * 1024))
        .await
        .unwrap();
    assert!(is_closed(&mut stream).await);
    assert_still_serving(server.address).await;
    server.stop().await;
}

#[tokio::test]
async fn unknown_command_and_bad_ranges_get_errors_and_the_connection_goes_on() {
    let server = TestServer::start().await;
    let mut stream = connect_go(server.address, "disk").await;
    stream.write_all(&request(0, 99, 5, 0, 0)).await.unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (EINVAL, 5));
    stream
        .write_all(&request(0, CMD_READ, 6, DISK_SIZE_BYTES - 1, 2))
        .await
        .unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (EINVAL, 6));
    stream
        .write_all(&request(0, CMD_WRITE, 7, DISK_SIZE_BYTES - 1, 2))
        .await
        .unwrap();
    stream.write_all(&[1, 2]).await.unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (ENOSPC, 7));
    stream
        .write_all(&request(1 << 7, CMD_FLUSH, 8, 0, 0))
        .await
        .unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (EINVAL, 8));
    stream
        .write_all(&request(0, CMD_FLUSH, 9, 0, 0))
        .await
        .unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (0, 9));

    let mut read_only = connect_go(server.address, "ro").await;
    read_only
        .write_all(&request(0, CMD_WRITE, 10, 0, 4))
        .await
        .unwrap();
    read_only.write_all(&[9; 4]).await.unwrap();
    assert_eq!(read_simple_reply(&mut read_only).await, (EPERM, 10));
    server.stop().await;
}

#[tokio::test]
async fn client_vanishing_mid_payload_leaves_the_export_untouched() {
    let server = TestServer::start().await;
    let mut stream = connect_go(server.address, "disk").await;
    stream
        .write_all(&request(0, CMD_WRITE, 1, 0, 65536))
        .await
        .unwrap();
    stream.write_all(&[0x77; 1000]).await.unwrap();
    drop(stream);
    assert_still_serving(server.address).await;
    assert_eq!(server.registry.disk.contents(0, 1000), vec![0; 1000]);
    server.stop().await;
}

#[tokio::test]
async fn many_pipelined_requests_all_get_replies() {
    let server = TestServer::start().await;
    let mut stream = connect_go(server.address, "disk").await;
    // Twice the in-flight bound: the server must stop reading, not drop.
    const REQUESTS: u64 = 256;
    let mut bytes = Vec::new();
    for cookie in 0..REQUESTS {
        bytes.extend(request(0, CMD_WRITE, cookie, cookie * 4096, 4096));
        bytes.extend(vec![cookie as u8; 4096]);
    }
    let (mut reader, mut writer) = stream.split();
    let send = async {
        writer.write_all(&bytes).await.unwrap();
    };
    let receive = async {
        let mut cookies = HashSet::new();
        for _ in 0..REQUESTS {
            let mut reply = [0u8; 16];
            reader.read_exact(&mut reply).await.unwrap();
            assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0);
            cookies.insert(u64::from_be_bytes(reply[8..16].try_into().unwrap()));
        }
        cookies
    };
    let ((), cookies) = tokio::time::timeout(STEP_TIMEOUT, async { tokio::join!(send, receive) })
        .await
        .unwrap();
    assert_eq!(cookies.len() as u64, REQUESTS);
    assert_eq!(
        server.registry.disk.contents(255 * 4096, 4096),
        vec![255; 4096]
    );

    // DISC after writes: their replies still come, then the server closes.
    stream
        .write_all(&request(0, CMD_WRITE, 1000, 0, 512))
        .await
        .unwrap();
    stream.write_all(&[0x42; 512]).await.unwrap();
    stream
        .write_all(&request(0, CMD_DISCONNECT, 1001, 0, 0))
        .await
        .unwrap();
    assert_eq!(read_simple_reply(&mut stream).await, (0, 1000));
    assert!(is_closed(&mut stream).await);
    assert_eq!(server.registry.disk.contents(0, 512), vec![0x42; 512]);
    server.stop().await;
}
