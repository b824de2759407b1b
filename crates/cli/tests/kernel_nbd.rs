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
//!
//! The same guest, booted with `trireme.scenario=proxmox`, stands in for a
//! Proxmox VE host (whose kernel has the module): it runs the Proxmox
//! plugin's own test of its kernel nbd path (integrations/proxmox/t/
//! 40-kernel-nbd.t, with perl and the plugin in the initramfs) against its
//! node: a VM's disk handed to QEMU as the volume's /dev/nbdN, grown by
//! `volume_resize` while "the VM" (qemu-storage-daemon) holds it, QMP
//! `block_resize` taking the new size; and a container's root disk
//! (`map_volume`), with ext4 made, mounted, written, unmounted and found
//! clean by e2fsck.
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
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The whole guest run: boot, the scenario (the paused writer waits up to
/// the kernel's request timeout, 5 s by `--kernel-nbd-request-timeout`)
/// and power-off.
const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
/// The guest's disk, holding the node's data directory and its pool.
const DATA_DISK_BYTES: u64 = 2 << 30;

/// One guest at a time: two TCG guests would share two loaded cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The Proxmox plugin's files the guest carries (integrations/proxmox):
/// the guest is assembled again when one changes.
const PLUGIN_FILES: [&str; 7] = [
    "PVE/Storage/Custom/TriremePlugin.pm",
    "PVE/Storage/Custom/Trireme/Api.pm",
    "PVE/Storage/Custom/Trireme/Local.pm",
    "PVE/Storage/Custom/Trireme/Device.pm",
    "t/lib/TriremeTest.pm",
    "t/lib/PVE/Storage/Plugin.pm",
    "t/40-kernel-nbd.t",
];

/// Assembles the guest once per kernel package, again when its sources,
/// the plugin or the trireme binary are newer than it.
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
        "qemu-storage-daemon",
        "perl",
    ]) {
        return Err(missing);
    }
    let plugin =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integrations/proxmox");
    let plugin_files: Vec<String> = PLUGIN_FILES
        .iter()
        .map(|file| plugin.join(file).display().to_string())
        .collect();
    let mut sources = vec![
        "assemble.sh",
        "kernel_nbd.sh",
        "proxmox.sh",
        "bench.sh",
        "perl_files.pl",
    ];
    sources.extend(plugin_files.iter().map(String::as_str));
    image::assemble("qemu-guest-kernel-nbd", &sources, Some(trireme_bin()))
}

/// What a guest run printed: its "TRIREME " lines, and the whole console
/// and QEMU's stderr for a failure's message.
struct GuestRun {
    marks: Vec<String>,
    console: String,
    stderr: String,
}

impl GuestRun {
    fn describe(&self) -> String {
        format!(
            "--- guest console ---\n{}\n--- qemu stderr ---\n{}",
            last_chars(&self.console, 8000),
            self.stderr
        )
    }

    /// The `RESULT ok` line, or a failure with the console.
    fn result(&self) -> &str {
        let result = self
            .marks
            .iter()
            .find(|mark| mark.starts_with("RESULT "))
            .unwrap_or_else(|| panic!("the guest printed no result\n{}", self.describe()));
        assert!(
            result.starts_with("RESULT ok"),
            "{result}\n{}",
            self.describe()
        );
        result
    }
}

/// The guest's data disk in `dir`: an empty ext4 of [`DATA_DISK_BYTES`].
fn data_disk(dir: &std::path::Path) -> std::path::PathBuf {
    let disk = dir.join("data.img");
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
    disk
}

/// Boots the guest (`scenario`: its trireme.scenario=, none for the
/// device scenario) on a fresh ext4 data disk and waits for it to power
/// off.
fn run_guest(image: &GuestImage, scenario: Option<&str>) -> GuestRun {
    let scratch = TempDir::new("kernel-nbd");
    let disk = data_disk(scratch.path());
    let console = scratch.path().join("console");
    // no_timer_check: see tests/qemu_guest.rs (a loaded host's TCG guest
    // can otherwise panic on its timer check at boot).
    let mut append = "console=ttyS0 panic=-1 quiet no_timer_check".to_string();
    if let Some(scenario) = scenario {
        append.push_str(&format!(" trireme.scenario={scenario}"));
    }
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
        .args(["-append", &append])
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
    let console = std::fs::read_to_string(&console).unwrap_or_default();
    let run = GuestRun {
        marks: console
            .lines()
            .filter_map(|line| line.trim_end().strip_prefix("TRIREME "))
            .map(str::to_string)
            .collect(),
        stderr: std::fs::read_to_string(scratch.path().join("qemu.stderr")).unwrap_or_default(),
        console,
    };
    assert!(
        exited,
        "the guest did not power off within {GUEST_TIMEOUT:?}\n{}",
        run.describe()
    );
    eprintln!("guest ran {:?}: {:#?}", started.elapsed(), run.marks);
    run
}

#[test]
fn io_pauses_while_the_daemon_restarts_and_the_data_reads_back() {
    let _one = one_at_a_time();
    let image = match guest_image() {
        Ok(image) => image,
        Err(reason) => {
            skip(&format!("no kernel nbd guest: {reason}"));
            return;
        }
    };
    let run = run_guest(&image, None);
    let result = run.result();
    let marks: Vec<&str> = run.marks.iter().map(String::as_str).collect();
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

/// TAP lines of t/40-kernel-nbd.t that must have passed in the guest:
/// the item each shows, by its test name.
const PROXMOX_CHECKS: [&str; 9] = [
    "qemu_blockdev_options: host_device on it",
    "volume_resize of the running VM's disk (qm resize)",
    "the device shows the new size when volume_resize returns",
    "QEMU's block_resize (qemu-server's next step) takes it",
    "QEMU sees 128 MiB",
    "past the old end, on the same device",
    "mkfs.ext4 on it (as pct create)",
    "e2fsck -f -n finds it clean",
    "every file reads back with its checksum",
];

#[test]
fn the_proxmox_plugin_gives_qemu_a_kernel_nbd_device_that_grows_while_the_vm_runs() {
    let _one = one_at_a_time();
    let image = match guest_image() {
        Ok(image) => image,
        Err(reason) => {
            skip(&format!("no kernel nbd guest: {reason}"));
            return;
        }
    };
    let run = run_guest(&image, Some("proxmox"));
    let tap: Vec<&str> = run
        .marks
        .iter()
        .filter_map(|mark| mark.strip_prefix("TAP "))
        .collect();
    let failed: Vec<&&str> = tap
        .iter()
        .filter(|line| line.starts_with("not ok"))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}\n{}", run.describe());
    for check in PROXMOX_CHECKS {
        assert!(
            tap.iter()
                .any(|line| line.starts_with("ok ") && line.ends_with(&format!(" - {check}"))),
            "no passing '{check}' in the guest's TAP\n{}",
            run.describe()
        );
    }
    run.result();
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
