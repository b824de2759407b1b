//! fio's nbd engine: random 4k writes with crc32c verification.

mod common;

use common::*;
use std::time::Duration;

fn fio_verify(node: &TestNode, vol: &str, iodepth: u32, numjobs: u32, per_job: &str) {
    let tmp = TempDir::new("fio");
    let json = tmp.path().join("fio.json");
    let mut c = cmd(
        "fio",
        &[
            "--name=verify".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={}", node.uri(vol)),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            format!("--iodepth={iodepth}"),
            format!("--numjobs={numjobs}"),
            format!("--size={per_job}"),
            format!("--offset_increment={per_job}"),
            "--verify=crc32c".into(),
            "--do_verify=1".into(),
            "--verify_fatal=1".into(),
            "--verify_dump=0".into(),
            // No verify-state files left in the working directory.
            "--verify_state_save=0".into(),
            "--runtime=60".into(),
            "--output-format=json".into(),
        ],
    );
    c.arg(format!("--output={}", json.display()));
    c.current_dir(tmp.path());
    let what = render(&c);
    let out = exec(&mut c, Duration::from_secs(240));
    let report = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(
        out.success(),
        "fio failed\n{}\n--- json ---\n{}",
        out.describe(&what),
        report
    );
    let v: serde_json::Value =
        serde_json::from_str(&report).unwrap_or_else(|e| panic!("fio JSON ({e}): {report}"));
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), numjobs as usize);
    for j in jobs {
        assert_eq!(j["error"].as_u64(), Some(0), "fio job error: {j}");
        let w = j["write"]["io_bytes"].as_u64().unwrap();
        let r = j["read"]["io_bytes"].as_u64().unwrap();
        assert!(w > 0, "nothing written: {j}");
        assert_eq!(r, w, "verify read back {r} of {w} bytes");
        eprintln!(
            "fio qd{iodepth} x{numjobs}: write {:.0} IOPS, verify read {:.0} IOPS",
            j["write"]["iops"].as_f64().unwrap(),
            j["read"]["iops"].as_f64().unwrap()
        );
    }
    assert!(
        !out.stderr.contains("verify:"),
        "verify errors: {}",
        out.stderr
    );
}

fn prereq() -> bool {
    if let Some(r) = missing_tools(&["fio"]) {
        skip(&r);
        return false;
    }
    true
}

#[test]
fn fio_randwrite_verify_qd1() {
    if !prereq() {
        return;
    }
    let node = TestNode::start();
    node.create_volume("qd1", "16M");
    fio_verify(&node, "qd1", 1, 1, "4M");
    node.assert_scan_clean("default");
}

#[test]
fn fio_randwrite_verify_qd32() {
    if !prereq() {
        return;
    }
    let node = TestNode::start();
    node.create_volume("qd32", "32M");
    fio_verify(&node, "qd32", 32, 1, "32M");
    node.assert_scan_clean("default");
}

#[test]
fn fio_randwrite_verify_four_connections() {
    if !prereq() {
        return;
    }
    let node = TestNode::start();
    node.create_volume("multi", "64M");
    fio_verify(&node, "multi", 8, 4, "16M");
    node.assert_scan_clean("default");
}
