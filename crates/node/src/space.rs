//! Free space of the file system holding a path, via statvfs(3).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Bytes available to an unprivileged user on the file system holding `path`.
pub fn available_bytes(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: statvfs only writes into `stats`, which is a properly sized,
    // zero-initialised struct, and `c_path` is a valid NUL-terminated string.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // the field widths differ between libc targets
    let bytes = (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn temp_dir_has_some_space() {
        let directory = tempfile::tempdir().unwrap();
        assert!(super::available_bytes(directory.path()).unwrap() > 0);
        assert!(super::available_bytes(&directory.path().join("missing")).is_err());
    }
}
