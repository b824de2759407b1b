//! Replicated volumes with three real `trireme node run` processes on
//! 127.0.0.1: synchronous writes, a secondary killed and resynced with only
//! its dirty regions, failover to another node with every acknowledged
//! write present, a flipped byte repaired from a peer, a tiebreaker, and a
//! live-migration drill with two primaries.

mod common;

use common::replicated::*;
use common::*;
use std::time::Duration;

#[test]
fn a_killed_secondary_resyncs_only_what_it_missed_and_failover_keeps_every_write() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "rv", "--size", "64M"]);
    wait_in_sync(&nodes[0], "rv", Duration::from_secs(30));
    attach(&nodes[0], "rv", "n1", &[]);
    wait_served(&nodes[0], "rv");
    let n1 = nodes[0].uri("rv");

    // A client that asks another node is told where the volume is served
    // (QEMU prints the server's message).
    let elsewhere = run_fail(&mut cmd("qemu-img", &["info", &nodes[1].uri("rv")]));
    assert!(
        elsewhere.stderr.contains(&format!(
            "volume 'rv' is attached on n1, not on this node (n2): connect to {n1}"
        )),
        "{}",
        elsewhere.describe("qemu-img info on n2")
    );

    // Written while all three are up.
    qemu_io_all(&n1, &["write -P 0x11 0 8M", "flush"]);

    // n3 dies; writes go on with n1 and n2 (two of three voters).
    nodes[2].kill9();
    qemu_io_all(&n1, &["write -P 0x22 16M 4M", "flush"]);
    let shown = show(&nodes[0], "rv");
    let n3 = shown["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|replica| replica["node"] == "n3")
        .cloned()
        .unwrap();
    assert_eq!(
        n3["in_sync"], false,
        "n3 is still listed up to date: {shown:#}"
    );

    // n3 returns and gets only the four regions written meanwhile.
    nodes[2].restart();
    wait_in_sync(&nodes[0], "rv", Duration::from_secs(60));
    let copied = resynced_bytes(&nodes[0]);
    assert_eq!(
        copied.last().copied(),
        Some(4 * MIB),
        "the resync of n3 should copy exactly the 4 MiB written while it was away: {copied:?}\n{}",
        nodes[0].log_tail()
    );

    // The primary dies; n2 takes over with every acknowledged write.
    nodes[0].kill9();
    nodes[1].cli(&["volume", "detach", "rv", "--node", "n1"]);
    attach(&nodes[1], "rv", "n2", &[]);
    wait_served(&nodes[1], "rv");
    let n2 = nodes[1].uri("rv");
    qemu_io_all(
        &n2,
        &[
            "read -P 0x11 0 8M",
            "read -P 0x22 16M 4M",
            "read -P 0 8M 8M",
        ],
    );
    // And goes on writing with n2 and n3.
    qemu_io_all(
        &n2,
        &["write -P 0x33 32M 1M", "flush", "read -P 0x33 32M 1M"],
    );
}

#[test]
fn fio_verify_survives_a_secondary_kill_and_a_failover() {
    if !tools_or_skip(&["fio", "qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "fv", "--size", "64M"]);
    wait_in_sync(&nodes[0], "fv", Duration::from_secs(30));
    attach(&nodes[0], "fv", "n1", &[]);
    wait_served(&nodes[0], "fv");

    let job = |node: &TestNode, extra: &[&str]| {
        let mut command = cmd(
            "fio",
            &[
                "--name=replicated",
                "--ioengine=nbd",
                &format!("--uri={}", node.uri("fv")),
                "--rw=randwrite",
                "--bs=4k",
                "--size=32M",
                "--iodepth=16",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--randrepeat=1",
                // No verify-state file in the working directory.
                "--verify_state_save=0",
                "--output-format=terse",
            ],
        );
        command.args(extra);
        command
    };
    // Kill n3 while fio writes; fio verifies what it wrote at the end.
    let mut fio = job(&nodes[0], &[]);
    let child = std::thread::spawn(move || exec(&mut fio, Duration::from_secs(600)));
    std::thread::sleep(Duration::from_secs(2));
    nodes[2].kill9();
    let out = child.join().unwrap();
    assert!(
        out.success(),
        "{}",
        out.describe("fio with a secondary killed")
    );

    nodes[2].restart();
    wait_in_sync(&nodes[0], "fv", Duration::from_secs(120));

    // Fail over to n3, the node that was away: it has every write.
    nodes[0].kill9();
    nodes[1].cli(&["volume", "detach", "fv", "--node", "n1"]);
    attach(&nodes[1], "fv", "n3", &[]);
    wait_served(&nodes[2], "fv");
    let mut verify = job(&nodes[2], &["--verify_only"]);
    let out = exec(&mut verify, Duration::from_secs(600));
    assert!(
        out.success(),
        "{}",
        out.describe("fio --verify_only after failover")
    );
}

#[test]
fn a_flipped_byte_on_the_primary_is_repaired_from_a_peer() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "bv", "--size", "16M"]);
    wait_in_sync(&nodes[0], "bv", Duration::from_secs(30));
    attach(&nodes[0], "bv", "n1", &[]);
    wait_served(&nodes[0], "bv");
    // A recognisable block: 4 KiB of one byte value nothing else has.
    qemu_io_all(&nodes[0].uri("bv"), &["write -P 0x5a 1M 4k", "flush"]);
    // The copy on n1 is damaged while n1 is down.
    let _ = nodes[0].scan("default");
    nodes[0].stop();
    let pool = nodes[0].data_dir().join("pools/default/pool.img");
    let hits = find_in_sparse_file(&pool, &[0x5a; 4096]);
    assert!(!hits.is_empty(), "the block is not in {}", pool.display());
    for hit in hits {
        flip_byte(&pool, hit + 100);
    }
    nodes[0].restart();
    wait_in_sync(&nodes[0], "bv", Duration::from_secs(60));
    wait_served(&nodes[0], "bv");
    // The read succeeds with the right bytes, from a peer, and the local
    // copy is rewritten.
    qemu_io_all(&nodes[0].uri("bv"), &["read -P 0x5a 1M 4k"]);
    let repaired = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(nodes[0].log_path())
            .unwrap_or_default()
            .contains("repaired")
    });
    assert!(repaired, "no repair was logged\n{}", nodes[0].log_tail());
    qemu_io_all(&nodes[0].uri("bv"), &["read -P 0x5a 1M 4k"]);
    // The cluster's event log says so too, by the primary's node.
    let mut last = serde_json::Value::Null;
    let logged = wait_until(Duration::from_secs(10), || {
        last = nodes[1].cli_json(&["events", "--volume", "bv"]);
        last["events"].as_array().is_some_and(|events| {
            events.iter().any(|event| {
                event["kind"] == "repaired"
                    && event["actor"] == "node n1"
                    && event["message"]
                        .as_str()
                        .is_some_and(|text| text.starts_with("reads of volume bv found"))
            })
        })
    });
    assert!(logged, "no read repair in the event log: {last:#}");
}

