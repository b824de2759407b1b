//! Silent corruption at rest: flip one byte of a volume's block inside the
//! pool file while the node is stopped; the read of that block must fail
//! with EIO, other blocks still read, the node stays up, and `pool scan`
//! reports the mismatch.

mod common;

use common::nbd_client::{self, NbdClient, EIO};
use common::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let first = u64::from_le_bytes(needle[..8].try_into().unwrap());
    let mut hits = Vec::new();
    if hay.len() < needle.len() {
        return hits;
    }
    for i in 0..=hay.len() - needle.len() {
        if hay[i] == needle[0]
            && u64::from_le_bytes(hay[i..i + 8].try_into().unwrap()) == first
            && &hay[i..i + needle.len()] == needle
        {
            hits.push(i);
        }
    }
    hits
}

fn flip_byte(path: &Path, off: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    let mut b = [0u8; 1];
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(&[b[0] ^ 0x40]).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn flipped_byte_reads_as_eio_and_scan_reports_it() {
    let mut node = TestNode::start();
    let pool_file = node.dir.path().join("flip-pool.img");
    let pool_path = pool_file.to_str().unwrap().to_string();
    node.cli(&[
        "pool", "create", "flip", "--path", &pool_path, "--size", "64M", "--class", "ssd",
    ]);
    node.cli(&["volume", "create", "fv", "--size", "8M", "--pool", "flip"]);

    let mut rng = Rng::from_env_or_time("byte flip");
    let mut victim = vec![0u8; 4096];
    rng.fill(&mut victim);
    let mut other = vec![0u8; 4096];
    rng.fill(&mut other);
    {
        let mut c = NbdClient::connect(node.nbd_port, "fv").unwrap();
        c.write(0, &victim, true).unwrap();
        c.write(1 << 20, &other, true).unwrap();
        c.flush().unwrap();
        c.disconnect();
    }
    // Let the journal be applied in place, then stop cleanly.
    let _ = node.scan("flip");
    node.stop();

    let hay =
        std::fs::read(&pool_file).unwrap_or_else(|e| panic!("read {}: {e}", pool_file.display()));
    let hits = find_all(&hay, &victim);
    eprintln!("victim block found at pool file offsets {hits:?}");
    assert!(
        !hits.is_empty(),
        "the written 4 KiB block was not found in {} ({} bytes) after a clean stop: data not stored in place/plainly?",
        pool_file.display(),
        hay.len()
    );
    drop(hay);
    // Flip it in every copy (journal and chunk), so that a stale journal
    // copy cannot hide the corruption.
    for h in &hits {
        flip_byte(&pool_file, *h as u64 + 1234);
    }

    node.restart();
    let mut c = NbdClient::connect(node.nbd_port, "fv").unwrap();
    match c.read(0, 4096) {
        Err(nbd_client::NbdError::Server(e)) => {
            assert_eq!(e, EIO, "corrupt block: expected EIO, got error {e}")
        }
        Err(e) => panic!(
            "corrupt block: connection failed instead of EIO: {e}\n{}",
            node.log_tail()
        ),
        Ok(buf) => panic!(
            "corrupt block read succeeded (returned {} data)",
            if buf == victim {
                "the original"
            } else {
                "wrong"
            }
        ),
    }
    // The connection and the other blocks are fine.
    assert_eq!(
        c.read(1 << 20, 4096).expect("other block"),
        other,
        "other block changed"
    );
    assert_eq!(
        c.read(4096, 4096)
            .expect("neighbour block in the same chunk"),
        vec![0u8; 4096]
    );
    c.disconnect();
    if have_tool("qemu-io") {
        let out = exec(
            &mut qemu_io(&node.uri("fv"), &["read 0 4096"]),
            Duration::from_secs(30),
        );
        assert!(
            !qemu_io_ok(&out),
            "qemu-io read of the corrupt block succeeded: {}",
            out.describe("qemu-io")
        );
        assert!(
            out.stdout.contains("Input/output error") || out.stderr.contains("Input/output error"),
            "qemu-io should report EIO: {}",
            out.describe("qemu-io read 0 4096")
        );
    }
    node.assert_healthy();

    let r = node.scan("flip");
    eprintln!("scan: {r}");
    let mism = r["checksum_mismatches"]
        .as_array()
        .unwrap_or_else(|| panic!("no checksum_mismatches: {r}"));
    assert!(
        !mism.is_empty(),
        "scan did not report the flipped byte: {r}"
    );
    node.assert_healthy();
    // Other pools are not affected.
    node.assert_scan_clean("default");
}
