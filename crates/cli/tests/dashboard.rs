//! The web dashboard (`/ui`) in a real browser: Debian's chromium driven by
//! Playwright (`playwright-core` from npm, pinned in tests/ui/package-lock.json;
//! `npm ci` there installs it, .ci/run does). A real three-node cluster
//! serves the page; tests/ui/dashboard.mjs checks that the pages show what
//! the REST API says, changes the cluster through the page (create, grow,
//! snapshot, rollback, detach, attach, delete with the name typed, replica
//! remove and add, verify, clone, snapshot delete, schedules, node labels,
//! pool scan), sees the over-commit flag, charts that open with the node's
//! I/O history (writes made here before the browser started) and no axis
//! label printed twice, sees a node killed here with SIGKILL shown offline
//! within 10 s, gets the token prompt from a node that trusts no client,
//! and the 404 pages. The history route is then checked through the API.
//!
//! Loopback clients are trusted by default, so the browser (on loopback)
//! meets the token check at a node run with `--trust-loopback=false`: the
//! same check, on the same code path, as a browser on another machine.
//!
//! Screenshots go to target/ui-screenshots/; with
//! `TRIREME_UPDATE_SCREENSHOT=1`, `dashboard.png` (a volume's page) is also
//! copied to docs/img/dashboard.png, README's and docs/dashboard.md's.

mod common;

use common::replicated::{named, wait_in_sync};
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole browser script; it takes ~40 s on an idle machine.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

fn ui_test_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui")
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Why the browser test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if let Some(missing) = missing_tools(&["node"]) {
        return Some(format!("{missing} (apt-get install nodejs)"));
    }
    if let Some(missing) = missing_tools(&["qemu-io"]) {
        return Some(format!("{missing} (apt-get install qemu-utils)"));
    }
    if !Path::new(&chromium()).exists() {
        return Some(format!(
            "no chromium at {} (apt-get install chromium)",
            chromium()
        ));
    }
    if !ui_test_dir().join("node_modules/playwright-core").is_dir() {
        return Some(format!(
            "playwright-core is not installed: run `npm ci` in {}",
            ui_test_dir().display()
        ));
    }
    None
}

fn screenshot_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is TARGET/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .join("ui-screenshots")
}

/// n1 and n3 trust loopback; n2 trusts no client without the token.
fn cluster() -> Vec<TestNode> {
    let first = TestNode::start_with(named("n1", None));
    let token = join_token(&first);
    let join = Some((first.api_address(), token));
    let mut locked = named("n2", join.clone());
    locked.args = vec!["--trust-loopback=false".into()];
    let nodes = vec![
        first,
        TestNode::start_with(locked),
        TestNode::start_with(named("n3", join)),
    ];
    let settled = wait_until(Duration::from_secs(60), || {
        let status = nodes[0].cli_json(&["status"]);
        // Every node's pool reported: a volume gets its three replicas.
        status["nodes"]["online"] == 3 && status["leader"].is_string() && status["pools"] == 3
    });
    assert!(settled, "cluster did not settle\n{}", nodes[0].log_tail());
    nodes
}

