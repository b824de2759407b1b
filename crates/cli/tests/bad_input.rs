//! Bad input at the CLI and REST level is refused with a message naming the
//! problem, and the node keeps serving; a full pool answers ENOSPC and
//! recovers after TRIM.

mod common;

use common::nbd_client::{NbdClient, NbdError, ENOSPC};
use common::*;

/// The node still answers health checks and serves I/O on volume "ok".
fn still_serving(node: &mut TestNode) {
    node.assert_healthy();
    let mut c = NbdClient::connect(node.nbd_port, "ok").expect("NBD connect after bad input");
    assert_eq!(
        c.read(0, 4096).expect("NBD read after bad input"),
        vec![0x5au8; 4096]
    );
    c.disconnect();
}

fn setup() -> TestNode {
    let node = TestNode::start();
    node.create_volume("ok", "4M");
    let mut c = NbdClient::connect(node.nbd_port, "ok").unwrap();
    c.write(0, &[0x5au8; 4096], true).unwrap();
    c.disconnect();
    node
}

/// Assert the failed command's message mentions one of `words`.
fn names_problem(out: &CmdOut, what: &str, words: &[&str]) {
    let msg = format!("{}\n{}", out.stderr, out.stdout).to_lowercase();
    assert!(
        words
            .iter()
            .any(|w| !w.is_empty() && msg.contains(&w.to_lowercase())),
        "{what}: message does not name the problem (expected one of {words:?})\n{}",
        out.describe(what)
    );
}

fn volume_names(node: &TestNode) -> String {
    node.cli(&["volume", "list"])
}

#[test]
fn volume_create_rejects_bad_sizes() {
    let mut node = setup();
    for size in [
        "0",
        "12X",
        "18446744073709551616",
        "18446744073709551615",
        "16E",
        "1000",
        "-1",
        "",
    ] {
        let out = node.cli_fail(&["volume", "create", "badsize", "--size", size]);
        names_problem(
            &out,
            &format!("volume create --size {size:?}"),
            &["size", size, "align", "multiple"],
        );
        assert!(
            !volume_names(&node).contains("badsize"),
            "volume created despite size {size:?}"
        );
        still_serving(&mut node);
    }
}

#[test]
fn volume_create_rejects_bad_names_and_duplicates() {
    let mut node = setup();
    for name in ["a/b", "", "/", "x\ny"] {
        let out = node.cli_fail(&["volume", "create", name, "--size", "4M"]);
        names_problem(&out, &format!("volume create {name:?}"), &["name"]);
        still_serving(&mut node);
    }
    node.create_volume("dup", "4M");
    let out = node.cli_fail(&["volume", "create", "dup", "--size", "8M"]);
    names_problem(
        &out,
        "duplicate volume create",
        &["exist", "dup", "already"],
    );
    let show = node.cli(&["volume", "show", "dup"]);
    assert!(
        show.contains("4194304") || show.contains("4M") || show.contains("4 M"),
        "dup changed: {show}"
    );
    still_serving(&mut node);
}

#[test]
fn unknown_volume_show_delete_grow() {
    let mut node = setup();
    for args in [
        vec!["volume", "show", "nosuch"],
        vec!["volume", "delete", "nosuch"],
        vec!["volume", "grow", "nosuch", "--size", "8M"],
        vec!["pool", "delete", "nosuchpool"],
        vec!["pool", "scan", "nosuchpool"],
    ] {
        let out = node.cli_fail(&args);
        names_problem(
            &out,
            &args.join(" "),
            &["not found", "no such", "unknown", "nosuch"],
        );
        still_serving(&mut node);
    }
    // Shrinking is not growing.
    let out = node.cli_fail(&["volume", "grow", "ok", "--size", "1M"]);
    names_problem(
        &out,
        "volume grow to a smaller size",
        &["size", "shrink", "smaller", "grow"],
    );
    still_serving(&mut node);
}

