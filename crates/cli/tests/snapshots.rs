//! Snapshots, clones and rollback with three real nodes on 127.0.0.1:
//! - qemu-io writes pattern A, a snapshot, pattern B: the snapshot's
//!   read-only export reads A (on every node holding it, and through
//!   qemu-img convert), the volume reads B; after a rollback it reads A;
//! - mkfs.ext4 and files, a snapshot while mounted, more files, then a
//!   clone through nbdfuse + loop: the first files are there, the later
//!   ones are not, and fsck is clean;
//! - a detached volume's snapshot, schedules, deletes that return space,
//!   and the errors bad requests get.

mod common;

use common::block::{block_device_missing, BlockDevice};
use common::replicated::*;
use common::*;
use serde_json::Value;
use std::time::Duration;

fn snapshot_uri(node: &TestNode, volume: &str, snapshot: &str) -> String {
    node.uri(&format!("{volume}@{snapshot}"))
}

fn snapshots(node: &TestNode, volume: &str) -> Vec<Value> {
    node.cli_json(&["snapshot", "list", volume])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// qemu-io on a read-only export.
fn qemu_io_read_only(uri: &str, commands: &[&str]) -> CmdOut {
    let mut command = std::process::Command::new("qemu-io");
    command.args(["-r", "-f", "raw"]);
    for c in commands {
        command.args(["-c", c]);
    }
    command.arg(uri);
    exec(&mut command, Duration::from_secs(120))
}

#[test]
fn a_snapshot_keeps_what_was_written_before_it_and_a_rollback_brings_it_back() {
    if !tools_or_skip(&["qemu-io", "qemu-img"]) {
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "sv", "--size", "64M"]);
    wait_in_sync(&nodes[0], "sv", Duration::from_secs(30));
    attach(&nodes[0], "sv", "n1", &[]);
    wait_served(&nodes[0], "sv");
    let uri = nodes[0].uri("sv");
    qemu_io_all(&uri, &["write -P 0xa1 0 8M"]);

    // Taken while attached, without a flush first: the barrier orders it.
    let taken = nodes[1].cli_json(&["snapshot", "create", "sv", "s1"]);
    assert_eq!(taken["state"], "ready", "{taken:#}");
    assert_eq!(
        taken["nodes"].as_array().map(Vec::len),
        Some(3),
        "every replica takes it: {taken:#}"
    );
    qemu_io_all(
        &uri,
        &["write -P 0xb2 0 4M", "write -P 0xb3 16M 1M", "flush"],
    );

    // The snapshot reads A on every node that holds it; the volume reads B.
    for node in &nodes {
        let out = qemu_io_read_only(
            &snapshot_uri(node, "sv", "s1"),
            &["read -P 0xa1 0 8M", "read -P 0 16M 1M"],
        );
        assert!(qemu_io_ok(&out), "{}", out.describe("read the snapshot"));
    }
    qemu_io_all(
        &uri,
        &[
            "read -P 0xb2 0 4M",
            "read -P 0xa1 4M 4M",
            "read -P 0xb3 16M 1M",
        ],
    );
    // Read-only: a write to the snapshot is refused.
    let mut write = qemu_io(&snapshot_uri(&nodes[0], "sv", "s1"), &["write -P 1 0 4k"]);
    let out = exec(&mut write, Duration::from_secs(60));
    assert!(!qemu_io_ok(&out), "a write to a snapshot succeeded");

    // A backup through qemu-img convert is the snapshot's content.
    let backup = TempDir::new("backup");
    let image = backup.path().join("s1.raw");
    run(&mut cmd(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &snapshot_uri(&nodes[2], "sv", "s1"),
            image.to_str().unwrap(),
        ],
    ));
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(bytes.len(), 64 << 20);
    assert!(bytes[..8 << 20].iter().all(|&b| b == 0xa1));
    assert!(bytes[8 << 20..].iter().all(|&b| b == 0));

    // Bad requests name what was wrong.
    let again = nodes[0].cli_fail(&["snapshot", "create", "sv", "s1"]);
    assert!(
        again.stderr.contains("already has a snapshot named 's1'"),
        "{}",
        again.describe("a second s1")
    );
    let unknown = nodes[0].cli_fail(&["snapshot", "create", "nosuch", "s1"]);
    assert!(
        unknown.stderr.contains("nosuch"),
        "{}",
        unknown.describe("unknown volume")
    );
    let attached = nodes[0].cli_fail(&["volume", "rollback", "sv", "s1"]);
    assert!(
        attached.stderr.contains("detach it first"),
        "{}",
        attached.describe("rollback while attached")
    );
    let missing = nodes[0].cli_fail(&["snapshot", "delete", "sv", "nosuch"]);
    assert!(
        missing.stderr.contains("no snapshot named 'nosuch'"),
        "{}",
        missing.describe("delete an unknown snapshot")
    );

    // Rollback: the volume reads A again, wherever it is attached next.
    nodes[0].cli(&["volume", "detach", "sv"]);
    nodes[0].cli(&["volume", "rollback", "sv", "s1"]);
    attach(&nodes[0], "sv", "n2", &[]);
    wait_served(&nodes[1], "sv");
    qemu_io_all(
        &nodes[1].uri("sv"),
        &["read -P 0xa1 0 8M", "read -P 0 16M 1M"],
    );
    let listed = snapshots(&nodes[2], "sv");
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["name"], "s1");

    // Deleted, it is gone from every node and its export with it.
    nodes[0].cli(&["snapshot", "delete", "sv", "s1"]);
    assert!(snapshots(&nodes[0], "sv").is_empty());
    let gone = qemu_io_read_only(&snapshot_uri(&nodes[0], "sv", "s1"), &["read 0 4k"]);
    assert!(!qemu_io_ok(&gone), "a deleted snapshot is still served");
    for node in &nodes {
        node.assert_scan_clean("default");
    }
}

