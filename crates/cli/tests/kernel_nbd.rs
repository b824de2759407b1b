//! The kernel `nbd` device path, in a real QEMU guest whose kernel has the
//! module (this machine's kernel has none): the guest is the Debian kernel
//! package of this release with a busybox initramfs that also holds this
//! build's `trireme`, nbd.ko and mkfs.ext4/e2fsck (tests/qemu_guest/
//! assemble.sh with a trireme binary). Its /init (tests/qemu_guest/
//! kernel_nbd.sh) runs a single-node trireme on the guest's disk, asks it
//! over the REST API for a volume's device (`kind: kernel-nbd`), makes an
//! ext4 file system on it, and SIGKILLs and restarts the daemon while a
//! writer writes synced files, then stops it (SIGSTOP) until the kernel,
//! past its request timeout, gives the connection up (the guest waits
//! for the kernel's log line: how long that takes depends on whether the
//! stop caught a request still being sent), and the continued daemon
//! must reconnect on the kernel's LINK_DEAD event. Then the volume grows
//! over the REST API while the ext4 is mounted and the writer writes: the
//! daemon, following the cluster state, gives the device the new size
//! (NBD_CMD_RECONFIGURE) on its live connection, /sys/block/nbdN/size
//! shows it, a read past the old end succeeds, and resize2fs grows the
//! mounted ext4 (df shows it). The same for a second volume with xfs,
//! attached first as every CSI volume is, so that its replication engine
//! takes the new size while it runs (the guest checks the engine's log
//! line) before the device grows
//! (xfs_growfs, then xfs_repair -n and the files' checksums).
//! It checks that the writer did not fail (its I/O paused until
//! the daemon reconnected the device, both times), that every file
//! written before and during reads back from the device with its checksum
//! after e2fsck, and that DELETE releases the device; the host asserts
//! its `RESULT ok` line.
//!
//! TCG, as tests/qemu_guest.rs: /dev/kvm opens on the machine the tests run
//! on (itself a VM), but a KVM guest there either aborts (`-cpu host`:
//! "failed to set MSR 0x10a") or prints nothing in two minutes.

mod common;
#[path = "qemu_guest/image.rs"]
mod image;

