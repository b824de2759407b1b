//! Checks of the test harness itself against a reference NBD server
//! (qemu-nbd), so that a failure elsewhere points at trireme, not at the
//! tests' own NBD client.

mod common;

use common::nbd_client::{decode, pattern, NbdClient};
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

struct QemuNbd {
    child: std::process::Child,
    port: u16,
    _dir: TempDir,
}

impl QemuNbd {
    fn start(size_mib: u64) -> QemuNbd {
        let dir = TempDir::new("qemu-nbd");
        let img = dir.path().join("disk.raw");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let port = free_port();
        let child = Command::new("qemu-nbd")
            .args([
                "-f",
                "raw",
                "-t",
                "-x",
                "vol",
                "-e",
                "8",
                "-b",
                "127.0.0.1",
                "-p",
            ])
            .arg(port.to_string())
            .arg(&img)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || std::net::TcpStream::connect((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "qemu-nbd did not listen"
        );
        QemuNbd {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nbd_client_against_qemu_nbd() {
    if let Some(r) = missing_tools(&["qemu-nbd"]) {
        skip(&r);
        return;
    }
    let q = QemuNbd::start(16);
    let mut c = NbdClient::connect(q.port, "vol").expect("connect");
    assert_eq!(c.size, 16 << 20);
    for b in 0..64u64 {
        c.write(b * 4096, &pattern(b, 7), b % 2 == 0).unwrap();
    }
    c.flush().unwrap();
    for b in 0..64u64 {
        let got = c.read(b * 4096, 4096).unwrap();
        assert_eq!(decode(&got), Some((b, 7)));
    }
    c.trim(0, 65536).unwrap();
    c.write_zeroes(65536, 65536, true).unwrap();
    let z = c.read(65536, 4096).unwrap();
    assert_eq!(decode(&z).map(|x| x.1), Some(0));
    // An unknown export is refused in the handshake.
    assert!(NbdClient::connect(q.port, "nope").is_err());
    c.disconnect();
}

#[test]
fn pattern_roundtrip() {
    let p = pattern(12, 34);
    assert_eq!(decode(&p), Some((12, 34)));
    let mut torn = p.clone();
    torn[2048..].copy_from_slice(&pattern(12, 35)[2048..]);
    assert_eq!(decode(&torn), None);
    assert_eq!(decode(&[0u8; 4096]).map(|x| x.1), Some(0));
}
