//! qemu-img and qemu-io against a trireme export.

mod common;

use common::*;

#[test]
fn qemu_img_info_and_convert_roundtrip() {
    if let Some(r) = missing_tools(&["qemu-img", "sha256sum"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    node.create_volume("conv", "32M");
    let uri = node.uri("conv");

    let info = run(&mut cmd(
        "qemu-img",
        &["info", "--output=json", "-f", "raw", &uri],
    ));
    let info: serde_json::Value = serde_json::from_str(&info).expect("qemu-img info JSON");
    assert_eq!(
        info["virtual-size"].as_u64(),
        Some(32 << 20),
        "qemu-img info: {info}"
    );

    let tmp = TempDir::new("conv");
    let src = tmp.path().join("src.raw");
    let out = tmp.path().join("out.raw");
    random_file(&src, 32 << 20, 1);
    // -n: the target exists already (it is the volume).
    run(
        cmd("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri),
    );
    run(cmd("qemu-img", &["convert", "-f", "raw", "-O", "raw", &uri]).arg(&out));
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 32 << 20);
    assert_eq!(
        sha256(&src),
        sha256(&out),
        "data read back differs from data written"
    );
    let cmp = run(cmd("qemu-img", &["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri));
    assert!(cmp.contains("identical"), "qemu-img compare: {cmp}");
}

#[test]
fn qemu_io_patterns_at_aligned_and_unaligned_offsets() {
    if let Some(r) = missing_tools(&["qemu-io"]) {
        skip(&r);
        return;
    }
    let node = TestNode::start();
    node.create_volume("pat", "8M");
    let uri = node.uri("pat");
    let size: u64 = 8 << 20;
    // (offset, length, pattern byte): aligned, unaligned, crossing 4 KiB and
    // 64 KiB chunk boundaries, and the very end of the device.
    let writes: &[(u64, u64, u8)] = &[
        (0, 4096, 0x11),
        (65536, 65536, 0x22),
        (1000, 3000, 0x33),
        (2_000_001, 100, 0x44),
        (196607, 2, 0x55),
        (262140, 8, 0x66),
        (300001, 70001, 0x77),
        (4 << 20, 1 << 20, 0x88),
        (size - 512, 512, 0x99),
        (size - 4097, 1, 0xaa),
    ];
    let cmds: Vec<String> = writes
        .iter()
        .map(|(o, l, p)| format!("write -P {p:#x} {o} {l}"))
        .collect();
    let refs: Vec<&str> = cmds.iter().map(|s| s.as_str()).collect();
    let out = exec(
        &mut qemu_io(&uri, &refs),
        std::time::Duration::from_secs(60),
    );
    assert!(qemu_io_ok(&out), "{}", out.describe("qemu-io writes"));

    // Read back in a new connection, each range and the gaps around some.
    // 0..4096 (0x11) was partly overwritten by 1000..4000 (0x33): skip it here.
    let mut reads: Vec<String> = writes[1..]
        .iter()
        .map(|(o, l, p)| format!("read -P {p:#x} {o} {l}"))
        .collect();
    reads.push("read -P 0 4096 61440".into());
    reads.push("read -P 0 131072 65535".into());
    reads.push("read -P 0 400000 100001".into());
    reads.push(format!("read -P 0 {} {}", 5 << 20, 1 << 20));
    let refs: Vec<&str> = reads.iter().map(|s| s.as_str()).collect();
    let out = exec(
        &mut qemu_io(&uri, &refs),
        std::time::Duration::from_secs(60),
    );
    assert!(qemu_io_ok(&out), "{}", out.describe("qemu-io reads"));
    // 0..4096 was 0x11 then 1000..4000 became 0x33: check the edges.
    let out = exec(
        &mut qemu_io(
            &uri,
            &[
                "read -P 0x11 0 1000",
                "read -P 0x33 1000 3000",
                "read -P 0x11 4000 96",
            ],
        ),
        std::time::Duration::from_secs(60),
    );
    assert!(
        qemu_io_ok(&out),
        "{}",
        out.describe("qemu-io overlap reads")
    );
    // A wrong pattern must be detected (the check above is not vacuous).
    let out = exec(
        &mut qemu_io(&uri, &["read -P 0x12 65536 4096"]),
        std::time::Duration::from_secs(60),
    );
    assert!(
        !qemu_io_ok(&out),
        "qemu-io did not notice a wrong pattern: {}",
        out.describe("qemu-io")
    );
}
