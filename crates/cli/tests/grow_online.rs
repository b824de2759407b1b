//! Growing an attached three-replica volume while it is written, on three
//! real nodes (docs/replication.md, "Growing an attached volume"): fio
//! writes and verifies over NBD while the volume grows through the REST
//! API; without a detach, a new NBD connection (nbdinfo) shows the new
//! size, qemu-io writes and reads past the old end, and `volume verify`
//! finds the three copies equal over the whole grown volume. Then a grow
//! of the idle volume while one replica's node is down: the volume serves
//! the new size at once, the node comes back, resyncs (grown part
//! included), and verify is clean again. A grow to a size over the
//! largest volume is refused and the volume goes on at the size it had.

mod common;

use common::replicated::*;
use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// The export's size as a new NBD client sees it.
fn nbd_size(uri: &str) -> Option<u64> {
    let out = exec(
        &mut cmd("nbdinfo", &["--size", uri]),
        Duration::from_secs(20),
    );
    out.success()
        .then(|| out.stdout.trim().parse().ok())
        .flatten()
}

fn wait_nbd_size(node: &TestNode, volume: &str, size: u64) {
    let uri = node.uri(volume);
    let mut last = None;
    let grown = wait_until(Duration::from_secs(30), || {
        last = nbd_size(&uri);
        last == Some(size)
    });
    assert!(
        grown,
        "{uri} serves {last:?} bytes, not {size}\n{:#}\n{}",
        show(node, volume),
        node.log_tail()
    );
}

/// Grows `volume` through the REST API: the status and the answer.
fn grow(node: &TestNode, volume: &str, size: u64) -> (u16, String) {
    http_at(
        &node.api_address(),
        "POST",
        &format!("/api/v1/volumes/{volume}/grow"),
        &[],
        format!(r#"{{"size_bytes": {size}}}"#).as_bytes(),
    )
}

fn verify_clean(node: &TestNode, volume: &str, size: u64) {
    let report: Value = node.cli_json(&["volume", "verify", volume]);
    assert_eq!(report["state"], "done", "{report:#}");
    assert_eq!(report["checked_bytes"], size, "{report:#}");
    assert_eq!(report["differing_blocks"], 0, "{report:#}");
    assert_eq!(report["unrecoverable_blocks"], 0, "{report:#}");
}

#[test]
fn an_attached_volume_grows_while_fio_writes_and_while_a_replica_is_down() {
    if !tools_or_skip(&["fio", "nbdinfo", "qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    // Not a whole number of 1 MiB regions: the region across the old end
    // is half old, half new.
    let old = 24 * MIB + 512 * 1024;
    nodes[0].cli(&["volume", "create", "gv", "--size", &old.to_string()]);
    wait_in_sync(&nodes[0], "gv", Duration::from_secs(30));
    attach(&nodes[0], "gv", "n1", &[]);
    wait_served(&nodes[0], "gv");
    let uri = nodes[0].uri("gv");
    assert_eq!(nbd_size(&uri), Some(old));

    // fio writes (and then reads back and checks) the old extent while
    // the volume grows under it.
    let report_dir = TempDir::new("fio");
    let mut fio = Command::new("fio");
    fio.current_dir(report_dir.path()).args([
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--name=grow",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        "--offset=0",
        "--size=16M",
        "--rate_iops=600",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    let writer = std::thread::spawn(move || exec(&mut fio, Duration::from_secs(90)));
    std::thread::sleep(Duration::from_secs(2));
    assert!(!writer.is_finished(), "fio ended before the grow");
    let grown = 40 * MIB;
    let (status, body) = grow(&nodes[1], "gv", grown);
    assert_eq!(status, 200, "grow: {body}");
    // The engine takes the new size once the three copies are grown: the
    // same export, without a detach, while fio still writes.
    wait_nbd_size(&nodes[0], "gv", grown);
    assert!(
        !writer.is_finished(),
        "fio ended before the engine grew: the grow was not under load"
    );
    let out = writer.join().unwrap();
    assert!(
        out.success(),
        "a write or a verifying read failed across the grow\n{}\n{}",
        out.describe("fio"),
        nodes[0].log_tail()
    );
    // Past the old end: in the region across it, and at the very end.
    qemu_io_all(
        &uri,
        &[
            &format!("write -P 0x61 {} 1M", old - 256 * 1024),
            &format!("write -P 0x62 {} 64k", grown - 64 * 1024),
            "flush",
            &format!("read -P 0x61 {} 1M", old - 256 * 1024),
            &format!("read -P 0x62 {} 64k", grown - 64 * 1024),
        ],
    );
    let shown = wait_in_sync(&nodes[0], "gv", Duration::from_secs(30));
    assert_eq!(shown["size_bytes"], grown, "{shown:#}");
    verify_clean(&nodes[0], "gv", grown);

    // A replica's node is down, the volume idle: the engine outdates it
    // (no write has yet) and grows onto the two others' copies.
    nodes[2].stop();
    let larger = 56 * MIB;
    let (status, body) = grow(&nodes[0], "gv", larger);
    assert_eq!(status, 200, "grow with n3 down: {body}");
    wait_nbd_size(&nodes[0], "gv", larger);
    qemu_io_all(
        &uri,
        &[
            "write -P 0x63 1M 1M",
            &format!("write -P 0x64 {} 2M", grown - MIB),
            "flush",
            &format!("read -P 0x64 {} 2M", grown - MIB),
        ],
    );
    // Back: its node grows its copy, the engine resyncs it.
    nodes[2].restart();
    let shown = wait_in_sync(&nodes[0], "gv", Duration::from_secs(60));
    assert_eq!(shown["size_bytes"], larger, "{shown:#}");
    verify_clean(&nodes[1], "gv", larger);
    qemu_io_all(
        &nodes[0].uri("gv"),
        &[
            "read -P 0x63 1M 1M",
            &format!("read -P 0x64 {} 2M", grown - MIB),
        ],
    );

    // Bad input: a size over the largest volume. Pools are thin (a grow
    // takes no space until it is written), so no pool refuses a size
    // below it; this one is refused before anything is recorded, and the
    // engine goes on serving the size every copy holds.
    let (status, body) = grow(&nodes[0], "gv", 1 << 62);
    assert_eq!(status, 400, "grow to 4 EiB: {body}");
    assert!(body.contains("size"), "grow to 4 EiB: {body}");
    let (status, body) = grow(&nodes[0], "gv", larger + 1);
    assert_eq!(status, 400, "grow to an unaligned size: {body}");
    assert_eq!(show(&nodes[0], "gv")["size_bytes"], larger);
    assert_eq!(nbd_size(&uri), Some(larger), "{}", nodes[0].log_tail());
    qemu_io_all(
        &uri,
        &["write -P 0x65 0 64k", "flush", "read -P 0x65 0 64k"],
    );
    nodes[0].assert_healthy();
}
