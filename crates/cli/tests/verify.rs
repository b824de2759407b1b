//! `trireme volume verify` on three real nodes: one replica's copy is
//! changed behind trireme's back while its node is stopped (one block
//! rewritten with a valid checksum, so only a comparison finds it; one
//! byte flipped, so its checksum fails), the node comes back in sync, and
//! the verify finds both blocks, rewrites them from the majority, and a
//! second verify finds nothing. Reads through that node then return the
//! majority's data.

mod common;

use common::replicated::*;
use common::*;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

fn read_u64_at(file: &mut std::fs::File, offset: u64) -> u64 {
    let mut bytes = [0u8; 8];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut bytes).unwrap();
    u64::from_le_bytes(bytes)
}

/// Replaces the in-place copy of the block holding `old` with `new`, and
/// its crc32c in the pool's checksum region, so that the pool's own
/// checks cannot tell (docs/store-format.md gives the layout).
fn rewrite_block_silently(pool: &Path, old: &[u8], new: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pool)
        .unwrap();
    let checksum_offset = read_u64_at(&mut file, 64);
    let data_offset = read_u64_at(&mut file, 80);
    let hits: Vec<u64> = find_in_sparse_file(pool, old)
        .into_iter()
        .filter(|&hit| hit >= data_offset)
        .collect();
    assert_eq!(hits.len(), 1, "the block's in-place copy: {hits:?}");
    let block = (hits[0] - data_offset) / 4096;
    assert_eq!((hits[0] - data_offset) % 4096, 0, "unaligned block");
    file.seek(SeekFrom::Start(hits[0])).unwrap();
    file.write_all(new).unwrap();
    file.seek(SeekFrom::Start(checksum_offset + 4 * block))
        .unwrap();
    file.write_all(&crc_fast::crc32_iscsi(new).to_le_bytes())
        .unwrap();
    file.sync_all().unwrap();
}

/// Flips one byte of the in-place copy of the block holding `old` (its
/// checksum then fails).
fn flip_block(pool: &Path, old: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pool)
        .unwrap();
    let data_offset = read_u64_at(&mut file, 80);
    let hits: Vec<u64> = find_in_sparse_file(pool, old)
        .into_iter()
        .filter(|&hit| hit >= data_offset)
        .collect();
    assert_eq!(hits.len(), 1, "the block's in-place copy: {hits:?}");
    file.seek(SeekFrom::Start(hits[0] + 7)).unwrap();
    file.write_all(&[old[7] ^ 0x01]).unwrap();
    file.sync_all().unwrap();
}

fn verify(node: &TestNode, volume: &str) -> Value {
    node.cli_json(&["volume", "verify", volume])
}

#[test]
fn verify_finds_silent_divergence_and_bad_blocks_and_repairs_them_from_the_majority() {
    if let Some(missing) = missing_tools(&["qemu-io"]) {
        skip(&missing);
        return;
    }
    let mut nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "vv", "--size", "16M"]);
    assert!(wait_until(Duration::from_secs(30), || in_sync(
        &nodes[0], "vv"
    )));

    // Not attached yet: a clear refusal.
    let refused = nodes[0].cli_fail(&["volume", "verify", "vv"]);
    assert!(
        refused.stderr.contains("not attached"),
        "{}",
        refused.describe("verify before attach")
    );

    nodes[0].cli(&["volume", "attach", "vv", "--node", "n1"]);
    wait_served(&nodes[0], "vv");
    let n1 = nodes[0].uri("vv");
    qemu_io_all(
        &n1,
        &[
            "write -P 0x3c 0 8M",
            "write -P 0x5a 1M 4k",
            "write -P 0x6b 3M 4k",
            "flush",
        ],
    );
    // A clean verify first: nothing differs.
    let clean = verify(&nodes[1], "vv");
    assert_eq!(clean["state"], "done", "{clean:#}");
    assert_eq!(clean["differing_blocks"], 0, "{clean:#}");
    assert_eq!(clean["checked_bytes"], 16 << 20, "{clean:#}");

    // n3's copy changes behind trireme's back while n3 is stopped.
    let _ = nodes[2].scan("default");
    nodes[2].stop();
    let pool = nodes[2].data_dir().join("pools/default/pool.img");
    rewrite_block_silently(&pool, &[0x5a; 4096], &[0xa5; 4096]);
    flip_block(&pool, &[0x6b; 4096]);
    nodes[2].restart();
    assert!(
        wait_until(Duration::from_secs(60), || in_sync(&nodes[0], "vv")),
        "n3 did not get back in sync\n{}",
        nodes[0].log_tail()
    );

    // Asked through n2 (forwarded to n1, the primary).
    let report = verify(&nodes[1], "vv");
    assert_eq!(report["state"], "done", "{report:#}");
    assert_eq!(report["primary"], "n1", "{report:#}");
    assert_eq!(report["differing_blocks"], 2, "{report:#}");
    assert_eq!(report["no_majority_blocks"], 0, "{report:#}");
    assert_eq!(report["unrecoverable_blocks"], 0, "{report:#}");
    let repaired = report["repaired"].as_array().unwrap();
    assert_eq!(repaired.len(), 1, "{report:#}");
    assert_eq!(repaired[0]["node"], "n3", "{report:#}");
    assert_eq!(repaired[0]["blocks"], 2, "{report:#}");
    // The table for people says the same.
    let mut table = std::process::Command::new(trireme_bin());
    table.args(["--api", &nodes[0].api_url(), "volume", "verify", "vv"]);
    let again = run(&mut table);
    assert!(
        again.contains("every block is identical on every replica"),
        "{again}"
    );

    // n3 serves the majority's data.
    nodes[0].cli(&["volume", "detach", "vv", "--node", "n1"]);
    nodes[0].cli(&["volume", "attach", "vv", "--node", "n3"]);
    wait_served(&nodes[2], "vv");
    qemu_io_all(
        &nodes[2].uri("vv"),
        &[
            "read -P 0x5a 1M 4k",
            "read -P 0x6b 3M 4k",
            "read -P 0x3c 0 1M",
        ],
    );
    // The new primary's engine has run no verify yet.
    let none = nodes[2].cli_fail(&["volume", "verify", "vv", "--status"]);
    assert!(
        none.stderr.contains("no verify of volume 'vv' ran"),
        "{}",
        none.describe("verify --status on a fresh engine")
    );
}
