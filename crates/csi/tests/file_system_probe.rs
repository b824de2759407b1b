//! NodeStage formats a volume only when the device holds no file system,
//! so the probe must read the device, never blkid's cache: a loop device
//! reused for a new, empty volume within two seconds of a probe of the
//! old one read as ext4 from the cache, the volume was not formatted and
//! its mount failed ("wrong fs type, bad superblock"), as csi-sanity's
//! NodeStage test saw in CI.

use std::path::Path;
use std::process::Command;
use trireme_csi::node::system::file_system_type;

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Detaches the loop device when the test ends, however it ends.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn can_run() -> bool {
    let tools = ["losetup", "mkfs.ext4", "blkid", "truncate"];
    let have = |tool: &&str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|out| out.status.success())
    };
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && tools.iter().all(have) && Path::new("/dev/loop-control").exists();
    if !ok {
        eprintln!("SKIPPED: needs root, /dev/loop-control and {tools:?}");
    }
    ok
}

#[test]
fn a_reused_loop_device_reads_as_empty_when_its_new_volume_is_empty() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.img").display().to_string();
    let new = dir.path().join("new.img").display().to_string();
    sh("truncate", &["-s", "32M", &old, &new]);
    sh("mkfs.ext4", &["-q", "-F", &old]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let device = Loop(sh("losetup", &["-f", "--show", &old]));
    assert_eq!(
        runtime.block_on(file_system_type(&device.0)).unwrap(),
        Some("ext4".to_string())
    );
    // Whatever else on the host probes devices (udev, another stage)
    // leaves this in blkid's cache.
    sh("blkid", &[&device.0]);
    sh("losetup", &["-d", &device.0]);
    // The same device again, now showing an empty volume.
    let reused = Command::new("losetup")
        .args([&device.0, &new])
        .output()
        .unwrap();
    if !reused.status.success() {
        eprintln!(
            "SKIPPED: {} was taken by another user between detach and attach",
            device.0
        );
        std::mem::forget(device);
        return;
    }
    assert_eq!(runtime.block_on(file_system_type(&device.0)).unwrap(), None);
}

#[test]
fn a_probe_of_a_missing_device_is_an_error_not_an_empty_device() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let probed = runtime.block_on(file_system_type("/dev/trireme-no-such-device"));
    assert!(probed.is_err(), "{probed:?}");
}

/// A partitioned device holds data blkid knows but no file system type:
/// the probe must say so, never "empty" (which NodeStage would format).
#[test]
fn a_partition_table_is_an_error_never_an_empty_device() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("partitioned.img");
    sh("truncate", &["-s", "32M", &image.display().to_string()]);
    // An MBR with one Linux partition (LBA 2048, 16 MiB).
    let mut mbr = vec![0u8; 512];
    mbr[440..444].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    mbr[446 + 4] = 0x83;
    mbr[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    mbr[446 + 12..446 + 16].copy_from_slice(&32768u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        file.write_all_at(&mbr, 0).unwrap();
    }
    let device = Loop(sh(
        "losetup",
        &["-f", "--show", &image.display().to_string()],
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let probed = runtime.block_on(file_system_type(&device.0));
    let error = probed.expect_err("a partition table is not an empty device");
    assert!(error.to_string().contains("dos partition table"), "{error}");
}
