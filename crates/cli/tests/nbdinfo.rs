//! nbdinfo: export size, flags, allocation map (sparse writes, TRIM), list.

mod common;

use common::*;
use serde_json::Value;

fn info_json(uri: &str, extra: &[&str]) -> Value {
    let mut c = cmd("nbdinfo", &["--json"]);
    c.args(extra).arg(uri);
    let out = run(&mut c);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo JSON ({e}): {out}"))
}

#[test]
fn nbdinfo_size_and_flags() {
    if let Some(r) = missing_tools(&["nbdinfo"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    node.create_volume("flags", "64M");
    let v = info_json(&node.uri("flags"), &[]);
    eprintln!("nbdinfo: {v:#}");
    assert_eq!(v["protocol"], "newstyle-fixed", "{v}");
    assert_eq!(
        v["structured"], true,
        "structured replies not negotiated: {v}"
    );
    let e = &v["exports"][0];
    assert_eq!(e["export-name"], "flags");
    assert_eq!(e["export-size"].as_u64(), Some(64 << 20), "{e}");
    assert_eq!(e["is_read_only"], false, "{e}");
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(e[flag], true, "{flag} should be true: {e}");
    }
    let contexts: Vec<&str> = e["contexts"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert!(
        contexts.contains(&"base:allocation"),
        "no base:allocation (BLOCK_STATUS): {e}"
    );
    // Reported, not required: fast zero.
    eprintln!("can_fast_zero = {}", e["can_fast_zero"]);
}

/// (offset, length, is_hole) extents from `nbdinfo --map --json`.
fn map(uri: &str) -> Vec<(u64, u64, bool)> {
    let out = run(&mut cmd("nbdinfo", &["--map", "--json", uri]));
    let v: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo --map JSON ({e}): {out}"));
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["offset"].as_u64().unwrap(),
                x["length"].as_u64().unwrap(),
                x["type"].as_u64().unwrap() & 1 == 1,
            )
        })
        .collect()
}

fn is_hole_at(m: &[(u64, u64, bool)], off: u64) -> bool {
    m.iter()
        .find(|(o, l, _)| *o <= off && off < o + l)
        .unwrap_or_else(|| panic!("offset {off} not covered by map {m:?}"))
        .2
}

fn check_contiguous(m: &[(u64, u64, bool)], size: u64) {
    let mut pos = 0;
    for (o, l, _) in m {
        assert_eq!(*o, pos, "map not contiguous: {m:?}");
        pos += l;
    }
    assert_eq!(pos, size, "map does not cover the device: {m:?}");
}

#[test]
fn nbdinfo_map_sparse_writes_and_trim() {
    if let Some(r) = missing_tools(&["nbdinfo", "qemu-io"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    let size: u64 = 16 << 20;
    node.create_volume("sparse", "16M");
    let uri = node.uri("sparse");

    let m = map(&uri);
    check_contiguous(&m, size);
    assert!(
        m.iter().all(|e| e.2),
        "a fresh volume should be all hole: {m:?}"
    );

    let out = exec(
        &mut qemu_io(
            &uri,
            &[
                "write -P 0x5a 0 4096",
                "write -P 0x5b 5242880 65536",
                "write -P 0x5c 12582912 131072",
            ],
        ),
        std::time::Duration::from_secs(60),
    );
    assert!(qemu_io_ok(&out), "{}", out.describe("qemu-io write"));
    let m = map(&uri);
    eprintln!("map after writes: {m:?}");
    check_contiguous(&m, size);
    for off in [
        0u64,
        5 << 20,
        (5 << 20) + 65535,
        12 << 20,
        (12 << 20) + 131071,
    ] {
        assert!(
            !is_hole_at(&m, off),
            "offset {off} was written but is a hole: {m:?}"
        );
    }
    for off in [
        1u64 << 20,
        3 << 20,
        8 << 20,
        (5 << 20) + 65536 + 65536,
        size - 1,
    ] {
        assert!(
            is_hole_at(&m, off),
            "offset {off} was never written but is data: {m:?}"
        );
    }

    // TRIM whole chunks: they become holes again and read as zeroes.
    let out = exec(
        &mut qemu_io(
            &uri,
            &[
                "discard 0 65536",
                "discard 5242880 65536",
                "discard 12582912 131072",
            ],
        ),
        std::time::Duration::from_secs(60),
    );
    assert!(qemu_io_ok(&out), "{}", out.describe("qemu-io discard"));
    let m = map(&uri);
    eprintln!("map after trim: {m:?}");
    check_contiguous(&m, size);
    assert!(
        m.iter().all(|e| e.2),
        "trimmed chunks should be holes again: {m:?}"
    );
    let out = exec(
        &mut qemu_io(
            &uri,
            &[
                "read -P 0 0 65536",
                "read -P 0 5242880 65536",
                "read -P 0 12582912 131072",
            ],
        ),
        std::time::Duration::from_secs(60),
    );
    assert!(
        qemu_io_ok(&out),
        "{}",
        out.describe("qemu-io read after trim")
    );
}

#[test]
fn nbdinfo_list_shows_volumes() {
    if let Some(r) = missing_tools(&["nbdinfo"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    node.create_volume("lista", "8M");
    node.create_volume("listb", "16M");
    let v = info_json(&format!("nbd://127.0.0.1:{}", node.nbd_port), &["--list"]);
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports: {v}"))
        .iter()
        .filter_map(|e| e["export-name"].as_str())
        .collect();
    assert!(
        names.contains(&"lista") && names.contains(&"listb"),
        "exports {names:?}"
    );
    node.cli(&["volume", "delete", "lista"]);
    let v = info_json(&format!("nbd://127.0.0.1:{}", node.nbd_port), &["--list"]);
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["export-name"].as_str())
        .collect();
    assert!(
        !names.contains(&"lista") && names.contains(&"listb"),
        "after delete: exports {names:?}"
    );
}
