//! The guests the tests boot in QEMU (tests/qemu_guest.rs and
//! tests/kernel_nbd.rs include this file): the Debian kernel package of
//! this release and a busybox initramfs, assembled by
//! tests/qemu_guest/assemble.sh and cached under target/tmp.

use crate::common::{cmd, exec};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The kernel and initramfs of a guest.
pub struct GuestImage {
    pub vmlinuz: PathBuf,
    pub initramfs: PathBuf,
}

/// tests/qemu_guest: the guest's sources.
pub fn guest_sources() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/qemu_guest")
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).ok()?.modified().ok()
}

/// The guest cached as target/tmp/`cache_name`/<kernel package>,
/// assembled again when any of `sources` (files of tests/qemu_guest, and
/// `trireme` if given) is newer than it. With `trireme`, assemble.sh puts
/// that binary in the initramfs too, for the kernel nbd guest.
pub fn assemble(
    cache_name: &str,
    sources: &[&str],
    trireme: Option<&str>,
) -> Result<GuestImage, String> {
    static ASSEMBLING: Mutex<()> = Mutex::new(());
    let _one = ASSEMBLING.lock().unwrap_or_else(|p| p.into_inner());
    let package = kernel_package()?;
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(cache_name)
        .join(&package);
    let image = GuestImage {
        vmlinuz: cache.join("vmlinuz"),
        initramfs: cache.join("initramfs.cpio.gz"),
    };
    let newest_source = sources
        .iter()
        .map(|file| guest_sources().join(file))
        .chain(trireme.map(PathBuf::from))
        .filter_map(|path| modified(&path))
        .max();
    let built = modified(&image.initramfs);
    if image.vmlinuz.exists() && built.is_some() && built >= newest_source {
        return Ok(image);
    }
    let _ = std::fs::remove_dir_all(&cache);
    let started = Instant::now();
    let mut command = cmd("sh", &[guest_sources().join("assemble.sh")]);
    command.arg(&package).arg(&cache);
    if let Some(trireme) = trireme {
        command.arg(trireme);
    }
    let out = exec(&mut command, Duration::from_secs(600));
    if !out.success() {
        return Err(out.describe(&format!(
            "assembling the guest {cache_name} (tests/qemu_guest/assemble.sh)"
        )));
    }
    eprintln!(
        "assembled the guest {cache_name} from {package} in {:?}",
        started.elapsed()
    );
    Ok(image)
}

/// TRIREME_GUEST_KERNEL, or the package this release's linux-image-amd64
/// depends on.
pub fn kernel_package() -> Result<String, String> {
    if let Ok(package) = std::env::var("TRIREME_GUEST_KERNEL") {
        return Ok(package);
    }
    let out = exec(
        &mut cmd("apt-cache", &["depends", "linux-image-amd64"]),
        Duration::from_secs(60),
    );
    out.stdout
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|name| name.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "no Debian kernel package (apt-cache depends linux-image-amd64: {}{})",
                out.stdout.trim(),
                out.stderr.trim()
            )
        })
}
