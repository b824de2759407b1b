//! Helpers for the tests of replicated volumes: a cluster of named nodes on
//! 127.0.0.1, waiting for replicas to get in sync and for a primary to
//! serve, and qemu-io checks.

use super::*;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};

pub const MIB: u64 = 1 << 20;

pub fn named(name: &str, join: Option<(String, String)>) -> NodeSpec {
    NodeSpec {
        name: Some(name.to_string()),
        join,
        ..NodeSpec::default()
    }
}

/// Nodes `n1`..`nN` in one cluster (n1 creates it, the others join),
/// settled: all online and a leader known.
pub fn cluster_of(count: usize) -> Vec<TestNode> {
    let first = TestNode::start_with(named("n1", None));
    let token = join_token(&first);
    let mut nodes = vec![first];
    for index in 2..=count {
        let join = Some((nodes[0].api_address(), token.clone()));
        nodes.push(TestNode::start_with(named(&format!("n{index}"), join)));
    }
    let settled = wait_until(Duration::from_secs(60), || {
        let status = nodes[0].cli_json(&["status"]);
        status["nodes"]["online"] == count && status["leader"].is_string()
    });
    assert!(settled, "cluster did not settle\n{}", nodes[0].log_tail());
    nodes
}

/// Three nodes n1, n2, n3 in one cluster, settled.
pub fn three_nodes() -> Vec<TestNode> {
    cluster_of(3)
}

pub fn show(node: &TestNode, volume: &str) -> Value {
    node.cli_json(&["volume", "show", volume])
}

/// Every diskful replica of the shown volume is up to date.
pub fn all_in_sync(shown: &Value) -> bool {
    let replicas = shown["replicas"].as_array().cloned().unwrap_or_default();
    let diskful: Vec<&Value> = replicas
        .iter()
        .filter(|replica| replica["kind"] == "diskful")
        .collect();
    !diskful.is_empty() && diskful.iter().all(|replica| replica["in_sync"] == true)
}

pub fn in_sync(node: &TestNode, volume: &str) -> bool {
    all_in_sync(&show(node, volume))
}

/// Waits until every diskful replica of `volume` is up to date.
pub fn wait_in_sync(node: &TestNode, volume: &str, timeout: Duration) -> Value {
    let mut last = Value::Null;
    let synced = wait_until(timeout, || {
        last = show(node, volume);
        all_in_sync(&last)
    });
    assert!(synced, "replicas of {volume} did not get in sync: {last:#}");
    last
}

/// The shown replica on `node`, if the volume has one there.
pub fn replica_on(shown: &Value, node: &str) -> Option<Value> {
    shown["replicas"]
        .as_array()?
        .iter()
        .find(|replica| replica["node"] == node)
        .cloned()
}

pub fn attach(node: &TestNode, volume: &str, on: &str, extra: &[&str]) {
    let mut args = vec!["volume", "attach", volume, "--node", on];
    args.extend_from_slice(extra);
    node.cli(&args);
}

/// Waits until `node` serves `volume` over NBD (its engine started).
pub fn wait_served(node: &TestNode, volume: &str) {
    let uri = node.uri(volume);
    let served = wait_until(Duration::from_secs(30), || {
        qemu_io_ok(&exec(
            &mut qemu_io(&uri, &["read 0 4096"]),
            Duration::from_secs(20),
        ))
    });
    assert!(served, "{uri} is not served\n{}", node.log_tail());
}

pub fn qemu_io_all(uri: &str, commands: &[&str]) {
    let out = exec(&mut qemu_io(uri, commands), Duration::from_secs(120));
    assert!(
        qemu_io_ok(&out),
        "{}",
        out.describe(&format!("qemu-io {commands:?} on {uri}"))
    );
}

/// Bytes the primary's engine copied to bring replicas in sync, one entry
/// per finished resync, from its log lines.
pub fn resynced_bytes(primary: &TestNode) -> Vec<u64> {
    let log = std::fs::read_to_string(primary.log_path()).unwrap_or_default();
    log.lines()
        .filter_map(|line| {
            let rest = line.split("resync done: copied ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// Flips one bit of the byte at `offset` of a file, durably.
pub fn flip_byte(path: &Path, offset: u64) {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&[byte[0] ^ 0x40]).unwrap();
    file.sync_all().unwrap();
}

/// False (after saying why) when a tool is missing outside CI; a failure
/// in CI.
pub fn tools_or_skip(tools: &[&str]) -> bool {
    if let Some(missing) = missing_tools(tools) {
        skip(&missing);
        return false;
    }
    true
}
