//! A real block device for an NBD export where the kernel has no nbd
//! module: nbdfuse shows the export as a file, a loop device makes it a
//! block device. Everything is undone on drop (unmount, detach, unmount
//! the FUSE file system, reap nbdfuse).

use super::*;
use std::process::{Child, Stdio};

fn quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The tools and kernel parts a [`BlockDevice`] needs, or why not.
pub fn block_device_missing() -> Option<String> {
    if let Some(missing) = missing_tools(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
    ]) {
        return Some(missing);
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse missing".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control missing (modprobe loop)".into());
    }
    None
}

pub struct BlockDevice {
    _dir: TempDir,
    fuse_dir: PathBuf,
    pub mount_dir: PathBuf,
    pub device: String,
    nbdfuse: Option<Child>,
    mounted: bool,
}

impl BlockDevice {
    /// `uri` (of `size_bytes`) as /dev/loopN.
    pub fn attach(uri: &str, size_bytes: u64) -> BlockDevice {
        let dir = TempDir::new("block");
        let fuse_dir = dir.path().join("fuse");
        let mount_dir = dir.path().join("mnt");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        std::fs::create_dir_all(&mount_dir).unwrap();
        // nbdfuse stays in the foreground until unmounted.
        let nbdfuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdfuse");
        let mut device = BlockDevice {
            _dir: dir,
            fuse_dir,
            mount_dir,
            device: String::new(),
            nbdfuse: Some(nbdfuse),
            mounted: false,
        };
        let file = device.fuse_dir.join("nbd");
        assert!(
            wait_until(Duration::from_secs(20), || std::fs::metadata(&file)
                .is_ok_and(|meta| meta.len() == size_bytes)),
            "nbdfuse did not show {uri} at {}",
            file.display()
        );
        device.device = run(cmd("losetup", &["-f", "--show"]).arg(&file))
            .trim()
            .to_string();
        assert!(
            device.device.starts_with("/dev/loop"),
            "losetup said {:?}",
            device.device
        );
        device
    }

    pub fn mkfs_ext4(&self) {
        run_t(
            &mut cmd("mkfs.ext4", &["-q", "-F", &self.device]),
            Duration::from_secs(180),
        );
    }

    pub fn mount(&mut self) {
        let mount_dir = self.mount_dir.display().to_string();
        run(&mut cmd("mount", &[&self.device, &mount_dir]));
        self.mounted = true;
    }

    pub fn unmount(&mut self) {
        let mount_dir = self.mount_dir.display().to_string();
        run(&mut cmd("umount", &[&mount_dir]));
        self.mounted = false;
    }

    /// `fsck.ext4 -fn`: whether the file system is clean, and what it said.
    pub fn fsck(&self) -> CmdOut {
        exec(
            &mut cmd("fsck.ext4", &["-fn", &self.device]),
            Duration::from_secs(180),
        )
    }
}

impl Drop for BlockDevice {
    fn drop(&mut self) {
        if self.mounted {
            quiet(&["umount", "-l", &self.mount_dir.display().to_string()]);
        }
        if !self.device.is_empty() {
            quiet(&["losetup", "-d", &self.device]);
        }
        quiet(&["fusermount3", "-u", &self.fuse_dir.display().to_string()]);
        if let Some(mut child) = self.nbdfuse.take() {
            std::thread::sleep(Duration::from_millis(200));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
