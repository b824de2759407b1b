//! nbdcopy of 256 MiB of random data into and out of a volume.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn nbdcopy_256m_roundtrip() {
    if let Some(r) = missing_tools(&["nbdcopy", "sha256sum"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    node.create_volume("big", "256M");
    let uri = node.uri("big");
    let tmp = TempDir::new("nbdcopy");
    let src = tmp.path().join("src.raw");
    let out = tmp.path().join("out.raw");
    random_file(&src, 256 << 20, 42);
    let t = std::time::Instant::now();
    run_t(
        cmd("nbdcopy", &["--flush"]).arg(&src).arg(&uri),
        Duration::from_secs(300),
    );
    eprintln!("nbdcopy in: {:?}", t.elapsed());
    let t = std::time::Instant::now();
    run_t(cmd("nbdcopy", &[&uri]).arg(&out), Duration::from_secs(300));
    eprintln!("nbdcopy out: {:?}", t.elapsed());
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 256 << 20);
    assert_eq!(sha256(&src), sha256(&out), "256 MiB read back differs");
    node.assert_scan_clean("default");
}
