//! Resyncs and full pools with three real `trireme node run` processes on
//! 127.0.0.1 (issue 19):
//! - a replica that falls behind while the volume is detached is resynced
//!   all the same (a resync-only engine on an up-to-date replica's node),
//!   `volume show --wait` follows it, and says why when nothing can run;
//! - a resync keeps a thin copy thin: after a killed primary comes back
//!   and is fully resynced, every replica holds about the same space;
//! - pools full everywhere give the client ENOSPC and outdate nobody.

mod common;

use common::replicated::*;
use common::*;
use serde_json::Value;
use std::time::Duration;

/// The allocated bytes of each diskful replica, as `volume show` reports.
fn allocated(shown: &Value) -> Vec<(String, u64)> {
    shown["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|replica| replica["kind"] == "diskful")
        .map(|replica| {
            (
                replica["node"].as_str().unwrap_or_default().to_string(),
                replica["allocated_bytes"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn wait_online(node: &TestNode, count: usize) {
    let settled = wait_until(Duration::from_secs(60), || {
        node.cli_json(&["status"])["nodes"]["online"] == count
    });
    assert!(settled, "not {count} nodes online\n{}", node.log_tail());
}

#[test]
fn a_detached_volume_resyncs_its_outdated_replicas() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "dv", "--size", "32M"]);
    wait_in_sync(&nodes[0], "dv", Duration::from_secs(30));
    attach(&nodes[0], "dv", "n1", &[]);
    wait_served(&nodes[0], "dv");
    let n1 = nodes[0].uri("dv");
    qemu_io_all(&n1, &["write -P 0x31 0 4M", "flush"]);

    // n3 goes away while the VM writes, then the VM stops.
    nodes[2].kill9();
    qemu_io_all(&n1, &["write -P 0x32 8M 2M", "flush"]);
    nodes[0].cli(&["volume", "detach", "dv"]);
    assert_eq!(
        replica_on(&show(&nodes[0], "dv"), "n3").unwrap()["in_sync"],
        false
    );

    // n3 returns: nothing is attached, yet it is resynced, and `--wait`
    // follows that to the end.
    nodes[2].restart();
    wait_online(&nodes[0], 3);
    let waited = nodes[0].cli_json(&["volume", "show", "dv", "--wait", "--timeout", "90s"]);
    assert!(all_in_sync(&waited), "{waited:#}");
    assert_eq!(
        waited["primaries"],
        serde_json::json!([]),
        "the resync engine is not an attachment: {waited:#}"
    );
    // Its engine ends, leaving the volume detached.
    let ended = wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(nodes[0].log_path())
            .unwrap_or_default()
            .contains("resync of the detached volume is over")
    });
    assert!(ended, "{}", nodes[0].log_tail());

    // The copy on n3 is whole: served from n3 alone with n1 gone.
    nodes[0].kill9();
    attach(&nodes[1], "dv", "n3", &[]);
    wait_served(&nodes[2], "dv");
    qemu_io_all(
        &nodes[2].uri("dv"),
        &["read -P 0x31 0 4M", "read -P 0x32 8M 2M", "read -P 0 4M 4M"],
    );
}

#[test]
fn wait_after_replica_add_on_a_detached_volume_ends() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&[
        "volume",
        "create",
        "wv",
        "--size",
        "16M",
        "--replicas",
        "2",
        "--nodes",
        "n1,n2",
    ]);
    wait_in_sync(&nodes[0], "wv", Duration::from_secs(30));

    // A new replica on a detached volume gets its data.
    nodes[0].cli(&["volume", "replica", "add", "wv", "--node", "n3"]);
    let waited = nodes[0].cli_json(&["volume", "show", "wv", "--wait", "--timeout", "60s"]);
    assert!(all_in_sync(&waited), "{waited:#}");

    // n3 falls behind and stays down after the VM stops: nothing can copy
    // to it, and `--wait` says why at once rather than wait.
    attach(&nodes[0], "wv", "n1", &[]);
    wait_served(&nodes[0], "wv");
    nodes[2].stop();
    qemu_io_all(&nodes[0].uri("wv"), &["write -P 0x77 0 1M", "flush"]);
    nodes[0].cli(&["volume", "detach", "wv"]);
    wait_online(&nodes[0], 2);
    let waited = nodes[0].cli_fail(&["volume", "show", "wv", "--wait", "--timeout", "60s"]);
    assert!(
        waited.stderr.contains("no resync can run")
            && waited.stderr.contains("n3")
            && waited.stderr.contains("start it again"),
        "{}",
        waited.describe("show --wait")
    );

    // Back, it is resynced although nothing is attached.
    nodes[2].restart();
    wait_online(&nodes[0], 3);
    let waited = nodes[0].cli_json(&["volume", "show", "wv", "--wait", "--timeout", "60s"]);
    assert!(all_in_sync(&waited), "{waited:#}");
}