#[test]
fn a_clone_of_a_file_system_snapshot_has_the_files_of_that_moment() {
    if let Some(missing) = block_device_missing() {
        skip(&missing);
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "fsv", "--size", "128M"]);
    wait_in_sync(&nodes[0], "fsv", Duration::from_secs(30));
    attach(&nodes[0], "fsv", "n1", &[]);
    wait_served(&nodes[0], "fsv");
    let mut disk = BlockDevice::attach(&nodes[0].uri("fsv"), 128 << 20);
    disk.mkfs_ext4();
    disk.mount();
    let first = disk.mount_dir.join("first");
    std::fs::create_dir_all(&first).unwrap();
    for i in 0..50 {
        std::fs::write(
            first.join(format!("f{i}")),
            format!("first {i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    random_file(&disk.mount_dir.join("big.bin"), 8 << 20, 11);
    let big = sha256(&disk.mount_dir.join("big.bin"));
    run(&mut cmd("sync", &[] as &[&str]));
    // Taken while mounted: crash-consistent, as if the machine had died.
    nodes[0].cli(&["snapshot", "create", "fsv", "before"]);
    let later = disk.mount_dir.join("later");
    std::fs::create_dir_all(&later).unwrap();
    for i in 0..20 {
        std::fs::write(later.join(format!("g{i}")), "later\n").unwrap();
    }
    std::fs::remove_file(first.join("f0")).unwrap();
    run(&mut cmd("sync", &[] as &[&str]));
    disk.unmount();
    drop(disk);

    // The clone is made from the snapshot's copies, on the same nodes.
    let clone = nodes[1].cli_json(&["volume", "create", "fsc", "--from-snapshot", "fsv@before"]);
    assert_eq!(clone["size_bytes"], 128 << 20, "{clone:#}");
    wait_in_sync(&nodes[0], "fsc", Duration::from_secs(30));
    attach(&nodes[0], "fsc", "n2", &[]);
    wait_served(&nodes[1], "fsc");
    let mut disk = BlockDevice::attach(&nodes[1].uri("fsc"), 128 << 20);
    // Mounting replays the journal the snapshot caught mid-flight.
    disk.mount();
    for i in 0..50 {
        let text = std::fs::read_to_string(disk.mount_dir.join("first").join(format!("f{i}")))
            .unwrap_or_else(|error| panic!("first/f{i} missing from the clone: {error}"));
        assert_eq!(text, format!("first {i}\n").repeat(i + 1));
    }
    assert_eq!(sha256(&disk.mount_dir.join("big.bin")), big);
    assert!(
        !disk.mount_dir.join("later").exists(),
        "files written after the snapshot are in the clone"
    );
    disk.unmount();
    let out = disk.fsck();
    assert!(
        out.success(),
        "{}",
        out.describe("fsck.ext4 -fn of the clone")
    );
    drop(disk);

    // The clone is a volume of its own: the source and its snapshot go,
    // the clone stays readable.
    nodes[0].cli(&["snapshot", "delete", "fsv", "before"]);
    nodes[0].cli(&["volume", "detach", "fsv"]);
    nodes[0].cli(&["volume", "delete", "fsv"]);
    qemu_io_all(&nodes[1].uri("fsc"), &["read 0 1M"]);
    for node in &nodes {
        node.assert_scan_clean("default");
    }
}

#[test]
fn a_detached_volume_is_snapshotted_by_its_replicas_and_schedules_prune() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "dv", "--size", "32M"]);
    wait_in_sync(&nodes[0], "dv", Duration::from_secs(30));
    attach(&nodes[0], "dv", "n1", &[]);
    wait_served(&nodes[0], "dv");
    qemu_io_all(&nodes[0].uri("dv"), &["write -P 0x5c 0 2M"]);
    nodes[0].cli(&["volume", "detach", "dv"]);
    // Detached: each replica's node takes it, once fenced.
    let taken = nodes[2].cli_json(&["snapshot", "create", "dv", "cold"]);
    assert_eq!(taken["state"], "ready", "{taken:#}");
    assert_eq!(
        taken["nodes"].as_array().map(Vec::len),
        Some(3),
        "{taken:#}"
    );
    for node in &nodes {
        let out = qemu_io_read_only(&snapshot_uri(node, "dv", "cold"), &["read -P 0x5c 0 2M"]);
        assert!(
            qemu_io_ok(&out),
            "{}",
            out.describe("read the detached snapshot")
        );
    }

    // A schedule every 10 s keeping 2: after the third, the first is pruned.
    let refused =
        nodes[0].cli_fail(&["snapshot", "schedule", "dv", "--every", "1s", "--keep", "2"]);
    assert!(
        refused.stderr.contains("too often"),
        "{}",
        refused.describe("1 s")
    );
    nodes[0].cli(&[
        "snapshot", "schedule", "dv", "--every", "10s", "--keep", "2",
    ]);
    let schedule = nodes[1].cli_json(&["snapshot", "schedule", "dv"]);
    assert_eq!(schedule["every_secs"], 10, "{schedule:#}");
    let cold_id = taken["id"].as_u64().unwrap();
    let mut listed = Vec::new();
    let pruned = wait_until(Duration::from_secs(90), || {
        listed = snapshots(&nodes[0], "dv");
        let scheduled: Vec<&Value> = listed
            .iter()
            .filter(|snapshot| snapshot["scheduled"] == true)
            .collect();
        // The first scheduled one had the id after "cold".
        scheduled.len() == 2
            && scheduled.iter().all(|snapshot| {
                snapshot["state"] == "ready" && snapshot["id"].as_u64() > Some(cold_id + 1)
            })
    });
    assert!(pruned, "the schedule did not take and prune: {listed:#?}");
    assert!(
        listed
            .iter()
            .filter(|snapshot| snapshot["scheduled"] == true)
            .all(|snapshot| snapshot["name"].as_str().unwrap().starts_with("auto-")),
        "{listed:#?}"
    );
    // Taken by hand, never pruned.
    assert!(listed.iter().any(|snapshot| snapshot["name"] == "cold"));
    nodes[0].cli(&["snapshot", "schedule", "dv", "--off"]);
}

