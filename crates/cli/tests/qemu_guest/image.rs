//! The Debian kernel package the tests' QEMU guests boot (tests/qemu_guest.rs
//! and tests/kernel_nbd.rs include this file).

use crate::common::{cmd, exec};
use std::time::Duration;

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