fn admin_token(node: &TestNode) -> String {
    std::fs::read_to_string(node.data_dir().join("admin.token"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn the_dashboard_shows_the_cluster_changes_it_and_sees_a_node_die() {
    if let Some(reason) = missing_prerequisite() {
        skip(&reason);
        return;
    }
    let mut nodes = cluster();
    let n1 = &nodes[0];
    // n1 serves the page and n2 the token prompt: n3 dies. n1 created the
    // cluster and leads it in all but rare runs; were it n3, a new leader
    // would be elected and mark n3 offline 3 s later, still within 10 s.
    let victim = "n3";
    n1.cli(&[
        "volume",
        "create",
        "vm-disk",
        "--size",
        "64M",
        "--replicas",
        "3",
    ]);
    wait_in_sync(n1, "vm-disk", Duration::from_secs(60));
    n1.cli(&["volume", "attach", "vm-disk", "--node", "n1"]);
    // I/O before the browser starts: the charts must open with it.
    let io_since_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let wrote = exec(
        &mut qemu_io(&n1.uri("vm-disk"), &["write -P 0x5a 0 8M", "flush"]),
        Duration::from_secs(60),
    );
    assert!(qemu_io_ok(&wrote), "{}", wrote.describe("qemu-io write"));

    // Screenshots of an earlier run must not pass for this one's.
    let _ = std::fs::remove_dir_all(screenshot_dir());
    let mut script = Command::new("node");
    script
        .arg("dashboard.mjs")
        .current_dir(ui_test_dir())
        .env("TRIREME_UI_URL", n1.api_url())
        .env("TRIREME_LOCKED_URL", nodes[1].api_url())
        .env("TRIREME_TOKEN", admin_token(n1))
        .env("TRIREME_VOLUME", "vm-disk")
        .env("TRIREME_ATTACHED_ON", "n1")
        .env("TRIREME_VICTIM", victim)
        .env("TRIREME_IO_SINCE_MS", io_since_ms.to_string())
        .env("SCREENSHOT_DIR", screenshot_dir())
        .env("CHROMIUM", chromium())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = script.spawn().expect("start node dashboard.mjs");
    let mut to_script = child.stdin.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    // The script's deadline: a hung browser must not hang the test.
    let pid = child.id();
    let started = Instant::now();
    let watchdog = std::thread::spawn(move || {
        while started.elapsed() < SCRIPT_TIMEOUT {
            std::thread::sleep(Duration::from_millis(200));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return false;
            }
        }
        // SAFETY: kill(2) on the pid of our own child, not yet reaped
        // (the main thread reaps it only after its stdout closes).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        true
    });

    let mut output = String::new();
    let mut killed_victim = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        eprintln!("[dashboard.mjs] {line}");
        output.push_str(&line);
        output.push('\n');
        if line == format!("kill {victim}") {
            let index = nodes
                .iter()
                .position(|node| node.spec.name.as_deref() == Some(victim));
            nodes[index.unwrap()].kill9();
            killed_victim = true;
            writeln!(to_script, "killed").unwrap();
            to_script.flush().unwrap();
        }
    }
    let status = child.wait().unwrap();
    let timed_out = watchdog.join().unwrap();
    let errors = errors.join().unwrap();
    assert!(
        status.success() && !timed_out,
        "the browser script failed ({status:?}{})\n--- stdout ---\n{output}\n--- stderr ---\n{errors}",
        if timed_out { ", timed out" } else { "" },
    );
    assert!(
        killed_victim,
        "the script never asked for the kill\n{output}"
    );
    assert!(
        output.contains("result: dashboard checks passed"),
        "{output}"
    );

    // What the page did, seen through the CLI (the REST API).
    let n1 = &nodes[0];
    let made: Value = n1.cli_json(&["volume", "show", "ui-made"]);
    assert_eq!(made["size_bytes"], 64 << 20, "{made:#}");
    let snapshots = n1.cli_json(&["snapshot", "list", "ui-made"]);
    assert_eq!(snapshots[0]["name"], "ui-snap", "{snapshots:#}");
    let attached = n1.cli_json(&["volume", "show", "vm-disk"]);
    assert_eq!(
        attached["primaries"],
        serde_json::json!(["n1"]),
        "{attached:#}"
    );
    let listed = n1.cli_json(&["node", "list"]);
    let state_of_victim = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["name"] == victim)
        .map(|node| node["state"].clone());
    assert_eq!(state_of_victim, Some(Value::from("offline")), "{listed:#}");
    assert_changes_through_the_page(n1);
    assert_history_route(n1);
    for name in [
        "overview",
        "nodes",
        "pools",
        "volumes",
        "volume",
        "node-offline",
        "volume-node-down",
        "token-prompt",
        "overcommitted",
        "node",
        "pool",
        "dashboard",
    ] {
        let path = screenshot_dir().join(format!("{name}.png"));
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(
            size > 10_000,
            "screenshot {} missing or empty",
            path.display()
        );
    }
    if std::env::var_os("TRIREME_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img/dashboard.png");
        std::fs::copy(screenshot_dir().join("dashboard.png"), &docs).unwrap();
    }
}

/// What the page's newer actions did, seen through the CLI (the REST API).
fn assert_changes_through_the_page(n1: &TestNode) {
    let gone = n1.cli_fail(&["volume", "show", "ui-big"]);
    assert!(
        gone.stderr.contains("ui-big"),
        "{}",
        gone.describe("show a deleted volume")
    );
    let clone = n1.cli_json(&["volume", "show", "ui-clone"]);
    assert_eq!(clone["size_bytes"], 64 << 20, "{clone:#}");
    let schedule = n1.cli_json(&["snapshot", "schedule", "ui-made"]);
    assert!(schedule["every_secs"].is_null(), "{schedule:#}");
    let node = n1.cli_json(&["node", "show", "n1"]);
    assert_eq!(node["labels"]["zone"], "rack1", "{node:#}");
}

/// GET /api/v1/io/history: 10 s slots, at most an hour of them, the
/// writes made before the browser started among them.
fn assert_history_route(n1: &TestNode) {
    for query in ["?volume=vm-disk", "", "?node=n1"] {
        let (status, body) = http_at(
            &n1.api_address(),
            "GET",
            &format!("/api/v1/io/history{query}"),
            &[],
            b"",
        );
        assert_eq!(status, 200, "{query}: {body}");
        let history: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(history["resolution_seconds"], 10, "{history:#}");
        assert_eq!(history["span_seconds"], 3600, "{history:#}");
        let samples = history["samples"].as_array().unwrap();
        assert!(
            !samples.is_empty() && samples.len() <= 360,
            "{query}: {history:#}"
        );
        let times: Vec<u64> = samples
            .iter()
            .map(|sample| sample["unix_seconds"].as_u64().unwrap())
            .collect();
        assert!(
            times.iter().all(|time| time.is_multiple_of(10)),
            "{times:?}"
        );
        assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "{times:?}");
        let written = samples
            .iter()
            .any(|sample| sample["write_bytes_per_sec"].as_f64().unwrap() > 0.0);
        assert!(written, "{query}: the 8 MiB written are in it: {history:#}");
    }
}