/// The node names a snapshot's record lists as holding it.
fn holders(node: &TestNode, volume: &str, snapshot: &str) -> Vec<String> {
    let listed = snapshots(node, volume);
    let found = listed
        .iter()
        .find(|entry| entry["name"] == snapshot)
        .unwrap_or_else(|| panic!("{volume}@{snapshot} not listed: {listed:#?}"));
    let mut names: Vec<String> = found["nodes"]
        .as_array()
        .expect("nodes listed")
        .iter()
        .map(|name| name.as_str().expect("a node name").to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn a_replica_that_was_away_is_recorded_without_the_snapshot_and_removes_deleted_ones() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "av", "--size", "64M"]);
    wait_in_sync(&nodes[0], "av", Duration::from_secs(30));
    attach(&nodes[0], "av", "n1", &[]);
    wait_served(&nodes[0], "av");
    let uri = nodes[0].uri("av");
    qemu_io_all(&uri, &["write -P 0xa1 0 8M", "flush"]);

    // n3 is away while s1 is taken: the record says where s1 exists.
    nodes[2].kill9();
    qemu_io_all(&uri, &["write -P 0xb2 0 4M", "flush"]);
    let taken = nodes[0].cli_json(&["snapshot", "create", "av", "s1"]);
    assert_eq!(taken["state"], "ready", "{taken:#}");
    assert_eq!(holders(&nodes[0], "av", "s1"), ["n1", "n2"]);

    // n3 returns and is resynced; it still does not hold s1, and says so.
    nodes[2].restart();
    wait_in_sync(&nodes[0], "av", Duration::from_secs(60));
    qemu_io_all(&uri, &["write -P 0xc3 0 2M", "flush"]);
    assert_eq!(holders(&nodes[2], "av", "s1"), ["n1", "n2"]);
    let absent = qemu_io_read_only(&snapshot_uri(&nodes[2], "av", "s1"), &["read 0 4k"]);
    assert!(
        !qemu_io_ok(&absent),
        "n3 serves a snapshot it never took: {}",
        absent.describe("read av@s1 on n3")
    );
    // A snapshot taken now is on all three, n3's copy included.
    nodes[0].cli(&["snapshot", "create", "av", "s2"]);
    assert_eq!(holders(&nodes[0], "av", "s2"), ["n1", "n2", "n3"]);

    // Snapshots survive a restart of a holder and of the primary.
    nodes[1].restart();
    nodes[0].restart();
    wait_served(&nodes[0], "av");
    wait_in_sync(&nodes[0], "av", Duration::from_secs(60));
    for node in &nodes[..2] {
        let out = qemu_io_read_only(
            &snapshot_uri(node, "av", "s1"),
            &["read -P 0xb2 0 4M", "read -P 0xa1 4M 4M"],
        );
        assert!(qemu_io_ok(&out), "{}", out.describe("read av@s1"));
    }
    for node in &nodes {
        let out = qemu_io_read_only(
            &snapshot_uri(node, "av", "s2"),
            &[
                "read -P 0xc3 0 2M",
                "read -P 0xb2 2M 2M",
                "read -P 0xa1 4M 4M",
            ],
        );
        assert!(qemu_io_ok(&out), "{}", out.describe("read av@s2"));
    }
    qemu_io_all(&nodes[0].uri("av"), &["read -P 0xc3 0 2M"]);

    // s2 deleted while n3 is away: its record waits for n3's copy, which n3
    // removes when it returns.
    nodes[2].kill9();
    nodes[0].cli(&["snapshot", "delete", "av", "s2"]);
    assert_eq!(holders(&nodes[0], "av", "s2"), ["n3"]);
    nodes[2].restart();
    let gone = wait_until(Duration::from_secs(60), || {
        snapshots(&nodes[0], "av")
            .iter()
            .all(|entry| entry["name"] != "s2")
    });
    assert!(
        gone,
        "s2 is still listed: {:#?}",
        snapshots(&nodes[0], "av")
    );
    let deleted = qemu_io_read_only(&snapshot_uri(&nodes[2], "av", "s2"), &["read 0 4k"]);
    assert!(
        !qemu_io_ok(&deleted),
        "n3 still serves the deleted s2: {}",
        deleted.describe("read av@s2 on n3")
    );
    wait_in_sync(&nodes[0], "av", Duration::from_secs(60));

    // Placement keeps a copy of every snapshot: with s1 on n1 and n2,
    // n2's replica may go; n1's is then the last copy of s1 and may not.
    nodes[0].cli(&["volume", "replica", "remove", "av", "--node", "n2"]);
    assert_eq!(holders(&nodes[0], "av", "s1"), ["n1"]);
    nodes[0].cli(&["volume", "detach", "av"]);
    let refused = nodes[0].cli_fail(&["volume", "replica", "remove", "av", "--node", "n1"]);
    assert!(
        refused.stderr.contains("last copy of snapshot(s) s1"),
        "{}",
        refused.describe("remove the last copy of s1")
    );
    for node in &nodes {
        node.assert_scan_clean("default");
    }
}