#[test]
fn two_replicas_and_a_tiebreaker_survive_the_loss_of_any_one_node() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "tv", "--size", "16M", "--replicas", "2"]);
    let shown = wait_in_sync(&nodes[0], "tv", Duration::from_secs(30));
    let replicas = shown["replicas"].as_array().unwrap().clone();
    let kind_of = |name: &str| {
        replicas
            .iter()
            .find(|replica| replica["node"] == name)
            .map(|replica| replica["kind"].as_str().unwrap().to_string())
    };
    let diskful: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|name| kind_of(name).as_deref() == Some("diskful"))
        .collect();
    let tiebreaker = ["n1", "n2", "n3"]
        .into_iter()
        .find(|name| kind_of(name).as_deref() == Some("tiebreaker"))
        .unwrap_or_else(|| panic!("no tiebreaker: {shown:#}"));
    assert_eq!(diskful.len(), 2, "{shown:#}");
    let index = |name: &str| name[1..].parse::<usize>().unwrap() - 1;

    // Lose the tiebreaker: the two copies keep quorum.
    let primary = diskful[0];
    attach(&nodes[0], "tv", primary, &[]);
    wait_served(&nodes[index(primary)], "tv");
    nodes[index(tiebreaker)].kill9();
    qemu_io_all(
        &nodes[index(primary)].uri("tv"),
        &["write -P 0x41 0 1M", "flush"],
    );
    nodes[index(tiebreaker)].restart();

    // Lose the other copy: one copy and the tiebreaker keep quorum.
    nodes[index(diskful[1])].kill9();
    qemu_io_all(
        &nodes[index(primary)].uri("tv"),
        &["write -P 0x42 1M 1M", "flush"],
    );
    nodes[index(diskful[1])].restart();
    wait_in_sync(&nodes[index(primary)], "tv", Duration::from_secs(60));

    // Lose the primary: the other copy takes over with everything.
    nodes[index(primary)].kill9();
    let survivor = &nodes[index(diskful[1])];
    survivor.cli(&["volume", "detach", "tv", "--node", primary]);
    attach(survivor, "tv", diskful[1], &[]);
    wait_served(survivor, "tv");
    qemu_io_all(
        &survivor.uri("tv"),
        &["read -P 0x41 0 1M", "read -P 0x42 1M 1M"],
    );
    qemu_io_all(&survivor.uri("tv"), &["write -P 0x43 2M 1M", "flush"]);
}

