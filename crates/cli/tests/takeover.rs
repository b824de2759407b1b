//! Failover in one step, with real `trireme node run` processes: the node
//! of a volume's primary is killed with SIGKILL, and an attach on another
//! node, retried until it succeeds, takes the volume over with every
//! acknowledged write. The time from the kill to the successful attach is
//! measured (the promise: at most 10 s with default settings), through the
//! CLI when the dead node is a follower and through the REST API when it
//! is the control plane's leader (which needs an election first).

mod common;

use common::replicated::*;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The promise: from the crash to an attach elsewhere.
const TAKEOVER_BUDGET: Duration = Duration::from_secs(10);

/// `trireme --api URL volume attach ...` with the human output.
fn attach_human(via: &TestNode, volume: &str, on: &str, extra: &[&str]) -> CmdOut {
    let mut command = std::process::Command::new(trireme_bin());
    command
        .args(["--api", &via.api_url(), "volume", "attach", volume])
        .args(["--node", on])
        .args(extra);
    exec(&mut command, CLI_TIMEOUT)
}

/// POST /api/v1/volumes/NAME/attach: (status, JSON body).
fn attach_rest(via: &TestNode, volume: &str, body: &str) -> (u16, Value) {
    let (status, body) = http_at(
        &via.api_address(),
        "POST",
        &format!("/api/v1/volumes/{volume}/attach"),
        &[],
        body.as_bytes(),
    );
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, json)
}