#[test]
fn a_resync_keeps_a_thin_replica_thin() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "tv", "--size", "256M"]);
    wait_in_sync(&nodes[0], "tv", Duration::from_secs(30));
    attach(&nodes[0], "tv", "n1", &[]);
    wait_served(&nodes[0], "tv");
    // 4 KiB writes scattered over the volume: about one per 64 KiB chunk
    // in a third of the chunks, so every 1 MiB region holds some data but
    // mostly holes.
    let mut rng = Rng::new(19);
    let commands: Vec<String> = (0..1_400)
        .map(|_| {
            let block = rng.below((256 * MIB) / 4096);
            format!("write -P 0x5a {} 4k", block * 4096)
        })
        .chain(["flush".to_string()])
        .collect();
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    qemu_io_all(&nodes[0].uri("tv"), &commands);

    // The primary dies and returns: its copy (that of a former primary
    // that crashed) is copied again in full from its peers.
    nodes[0].kill9();
    nodes[0].restart();
    let resynced = wait_until(Duration::from_secs(120), || {
        let log = std::fs::read_to_string(nodes[0].log_path()).unwrap_or_default();
        log.contains("resync done") && in_sync(&nodes[1], "tv")
    });
    assert!(resynced, "n1 was not resynced\n{}", nodes[0].log_tail());

    // Every copy holds about what the others do (the reports move in
    // steps of 1/64 of the volume).
    let mut last = Vec::new();
    let close = wait_until(Duration::from_secs(30), || {
        last = allocated(&show(&nodes[1], "tv"));
        let sizes: Vec<u64> = last.iter().map(|(_, bytes)| *bytes).collect();
        let (least, most) = (
            sizes.iter().copied().min().unwrap_or(0),
            sizes.iter().copied().max().unwrap_or(0),
        );
        sizes.len() == 3 && least > 0 && most <= least + least / 8 + 8 * MIB
    });
    assert!(
        close,
        "the resynced replica holds more than its peers: {last:?}\n{}",
        nodes[0].log_tail()
    );
}

#[test]
fn full_pools_everywhere_give_enospc_and_outdate_nobody() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let nodes = three_nodes();
    for node in &nodes {
        let path = node.data_dir().join("small.img").display().to_string();
        node.cli(&[
            "pool", "create", "small", "--path", &path, "--size", "64M", "--class", "ssd",
        ]);
    }
    let placed = wait_until(Duration::from_secs(30), || {
        exec(
            &mut nodes[0].cli_cmd(&[
                "volume", "create", "fv", "--size", "256M", "--pool", "small",
            ]),
            Duration::from_secs(30),
        )
        .success()
    });
    assert!(placed, "the volume was not placed on the small pools");
    wait_in_sync(&nodes[0], "fv", Duration::from_secs(30));
    attach(&nodes[0], "fv", "n1", &[]);
    wait_served(&nodes[0], "fv");

    // Sequential 1 MiB writes until well past the pools' room.
    let commands: Vec<String> = (0..96u64)
        .map(|mib| format!("write -P 0x66 {}M 1M", mib))
        .collect();
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
    let out = exec(
        &mut qemu_io(&nodes[0].uri("fv"), &commands),
        Duration::from_secs(120),
    );
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(
        said.contains("No space left on device"),
        "the pools never filled: {}",
        out.describe("qemu-io")
    );
    assert!(
        !said.contains("Input/output error"),
        "a write got EIO instead of ENOSPC: {}",
        out.describe("qemu-io")
    );
    // Nobody was outdated: the three copies stay up to date.
    std::thread::sleep(Duration::from_secs(2));
    let shown = show(&nodes[0], "fv");
    assert!(
        all_in_sync(&shown),
        "a full pool outdated a replica: {shown:#}\n{}",
        nodes[0].log_tail()
    );
    // And what fitted is there.
    qemu_io_all(&nodes[0].uri("fv"), &["read -P 0x66 0 16M"]);
}
