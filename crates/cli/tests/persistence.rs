//! Pools, volumes and data survive a clean restart (SIGTERM) and a kill -9.

mod common;

use common::nbd_client::NbdClient;
use common::*;

fn populate(node: &TestNode) {
    let path = node.dir.path().join("keep.img");
    node.cli(&[
        "pool",
        "create",
        "keep",
        "--path",
        path.to_str().unwrap(),
        "--size",
        "64M",
        "--class",
        "hdd",
    ]);
    node.cli(&[
        "volume", "create", "onkeep", "--size", "8M", "--pool", "keep",
    ]);
    node.cli(&["volume", "create", "ondefault", "--size", "4M"]);
    node.cli(&["volume", "grow", "ondefault", "--size", "12M"]);
    node.cli(&["volume", "create", "gone", "--size", "4M"]);
    node.cli(&["volume", "delete", "gone"]);
    for (vol, seed) in [("onkeep", 1u64), ("ondefault", 2)] {
        let mut c = NbdClient::connect(node.nbd_port, vol).unwrap();
        let mut rng = Rng::new(seed);
        for i in 0..60u64 {
            let mut b = vec![0u8; 4096];
            rng.fill(&mut b);
            // Spread over the first 8 MiB, across many chunks.
            c.write(i * 131072 + (i % 3) * 4096, &b, i % 2 == 0)
                .unwrap();
        }
        c.flush().unwrap();
        c.disconnect();
    }
}

fn check(node: &TestNode) {
    let pools = node.cli(&["pool", "list"]);
    assert!(
        pools.contains("keep") && pools.contains("default"),
        "pools after restart: {pools}"
    );
    let vols = node.cli(&["volume", "list"]);
    assert!(
        vols.contains("onkeep") && vols.contains("ondefault"),
        "volumes after restart: {vols}"
    );
    assert!(
        !vols.contains("\"gone\""),
        "deleted volume came back: {vols}"
    );
    for (vol, seed, size) in [("onkeep", 1u64, 8u64 << 20), ("ondefault", 2, 12 << 20)] {
        let mut c = NbdClient::connect(node.nbd_port, vol).unwrap();
        assert_eq!(c.size, size, "{vol}: size after restart");
        let mut rng = Rng::new(seed);
        for i in 0..60u64 {
            let mut b = vec![0u8; 4096];
            rng.fill(&mut b);
            let off = i * 131072 + (i % 3) * 4096;
            if off + 4096 > size {
                continue;
            }
            assert!(
                c.read(off, 4096).unwrap() == b,
                "{vol}: block at {off} differs after restart"
            );
        }
        c.disconnect();
    }
    node.assert_scan_clean("keep");
    node.assert_scan_clean("default");
}

#[test]
fn survives_clean_restart() {
    let mut node = TestNode::start();
    populate(&node);
    check(&node);
    node.stop();
    node.restart();
    check(&node);
    node.stop();
    node.restart();
    check(&node);
}

#[test]
fn survives_kill9_restart() {
    let mut node = TestNode::start();
    populate(&node);
    node.kill9();
    node.restart();
    check(&node);
    node.kill9();
    node.restart();
    check(&node);
    // The NBD unix socket is usable after a crash left the old one behind.
    let sock = node.data_dir().join("nbd.sock");
    assert!(sock.exists(), "{} missing after restart", sock.display());
    if have_tool("nbdinfo") {
        let uri = format!("nbd+unix:///onkeep?socket={}", sock.display());
        let out = run(&mut cmd("nbdinfo", &["--size", &uri]));
        assert_eq!(out.trim(), (8u64 << 20).to_string());
    }
}
