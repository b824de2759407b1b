//! The server driven by the NBD clients users run: nbdinfo, qemu-io,
//! qemu-img and nbdcopy, over TCP on 127.0.0.1 and over a unix socket.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_reports_size_flags_and_list() {
    let server = TestServer::start().await;
    let size = run_ok("nbdinfo", &["--size", &server.uri("disk")]).await;
    assert_eq!(size.trim(), DISK_SIZE_BYTES.to_string());
    for capability in ["flush", "fua", "trim", "zero", "fast-zero", "multi-conn"] {
        run_ok("nbdinfo", &["--can", capability, &server.uri("disk")]).await;
    }
    run_ok("nbdinfo", &["--is", "read-only", &server.uri("ro")]).await;
    let (read_only, _, _) = run("nbdinfo", &["--is", "read-only", &server.uri("disk")]).await;
    assert!(!read_only, "disk must not be read-only");

    let list = run_ok("nbdinfo", &["--list", &server.uri("")]).await;
    assert!(
        list.contains("export=\"disk\"") || list.contains("disk"),
        "{list}"
    );
    assert!(list.contains("ro"), "{list}");

    let (found, _, stderr) = run("nbdinfo", &["--size", &server.uri("missing")]).await;
    assert!(!found);
    assert!(
        stderr.contains("missing"),
        "unknown export message: {stderr}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_writes_and_reads_back() {
    let server = TestServer::start().await;
    let uri = server.uri("disk");
    let output = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 0 64k",
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "write -z 4k 4k",
            "-c",
            "read -P 0 4k 4k",
            "-c",
            "flush",
            "-c",
            "write -P 0xcd -f 1m 8k",
            "-c",
            "read -P 0xcd 1m 8k",
        ],
    )
    .await;
    assert!(!output.contains("Pattern verification failed"), "{output}");
    assert_eq!(server.registry.disk.contents(0, 4096), vec![0xab; 4096]);
    assert_eq!(server.registry.disk.contents(4096, 4096), vec![0; 4096]);
    assert_eq!(
        server.registry.disk.contents(1 << 20, 8192),
        vec![0xcd; 8192]
    );

    let (written, stdout, stderr) = run(
        "qemu-io",
        &["-f", "raw", &server.uri("ro"), "-c", "write -P 1 0 4k"],
    )
    .await;
    let combined = format!("{stdout}{stderr}");
    assert!(
        !written || combined.contains("failed") || combined.contains("read-only"),
        "{combined}"
    );
    assert_eq!(server.registry.read_only.contents(0, 4096), vec![0; 4096]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_info_and_nbdinfo_map() {
    let server = TestServer::start().await;
    let info = run_ok("qemu-img", &["info", "-f", "raw", &server.uri("disk")]).await;
    assert!(info.contains("virtual size: 4 MiB"), "{info}");

    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &server.uri("disk"),
            "-c",
            "write -P 0x11 64k 128k",
        ],
    )
    .await;
    let map = run_ok("nbdinfo", &["--map", &server.uri("disk")]).await;
    let rows: Vec<Vec<&str>> = map
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    // offset length type description
    assert_eq!(rows[0][..3], ["0", "65536", "3"], "{map}");
    assert_eq!(rows[1][..3], ["65536", "131072", "0"], "{map}");
    assert_eq!(
        rows[2][..2],
        ["196608", (DISK_SIZE_BYTES - 196608).to_string().as_str()],
        "{map}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopy_round_trips_over_tcp_and_unix_socket() {
    let server = TestServer::start().await;
    let directory = tempfile::tempdir().unwrap();
    let source = directory.path().join("source.img");
    let back = directory.path().join("back.img");
    let pattern: Vec<u8> = (0..DISK_SIZE_BYTES)
        .map(|index| (index * 7 % 251) as u8)
        .collect();
    std::fs::write(&source, &pattern).unwrap();

    // nbdcopy uses several connections at once, as CAN_MULTI_CONN allows.
    run_ok("nbdcopy", &[source.to_str().unwrap(), &server.uri("disk")]).await;
    assert!(server.registry.disk.contents(0, DISK_SIZE_BYTES as usize) == pattern);

    run_ok(
        "nbdcopy",
        &[&server.unix_uri("disk"), back.to_str().unwrap()],
    )
    .await;
    assert!(std::fs::read(&back).unwrap() == pattern);

    let size = run_ok("nbdinfo", &["--size", &server.unix_uri("ro")]).await;
    assert_eq!(size.trim(), "65536");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_removes_the_unix_socket() {
    let server = TestServer::start().await;
    let path = server.unix_socket.clone();
    assert!(path.exists());
    server.stop().await;
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_target_completing_out_of_order_serves_real_clients() {
    // Requests handed to the target with `submit` and completed from its
    // own thread, newest first: the replies still reach the right requests.
    let server = TestServer::start().await;
    let uri = server.uri("async");
    let output = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "aio_write -P 0x11 0 64k",
            "-c",
            "aio_write -P 0x22 64k 64k",
            "-c",
            "aio_write -P 0x33 1m 4k",
            "-c",
            "aio_flush",
            "-c",
            "read -P 0x11 0 64k",
            "-c",
            "read -P 0x22 64k 64k",
            "-c",
            "read -P 0x33 1m 4k",
            "-c",
            "read -P 0 2m 64k",
            "-c",
            "write -z 64k 4k",
            "-c",
            "read -P 0 64k 4k",
            "-c",
            "discard 0 4k",
            "-c",
            "read -P 0 0 4k",
            "-c",
            "write -P 0x44 -f 3m 8k",
            "-c",
            "read -P 0x44 3m 8k",
        ],
    )
    .await;
    assert!(!output.contains("Pattern verification failed"), "{output}");
    assert_eq!(
        server.registry.asynchronous.memory.contents(1 << 20, 4096),
        vec![0x33; 4096]
    );
    // A whole-disk round trip with many requests in flight.
    let directory = tempfile::tempdir().unwrap();
    let source = directory.path().join("source.img");
    let back = directory.path().join("back.img");
    let data: Vec<u8> = (0..DISK_SIZE_BYTES)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&source, &data).unwrap();
    run_ok("nbdcopy", &[source.to_str().unwrap(), &uri]).await;
    run_ok("nbdcopy", &[&uri, back.to_str().unwrap()]).await;
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy back differs"
    );
    server.stop().await;
}
