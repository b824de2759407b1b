//! `--api a,b`: the CLI moves on to the next node when the connection to
//! one fails in any way, with a real node behind the second address.

mod common;

use common::*;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A listener that takes each connection, reads the start of the request
/// (so the request has arrived) and resets it: SO_LINGER 0 makes close send
/// RST, and the client sees "Connection reset by peer".
struct ResettingListener {
    address: String,
    resets: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ResettingListener {
    fn start() -> ResettingListener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let resets = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (resets, stop) = (resets.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((mut stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .unwrap();
                    let mut start = [0u8; 16];
                    let _ = stream.read(&mut start);
                    let linger = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    // SAFETY: a valid socket and a linger struct of the
                    // size given.
                    let result = unsafe {
                        libc::setsockopt(
                            stream.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            &linger as *const libc::linger as *const libc::c_void,
                            std::mem::size_of::<libc::linger>() as libc::socklen_t,
                        )
                    };
                    assert_eq!(result, 0, "SO_LINGER");
                    drop(stream);
                    resets.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        ResettingListener {
            address,
            resets,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for ResettingListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_reset_connection_moves_on_to_the_next_node() {
    let node = TestNode::start();
    let reset = ResettingListener::start();
    let api = format!("{},{}", reset.address, node.api_url());

    let mut status = cmd(
        trireme_bin(),
        &["--api", &api, "--output", "json", "status"],
    );
    let out = exec(&mut status, CLI_TIMEOUT);
    assert!(
        out.success(),
        "{}",
        out.describe("trireme --api RESET,NODE status")
    );
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(json["nodes"].is_object(), "{json:#}");
    assert!(
        reset.resets.load(Ordering::Relaxed) >= 1,
        "the first address was never tried"
    );

    // A change goes through too, and only once.
    let mut create = cmd(
        trireme_bin(),
        &[
            "--api", &api, "--output", "json", "volume", "create", "v1", "--size", "16M",
        ],
    );
    let out = exec(&mut create, CLI_TIMEOUT);
    assert!(
        out.success(),
        "{}",
        out.describe("volume create through RESET,NODE")
    );
    let listed = node.cli_json(&["volume", "list"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");

    // An error answer from a live node is the answer: no other node is asked.
    let before = reset.resets.load(Ordering::Relaxed);
    let api_live_first = format!("{},{}", node.api_url(), reset.address);
    let mut missing = cmd(
        trireme_bin(),
        &["--api", &api_live_first, "volume", "show", "nope"],
    );
    let out = exec(&mut missing, CLI_TIMEOUT);
    assert!(
        !out.success() && out.stderr.contains("nope"),
        "{}",
        out.stderr
    );
    assert_eq!(reset.resets.load(Ordering::Relaxed), before);
}