#[test]
fn live_migration_with_two_primaries_keeps_every_write_on_every_replica() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "mv", "--size", "16M"]);
    wait_in_sync(&nodes[0], "mv", Duration::from_secs(30));
    attach(&nodes[0], "mv", "n1", &[]);
    wait_served(&nodes[0], "mv");
    qemu_io_all(&nodes[0].uri("mv"), &["write -P 0x61 0 1M", "flush"]);

    // Without the flag the second attach is refused, naming the primary.
    let refused = nodes[0].cli_fail(&["volume", "attach", "mv", "--node", "n2"]);
    assert!(
        refused.stderr.contains("n1"),
        "the refusal should name the current primary: {}",
        refused.describe("attach without --allow-two-primaries")
    );
    attach(&nodes[0], "mv", "n2", &["--allow-two-primaries"]);
    wait_served(&nodes[1], "mv");
    qemu_io_all(&nodes[1].uri("mv"), &["write -P 0x62 1M 1M", "flush"]);
    nodes[0].cli(&["volume", "detach", "mv", "--node", "n1"]);
    let not_attached = nodes[0].cli_fail(&["volume", "detach", "mv", "--node", "n1"]);
    assert!(!not_attached.success());
    qemu_io_all(&nodes[1].uri("mv"), &["write -P 0x63 2M 1M", "flush"]);

    // Every replica has every write: attach each in turn and read.
    for (index, name) in ["n1", "n2", "n3"].iter().enumerate() {
        for primary in show(&nodes[0], "mv")["primaries"]
            .as_array()
            .unwrap()
            .clone()
        {
            nodes[0].cli(&[
                "volume",
                "detach",
                "mv",
                "--node",
                primary.as_str().unwrap(),
            ]);
        }
        attach(&nodes[0], "mv", name, &[]);
        wait_served(&nodes[index], "mv");
        qemu_io_all(
            &nodes[index].uri("mv"),
            &[
                "read -P 0x61 0 1M",
                "read -P 0x62 1M 1M",
                "read -P 0x63 2M 1M",
            ],
        );
    }
}

/// The end of a live migration: the source detaches while the target's
/// client writes and flushes; the client sees no error. bench/guest.sh saw
/// the target's engine restart at this moment and fail QEMU's requests
/// ("target is shutting down"); this test has not made that restart happen
/// (it passes without the fix that makes a connection follow its engine
/// across a restart), so it guards the migration's end, not that fix.
#[test]
fn the_source_detaching_after_a_migration_fails_no_request_on_the_target() {
    if !tools_or_skip(&["fio", "qemu-io"]) {
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "md", "--size", "64M"]);
    wait_in_sync(&nodes[0], "md", Duration::from_secs(30));
    // Between two followers (n1 leads the control plane), the source
    // written through first, as a guest's disk is before it migrates.
    attach(&nodes[0], "md", "n2", &[]);
    wait_served(&nodes[1], "md");
    qemu_io_all(&nodes[1].uri("md"), &["write -P 0x51 0 8M", "flush"]);
    attach(&nodes[0], "md", "n3", &["--allow-two-primaries"]);
    wait_served(&nodes[2], "md");

    let mut fio = cmd(
        "fio",
        &[
            "--name=migrated",
            "--ioengine=nbd",
            &format!("--uri={}", nodes[2].uri("md")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=48M",
            "--iodepth=16",
            // Flushes too: a flush in flight at the restart must not fail.
            "--fsync=16",
            // Writing for a fixed time (the detach comes in the middle),
            // checking what it wrote as it goes.
            "--time_based",
            "--runtime=8",
            "--verify_backlog=512",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--randrepeat=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ],
    );
    let child = std::thread::spawn(move || exec(&mut fio, Duration::from_secs(600)));
    std::thread::sleep(Duration::from_secs(3));
    nodes[1].cli(&["volume", "detach", "md", "--node", "n2"]);
    let out = child.join().unwrap();
    assert!(
        out.success(),
        "{}",
        out.describe("fio on the target while the source detached")
    );
    let primaries = show(&nodes[0], "md")["primaries"].clone();
    assert_eq!(primaries, serde_json::json!(["n3"]), "{primaries}");
}

#[test]
fn a_diskless_primary_on_the_tiebreaker_node_counts_its_own_vote() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "dv", "--size", "16M", "--replicas", "2"]);
    let shown = wait_in_sync(&nodes[0], "dv", Duration::from_secs(30));
    let replicas = shown["replicas"].as_array().unwrap().clone();
    let named = |kind: &str| -> Vec<usize> {
        replicas
            .iter()
            .filter(|replica| replica["kind"] == kind)
            .map(|replica| {
                replica["node"].as_str().unwrap()[1..]
                    .parse::<usize>()
                    .unwrap()
                    - 1
            })
            .collect()
    };
    let (diskful, tiebreaker) = (named("diskful"), named("tiebreaker"));
    assert_eq!((diskful.len(), tiebreaker.len()), (2, 1), "{shown:#}");
    let t = tiebreaker[0];
    // The VM runs on the node without a copy: its engine reads and writes
    // through the two copies, and its own tiebreaker vote counts.
    attach(&nodes[0], "dv", &format!("n{}", t + 1), &[]);
    wait_served(&nodes[t], "dv");
    let uri = nodes[t].uri("dv");
    qemu_io_all(&uri, &["write -P 0x71 0 1M", "flush"]);
    nodes[diskful[1]].kill9();
    // One copy and the tiebreaker (this node) are two of three voters.
    qemu_io_all(&uri, &["write -P 0x72 1M 1M", "flush", "read -P 0x71 0 1M"]);
    nodes[diskful[1]].restart();
    wait_in_sync(&nodes[t], "dv", Duration::from_secs(60));
    qemu_io_all(&uri, &["read -P 0x71 0 1M", "read -P 0x72 1M 1M"]);
}
