//! Pools made and measured by a real node on 127.0.0.1:
//! - a pool file takes on the host about the data it holds, however often
//!   whole chunks are overwritten, and `pool list` / `pool show` say how
//!   much it takes.

mod common;

use common::nbd_client::NbdClient;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Field finding: after a benchmark each node's pool file took 11 GB on
/// the host while `pool show` said 2 GiB allocated.
#[test]
fn a_pool_file_takes_about_its_data_on_the_host_and_pool_list_says_so() {
    let node = TestNode::start();
    let path = node.dir.path().join("churn.img");
    let path_text = path.to_str().unwrap();
    node.cli(&[
        "pool", "create", "churn", "--path", path_text, "--size", "512M",
    ]);
    node.cli(&[
        "volume", "create", "busy", "--size", "64M", "--pool", "churn",
    ]);
    let mut client = NbdClient::connect(node.nbd_port, "busy").unwrap();
    // 640 MiB of whole-chunk writes over the same 32 MiB: more than the
    // pool's chunks, so a pool that does not reuse freed chunks first
    // walks through all of them.
    let mut rng = Rng::new(19);
    let mut block = vec![0u8; MIB as usize];
    for _round in 0..20 {
        for piece in 0..32u64 {
            rng.fill(&mut block);
            client.write(piece * MIB, &block, false).unwrap();
        }
        client.flush().unwrap();
    }
    client.disconnect();
    let journal_and_checksums =
        |pool: &serde_json::Value| pool["journal_bytes"].as_u64().unwrap() + 2 * MIB;
    let mut last = serde_json::Value::Null;
    // Freed chunks go back at the next checkpoint (every second).
    let settled = wait_until(Duration::from_secs(20), || {
        last = node.cli_json(&["pool", "show", "churn"]);
        let host = last["host_bytes"].as_u64().unwrap();
        last["allocated_bytes"] == 32 * MIB && host <= journal_and_checksums(&last) + 32 * MIB
    });
    assert!(
        settled,
        "the pool file takes far more than its 32 MiB of data on the host: {last:#}"
    );
    // What the node reports is what the host's file system says.
    let blocks_bytes = std::fs::metadata(&path).unwrap().blocks() * 512;
    let reported = last["host_bytes"].as_u64().unwrap();
    assert!(
        blocks_bytes.abs_diff(reported) <= 4 * MIB,
        "st_blocks says {blocks_bytes}, the node {reported}"
    );
    // The tables show it.
    let table = run(Command::new(trireme_bin()).args(["--api", &node.api_url(), "pool", "list"]));
    assert!(table.contains("ON HOST"), "{table}");
    let detail =
        run(Command::new(trireme_bin()).args(["--api", &node.api_url(), "pool", "show", "churn"]));
    assert!(detail.contains("on host"), "{detail}");
    node.assert_scan_clean("churn");
}