/// Retries `attempt` until it succeeds or the budget (with some margin to
/// report a useful failure) is spent; returns the time taken from `since`
/// and every refusal seen on the way.
fn retry_until_attached(
    since: Instant,
    mut attempt: impl FnMut() -> Result<String, String>,
) -> (Duration, String, Vec<String>) {
    let mut refusals = Vec::new();
    loop {
        match attempt() {
            Ok(answer) => return (since.elapsed(), answer, refusals),
            Err(refusal) => refusals.push(refusal),
        }
        assert!(
            since.elapsed() < TAKEOVER_BUDGET * 3,
            "no takeover after {:?}; refusals: {refusals:#?}",
            since.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_dead_primary_is_taken_over_by_one_attach_within_ten_seconds() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let mut nodes = three_nodes();
    let leader = nodes[0].cli_json(&["status"])["leader"]
        .as_str()
        .unwrap()
        .to_string();
    let index = |name: &str| {
        nodes
            .iter()
            .position(|n| n.spec.name.as_deref() == Some(name))
    };
    let leader_index = index(&leader).unwrap();
    // A follower holds the first volume's primary, the leader the second's.
    let follower = (0..3).find(|i| *i != leader_index).unwrap();
    let target = (0..3)
        .find(|i| *i != leader_index && *i != follower)
        .unwrap();
    let name = |i: usize| nodes[i].spec.name.clone().unwrap();
    let (follower_name, target_name) = (name(follower), name(target));

    for volume in ["fa", "fb"] {
        nodes[0].cli(&["volume", "create", volume, "--size", "64M"]);
        wait_in_sync(&nodes[0], volume, Duration::from_secs(30));
    }
    attach(&nodes[0], "fa", &follower_name, &[]);
    attach(&nodes[0], "fb", &leader, &[]);
    wait_served(&nodes[follower], "fa");
    wait_served(&nodes[leader_index], "fb");
    qemu_io_all(&nodes[follower].uri("fa"), &["write -P 0x5a 0 8M", "flush"]);
    qemu_io_all(
        &nodes[leader_index].uri("fb"),
        &["write -P 0x6b 0 8M", "flush"],
    );

    // While the primary's node is alive, an attach elsewhere is refused,
    // and the refusal says the node is still counted online, when it was
    // last heard from, and the ways out (a migration, waiting, forcing).
    let refused = attach_human(&nodes[target], "fa", &target_name, &[]);
    assert!(
        !refused.success(),
        "{}",
        refused.describe("attach on a live primary")
    );
    for part in [
        format!("attached on node '{follower_name}', which the cluster still counts as online"),
        "the leader last heard from it".to_string(),
        "--allow-two-primaries".to_string(),
        "--force-takeover".to_string(),
    ] {
        assert!(
            refused.stderr.contains(&part),
            "missing {part:?}: {}",
            refused.stderr
        );
    }

    // 1. The follower dies; the CLI on the target retries until it wins.
    nodes[follower].kill9();
    let killed = Instant::now();
    let (took, answer, refusals) = retry_until_attached(killed, || {
        let out = attach_human(&nodes[target], "fa", &target_name, &[]);
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    });
    eprintln!(
        "takeover from a dead follower: attach succeeded {took:?} after the kill ({} refusals)",
        refusals.len()
    );
    for refusal in &refusals {
        assert!(
            refusal.contains("still counts as online") && refusal.contains("--force-takeover"),
            "a refusal during the takeover does not explain itself: {refusal}"
        );
    }
    assert!(
        answer.contains(&format!("took over from {follower_name} (offline)"))
            && answer.contains("Do not start the VM")
            && answer.contains(&format!("served at {}", nodes[target].uri("fa"))),
        "{answer}"
    );
    assert!(took <= TAKEOVER_BUDGET, "the takeover took {took:?}");
    wait_served(&nodes[target], "fa");
    qemu_io_all(
        &nodes[target].uri("fa"),
        &["read -P 0x5a 0 8M", "read -P 0 8M 8M"],
    );
    let shown = show(&nodes[target], "fa");
    assert_eq!(
        shown["primaries"],
        serde_json::json!([target_name]),
        "{shown:#}"
    );

    // The follower returns (two dead nodes of three would leave no quorum).
    nodes[follower].restart();
    let back = wait_until(Duration::from_secs(60), || {
        nodes[target].cli_json(&["status"])["nodes"]["online"] == 3
    });
    assert!(
        back,
        "{follower_name} did not come back\n{}",
        nodes[follower].log_tail()
    );

    // 2. The leader dies: an election first, then the new leader's look
    // at the silent node. Through the REST API, as the plugin does it.
    nodes[leader_index].kill9();
    let killed = Instant::now();
    let body = format!(r#"{{"node":"{target_name}"}}"#);
    let (took, answer, refusals) =
        retry_until_attached(killed, || match attach_rest(&nodes[target], "fb", &body) {
            (200, json) => Ok(json.to_string()),
            (status, json) => Err(format!("{status} {json}")),
        });
    eprintln!(
        "takeover from a dead leader: attach succeeded {took:?} after the kill ({} refusals)",
        refusals.len()
    );
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        answer["fenced"],
        serde_json::json!([{ "node": leader, "state": "offline" }]),
        "{answer:#}"
    );
    assert_eq!(answer["nbd_url"], nodes[target].uri("fb"), "{answer:#}");
    assert_eq!(answer["primaries"], serde_json::json!([target_name]));
    assert!(took <= TAKEOVER_BUDGET, "the takeover took {took:?}");
    wait_served(&nodes[target], "fb");
    qemu_io_all(
        &nodes[target].uri("fb"),
        &["read -P 0x6b 0 8M", "read -P 0 8M 8M"],
    );
}

#[test]
fn force_takeover_and_a_second_primary_say_what_they_did() {
    if !tools_or_skip(&["qemu-io"]) {
        return;
    }
    let nodes = three_nodes();
    nodes[0].cli(&["volume", "create", "mv", "--size", "16M"]);
    wait_in_sync(&nodes[0], "mv", Duration::from_secs(30));
    attach(&nodes[0], "mv", "n2", &[]);
    wait_served(&nodes[1], "mv");

    // A second primary for a migration, asked through a third node: the
    // answer names where the new primary serves it, not the old one.
    let second = attach_human(&nodes[0], "mv", "n3", &["--allow-two-primaries"]);
    assert!(second.success(), "{}", second.describe("second primary"));
    assert!(
        second
            .stdout
            .contains(&format!("served at {}", nodes[2].uri("mv")))
            && second.stdout.contains("two primaries")
            && !second.stdout.contains("took over"),
        "{}",
        second.stdout
    );
    nodes[0].cli(&["volume", "detach", "mv", "--node", "n3"]);

    // --force-takeover fences a primary the cluster still counts online.
    qemu_io_all(&nodes[1].uri("mv"), &["write -P 0x7c 0 1M", "flush"]);
    let forced = attach_human(&nodes[0], "mv", "n3", &["--force-takeover"]);
    assert!(forced.success(), "{}", forced.describe("forced takeover"));
    assert!(
        forced
            .stdout
            .contains("took over from n2 (online): n2 is fenced"),
        "{}",
        forced.stdout
    );
    wait_served(&nodes[2], "mv");
    qemu_io_all(&nodes[2].uri("mv"), &["read -P 0x7c 0 1M"]);
    let shown = show(&nodes[0], "mv");
    assert_eq!(shown["primaries"], serde_json::json!(["n3"]), "{shown:#}");
}
