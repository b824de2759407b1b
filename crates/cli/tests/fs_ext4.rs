//! A real filesystem on a volume: nbdfuse exposes the export as a file, a
//! loop device makes it a block device, then mkfs.ext4, mount, write, fsck.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn sh_quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[test]
fn mkfs_ext4_via_nbdfuse_and_loop() {
    if let Some(r) = missing_tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
    ]) {
        skip(&r);
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        skip("/dev/fuse missing");
        return;
    }
    if !Path::new("/dev/loop-control").exists() {
        skip("/dev/loop-control missing (modprobe loop)");
        return;
    }
    let node = TestNode::start();
    node.create_volume("fs", "128M");
    let tmp = TempDir::new("ext4");
    let fuse_dir = tmp.path().join("fuse");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let fuse_s = fuse_dir.to_str().unwrap().to_string();
    let mnt_s = mnt.to_str().unwrap().to_string();

    // nbdfuse stays in the foreground until unmounted.
    let nbdfuse: Child = Command::new("nbdfuse")
        .arg(&fuse_dir)
        .arg(node.uri("fs"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nbdfuse");
    let fuse_s2 = fuse_s.clone();
    let mut nbdfuse = Some(nbdfuse);
    let _fuse_guard = Guard(Some(move || {
        sh_quiet(&["fusermount3", "-u", &fuse_s2]);
        if let Some(mut c) = nbdfuse.take() {
            std::thread::sleep(Duration::from_millis(200));
            let _ = c.kill();
            let _ = c.wait();
        }
    }));
    let file = fuse_dir.join("nbd");
    assert!(
        wait_until(Duration::from_secs(20), || std::fs::metadata(&file)
            .map(|m| m.len() == 128 << 20)
            .unwrap_or(false)),
        "nbdfuse did not expose {} of 128 MiB",
        file.display()
    );

    let loopdev = run(cmd("losetup", &["-f", "--show"]).arg(&file))
        .trim()
        .to_string();
    assert!(loopdev.starts_with("/dev/loop"), "losetup said {loopdev:?}");
    let l2 = loopdev.clone();
    let mut loop_guard = Guard(Some(move || sh_quiet(&["losetup", "-d", &l2])));

    run_t(
        &mut cmd("mkfs.ext4", &["-q", "-F", &loopdev]),
        Duration::from_secs(180),
    );
    run(&mut cmd("mount", &[&loopdev, &mnt_s]));
    let m2 = mnt_s.clone();
    let mut mounted_guard = Guard(Some(move || sh_quiet(&["umount", "-l", &m2])));

    // Some files: one of 16 MiB random data, many small ones.
    random_file(&mnt.join("big.bin"), 16 << 20, 7);
    std::fs::create_dir_all(mnt.join("small")).unwrap();
    for i in 0..200 {
        std::fs::write(
            mnt.join("small").join(format!("f{i}")),
            format!("file {i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    let big_sum = sha256(&mnt.join("big.bin"));
    run(&mut cmd("sync", &[] as &[&str]));
    run(&mut cmd("umount", &[&mnt_s]));
    mounted_guard.0 = None;

    let out = exec(
        &mut cmd("fsck.ext4", &["-fn", &loopdev]),
        Duration::from_secs(180),
    );
    assert!(
        out.success(),
        "fsck not clean\n{}",
        out.describe("fsck.ext4 -fn")
    );

    // Mount again and read everything back.
    run(&mut cmd("mount", &[&loopdev, &mnt_s]));
    let m3 = mnt_s.clone();
    let mut mounted_again = Guard(Some(move || sh_quiet(&["umount", "-l", &m3])));
    assert_eq!(sha256(&mnt.join("big.bin")), big_sum);
    for i in 0..200 {
        let s = std::fs::read_to_string(mnt.join("small").join(format!("f{i}"))).unwrap();
        assert_eq!(s, format!("file {i}\n").repeat(i + 1));
    }
    run(&mut cmd("umount", &[&mnt_s]));
    mounted_again.0 = None;
    run(&mut cmd("losetup", &["-d", &loopdev]));
    loop_guard.0 = None;
    run(&mut cmd("fusermount3", &["-u", &fuse_s]));
    // The guard reaps nbdfuse.
    drop(_fuse_guard);
    node.assert_scan_clean("default");
}
