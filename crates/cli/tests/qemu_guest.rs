//! Real QEMU (TCG) running a small Linux guest whose disk is a trireme
//! volume, reached exactly as the Proxmox plugin says: its own Perl code
//! (integrations/proxmox, run through t/bin/pve-volume with the test
//! stand-in for Proxmox's base class) gives the `-blockdev` options
//! (`qemu_blockdev_options`, Proxmox VE 9) or the `-drive` path (`path`,
//! Proxmox VE 8) that QEMU is started with, and every volume is allocated,
//! activated (a migration's second primary, HA's takeover) and deactivated
//! by the plugin's `alloc_image`, `activate_volume` and `deactivate_volume`.
//!
//! The guest is assembled once by tests/qemu_guest/assemble.sh from the
//! Debian kernel package of this release (linux-image-amd64's dependency)
//! and busybox-static, and cached in target/tmp/qemu-guest/<package>. Its
//! /init (tests/qemu_guest/init.sh) mounts the disk and writes files of
//! random data, each synced before its checksum is appended to `sums` and
//! synced, printing `TRIREME SYNCED n` on the serial console after each.
//! The file system is made on the host beforehand (mkfs.ext4, copied onto
//! the volume with nbdcopy): busybox's mke2fs makes only ext2, which has
//! no journal and would not come back clean after a crash.
//!
//! After each scenario the host checks the disk on its own: nbdcopy to a
//! file, `e2fsck -fn` (clean), and every file listed in `sums` read with
//! debugfs and checked against its checksum, every file the guest reported
//! synced among them.
//!
//! Besides boot, HA restart, live migration and a restart of the primary,
//! a backup as vzdump takes one: QEMU's own backup job (QMP
//! `blockdev-backup`) copies the running guest's disk to a file, which is
//! then checked the same way.

mod common;
#[path = "qemu_guest/image.rs"]
mod image;

use common::replicated::*;
use common::*;
use image::GuestImage;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The guest's disk.
const VOLUME_BYTES: u64 = 64 << 20;
/// How long a TCG boot of the guest may take on a loaded machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// One scenario at a time: each runs three nodes and one or two TCG guests,
/// which is what two loaded cores can carry.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn plugin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../integrations/proxmox")
}

/// The Proxmox plugin, called as each Proxmox node (one per trireme node)
/// calls it: the same storage.cfg entry everywhere (every node's API,
/// the admin token), `local-api` that node's own, and a state directory
/// per node (its /run/trireme-pve).
struct Plugin {
    apis: String,
    token: String,
    state: PathBuf,
}

impl Plugin {
    fn new(nodes: &[TestNode], scratch: &Path) -> Plugin {
        let apis: Vec<String> = nodes.iter().map(TestNode::api_url).collect();
        let token = std::fs::read_to_string(nodes[0].data_dir().join("admin.token")).unwrap();
        Plugin {
            apis: apis.join(","),
            token: token.trim().to_string(),
            state: scratch.join("pve-state"),
        }
    }

    /// `pve-volume OPERATION ARGS...` on the Proxmox node of `on`.
    fn command(&self, on: &TestNode, args: &[&str]) -> Command {
        let dir = plugin_dir();
        let mut command = cmd("perl", &["-I", ".", "-I", "t/lib", "t/bin/pve-volume"]);
        command
            .current_dir(&dir)
            .args(["--api", &self.apis, "--token", &self.token])
            .args(["--local-api", &on.api_url()])
            .args(args)
            .env("TRIREME_PVE_STATE_DIR", self.state.join(name_of(on)))
            .env_remove("PVE_MIGRATED_FROM");
        command
    }

    fn call(&self, on: &TestNode, args: &[&str]) -> CmdOut {
        exec(&mut self.command(on, args), Duration::from_secs(60))
    }

    /// A call that must succeed; its output.
    fn ok(&self, on: &TestNode, args: &[&str]) -> CmdOut {
        let out = self.call(on, args);
        assert!(
            out.success(),
            "{}\n--- node log ---\n{}",
            out.describe(&format!("the plugin's {args:?} on {}", name_of(on))),
            on.log_tail()
        );
        out
    }