#[test]
fn pool_delete_refused_while_it_holds_volumes() {
    let mut node = setup();
    let path = node.dir.path().join("p2.img");
    node.cli(&[
        "pool",
        "create",
        "p2",
        "--path",
        path.to_str().unwrap(),
        "--size",
        "64M",
        "--class",
        "ssd",
    ]);
    node.cli(&["volume", "create", "onp2", "--size", "4M", "--pool", "p2"]);
    let mut c = NbdClient::connect(node.nbd_port, "onp2").unwrap();
    c.write(0, &[7u8; 4096], true).unwrap();
    let out = node.cli_fail(&["pool", "delete", "p2"]);
    names_problem(
        &out,
        "pool delete with volumes",
        &["volume", "in use", "not empty", "onp2"],
    );
    assert!(node.cli(&["pool", "list"]).contains("p2"));
    assert_eq!(
        c.read(0, 4096).unwrap(),
        vec![7u8; 4096],
        "data on p2 after refused delete"
    );
    c.disconnect();
    // Once empty it can go.
    node.cli(&["volume", "delete", "onp2"]);
    node.cli(&["pool", "delete", "p2"]);
    assert!(!node.cli(&["pool", "list"]).contains("\"p2\""));
    // Creating a pool with bad parameters is refused too.
    let out = node.cli_fail(&[
        "pool",
        "create",
        "p3",
        "--path",
        path.to_str().unwrap(),
        "--size",
        "0",
        "--class",
        "ssd",
    ]);
    names_problem(&out, "pool create --size 0", &["size"]);
    let out = node.cli_fail(&[
        "pool",
        "create",
        "p4",
        "--path",
        "/nonexistent-dir/x/p.img",
        "--size",
        "64M",
        "--class",
        "ssd",
    ]);
    names_problem(
        &out,
        "pool create in a missing directory",
        &["path", "no such", "directory", "not found", "nonexistent"],
    );
    still_serving(&mut node);
}

#[test]
fn rest_rejects_malformed_requests() {
    let mut node = setup();
    let port = node.api_port;
    let (code, body) = http_raw(port, "GET", "/api/v1/openapi.json", "application/json", b"");
    assert_eq!(code, 200, "openapi: {body}");
    let spec: serde_json::Value = serde_json::from_str(&body).expect("openapi.json is JSON");
    assert!(
        spec["paths"]
            .as_object()
            .map(|p| p.keys().any(|k| k.contains("/volumes")))
            .unwrap_or(false),
        "{spec}"
    );

    let cases: &[(&str, &str, &str, &[u8])] = &[
        (
            "POST",
            "/api/v1/volumes",
            "application/json",
            b"{\"name\": \"x\", \"size\":",
        ),
        (
            "POST",
            "/api/v1/volumes",
            "application/json",
            b"not json at all",
        ),
        (
            "POST",
            "/api/v1/volumes",
            "application/json",
            b"{\"name\": 5, \"size\": \"big\"}",
        ),
        ("POST", "/api/v1/volumes", "application/json", b"[]"),
        (
            "POST",
            "/api/v1/volumes",
            "application/json",
            b"{\"name\": \"huge\", \"size\": 18446744073709551616}",
        ),
        (
            "POST",
            "/api/v1/volumes",
            "application/json",
            b"{\"name\": \"huge\", \"size_bytes\": 18446744073709551616}",
        ),
        ("POST", "/api/v1/volumes", "text/plain", b"{}"),
        (
            "POST",
            "/api/v1/pools",
            "application/json",
            b"{\"name\": \"\"}",
        ),
        ("GET", "/api/v1/volumes/nosuch", "application/json", b""),
        ("DELETE", "/api/v1/volumes/nosuch", "application/json", b""),
    ];
    for (m, p, ct, body) in cases {
        let (code, resp) = http_raw(port, m, p, ct, body);
        assert!(
            (400..500).contains(&code),
            "{m} {p} ({ct}) {:?}: expected 4xx, got {code}: {resp}",
            String::from_utf8_lossy(body)
        );
        assert!(
            !resp.trim().is_empty(),
            "{m} {p}: {code} with an empty body: no message"
        );
        eprintln!(
            "{m} {p} {:?} -> {code} {resp}",
            String::from_utf8_lossy(body)
        );
    }
    // Raw garbage on the API port does not hurt.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = s.write_all(b"\x00\x01\x02garbage\r\n\r\n");
    }
    // Garbage on the NBD port neither.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", node.nbd_port)).unwrap();
        let _ = s.write_all(&[0xffu8; 300]);
    }
    assert!(!volume_names(&node).contains("huge"));
    still_serving(&mut node);
}