/// Field finding: write 4 MiB, snapshot s1, overwrite, snapshot s2,
/// overwrite: both listed 0 B exclusive, and deleting s1 gave back 4 MiB.
/// The volume is 1 GiB, so 4 MiB is less than the share of the volume's
/// size by which snapshot space used to have to move to be reported.
/// Each step waits for the list to show the step before, as the admin saw.
#[test]
fn snapshot_exclusive_bytes_show_what_overwrites_left_to_each_snapshot() {
    use common::nbd_client::NbdClient;
    const MIB: u64 = 1 << 20;
    let node = TestNode::start();
    node.create_volume("ov", "1G");
    let write_4m = |seed: u8| {
        let mut client = NbdClient::connect(node.nbd_port, "ov").unwrap();
        for piece in 0..4u64 {
            client
                .write(piece * MIB, &vec![seed; MIB as usize], false)
                .unwrap();
        }
        client.flush().unwrap();
        client.disconnect();
    };
    let space = |name: &str| -> (u64, u64) {
        snapshots(&node, "ov")
            .iter()
            .find(|snapshot| snapshot["name"] == name)
            .map(|snapshot| {
                (
                    snapshot["exclusive_bytes"].as_u64().unwrap(),
                    snapshot["shared_bytes"].as_u64().unwrap(),
                )
            })
            .unwrap_or_else(|| panic!("no snapshot {name}"))
    };
    let wait_for = |expected: &[(&str, (u64, u64))]| {
        let shown = wait_until(Duration::from_secs(30), || {
            expected.iter().all(|(name, bytes)| space(name) == *bytes)
        });
        assert!(
            shown,
            "snapshot list never showed {expected:?}: {:#?}",
            snapshots(&node, "ov")
        );
    };
    write_4m(1);
    node.cli(&["snapshot", "create", "ov", "s1"]);
    wait_for(&[("s1", (0, 4 * MIB))]);
    write_4m(2);
    node.cli(&["snapshot", "create", "ov", "s2"]);
    wait_for(&[("s1", (4 * MIB, 0)), ("s2", (0, 4 * MIB))]);
    write_4m(3);
    wait_for(&[("s1", (4 * MIB, 0)), ("s2", (4 * MIB, 0))]);
    let allocated = || {
        node.cli_json(&["pool", "show", "default"])["allocated_bytes"]
            .as_u64()
            .unwrap()
    };
    let before = allocated();
    node.cli(&["snapshot", "delete", "ov", "s1"]);
    assert_eq!(before - allocated(), 4 * MIB, "deleting s1 gave back");
    node.assert_scan_clean("default");
}