    /// `qemu_blockdev_options` on `on`: what Proxmox VE 9 gives `-blockdev`.
    fn blockdev(&self, on: &TestNode, volume: &str) -> Value {
        let out = self.ok(on, &["blockdev", volume]);
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("blockdev options {:?}: {e}", out.stdout))
    }

    /// `path` on `on`: what Proxmox VE 8 gives `-drive file=`.
    fn path(&self, on: &TestNode, volume: &str) -> String {
        self.ok(on, &["path", volume]).stdout.trim().to_string()
    }

    /// The NBD URI of what `qemu_blockdev_options` names, for the host's
    /// own tools (nbdcopy, qemu-io).
    fn uri(&self, on: &TestNode, volume: &str) -> String {
        let options = self.blockdev(on, volume);
        assert_eq!(options["server"]["type"], "unix", "{options:#}");
        format!(
            "nbd+unix:///{}?socket={}",
            options["export"].as_str().unwrap(),
            options["server"]["path"].as_str().unwrap()
        )
    }
}

/// A guest's disk as QEMU is given it.
enum Disk {
    /// `-blockdev` with these options under a raw format node (Proxmox VE 9).
    Blockdev(Value),
    /// `-drive file=PATH,format=raw` (Proxmox VE 8).
    Drive(String),
}

/// Assembles (once, cached under target/tmp) the guest, or says why not.
fn guest_image() -> Result<GuestImage, String> {
    if let Some(missing) = missing_tools(&[
        "qemu-system-x86_64",
        "busybox",
        "apt-get",
        "apt-cache",
        "dpkg",
        "gzip",
        "mkfs.ext4",
        "e2fsck",
        "debugfs",
        "nbdcopy",
        // The plugin, which gives QEMU its disk.
        "perl",
    ]) {
        return Err(missing);
    }
    image::assemble("qemu-guest", &["assemble.sh", "init.sh"], None)
}

/// The guest, or a skip (a failure in CI) saying what is missing.
fn guest_or_skip() -> Option<GuestImage> {
    match guest_image() {
        Ok(image) => Some(image),
        Err(reason) => {
            skip(&format!("no QEMU guest: {reason}"));
            None
        }
    }
}

/// One `qemu-system-x86_64` process: serial console to a file, QMP on a
/// unix socket. Killed when dropped.
struct Qemu {
    child: Child,
    console: PathBuf,
    qmp: PathBuf,
    name: String,
}