#[test]
fn full_pool_gives_enospc_and_recovers_after_trim() {
    let mut node = setup();
    let path = node.dir.path().join("small.img");
    node.cli(&[
        "pool",
        "create",
        "small",
        "--path",
        path.to_str().unwrap(),
        "--size",
        "16M",
        "--class",
        "ssd",
    ]);
    // Over-committed: 64 MiB volume on a 16 MiB pool (the smallest allowed) (thin provisioning).
    node.cli(&[
        "volume", "create", "over", "--size", "64M", "--pool", "small",
    ]);
    let mut c = NbdClient::connect(node.nbd_port, "over").unwrap();
    let chunk: u64 = 64 << 10;
    let mut written = 0u64;
    let mut got = None;
    for i in 0..(64 << 20) / chunk {
        let data = vec![(i % 251) as u8 + 1; chunk as usize];
        match c.write(i * chunk, &data, true) {
            Ok(()) => written += 1,
            Err(NbdError::Server(e)) => {
                got = Some(e);
                break;
            }
            Err(e) => panic!(
                "connection failed at chunk {i} instead of ENOSPC: {e}\n{}",
                node.log_tail()
            ),
        }
    }
    eprintln!("{written} chunks of 64 KiB written before {got:?}");
    assert_eq!(
        got,
        Some(ENOSPC),
        "expected ENOSPC (28) when the 16 MiB pool filled ({written} chunks written)"
    );
    assert!(written > 0, "no write fit in the pool");
    node.assert_healthy();
    // Everything acknowledged is still there.
    for i in 0..written {
        let want = vec![(i % 251) as u8 + 1; chunk as usize];
        assert!(
            c.read(i * chunk, chunk as u32)
                .expect("read on a full pool")
                == want,
            "chunk {i} lost on a full pool"
        );
    }
    // Overwrites of allocated chunks need no space: still accepted.
    c.write(0, &vec![1u8; chunk as usize], true)
        .expect("overwrite of an allocated chunk on a full pool");
    // qemu-io sees ENOSPC as "No space left on device" too.
    if have_tool("qemu-io") {
        let off = (written + 1) * chunk;
        let w = format!("write -P 0x42 {off} 65536");
        let out = exec(
            &mut qemu_io(&node.uri("over"), &[&w]),
            std::time::Duration::from_secs(60),
        );
        assert!(
            out.stdout.contains("No space left on device")
                || out.stderr.contains("No space left on device"),
            "qemu-io should report ENOSPC: {}",
            out.describe(&w)
        );
    }
    // Other pools still take writes.
    let mut ok = NbdClient::connect(node.nbd_port, "ok").unwrap();
    ok.write(8192, &[1u8; 4096], true)
        .expect("write to the default pool while another is full");
    ok.disconnect();
    // TRIM everything; writing works again.
    c.trim(0, (written * chunk) as u32).expect("trim");
    c.flush().expect("flush");
    for i in 0..written.min(16) {
        c.write(i * chunk + (32 << 20), &vec![9u8; chunk as usize], true)
            .unwrap_or_else(|e| panic!("write after trim failed at chunk {i}: {e}"));
    }
    assert_eq!(c.read(32 << 20, 4096).unwrap(), vec![9u8; 4096]);
    assert_eq!(
        c.read(0, 4096).unwrap(),
        vec![0u8; 4096],
        "trimmed range should read zeroes"
    );
    c.disconnect();
    node.assert_scan_clean("small");
    still_serving(&mut node);
}
