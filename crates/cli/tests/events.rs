//! The cluster's event log (issue 23, item 3) with three real `trireme node
//! run` processes on 127.0.0.1, one cluster for every check:
//! - attach, snapshot and detach are logged with who asked (a local client,
//!   the admin token), in `trireme events` text and `--output json`; a
//!   verify's result by the primary's node;
//! - `--follow` prints a new event as it comes;
//! - what the leader sees is logged by it: a node offline and online
//!   again, and a volume's quorum lost and regained with it; a replica
//!   outdated by writes while its node was down, and its resync started
//!   and finished when the node returns;
//! - a flood of changes keeps only the newest 1000 events, and a reader
//!   that fell behind is told how many it missed;
//! - the log survives a restart of every node;
//! - bad input (after=garbage, an unknown volume, a huge limit, an unknown
//!   parameter) gets a clear error.

mod common;

use common::nbd_client::NbdClient;
use common::replicated::*;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

/// The log's capacity (`trireme_control::EVENT_LOG_CAPACITY`).
const CAPACITY: usize = 1000;

fn events(node: &TestNode, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["events"];
    all.extend_from_slice(args);
    node.cli_json(&all)["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn find<'a>(events: &'a [Value], kind: &str, volume: Option<&str>) -> Option<&'a Value> {
    events.iter().rev().find(|event| {
        event["kind"] == kind && volume.is_none_or(|volume| event["volume"] == volume)
    })
}

/// Waits until an event of `kind` (about `subject`: its node or volume)
/// is in the log; returns it.
fn wait_event(node: &TestNode, kind: &str, subject: &str) -> Value {
    let mut found = None;
    let seen = wait_until(Duration::from_secs(30), || {
        found = events(node, &["--limit", "1000"])
            .into_iter()
            .rev()
            .find(|event| {
                event["kind"] == kind && (event["node"] == subject || event["volume"] == subject)
            });
        found.is_some()
    });
    assert!(
        seen,
        "no {kind} event of {subject}: {:#?}\n{}",
        events(node, &["--limit", "30"]),
        node.log_tail()
    );
    found.unwrap()
}

fn get(node: &TestNode, path: &str) -> (u16, Value) {
    let (status, body) = http_raw(node.api_port, "GET", path, "application/json", b"");
    let json = serde_json::from_str(&body).unwrap_or(Value::Null);
    (status, json)
}

#[test]
fn the_event_log() {
    let mut nodes = three_nodes();
    let token = std::fs::read_to_string(nodes[0].data_dir().join("admin.token"))
        .unwrap()
        .trim()
        .to_string();

    // Changes asked for by people: a local client, then the admin token.
    nodes[0].cli(&["volume", "create", "ev", "--size", "16M"]);
    wait_in_sync(&nodes[0], "ev", Duration::from_secs(30));
    attach(&nodes[0], "ev", "n1", &[]);
    nodes[1].cli(&["--token", &token, "snapshot", "create", "ev", "s1"]);
    // A verify's result, logged by the primary's node once it is done (the
    // engine starts within a second of the attach).
    let verified = wait_until(Duration::from_secs(30), || {
        exec(
            &mut nodes[0].cli_cmd(&["volume", "verify", "ev"]),
            Duration::from_secs(60),
        )
        .success()
    });
    assert!(
        verified,
        "verify did not run
{}",
        nodes[0].log_tail()
    );
    let result = wait_event(&nodes[0], "verify_finished", "ev");
    assert_eq!(result["actor"], "node n1", "{result}");
    assert!(
        result["message"]
            .as_str()
            .unwrap()
            .contains("0 blocks differed"),
        "{result}"
    );
    nodes[0].cli(&["volume", "detach", "ev"]);
    // Read from n3, which applies the log a moment after the leader.
    wait_event(&nodes[2], "detached", "ev");
    let log = events(&nodes[2], &["--volume", "ev"]);
    let attached = find(&log, "attached", Some("ev")).expect("an attached event");
    assert_eq!(attached["actor"], "local client on n1", "{attached}");
    assert_eq!(attached["node"], "n1");
    let snapshot = find(&log, "snapshot_created", Some("ev")).expect("a snapshot event");
    assert_eq!(snapshot["actor"], "admin token via n2", "{snapshot}");
    assert!(snapshot["message"].as_str().unwrap().contains("s1"));
    let detached = find(&log, "detached", Some("ev")).expect("a detached event");
    assert!(detached["seq"].as_u64() > attached["seq"].as_u64());
    assert!(find(&log, "volume_created", Some("ev")).is_some());
    assert!(
        attached["time"].as_str().unwrap().ends_with('Z'),
        "{attached}"
    );
    // The same in text, one line each.
    let mut text = nodes[0].cli_cmd(&["events", "--volume", "ev"]);
    text.args(["--output", "table"]);
    let text = run(&mut text);
    assert!(
        text.lines()
            .any(|line| line.contains("attached ev @n1  by local client on n1")),
        "{text}"
    );

    // --follow prints what comes after it started.
    let mut follow = nodes[1].cli_cmd(&["events", "--follow", "--limit", "1"]);
    let mut child = follow.stdout(Stdio::piped()).spawn().unwrap();
    let (lines, received) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    nodes[0].cli(&["cluster", "settings", "--eviction-delay", "2h"]);
    let mut followed = Vec::new();
    let seen = wait_until(Duration::from_secs(20), || {
        followed.extend(received.try_iter());
        followed.iter().any(|line: &String| {
            serde_json::from_str::<Value>(line)
                .is_ok_and(|event| event["kind"] == "settings_changed")
        })
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen, "--follow printed no settings_changed: {followed:?}");

    // What the leader sees: n3 offline takes the quorum of a volume whose
    // only replica it holds; both come back with it.
    nodes[0].cli(&[
        "volume",
        "create",
        "solo",
        "--size",
        "8M",
        "--replicas",
        "1",
        "--nodes",
        "n3",
    ]);
    wait_in_sync(&nodes[0], "solo", Duration::from_secs(30));
    // And one with a copy on n1 and on n3, written while n3 is down: n3's
    // copy falls behind and is resynced when it returns.
    nodes[0].cli(&[
        "volume",
        "create",
        "rs",
        "--size",
        "8M",
        "--replicas",
        "2",
        "--nodes",
        "n1,n3",
    ]);
    wait_in_sync(&nodes[0], "rs", Duration::from_secs(30));
    nodes[2].kill9();
    let offline = wait_event(&nodes[0], "node_offline", "n3");
    assert!(
        offline["actor"].as_str().unwrap().starts_with("node n"),
        "{offline}"
    );
    let lost = wait_event(&nodes[0], "quorum_lost", "solo");
    assert!(
        lost["message"].as_str().unwrap().contains("0 of 1"),
        "{lost}"
    );
    attach(&nodes[0], "rs", "n1", &[]);
    wait_served(&nodes[0], "rs");
    let mut client = NbdClient::connect(nodes[0].nbd_port, "rs").expect("NBD connect to rs");
    client
        .write(0, &vec![0x5a; 8 << 20], false)
        .expect("write to rs while n3 is down");
    client.flush().expect("flush of rs");
    drop(client);
    wait_event(&nodes[0], "replica_outdated", "rs");
    // Slow enough that the resync outlasts one progress report (1 s): a
    // shorter one logs only its end. The first 4 MiB go at once (the
    // engine's burst), the other 4 at 1 MiB/s.
    nodes[0].cli(&["cluster", "settings", "--resync-rate", "1M"]);
    nodes[2].restart();
    wait_event(&nodes[0], "node_online", "n3");
    wait_event(&nodes[0], "quorum_regained", "solo");
    let started = wait_event(&nodes[0], "resync_started", "rs");
    let finished = wait_event(&nodes[0], "resync_finished", "rs");
    assert!(
        finished["seq"].as_u64() > started["seq"].as_u64(),
        "{started} {finished}"
    );
    nodes[0].cli(&["volume", "detach", "rs"]);
    nodes[0].cli(&["cluster", "settings", "--resync-rate", "256M"]);

    // A flood: each label change is an event; the log keeps the newest.
    let before_flood = nodes[0].cli_json(&["events", "--limit", "1"])["last_seq"]
        .as_u64()
        .unwrap();
    let port = nodes[0].api_port;
    let writers: Vec<_> = (0..16)
        .map(|writer| {
            std::thread::spawn(move || {
                for index in 0..(CAPACITY / 16 + 8) {
                    let body = format!(r#"{{"set":{{"flood":"w{writer}-{index}"}}}}"#);
                    let (status, answer) = http_raw(
                        port,
                        "PUT",
                        "/api/v1/nodes/n2/labels",
                        "application/json",
                        body.as_bytes(),
                    );
                    assert_eq!(status, 200, "{answer}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let (status, all) = get(&nodes[1], "/api/v1/events?limit=1000");
    assert_eq!(status, 200, "{all}");
    let kept = all["events"].as_array().unwrap();
    assert_eq!(kept.len(), CAPACITY, "the log holds exactly its capacity");
    let last_seq = all["last_seq"].as_u64().unwrap();
    assert!(last_seq >= before_flood + CAPACITY as u64);
    assert_eq!(kept.last().unwrap()["seq"], last_seq);
    assert_eq!(kept.first().unwrap()["seq"], last_seq - CAPACITY as u64 + 1);
    // A reader that stopped at #1 is told what it missed (the log moves on
    // meanwhile: count from the oldest event it got).
    let (_, behind) = get(&nodes[1], "/api/v1/events?after=1&limit=1");
    let oldest = behind["events"][0]["seq"].as_u64().unwrap();
    assert!(oldest > last_seq - CAPACITY as u64, "{behind}");
    assert_eq!(behind["missed"].as_u64().unwrap(), oldest - 2, "{behind}");

    // Every node stops; the log is there when they are back.
    for node in nodes.iter_mut() {
        node.stop();
    }
    for node in nodes.iter_mut() {
        node.restart();
    }
    let settled = wait_until(Duration::from_secs(60), || {
        get(&nodes[2], "/api/v1/events?limit=1000").1["last_seq"].as_u64() >= Some(last_seq)
    });
    assert!(
        settled,
        "the log did not come back\n{}",
        nodes[2].log_tail()
    );
    let (_, after_restart) = get(
        &nodes[2],
        &format!("/api/v1/events?after={}&limit=1", last_seq - 5),
    );
    assert_eq!(
        after_restart["events"][0]["seq"],
        last_seq - 4,
        "{after_restart}"
    );

    // Bad input: clear errors, no crash.
    for (query, expected) in [
        (
            "after=garbage",
            "after=\"garbage\" is not an event sequence number",
        ),
        (
            "limit=5000",
            "limit=\"5000\" is not a number from 1 to 1000",
        ),
        ("limit=0", "is not a number from 1 to 1000"),
        ("colour=red", "unknown parameter 'colour'"),
    ] {
        let (status, answer) = get(&nodes[0], &format!("/api/v1/events?{query}"));
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(expected),
            "{query}: {answer}"
        );
    }
    let (status, answer) = get(&nodes[0], "/api/v1/events?volume=nosuch");
    assert_eq!(status, 404, "{answer}");
    let unknown = nodes[0].cli_fail(&["events", "--volume", "nosuch"]);
    assert!(
        unknown.stderr.contains("no volume named 'nosuch'"),
        "{}",
        unknown.stderr
    );
    let garbage = nodes[0].cli_fail(&["events", "--limit", "0"]);
    assert!(garbage.stderr.contains("--limit"), "{}", garbage.stderr);
    assert!(nodes[0].healthy());
}