impl Qemu {
    fn start(
        image: &GuestImage,
        dir: &Path,
        name: &str,
        disk: Disk,
        mode: &str,
        count: u32,
        incoming: Option<u16>,
    ) -> Qemu {
        let console = dir.join(format!("{name}.console"));
        let qmp = dir.join(format!("{name}.qmp"));
        let mut command = cmd(
            "qemu-system-x86_64",
            &["-m", "256", "-display", "none", "-nodefaults", "-no-reboot"],
        );
        command
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-kernel")
            .arg(&image.vmlinuz)
            .arg("-initrd")
            .arg(&image.initramfs)
            // no_timer_check: on a loaded host the TCG guest's kernel can
            // find its timer too slow and panic ("IO-APIC + timer doesn't
            // work") before it mounts anything.
            .arg("-append")
            .arg(format!(
                "console=ttyS0 panic=-1 quiet no_timer_check trireme.mode={mode} trireme.count={count}"
            ))
            .arg("-device")
            .arg("virtio-blk-pci,drive=drive0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join(format!("{name}.stderr"))).unwrap(),
            ));
        match disk {
            // Proxmox puts a raw format node over the storage's protocol node.
            Disk::Blockdev(mut options) => {
                options["node-name"] = json!("proto0");
                command
                    .arg("-blockdev")
                    .arg(options.to_string())
                    .arg("-blockdev")
                    .arg("raw,file=proto0,node-name=drive0");
            }
            Disk::Drive(path) => {
                command
                    .arg("-drive")
                    .arg(format!("file={path},format=raw,if=none,id=drive0"));
            }
        }
        if let Some(port) = incoming {
            command
                .arg("-incoming")
                .arg(format!("tcp:127.0.0.1:{port}"));
        }
        let child = command.spawn().expect("cannot start qemu-system-x86_64");
        Qemu {
            child,
            console,
            qmp,
            name: name.to_string(),
        }
    }

    fn console_text(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Lines of the console starting with "TRIREME ".
    fn marks(&self) -> Vec<String> {
        self.console_text()
            .lines()
            .filter_map(|line| line.trim_end().strip_prefix("TRIREME "))
            .map(str::to_string)
            .collect()
    }

    /// The highest `n` of the `SYNCED n` lines so far.
    fn synced(&self) -> u32 {
        synced_in(&self.marks())
    }

    fn describe(&self) -> String {
        let stderr =
            std::fs::read_to_string(self.console.with_extension("stderr")).unwrap_or_default();
        format!(
            "--- {} console ---\n{}\n--- {} stderr ---\n{stderr}",
            self.name,
            tail(&self.console_text(), 4000),
            self.name
        )
    }

    /// Waits until the console has a mark for which `done` holds.
    fn wait_mark(&mut self, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let mut found = None;
        let ok = wait_until(timeout, || {
            found = self.marks().into_iter().find(|mark| done(mark));
            found.is_some() || self.exited()
        });
        let exited = self.exited();
        match found {
            Some(mark) => mark,
            None => panic!(
                "{}: no awaited mark within {timeout:?} (timed out: {}, exited: {exited})\n{}",
                self.name,
                !ok,
                self.describe()
            ),
        }
    }

    /// Waits for the guest to unmount its disk and power off.
    fn wait_poweroff(&mut self, timeout: Duration) {
        self.wait_mark(timeout, |mark| mark == "UNMOUNTED");
        let exited = wait_until(Duration::from_secs(30), || self.exited());
        assert!(
            exited,
            "{} did not power off\n{}",
            self.name,
            self.describe()
        );
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// One QMP command; its "return" (panics on an "error").
    fn qmp(&self, command: &str, arguments: Value) -> Value {
        let stream = UnixStream::connect(&self.qmp)
            .unwrap_or_else(|e| panic!("{}: QMP {}: {e}", self.name, self.qmp.display()));
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut answer = |request: Value| -> Value {
            writeln!(writer, "{request}").unwrap();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                assert!(!line.is_empty(), "{}: QMP closed", self.name);
                let reply: Value = serde_json::from_str(&line).unwrap();
                if let Some(error) = reply.get("error") {
                    panic!("{}: QMP {request} failed: {error}", self.name);
                }
                if let Some(value) = reply.get("return") {
                    return value.clone();
                }
                // The greeting and events.
            }
        };
        answer(json!({ "execute": "qmp_capabilities" }));
        answer(json!({ "execute": command, "arguments": arguments }))
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The last `n` bytes of `s` (on a character boundary).
fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn synced_in(marks: &[String]) -> u32 {
    marks
        .iter()
        .filter_map(|mark| mark.strip_prefix("SYNCED ")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// A replicated volume `vm-VMID-disk-0` with an empty ext4 file system
/// (made on the host: busybox's mke2fs makes only ext2), allocated by the
/// plugin and activated by it on `on`.
fn volume_with_ext4(
    plugin: &Plugin,
    nodes: &[TestNode],
    on: usize,
    vmid: u32,
    scratch: &Path,
) -> String {
    let volume = format!("vm-{vmid}-disk-0");
    let size_kib = VOLUME_BYTES / 1024;
    let allocated = plugin.ok(
        &nodes[on],
        &["alloc", &vmid.to_string(), &volume, &size_kib.to_string()],
    );
    assert_eq!(allocated.stdout.trim(), volume);
    wait_in_sync(&nodes[0], &volume, Duration::from_secs(60));
    plugin.ok(&nodes[on], &["activate", &volume]);
    let image = scratch.join("mkfs.img");
    let file = std::fs::File::create(&image).unwrap();
    file.set_len(VOLUME_BYTES).unwrap();
    drop(file);
    run(cmd("mkfs.ext4", &["-q", "-F"]).arg(&image));
    run(cmd("nbdcopy", &["--flush"])
        .arg(&image)
        .arg(plugin.uri(&nodes[on], &volume)));
    std::fs::remove_file(&image).unwrap();
    volume
}

/// The host's own look at the disk through what the plugin gives on
/// `node`: `e2fsck -fn` finds it clean, and every file in `sums` matches
/// its checksum; the files 1..=`synced` are all among them. Returns the
/// numbers of the files it holds.
fn check_disk(
    plugin: &Plugin,
    node: &TestNode,
    volume: &str,
    scratch: &Path,
    synced: u32,
) -> Vec<u32> {
    let image = scratch.join("check.img");
    run(cmd("nbdcopy", &[plugin.uri(node, volume)]).arg(&image));
    let files = check_image(&image, scratch, synced);
    std::fs::remove_file(&image).unwrap();
    files
}

/// `check_disk` of an image file: clean, and every file in `sums`
/// matches its checksum, 1..=`synced` among them.
fn check_image(image: &Path, scratch: &Path, synced: u32) -> Vec<u32> {
    let fsck = exec(cmd("e2fsck", &["-fn"]).arg(image), Duration::from_secs(120));
    assert!(
        fsck.success(),
        "{}",
        fsck.describe("e2fsck -fn of the guest's disk")
    );
    let debugfs = |request: &str| -> Vec<u8> {
        let out = cmd("debugfs", &["-R", request])
            .arg(image)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "debugfs -R {request:?} failed");
        out.stdout
    };
    let sums = String::from_utf8(debugfs("cat /sums")).unwrap();
    let mut files = Vec::new();
    for line in sums.lines() {
        let (sum, name) = line
            .split_once("  ")
            .unwrap_or_else(|| panic!("a torn line in sums: {line:?}\n{sums}"));
        let data = debugfs(&format!("cat /{name}"));
        assert_eq!(data.len(), 256 << 10, "{name} has {} bytes", data.len());
        let dumped = scratch.join("dumped");
        std::fs::write(&dumped, &data).unwrap();
        assert_eq!(sha256(&dumped), sum, "{name} does not match its checksum");
        files.push(name.trim_start_matches("f.").parse::<u32>().unwrap());
    }
    for n in 1..=synced {
        assert!(
            files.contains(&n),
            "f.{n} was synced by the guest but is not in sums: {files:?}"
        );
    }
    files
}

fn name_of(node: &TestNode) -> String {
    node.spec.name.clone().unwrap()
}

#[test]
fn a_guest_boots_and_writes_synced_files_on_a_replicated_volume() {
    let _one = one_at_a_time();
    let Some(image) = guest_or_skip() else {
        return;
    };
    let scratch = TempDir::new("qemu-a");
    let nodes = three_nodes();
    let plugin = Plugin::new(&nodes, scratch.path());
    let volume = volume_with_ext4(&plugin, &nodes, 0, 101, scratch.path());

    // As Proxmox VE 8 starts QEMU: `-drive file=` the plugin's path.
    let path = plugin.path(&nodes[0], &volume);
    let started = Instant::now();
    let mut guest = Qemu::start(
        &image,
        scratch.path(),
        "guest",
        Disk::Drive(path),
        "write",
        8,
        None,
    );
    guest.wait_mark(BOOT_TIMEOUT, |mark| mark.starts_with("BOOTED"));
    eprintln!("the guest booted in {:?}", started.elapsed());
    guest.wait_poweroff(BOOT_TIMEOUT);
    let marks = guest.marks();
    assert!(
        marks.contains(&"WROTE 8".to_string()),
        "{}",
        guest.describe()
    );
    eprintln!("wrote and synced 8 files in {:?}", started.elapsed());

    let files = check_disk(&plugin, &nodes[0], &volume, scratch.path(), 8);
    assert_eq!(files.len(), 8, "{files:?}");
    // A replica elsewhere holds the same: the VM stopped here and its disk
    // activated on another node, where the host reads it again.
    plugin.ok(&nodes[0], &["deactivate", &volume]);
    plugin.ok(&nodes[1], &["activate", &volume]);
    let files = check_disk(&plugin, &nodes[1], &volume, scratch.path(), 8);
    assert_eq!(files.len(), 8, "{files:?}");
}

/// `SYNCED n` with n at least `at_least`.
fn synced_at_least(at_least: u32) -> impl Fn(&str) -> bool {
    move |mark| {
        mark.strip_prefix("SYNCED ")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= at_least)
    }
}

/// Waits until `node` serves `volume` where the plugin says; false after
/// `timeout`.
fn readable_on_socket(plugin: &Plugin, node: &TestNode, volume: &str, timeout: Duration) -> bool {
    let uri = plugin.uri(node, volume);
    wait_until(timeout, || {
        qemu_io_ok(&exec(
            &mut qemu_io(&uri, &["read 0 4096"]),
            Duration::from_secs(20),
        ))
    })
}

#[test]
fn ha_restart_after_kill9_of_node_and_guest_boots_elsewhere_with_every_synced_file() {
    let _one = one_at_a_time();
    let Some(image) = guest_or_skip() else {
        return;
    };
    let scratch = TempDir::new("qemu-b");
    let mut nodes = three_nodes();
    let plugin = Plugin::new(&nodes, scratch.path());
    // The guest runs on a follower of the control plane, so that its
    // death is seen without an election first (takeover.rs covers that).
    let leader = nodes[0].cli_json(&["status"])["leader"]
        .as_str()
        .unwrap()
        .to_string();
    let followers: Vec<usize> = (0..3).filter(|i| name_of(&nodes[*i]) != leader).collect();
    let (dying, target) = (followers[0], followers[1]);
    let volume = volume_with_ext4(&plugin, &nodes, dying, 102, scratch.path());

    let mut guest = Qemu::start(
        &image,
        scratch.path(),
        "guest",
        Disk::Blockdev(plugin.blockdev(&nodes[dying], &volume)),
        "write",
        1000,
        None,
    );
    guest.wait_mark(BOOT_TIMEOUT, synced_at_least(5));
    let dying_name = name_of(&nodes[dying]);
    nodes[dying].kill9();
    guest.kill9();
    let killed = Instant::now();
    let synced = guest.synced();

    // Proxmox HA starts the VM on the target: the plugin's activate_volume
    // there, retried until the cluster counts the dead node offline and the
    // attach takes the volume over.
    let target_name = name_of(&nodes[target]);
    let mut refusals = Vec::new();
    let activated = loop {
        let out = plugin.call(&nodes[target], &["activate", &volume]);
        if out.success() {
            break out;
        }
        refusals.push(out.stderr);
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no takeover a minute after the kill: {refusals:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let attached = killed.elapsed();
    assert!(
        activated
            .stderr
            .contains(&format!("took '{volume}' over from node '{dying_name}'")),
        "the takeover is not reported: {}",
        activated.stderr
    );
    assert!(
        readable_on_socket(&plugin, &nodes[target], &volume, Duration::from_secs(60)),
        "{volume} is not readable on {target_name}\n{}",
        nodes[target].log_tail()
    );
    let readable = killed.elapsed();
    eprintln!(
        "HA restart: activate_volume on {target_name} succeeded {attached:?} after the kill \
         ({} refusals), the disk readable through its socket after {readable:?}",
        refusals.len()
    );

    // The guest boots on the target: it mounts (replaying the journal),
    // checks every file in sums, writes two more and unmounts cleanly.
    let booted = Instant::now();
    let mut again = Qemu::start(
        &image,
        scratch.path(),
        "again",
        Disk::Blockdev(plugin.blockdev(&nodes[target], &volume)),
        "both",
        2,
        None,
    );
    again.wait_poweroff(BOOT_TIMEOUT);
    eprintln!(
        "the guest booted, verified and powered off in {:?}",
        booted.elapsed()
    );
    let marks = again.marks();
    let verified = marks
        .iter()
        .find_map(|mark| mark.strip_prefix("VERIFIED "))
        .unwrap_or_else(|| panic!("no VERIFIED\n{}", again.describe()))
        .to_string();
    assert!(
        verified.ends_with(" bad=0"),
        "{verified}\n{}",
        again.describe()
    );
    let files = check_disk(&plugin, &nodes[target], &volume, scratch.path(), synced);
    let written_after = synced_in(&marks);
    assert!(
        marks.iter().any(|mark| mark.starts_with("WROTE ")) && files.contains(&written_after),
        "{files:?}\n{}",
        again.describe()
    );
}

#[test]
fn live_migration_between_two_nodes_while_the_guest_writes_keeps_every_file() {
    let _one = one_at_a_time();
    let Some(image) = guest_or_skip() else {
        return;
    };
    const FILES: u32 = 60;
    let scratch = TempDir::new("qemu-c");
    let nodes = three_nodes();
    let plugin = Plugin::new(&nodes, scratch.path());
    let volume = volume_with_ext4(&plugin, &nodes, 0, 103, scratch.path());
    let mut source = Qemu::start(
        &image,
        scratch.path(),
        "source",
        Disk::Blockdev(plugin.blockdev(&nodes[0], &volume)),
        "write",
        FILES,
        None,
    );
    source.wait_mark(BOOT_TIMEOUT, synced_at_least(3));

    // What Proxmox does for a live migration: activate on the target
    // (qemu-server sets PVE_MIGRATED_FROM: a second primary), start QEMU
    // there waiting for the migration stream, migrate, then deactivate on
    // the source.
    let mut activate = plugin.command(&nodes[1], &["activate", &volume]);
    activate.env("PVE_MIGRATED_FROM", name_of(&nodes[0]));
    let out = exec(&mut activate, Duration::from_secs(60));
    assert!(
        out.success(),
        "{}",
        out.describe("activate_volume on the migration's target")
    );
    let shown = show(&nodes[0], &volume);
    assert_eq!(
        shown["primaries"].as_array().map(Vec::len),
        Some(2),
        "a migration's activation makes a second primary: {shown:#}"
    );
    let port = free_port();
    let mut target = Qemu::start(
        &image,
        scratch.path(),
        "target",
        Disk::Blockdev(plugin.blockdev(&nodes[1], &volume)),
        "write",
        FILES,
        Some(port),
    );
    assert!(
        wait_until(Duration::from_secs(30), || target.qmp.exists()),
        "{}",
        target.describe()
    );
    // QMP answers once the main loop runs, after the incoming listener is
    // up (a probing connection would take the migration's place).
    let waiting = target.qmp("query-status", json!({}));
    assert_eq!(waiting["status"], "inmigrate", "{waiting:#}");
    let synced_before = source.synced();
    let started = Instant::now();
    source.qmp("migrate", json!({ "uri": format!("tcp:127.0.0.1:{port}") }));
    let mut status = Value::Null;
    let done = wait_until(Duration::from_secs(120), || {
        status = source.qmp("query-migrate", json!({}));
        matches!(status["status"].as_str(), Some("completed" | "failed"))
    });
    assert!(
        done && status["status"] == "completed",
        "migration: {status:#}\n{}\n{}",
        source.describe(),
        target.describe()
    );
    let synced_at_switch = source.synced();
    eprintln!(
        "live migration: {:?} in all, downtime {} ms, {} MiB sent; the guest synced \
         files {synced_before}..{synced_at_switch} during it",
        started.elapsed(),
        status["downtime"],
        status["ram"]["transferred"].as_u64().unwrap_or(0) >> 20
    );
    assert!(status["downtime"].is_u64(), "{status:#}");
    source.kill9();
    plugin.ok(&nodes[0], &["deactivate", &volume]);
    let shown = show(&nodes[1], &volume);
    assert_eq!(
        shown["primaries"],
        json!([name_of(&nodes[1])]),
        "after the source's deactivation the target alone serves it: {shown:#}"
    );

    // The guest goes on writing on the target until all its files are
    // written, and unmounts cleanly there.
    target.wait_poweroff(BOOT_TIMEOUT);
    assert!(
        target.marks().contains(&format!("WROTE {FILES}")) && target.synced() > synced_at_switch,
        "{}",
        target.describe()
    );
    let files = check_disk(&plugin, &nodes[1], &volume, scratch.path(), FILES);
    assert_eq!(files.len() as u32, FILES, "{files:?}");
}

#[test]
fn restarting_the_primary_under_a_writing_guest_gives_it_no_io_error() {
    let _one = one_at_a_time();
    let Some(image) = guest_or_skip() else {
        return;
    };
    const FILES: u32 = 40;
    let scratch = TempDir::new("qemu-d");
    let mut nodes = three_nodes();
    let plugin = Plugin::new(&nodes, scratch.path());
    let volume = volume_with_ext4(&plugin, &nodes, 1, 104, scratch.path());
    let options = plugin.blockdev(&nodes[1], &volume);
    // What lets QEMU ride over the restart.
    assert!(
        options["reconnect-delay"].as_u64().is_some_and(|s| s > 0),
        "the plugin gives QEMU no reconnect-delay: {options:#}"
    );
    let mut guest = Qemu::start(
        &image,
        scratch.path(),
        "guest",
        Disk::Blockdev(options),
        "write",
        FILES,
        None,
    );
    guest.wait_mark(BOOT_TIMEOUT, synced_at_least(3));

    // An upgrade: the primary's node stops (SIGTERM) and starts again on
    // the same data directory and socket, within QEMU's reconnect-delay.
    let stopping = Instant::now();
    nodes[1].stop();
    let synced_at_stop = guest.synced();
    nodes[1].restart();
    eprintln!(
        "primary restart: node back (ready) {:?} after the stop began",
        stopping.elapsed()
    );
    guest.wait_poweroff(BOOT_TIMEOUT);
    let console = guest.console_text();
    assert!(
        !console.contains("IO-ERROR") && !console.contains("I/O error"),
        "the guest saw an I/O error\n{}",
        guest.describe()
    );
    assert!(
        guest.marks().contains(&format!("WROTE {FILES}")) && guest.synced() > synced_at_stop,
        "{}",
        guest.describe()
    );
    let files = check_disk(&plugin, &nodes[1], &volume, scratch.path(), FILES);
    assert_eq!(files.len() as u32, FILES, "{files:?}");
}

/// QEMU's backup job as vzdump starts it, of `guest`'s disk to the raw
/// file `target`: QMP `blockdev-add` of the target, `blockdev-backup`
/// (sync full), waiting for the job to conclude without an error.
fn back_up(guest: &Qemu, target: &Path) {
    std::fs::File::create(target)
        .unwrap()
        .set_len(VOLUME_BYTES)
        .unwrap();
    guest.qmp(
        "blockdev-add",
        json!({ "driver": "raw", "node-name": "backup0",
                "file": { "driver": "file", "filename": target.display().to_string() } }),
    );
    guest.qmp(
        "blockdev-backup",
        json!({ "job-id": "vzdump", "device": "drive0", "target": "backup0",
                "sync": "full", "auto-dismiss": false }),
    );
    let mut job = Value::Null;
    let concluded = wait_until(Duration::from_secs(120), || {
        let jobs = guest.qmp("query-jobs", json!({}));
        job = jobs
            .as_array()
            .and_then(|jobs| jobs.iter().find(|job| job["id"] == "vzdump"))
            .cloned()
            .unwrap_or(Value::Null);
        job["status"] == "concluded"
    });
    assert!(
        concluded && job.get("error").is_none(),
        "the backup job: {job:#}\n{}",
        guest.describe()
    );
    guest.qmp("job-dismiss", json!({ "id": "vzdump" }));
}

/// A vzdump-style backup: QEMU's own backup job (QMP `blockdev-backup`,
/// sync full) copies a running guest's disk to a file while the guest
/// goes on writing. The copy is the disk as it was when the job started
/// (QEMU copies a block before the guest overwrites it), so it is
/// crash-consistent: once its ext4 journal is replayed (as a restore's
/// first mount would), e2fsck finds it clean and every file the guest had
/// synced before the job started is in it with its checksum.
#[test]
fn a_backup_of_a_running_guest_holds_every_file_synced_before_it_started() {
    let _one = one_at_a_time();
    let Some(image) = guest_or_skip() else {
        return;
    };
    let scratch = TempDir::new("qemu-e");
    let nodes = three_nodes();
    let plugin = Plugin::new(&nodes, scratch.path());
    let volume = volume_with_ext4(&plugin, &nodes, 0, 105, scratch.path());
    let mut guest = Qemu::start(
        &image,
        scratch.path(),
        "guest",
        Disk::Blockdev(plugin.blockdev(&nodes[0], &volume)),
        "write",
        1000,
        None,
    );
    guest.wait_mark(BOOT_TIMEOUT, synced_at_least(3));

    let backup = scratch.path().join("vzdump.raw");
    let synced_before = guest.synced();
    let started = Instant::now();
    back_up(&guest, &backup);
    eprintln!(
        "backup of the running guest's {} MiB disk in {:?} (the guest had synced {synced_before} files)",
        VOLUME_BYTES >> 20,
        started.elapsed()
    );
    // The guest ran on through the backup and after it.
    guest.wait_mark(BOOT_TIMEOUT, synced_at_least(synced_before + 2));
    guest.kill9();

    // A restore's first mount replays the journal; e2fsck's journal-only
    // pass does the same on the copy, then a full check must find it clean.
    let replay = exec(
        cmd("e2fsck", &["-y", "-E", "journal_only"]).arg(&backup),
        Duration::from_secs(60),
    );
    assert!(
        replay.status.is_some_and(|code| code <= 1),
        "{}",
        replay.describe("e2fsck -E journal_only of the backup")
    );
    let files = check_image(&backup, scratch.path(), synced_before);
    eprintln!("the backup holds files 1..={} and they check", files.len());
}
