//! README's quick start as a user types it: a relative data directory and
//! `--demo`, then the printed NBD address answers.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn node_run_demo_with_a_relative_data_dir_serves_the_demo_volume() {
    let work = TempDir::new("quickstart");
    let mut child = std::process::Command::new(trireme_bin())
        .current_dir(work.path())
        .args(["node", "run", "--data-dir", "./trireme-data", "--demo"])
        .args(["--nbd-listen=127.0.0.1:0", "--api-listen=127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start trireme");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut printed = Vec::new();
    while !printed.iter().any(|line: &String| is_ready_line(line)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("no ready line; printed:\n{}", printed.join("\n"));
            }
        }
    }
    let ready = printed
        .iter()
        .find(|line| is_ready_line(line))
        .expect("seen");
    let (_, nbd_port) = ready_ports(ready).expect("ports in the ready line");
    let address = format!("nbd://127.0.0.1:{nbd_port}/demo");
    let told = printed.iter().any(|line| line.contains(&address));
    let info = exec(
        &mut cmd("nbdinfo", &["--size", &address]),
        Duration::from_secs(30),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        told,
        "the node should print {address}:\n{}",
        printed.join("\n")
    );
    assert!(info.success(), "{}", info.describe("nbdinfo --size"));
    assert_eq!(info.stdout.trim(), "1073741824");
    assert!(
        work.path()
            .join("trireme-data/pools/default/pool.img")
            .exists(),
        "the default pool lives in the relative data directory"
    );
}
