//! Monitoring against real nodes: `GET /metrics` under fio I/O passes
//! `promtool check metrics` and counts what fio did, per volume and per
//! replica link; `GET /api/v1/io` shows the cluster's rates, busiest volume
//! first, and names a killed node as missing within bounded time; every
//! metric the Grafana dashboard queries exists.

mod common;

use common::replicated::*;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn api_get(node: &TestNode, path: &str) -> (u16, String) {
    let port: u16 = node
        .api_address()
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("API port");
    http_raw(port, "GET", path, "text/plain", b"")
}

fn scrape(node: &TestNode) -> String {
    let (status, body) = api_get(node, "/metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    body
}

/// The value of the sample `series` (name with its labels, as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn promtool_check(text: &str) {
    let mut command = cmd("promtool", &["check", "metrics"]);
    command.stdin(std::process::Stdio::piped());
    command.stdout(std::process::Stdio::piped());
    command.stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("start promtool");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- metrics ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fio_random_writes(node: &TestNode, volume: &str, seconds: u32) -> std::process::Command {
    cmd(
        "fio",
        &[
            "--name=metrics",
            "--ioengine=nbd",
            &format!("--uri={}", node.uri(volume)),
            "--rw=randrw",
            "--bs=4k",
            "--size=16M",
            "--iodepth=8",
            "--time_based=1",
            &format!("--runtime={seconds}"),
            "--output-format=terse",
        ],
    )
}

#[test]
fn metrics_and_io_rates_of_a_cluster_under_io() {
    if !tools_or_skip(&["fio", "promtool"]) {
        return;
    }
    let mut nodes = cluster_of(3);
    nodes[0].cli(&["volume", "create", "busy", "--size", "64M"]);
    nodes[0].cli(&["volume", "create", "idle", "--size", "16M"]);
    wait_in_sync(&nodes[0], "busy", Duration::from_secs(30));
    attach(&nodes[0], "busy", "n1", &[]);
    wait_served(&nodes[0], "busy");

    // Scrape while fio runs: the exposition must be valid under load.
    let mut fio = fio_random_writes(&nodes[0], "busy", 4);
    let fio = std::thread::spawn(move || exec(&mut fio, Duration::from_secs(120)));
    std::thread::sleep(Duration::from_secs(2));
    let during = scrape(&nodes[0]);
    promtool_check(&during);
    let io: Value = serde_json::from_str(&api_get(&nodes[1], "/api/v1/io").1).unwrap();
    let screen = nodes[2].cli(&["status"]);
    // The screen a person reads: the same rates as text, like `ceph -s`.
    let text = exec(
        std::process::Command::new(trireme_bin()).args(["--api", &nodes[2].api_url(), "status"]),
        Duration::from_secs(30),
    );
    let out = fio.join().unwrap();
    assert!(out.success(), "{}", out.describe("fio"));

    // Rates asked of another node include the primary's volume, first.
    assert!(io["write_iops"].as_f64().unwrap() > 0.0, "{io:#}");
    assert!(io["read_bytes_per_sec"].as_f64().unwrap() > 0.0, "{io:#}");
    assert_eq!(io["volumes"][0]["volume"], "busy", "{io:#}");
    assert_eq!(io["volumes"][0]["node"], "n1", "{io:#}");
    assert_eq!(io["missing_nodes"], serde_json::json!([]), "{io:#}");
    // `trireme status` carries the same rates.
    let status: Value = serde_json::from_str(&screen).expect("status JSON");
    assert_eq!(status["io"]["volumes"][0]["volume"], "busy", "{status:#}");
    assert!(
        status["io"]["write_iops"].as_f64().unwrap() > 0.0,
        "{status:#}"
    );

    assert!(text.success(), "{}", text.describe("trireme status"));
    let io_section = text
        .stdout
        .split("\nio:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no io: section in\n{}", text.stdout));
    let client = io_section.lines().next().unwrap_or_default();
    assert!(
        client.starts_with("  client:")
            && client.contains("op/s wr")
            && !client.contains(" 0 op/s wr"),
        "{}",
        text.stdout
    );
    assert!(
        io_section.contains("  busiest:    busy on n1: "),
        "{}",
        text.stdout
    );
    // Only volumes with I/O are listed.
    assert!(!io_section.contains("idle"), "{}", text.stdout);

    // What fio did is counted at the edge and on the replica links.
    let after = scrape(&nodes[0]);
    promtool_check(&after);
    let writes = sample(
        &after,
        r#"trireme_volume_operations_total{volume="busy",op="write"}"#,
    )
    .expect("write counter");
    let written = sample(
        &after,
        r#"trireme_volume_bytes_total{volume="busy",op="write"}"#,
    )
    .unwrap();
    assert!(writes > 100.0, "{writes}");
    assert_eq!(written, writes * 4096.0);
    let latency_count = sample(
        &after,
        r#"trireme_volume_request_duration_seconds_count{volume="busy",op="write"}"#,
    )
    .unwrap();
    assert_eq!(latency_count, writes);
    assert_eq!(
        sample(
            &after,
            r#"trireme_volume_in_flight_requests{volume="busy"}"#
        ),
        Some(0.0)
    );
    for peer in ["n2", "n3"] {
        let acks = sample(
            &after,
            &format!(
                r#"trireme_replication_ack_duration_seconds_count{{volume="busy",peer="{peer}"}}"#
            ),
        );
        // Writes travel batched, so there are fewer acknowledgements.
        assert!(acks.unwrap_or(0.0) > 0.0, "acks from {peer}: {acks:?}");
        assert_eq!(
            sample(
                &after,
                &format!(
                    r#"trireme_replication_link_state{{volume="busy",peer="{peer}",state="up-to-date"}}"#
                )
            ),
            Some(1.0)
        );
    }
    assert_eq!(
        sample(&after, r#"trireme_replication_quorum{volume="busy"}"#),
        Some(1.0)
    );
    assert!(sample(&after, r#"trireme_pool_capacity_bytes{pool="default"}"#).unwrap() > 0.0);
    // The pool's stalls: it checkpointed what fio wrote, and took time
    // doing it; admission waits are counted by reason even when none waited.
    let checkpoints = r#"trireme_pool_background_waits_total{pool="default",work="checkpoint"}"#;
    assert!(sample(&after, checkpoints).unwrap() > 0.0, "{checkpoints}");
    let checkpoint_seconds =
        r#"trireme_pool_background_wait_seconds_total{pool="default",work="checkpoint"}"#;
    assert!(sample(&after, checkpoint_seconds).unwrap() > 0.0);
    for reason in ["journal_full", "unapplied_bytes", "chunks"] {
        let waits = format!(
            r#"trireme_pool_admission_wait_seconds_total{{pool="default",reason="{reason}"}}"#
        );
        assert!(sample(&after, &waits).is_some(), "{waits} missing");
    }
    assert!(sample(&after, "trireme_process_resident_memory_bytes").unwrap() > 1e6);
    assert_eq!(
        sample(&after, r#"trireme_node_state{node="n3",state="online"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"trireme_volume_state{volume="idle",state="ready"}"#
        ),
        Some(1.0)
    );

    // A node that cannot answer is named, and the answer still comes fast.
    nodes[2].kill9();
    let started = Instant::now();
    let (status, body) = api_get(&nodes[1], "/api/v1/io");
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let io: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(io["missing_nodes"], serde_json::json!(["n3"]), "{io:#}");
    assert!(io["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["volume"] == "busy"));
    grafana_queries_use_only_real_metrics(&after);
}

/// Every `trireme_*` name in deploy/grafana/trireme.json's queries is a
/// family (or a histogram's series) of a real node's `/metrics`.
fn grafana_queries_use_only_real_metrics(exposition: &str) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/trireme.json"
    );
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the Grafana dashboard"))
            .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    collect_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 10, "only {} queries", queries.len());
    // Series with samples, and the series of every declared family (a
    // resync's gauges have samples only while one runs).
    let mut exposed: BTreeSet<String> = exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(String::from)
        .collect();
    for line in exposition.lines() {
        let Some(declared) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = declared.split_once(' ').expect("TYPE name kind");
        match kind {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .all(|suffix| exposed.insert(format!("{name}{suffix}"))),
            _ => exposed.insert(name.to_string()),
        };
    }
    let mut used = BTreeSet::new();
    for query in &queries {
        for word in query.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("trireme_") {
                used.insert(word.to_string());
            }
        }
    }
    let missing: Vec<&String> = used
        .iter()
        .filter(|name| !exposed.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no node exposes: {missing:?}"
    );
    assert!(used.len() >= 10, "{used:?}");
}

fn collect_queries(value: &Value, queries: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query", Value::String(text)) => queries.push(text.clone()),
                    _ => collect_queries(value, queries),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_queries(item, queries)),
        _ => {}
    }
}