use common::*;
use image::GuestImage;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole guest run: boot, the scenario (the paused writer waits up to
/// the kernel's request timeout, 5 s by `--kernel-nbd-request-timeout`)
/// and power-off.
const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
/// The guest's disk, holding the node's data directory and its pool.
const DATA_DISK_BYTES: u64 = 2 << 30;

/// Assembles the guest once per kernel package, again when its sources or
/// the trireme binary are newer than it.
fn guest_image() -> Result<GuestImage, String> {
    if let Some(missing) = missing_tools(&[
        "qemu-system-x86_64",
        "busybox",
        "apt-get",
        "apt-cache",
        "dpkg",
        "gzip",
        "ldd",
        "mkfs.ext4",
        "e2fsck",
        "resize2fs",
        "mkfs.xfs",
        "xfs_growfs",
        "xfs_repair",
    ]) {
        return Err(missing);
    }
    image::assemble(
        "qemu-guest-kernel-nbd",
        &["assemble.sh", "kernel_nbd.sh"],
        Some(trireme_bin()),
    )
}

#[test]
fn io_pauses_while_the_daemon_restarts_and_the_data_reads_back() {
    let image = match guest_image() {
        Ok(image) => image,
        Err(reason) => {
            skip(&format!("no kernel nbd guest: {reason}"));
            return;
        }
    };
    let scratch = TempDir::new("kernel-nbd");
    let disk = scratch.path().join("data.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(DATA_DISK_BYTES)
        .unwrap();
    let made = exec(
        cmd("mkfs.ext4", &["-q", "-F"]).arg(&disk),
        Duration::from_secs(60),
    );
    assert!(
        made.success(),
        "{}",
        made.describe("mkfs.ext4 of the guest's disk")
    );
    let console = scratch.path().join("console");
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args([
            "-m",
            "1024",
            "-smp",
            "2",
            "-display",
            "none",
            "-nodefaults",
            "-no-reboot",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&image.vmlinuz)
        .arg("-initrd")
        .arg(&image.initramfs)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", disk.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(scratch.path().join("qemu.stderr")).unwrap(),
        ));
    let started = Instant::now();
    let mut qemu = command.spawn().expect("cannot start qemu-system-x86_64");
    let exited = wait_until(GUEST_TIMEOUT, || qemu.try_wait().ok().flatten().is_some());
    if !exited {
        let _ = qemu.kill();
        let _ = qemu.wait();
    }
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let stderr = std::fs::read_to_string(scratch.path().join("qemu.stderr")).unwrap_or_default();
    let describe = || {
        format!(
            "--- guest console ---\n{}\n--- qemu stderr ---\n{stderr}",
            last_chars(&text, 8000)
        )
    };
    assert!(
        exited,
        "the guest did not power off within {GUEST_TIMEOUT:?}\n{}",
        describe()
    );
    let marks: Vec<&str> = text
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix("TRIREME "))
        .collect();
    eprintln!("guest ran {:?}: {marks:#?}", started.elapsed());
    let result = marks
        .iter()
        .find(|mark| mark.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("the guest printed no result\n{}", describe()));
    assert!(result.starts_with("RESULT ok"), "{result}\n{}", describe());
    // The kill fell while the writer was writing: files before and after.
    let killed_at = file_number(&marks, "KILLED after file ");
    assert!((5..40).contains(&killed_at), "{marks:?}");
    assert!(
        marks
            .iter()
            .any(|mark| mark.starts_with("DEVICE /dev/nbd") && mark.ends_with("kind=kernel-nbd")),
        "{marks:?}"
    );
    // The device grew by 128 MiB in place, and the ext4 on it.
    let grew = marks
        .iter()
        .find_map(|mark| mark.strip_prefix("GREW "))
        .unwrap_or_else(|| panic!("no GREW mark: {marks:?}"));
    let sizes: Vec<u64> = grew
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    assert!(
        matches!(sizes.as_slice(), [from, to] if *to == from + (128 << 20)),
        "{grew}"
    );
    assert!(
        marks
            .iter()
            .any(|mark| mark.starts_with("RESIZED ext4 online")),
        "{marks:?}"
    );
    // And an xfs grown online with xfs_growfs, checked by xfs_repair.
    assert!(
        marks.iter().any(|mark| mark.starts_with("XFS GREW")) && marks.contains(&"XFS VERIFIED"),
        "{marks:?}"
    );
    assert!(
        marks
            .iter()
            .any(|mark| mark.starts_with("STOPPED after file"))
            && marks
                .iter()
                .any(|mark| mark.starts_with("CONTINUED at file")),
        "{marks:?}"
    );
    // Every file the writer wrote, and the one written before it started.
    let files: u32 = result
        .split_whitespace()
        .find_map(|word| word.strip_prefix("files="))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no file count in {result}"));
    let verified = format!("VERIFIED {} files", files + 1);
    assert!(marks.contains(&verified.as_str()), "{verified}: {marks:?}");
    // The daemon was down for at least 2 s (killed, then started after
    // `sleep 2`), and the file the writer wrote then waited it out: its
    // synced write paused, it did not fail or finish without the device.
    let slowest: u32 = result
        .rsplit_once("slowest=")
        .and_then(|(_, seconds)| seconds.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no slowest file in {result}"));
    assert!(slowest >= 2, "no file waited for the restart: {result}");
}

fn file_number(marks: &[&str], prefix: &str) -> u32 {
    marks
        .iter()
        .find_map(|mark| mark.strip_prefix(prefix))
        .and_then(|number| number.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{prefix}' mark: {marks:?}"))
}

/// The end of `text`, at most `count` bytes, cut at a character boundary.
fn last_chars(text: &str, count: usize) -> &str {
    let mut start = text.len().saturating_sub(count);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
