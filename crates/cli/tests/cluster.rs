//! The control plane with real `trireme node run` processes on 127.0.0.1:
//! growing from one node to three and five, losing the leader, restarting,
//! stopping everything and starting again.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// How long a new leader may take after the old one is killed. Elections
/// time out after 1-2 s; the rest is slack for a loaded 2-core machine.
const ELECTION_DEADLINE: Duration = Duration::from_secs(15);

fn spec(name: &str, join: Option<(String, String)>) -> NodeSpec {
    NodeSpec {
        name: Some(name.to_string()),
        join,
        ..NodeSpec::default()
    }
}

fn joiner(first: &TestNode, name: &str) -> TestNode {
    TestNode::start_with(spec(name, Some((first.api_address(), join_token(first)))))
}

fn status(node: &TestNode) -> Value {
    node.cli_json(&["status"])
}

/// Waits until `node` reports `voters` voters, all nodes online, and a leader.
fn wait_settled(node: &TestNode, voters: usize, nodes: usize) -> Value {
    let mut last = Value::Null;
    let settled = wait_until(Duration::from_secs(60), || {
        last = status(node);
        last["voters"].as_array().map(Vec::len) == Some(voters)
            && last["nodes"]["online"] == nodes
            && last["nodes"]["total"] == nodes
            && last["leader"].is_string()
    });
    assert!(
        settled,
        "cluster did not settle at {voters} voters / {nodes} nodes: {last:#}\n--- log ---\n{}",
        node.log_tail()
    );
    last
}

fn volume_names(node: &TestNode) -> BTreeSet<String> {
    node.cli_json(&["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|volume| volume["name"].as_str().unwrap().to_string())
        .collect()
}

fn leader_of(nodes: &[TestNode], alive: &[bool]) -> Option<String> {
    nodes
        .iter()
        .zip(alive)
        .filter(|(_, alive)| **alive)
        .find_map(|(node, _)| {
            let mut c = node.cli_cmd(&["status"]);
            let out = exec(&mut c, CLI_TIMEOUT);
            if !out.success() {
                return None;
            }
            let json: Value = serde_json::from_str(&out.stdout).ok()?;
            json["leader"].as_str().map(String::from)
        })
}

#[test]
fn grows_to_five_survives_leader_loss_and_full_restart() {
    let mut nodes = vec![TestNode::start_with(spec("n1", None))];
    let first_status = status(&nodes[0]);
    let cluster_id = first_status["cluster_id"].as_str().unwrap().to_string();
    assert_eq!(first_status["leader"], "n1", "{first_status:#}");

    // One to three: the control plane becomes three voters.
    for name in ["n2", "n3"] {
        let node = joiner(&nodes[0], name);
        nodes.push(node);
    }
    let settled = wait_settled(&nodes[2], 3, 3);
    assert_eq!(settled["cluster_id"], cluster_id.as_str());

    // A volume with no flags gets the default group's three replicas.
    let volume = nodes[1].cli_json(&["volume", "create", "vm1", "--size", "64M"]);
    assert_eq!(volume["state"], "ready", "{volume:#}");
    let holders: BTreeSet<&str> = volume["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|replica| replica["node"].as_str().unwrap())
        .collect();
    assert_eq!(holders, BTreeSet::from(["n1", "n2", "n3"]), "{volume:#}");

    // Three to five: five voters, and the new nodes have the state.
    for name in ["n4", "n5"] {
        let node = joiner(&nodes[1], name);
        nodes.push(node);
    }
    wait_settled(&nodes[4], 5, 5);
    assert_eq!(volume_names(&nodes[4]), BTreeSet::from(["vm1".to_string()]));

    // Kill the leader: a survivor elects a new one, and the CLI keeps
    // working through any survivor.
    let mut alive = vec![true; nodes.len()];
    let leader = leader_of(&nodes, &alive).expect("a leader");
    let index = nodes
        .iter()
        .position(|node| node.spec.name.as_deref() == Some(leader.as_str()))
        .unwrap();
    let killed_at = Instant::now();
    nodes[index].kill9();
    alive[index] = false;
    let mut new_leader = None;
    let elected = wait_until(ELECTION_DEADLINE, || {
        new_leader = leader_of(&nodes, &alive).filter(|name| *name != leader);
        new_leader.is_some()
    });
    assert!(
        elected,
        "no new leader within {ELECTION_DEADLINE:?} of killing {leader}"
    );
    eprintln!(
        "leader {leader} killed; {} elected after {:?}",
        new_leader.unwrap(),
        killed_at.elapsed()
    );
    let survivors: Vec<usize> = (0..nodes.len()).filter(|i| alive[*i]).collect();
    for (round, i) in survivors.iter().enumerate() {
        let name = format!("after-{round}");
        let created = nodes[*i].cli_json(&["volume", "create", &name, "--size", "16M"]);
        assert_eq!(created["name"], name.as_str());
    }
    // Through a list of addresses whose first one is dead.
    let dead_then_alive = format!(
        "{},{}",
        nodes[index].api_url(),
        nodes[survivors[0]].api_url()
    );
    let mut c = cmd(
        trireme_bin(),
        &[
            "--api",
            &dead_then_alive,
            "--output",
            "json",
            "volume",
            "list",
        ],
    );
    let listed: Value = serde_json::from_str(&run(&mut c)).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1 + survivors.len());

    // The killed node restarts and catches up.
    nodes[index].restart();
    alive[index] = true;
    let expected = volume_names(&nodes[survivors[0]]);
    let caught_up = wait_until(Duration::from_secs(60), || {
        volume_names(&nodes[index]) == expected
    });
    assert!(
        caught_up,
        "restarted {leader} did not catch up\n{}",
        nodes[index].log_tail()
    );
    wait_settled(&nodes[index], 5, 5);

    // Stop every node, start them all again: the state is intact.
    let before: Vec<BTreeSet<String>> = nodes.iter().map(volume_names).collect();
    for node in nodes.iter_mut() {
        node.stop();
    }
    for node in nodes.iter_mut() {
        node.restart();
    }
    let after_status = wait_settled(&nodes[0], 5, 5);
    assert_eq!(after_status["cluster_id"], cluster_id.as_str());
    for (node, names) in nodes.iter().zip(&before) {
        assert_eq!(&volume_names(node), names, "{}", node.log_tail());
    }
    let vm1 = nodes[3].cli_json(&["volume", "show", "vm1"]);
    assert_eq!(vm1["state"], "ready", "{vm1:#}");
}

#[test]
fn joins_need_the_right_token() {
    let first = TestNode::start_with(spec("first", None));
    let token = join_token(&first);

    // A malformed token is refused before anything is sent.
    let dir = TempDir::new("bad-join");
    let out = failed_join(&first, "second", "nonsense", &dir);
    assert!(
        out.stderr.contains("join token is malformed"),
        "{}",
        out.stderr
    );

    // A token of the right shape with the wrong secret.
    let cluster_id = token.split('-').nth(1).unwrap();
    let forged = format!("TRM1-{cluster_id}-{}", "ab".repeat(32));
    let out = failed_join(&first, "second", &forged, &dir);
    assert!(out.stderr.contains("wrong join token"), "{}", out.stderr);

    // A name already taken.
    let dir2 = TempDir::new("dup-join");
    let out = failed_join(&first, "first", &token, &dir2);
    assert!(out.stderr.contains("already a member"), "{}", out.stderr);

    // A join request replayed byte for byte is refused.
    let request = signed_join_request(&token, "replayed");
    let (status, body) = http_at(
        &first.api_address(),
        "POST",
        "/internal/v1/join",
        &[],
        request.as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_at(
        &first.api_address(),
        "POST",
        "/internal/v1/join",
        &[],
        request.as_bytes(),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("already used"), "{body}");

    // Node-to-node endpoints refuse unsigned and forged requests.
    let (status, body) = http_at(
        &first.api_address(),
        "POST",
        "/internal/v1/write",
        &[],
        b"{}",
    );
    assert_eq!(status, 401, "{body}");
    let (status, body) = http_at(
        &first.api_address(),
        "POST",
        "/internal/v1/heartbeat",
        &[
            ("x-trireme-node", "2"),
            ("x-trireme-time", &now_ms().to_string()),
            ("x-trireme-mac", &"00".repeat(32)),
        ],
        br#"{"node":2}"#,
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("not a member"), "{body}");
}

/// `trireme node run --join` on `first` that must fail; its output.
fn failed_join(first: &TestNode, name: &str, token: &str, dir: &TempDir) -> CmdOut {
    let mut c = cmd(
        trireme_bin(),
        &[
            "node",
            "run",
            "--name",
            name,
            "--api-listen",
            "127.0.0.1:0",
            "--nbd-listen",
            "127.0.0.1:0",
            "--join",
            &first.api_address(),
            "--token",
            token,
        ],
    );
    c.arg("--data-dir").arg(dir.path());
    run_fail(&mut c)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A join request signed as `trireme node run --join` signs it.
fn signed_join_request(token: &str, name: &str) -> String {
    use trireme_node::cluster::auth;
    use trireme_node::cluster::protocol::JoinRequest;
    let token = auth::JoinToken::parse(token).unwrap();
    let mut request = JoinRequest {
        cluster_id: token.cluster_id.clone(),
        node: trireme_control::NodeRegistration {
            name: trireme_types::NodeName::new(name).unwrap(),
            api_address: "127.0.0.1:9".into(),
            nbd_address: None,
            data_address: None,
            labels: Default::default(),
        },
        nonce: auth::random_hex(16),
        time_ms: now_ms(),
        mac: String::new(),
    };
    request.mac = auth::join_mac(&token.secret, &request.canonical());
    serde_json::to_string(&request).unwrap()
}

#[test]
fn remote_clients_need_the_admin_token() {
    let node = TestNode::start_with(NodeSpec {
        name: Some("locked".into()),
        args: vec!["--trust-loopback=false".into()],
        ..NodeSpec::default()
    });
    let out = run_fail(&mut node.cli_cmd(&["volume", "list"]));
    assert!(out.stderr.contains("needs a token"), "{}", out.stderr);
    let wrong = run_fail(&mut {
        let mut c = node.cli_cmd(&["volume", "list"]);
        c.args(["--token", "trmadm-0000"]);
        c
    });
    assert!(wrong.stderr.contains("token is wrong"), "{}", wrong.stderr);
    let token = std::fs::read_to_string(node.data_dir().join("admin.token")).unwrap();
    let mut c = node.cli_cmd(&["volume", "list"]);
    c.args(["--token", token.trim()]);
    let listed: Value = serde_json::from_str(&run(&mut c)).unwrap();
    assert!(listed.is_array());
    // Health stays open, for load balancers and probes.
    let (status, _) = http_at(&node.api_address(), "GET", "/api/v1/health", &[], b"");
    assert_eq!(status, 200);
}

#[test]
fn removing_a_node_moves_its_vote_and_guards_last_replicas() {
    let mut nodes = vec![TestNode::start_with(spec("r1", None))];
    for name in ["r2", "r3", "r4"] {
        let node = joiner(&nodes[0], name);
        nodes.push(node);
    }
    // Four nodes: three voters and one learner.
    let settled = wait_settled(&nodes[0], 3, 4);
    assert_eq!(
        settled["learners"].as_array().unwrap().len(),
        1,
        "{settled:#}"
    );

    // Placement refusals say what is missing.
    let refused = run_fail(&mut nodes[0].cli_cmd(&[
        "volume",
        "create",
        "big",
        "--size",
        "16M",
        "--replicas",
        "5",
    ]));
    assert!(
        refused.stderr.contains("needs 5") && refused.stderr.contains("found 4"),
        "{}",
        refused.stderr
    );
    let unknown = run_fail(&mut nodes[0].cli_cmd(&[
        "volume", "create", "x", "--size", "16M", "--nodes", "r1,nope",
    ]));
    assert!(unknown.stderr.contains("nope"), "{}", unknown.stderr);

    // A volume whose only replica is on r2: r2 cannot be removed.
    let only = nodes[0].cli_json(&[
        "volume", "create", "only-r2", "--size", "16M", "--nodes", "r2",
    ]);
    assert_eq!(only["replicas"][0]["node"], "r2", "{only:#}");
    let guarded = run_fail(&mut nodes[0].cli_cmd(&["node", "remove", "r2"]));
    assert!(
        guarded.stderr.contains("last up-to-date replica") && guarded.stderr.contains("only-r2"),
        "{}",
        guarded.stderr
    );
    nodes[0].cli(&["volume", "delete", "only-r2"]);

    // Now it can go; its vote moves to the learner.
    let voters_before: BTreeSet<String> = status(&nodes[0])["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let removed = voters_before
        .iter()
        .find(|name| *name != "r1")
        .unwrap()
        .clone();
    nodes[0].cli(&["node", "remove", &removed]);
    let index = nodes
        .iter()
        .position(|node| node.spec.name.as_deref() == Some(removed.as_str()))
        .unwrap();
    // The removed node learns it (from a member, or from its own copy of
    // the state) and stops by itself, saying why.
    let exit = nodes[index].wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|status| !status.success()),
        "the removed node did not stop by itself ({exit:?})\n--- its log ---\n{}",
        nodes[index].log_tail()
    );
    assert!(
        nodes[index].log_tail().contains("was removed from cluster"),
        "{}",
        nodes[index].log_tail()
    );
    let mut last = Value::Null;
    let moved = wait_until(Duration::from_secs(30), || {
        last = status(&nodes[0]);
        let voters: BTreeSet<String> = last["voters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let remaining: BTreeSet<String> = ["r1", "r2", "r3", "r4"]
            .iter()
            .map(|name| name.to_string())
            .filter(|name| *name != removed)
            .collect();
        voters == remaining && last["nodes"]["total"] == 3
    });
    assert!(moved, "the vote of {removed} did not move: {last:#}");
    assert_eq!(last["learners"].as_array().unwrap().len(), 0, "{last:#}");
}

/// A node removed while it was down comes back on its old data directory:
/// it must refuse to start (members answer that it was removed), record
/// that, and refuse again with no member around; nothing it held is served.
#[test]
fn a_removed_node_refuses_to_come_back() {
    let mut nodes = vec![TestNode::start_with(spec("z1", None))];
    for name in ["z2", "z3"] {
        let node = joiner(&nodes[0], name);
        nodes.push(node);
    }
    wait_settled(&nodes[0], 3, 3);
    for volume in ["gone", "kept"] {
        nodes[0].cli(&[
            "volume", "create", volume, "--size", "16M", "--nodes", "z1,z2,z3",
        ]);
    }
    nodes[0].cli(&["volume", "attach", "gone", "--node", "z3"]);

    // z3 goes down, is removed, and a volume it served is deleted.
    nodes[2].stop();
    let mut last = Value::Null;
    let offline = wait_until(Duration::from_secs(30), || {
        last = status(&nodes[0]);
        last["nodes"]["online"] == 2
    });
    assert!(offline, "z3 is not offline: {last:#}");
    nodes[0].cli(&["node", "remove", "z3"]);
    nodes[0].cli(&["volume", "delete", "gone"]);

    let refused = nodes[2].start_refused();
    let said = format!("{}{}", refused.stdout, refused.stderr);
    assert!(
        said.contains("was removed from cluster")
            && said.contains("rm -rf")
            && said.contains("--join"),
        "{said}"
    );
    assert!(
        !said.contains("trireme node ready") && !said.contains("restarting the primary"),
        "the removed node started something:\n{said}"
    );
    assert!(
        !said.contains("add a machine with"),
        "the removed node offered a join command:\n{said}"
    );
    let settled = wait_until(Duration::from_secs(30), || {
        last = status(&nodes[0]);
        last["nodes"]["total"] == 2 && last["nodes"]["online"] == 2
    });
    assert!(settled, "the members changed: {last:#}");
    assert_eq!(
        volume_names(&nodes[0]),
        BTreeSet::from(["kept".to_string()])
    );

    // Recorded in its data directory: with every member down it still
    // refuses, without asking anyone.
    nodes[0].stop();
    nodes[1].stop();
    let again = nodes[2].start_refused();
    let said = format!("{}{}", again.stdout, again.stderr);
    assert!(
        said.contains("was removed from cluster") && said.contains("answered"),
        "{said}"
    );
}

/// The lines `node` logged (stderr, without the copied stdout) since
/// `from` bytes into its current log.
fn log_lines_since(node: &TestNode, from: usize) -> Vec<String> {
    let log = std::fs::read_to_string(node.log_path()).unwrap_or_default();
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.starts_with("[stdout]"))
        .map(String::from)
        .collect()
}

/// A peer down for 15 s is one WARN when it goes and one INFO when it is
/// back on the leader, not a line per failed message; every log line is
/// JSON with `--log-format json`.
#[test]
fn a_peer_outage_is_logged_once_and_logs_are_json() {
    let json_spec = |name: &str, join| NodeSpec {
        args: vec!["--log-format".into(), "json".into()],
        ..spec(name, join)
    };
    let mut nodes = vec![TestNode::start_with(json_spec("l1", None))];
    for name in ["l2", "l3"] {
        let join = Some((nodes[0].api_address(), join_token(&nodes[0])));
        nodes.push(TestNode::start_with(json_spec(name, join)));
    }
    wait_settled(&nodes[0], 3, 3);
    nodes[0].cli(&[
        "volume", "create", "v", "--size", "16M", "--nodes", "l1,l2,l3",
    ]);
    let sizes: Vec<usize> = nodes[..2]
        .iter()
        .map(|node| std::fs::metadata(node.log_path()).unwrap().len() as usize)
        .collect();

    nodes[2].kill9();
    std::thread::sleep(Duration::from_secs(15));
    nodes[2].restart();
    wait_settled(&nodes[0], 3, 3);

    let mut offline_lines = 0;
    let mut online_lines = 0;
    for (node, from) in nodes[..2].iter().zip(&sizes) {
        let lines = log_lines_since(node, *from);
        let events: Vec<Value> = lines
            .iter()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|error| panic!("a log line is not JSON ({error}): {line}"))
            })
            .collect();
        let at = |level: &str| events.iter().filter(|e| e["level"] == level).count();
        assert!(
            lines.len() <= 20 && at("ERROR") <= 2,
            "{} logged {} lines ({} at ERROR) about one peer's 15 s outage:\n{}",
            node.spec.name.as_deref().unwrap(),
            lines.len(),
            at("ERROR"),
            lines.join("\n")
        );
        offline_lines += events
            .iter()
            .filter(|e| e["level"] == "WARN" && e["name"] == "l3")
            .filter(|e| e["message"].as_str().unwrap_or("").contains("offline"))
            .count();
        online_lines += events
            .iter()
            .filter(|e| e["level"] == "INFO" && e["name"] == "l3")
            .filter(|e| e["message"].as_str().unwrap_or("").contains("back online"))
            .count();
    }
    // Said by the leader (one of the survivors, or two if it changed).
    assert!(
        (1..=2).contains(&offline_lines),
        "offline said {offline_lines} times"
    );
    assert!(
        (1..=2).contains(&online_lines),
        "back online said {online_lines} times"
    );
}

/// The warnings of `status`'s `misplaced_volumes`, each checked against
/// its typed fields and found among the `warnings` too.
fn placement_warnings(node: &TestNode) -> Vec<String> {
    let status = status(node);
    let warnings = status["warnings"].as_array().unwrap();
    status["misplaced_volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|misplaced| {
            let warning = misplaced["warning"].as_str().unwrap();
            for field in ["volume", "group", "node", "reason"] {
                let value = misplaced[field].as_str().unwrap();
                assert!(
                    warning.contains(value),
                    "{field} '{value}' not in '{warning}'"
                );
            }
            assert!(warnings.iter().any(|w| w == warning), "{status:#}");
            warning.to_string()
        })
        .collect()
}

/// Labels change through the CLI and on a restart with other `--label`s, a
/// group changes with `group modify`, and `status` names the volumes whose
/// placement no longer satisfies their group.
#[test]
fn labels_and_groups_change_and_placement_is_rechecked() {
    let labelled = |name: &str, zone: &str, join| NodeSpec {
        args: vec!["--label".into(), format!("zone={zone}")],
        ..spec(name, join)
    };
    let first = TestNode::start_with(labelled("g1", "a", None));
    let join = Some((first.api_address(), join_token(&first)));
    let mut second = TestNode::start_with(labelled("g2", "b", join));
    let mut last = Value::Null;
    let settled = wait_until(Duration::from_secs(60), || {
        last = status(&first);
        last["nodes"]["online"] == 2 && last["leader"].is_string()
    });
    assert!(settled, "{last:#}");
    first.cli(&[
        "group",
        "create",
        "zoned",
        "--place-count",
        "2",
        "--replicas-on-different",
        "zone",
    ]);
    first.cli(&["volume", "create", "v", "--size", "16M", "--group", "zoned"]);
    assert_eq!(placement_warnings(&first), Vec::<String>::new());

    // Through the CLI: g2 moves into g1's zone.
    let api = first.api_url();
    let said = run(&mut cmd(
        trireme_bin(),
        &["--api", &api, "node", "label", "g2", "zone=a", "rack=r1"],
    ));
    assert!(
        said.contains("zone=a") && said.contains("g1 and g2 both have zone=a"),
        "{said}"
    );
    let shown = first.cli_json(&["node", "show", "g2"]);
    assert_eq!(shown["labels"]["zone"], "a", "{shown:#}");
    assert_eq!(shown["state"], "online", "{shown:#}");
    assert_eq!(shown["replicas"][0]["volume"], "v", "{shown:#}");
    assert!(shown["pool_list"]
        .as_array()
        .is_some_and(|pools| !pools.is_empty()));
    let [warning] = placement_warnings(&first).try_into().unwrap();
    assert!(
        warning.contains("volume v") && warning.contains("replica remove v --node g2"),
        "{warning}"
    );
    let misplaced = &status(&first)["misplaced_volumes"][0];
    assert_eq!(
        (
            &misplaced["volume"],
            &misplaced["group"],
            &misplaced["node"]
        ),
        (
            &serde_json::json!("v"),
            &serde_json::json!("zoned"),
            &serde_json::json!("g2")
        ),
        "{misplaced:#}"
    );
    // The CLI prints what `status` says.
    assert!(said.contains(&format!("warning: {warning}")), "{said}");
    first.cli(&["node", "label", "g2", "rack-"]);
    let shown = first.cli_json(&["node", "show", "g2"]);
    assert!(shown["labels"].get("rack").is_none(), "{shown:#}");

    // On a restart with another --label: the node proposes its labels.
    second.spec.args = vec!["--label".into(), "zone=c".into()];
    second.restart();
    let mut left = Vec::new();
    let fixed = wait_until(Duration::from_secs(30), || {
        left = placement_warnings(&first);
        left.is_empty()
    });
    assert!(fixed, "{left:?}");
    assert_eq!(
        first.cli_json(&["node", "show", "g2"])["labels"]["zone"],
        "c"
    );

    // group modify: validated as create, and placement re-checked.
    let refused = first.cli_fail(&["group", "modify", "zoned", "--place-count", "0"]);
    assert!(
        refused.stderr.contains("place-count 0"),
        "{}",
        refused.stderr
    );
    let unknown = first.cli_fail(&["group", "modify", "nope", "--place-count", "2"]);
    assert!(unknown.stderr.contains("nope"), "{}", unknown.stderr);
    first.cli(&["group", "modify", "zoned", "--class", "nvme"]);
    let groups = first.cli_json(&["group", "list"]);
    let zoned = groups
        .as_array()
        .unwrap()
        .iter()
        .find(|group| group["name"] == "zoned")
        .unwrap();
    assert_eq!(zoned["class"], "nvme", "{groups:#}");
    assert_eq!(zoned["replicas_on_different"][0], "zone", "{groups:#}");
    let warnings = placement_warnings(&first);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("the group wants nvme"), "{warnings:?}");
    first.cli(&["group", "modify", "zoned", "--any-class"]);
    assert_eq!(placement_warnings(&first), Vec::<String>::new());
}

#[test]
fn volumes_keep_serving_without_a_leader() {
    if let Some(reason) = missing_tools(&["qemu-io"]) {
        skip(&reason);
        return;
    }
    let first = TestNode::start_with(spec("s1", None));
    let mut others = [joiner(&first, "s2"), joiner(&first, "s3")];
    wait_settled(&first, 3, 3);
    first.cli_json(&[
        "volume", "create", "local", "--size", "16M", "--nodes", "s1",
    ]);
    let uri = first.uri("local");
    let out = exec(&mut qemu_io(&uri, &["write -P 0x5a 0 1M"]), CLI_TIMEOUT);
    assert!(qemu_io_ok(&out), "{}", out.describe("qemu-io write"));

    // Two of three voters gone: no leader, no control-plane writes...
    for node in others.iter_mut() {
        node.kill9();
    }
    let refused = run_fail(&mut first.cli_cmd(&["volume", "create", "nope", "--size", "16M"]));
    assert!(refused.stderr.contains("no leader"), "{}", refused.stderr);
    // ...but the volume this node serves goes on being read and written.
    let out = exec(
        &mut qemu_io(
            &uri,
            &[
                "read -P 0x5a 0 1M",
                "write -P 0x6b 1M 1M",
                "read -P 0x6b 1M 1M",
            ],
        ),
        CLI_TIMEOUT,
    );
    assert!(
        qemu_io_ok(&out),
        "{}",
        out.describe("qemu-io without a leader")
    );
    // Reads of the state are answered from the local copy.
    let local = first.cli_json(&["volume", "show", "local"]);
    assert_eq!(local["name"], "local");
    let screen = status(&first);
    assert!(screen["leader"].is_null(), "{screen:#}");
    assert!(
        screen["warnings"].to_string().contains("no leader"),
        "{screen:#}"
    );
}

#[test]
fn an_offline_node_is_evicted_only_when_switched_on() {
    let first = TestNode::start_with(spec("e1", None));
    let mut others = [
        joiner(&first, "e2"),
        joiner(&first, "e3"),
        joiner(&first, "e4"),
    ];
    let settled = wait_settled(&first, 3, 4);
    // The node that goes away is a voter (not the leader, not e1, which
    // the test asks): its seat must go to the learner when it is evicted.
    let names = |value: &Value| -> BTreeSet<String> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|name| name.as_str().unwrap().to_string())
            .collect()
    };
    let voters = names(&settled["voters"]);
    let victim = voters
        .iter()
        .find(|name| *name != "e1" && settled["leader"] != name.as_str())
        .expect("a voter that is neither e1 nor the leader")
        .clone();
    let learner = ["e2", "e3", "e4"]
        .into_iter()
        .find(|name| !voters.contains(*name))
        .expect("four nodes, three voters")
        .to_string();
    let victim_index = ["e2", "e3", "e4"]
        .iter()
        .position(|name| *name == victim)
        .unwrap();
    let volume = first.cli_json(&[
        "volume",
        "create",
        "pair",
        "--size",
        "16M",
        "--nodes",
        &format!("e1,{victim}"),
    ]);
    assert_eq!(
        volume["replicas"].as_array().unwrap().len(),
        3,
        "two replicas and a tiebreaker: {volume:#}"
    );

    // The victim goes away: offline, and with eviction off it stays that way.
    others[victim_index].kill9();
    let node_state = |name: &str| -> String {
        first
            .cli_json(&["node", "list"])
            .as_array()
            .unwrap()
            .iter()
            .find(|node| node["name"] == name)
            .map(|node| node["state"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let offline = wait_until(Duration::from_secs(30), || node_state(&victim) == "offline");
    assert!(offline, "{victim} never went offline");
    std::thread::sleep(Duration::from_secs(3));
    let holders = |volume: &Value| -> BTreeSet<String> {
        volume["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|replica| replica["kind"] == "diskful")
            .map(|replica| replica["node"].as_str().unwrap().to_string())
            .collect()
    };
    let unchanged = first.cli_json(&["volume", "show", "pair"]);
    assert_eq!(
        holders(&unchanged),
        BTreeSet::from(["e1".to_string(), victim.clone()])
    );
    assert_eq!(
        names(&status(&first)["voters"]),
        voters,
        "a seat moved with eviction off"
    );

    // Switched on with the shortest delay: the victim is evicted, its
    // replica goes to a node without one and is made there, and its vote
    // goes to the learner.
    first.cli(&[
        "cluster",
        "settings",
        "--eviction",
        "on",
        "--eviction-delay",
        "10s",
    ]);
    let mut last = Value::Null;
    let moved = wait_until(Duration::from_secs(60), || {
        last = first.cli_json(&["volume", "show", "pair"]);
        let now = holders(&last);
        // The new replica is made but empty: the volume holds one
        // up-to-date copy until it is resynced, and says so.
        let made = last["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|replica| replica["kind"] == "diskful")
            .all(|replica| replica["observed"] == "ready");
        now.len() == 2
            && now.contains("e1")
            && !now.contains(&victim)
            && made
            && ["degraded", "syncing", "ready"].contains(&last["state"].as_str().unwrap_or(""))
    });
    assert!(
        moved,
        "the replica on {victim} was not re-placed: {last:#}\n{}",
        first.log_tail()
    );
    assert_eq!(node_state(&victim), "evicted");
    let mut screen = Value::Null;
    let seat_moved = wait_until(Duration::from_secs(30), || {
        screen = status(&first);
        let now = names(&screen["voters"]);
        now.len() == 3 && now.contains(&learner) && !now.contains(&victim)
    });
    assert!(
        seat_moved,
        "{victim}'s vote did not go to {learner}: {screen:#}\n{}",
        first.log_tail()
    );
    // Back online, the victim is online again (and holds nothing of
    // `pair`), as a learner.
    others[victim_index].restart();
    let back = wait_until(Duration::from_secs(30), || node_state(&victim) == "online");
    assert!(back, "{victim} did not come back online");
    assert!(
        !names(&status(&first)["voters"]).contains(&victim),
        "{victim} took a seat back"
    );
}

/// The member of `volume` (as `volume show` answers) that is its
/// tiebreaker, if any.
fn tiebreaker_of(volume: &Value) -> Option<String> {
    volume["replicas"]
        .as_array()?
        .iter()
        .find(|replica| replica["kind"] == "tiebreaker")
        .and_then(|replica| replica["node"].as_str().map(String::from))
}

#[test]
fn a_lost_tiebreaker_comes_back_and_two_nodes_keep_one_voter() {
    let first = TestNode::start_with(spec("t1", None));
    let mut others = vec![joiner(&first, "t2"), joiner(&first, "t3")];
    wait_settled(&first, 3, 3);
    let pair = first.cli_json(&[
        "volume", "create", "pair", "--size", "16M", "--nodes", "t1,t2",
    ]);
    assert_eq!(tiebreaker_of(&pair).as_deref(), Some("t3"), "{pair:#}");

    // t3 leaves: two nodes, and one voter, the leader (docs/cluster.md):
    // with two voters the loss of either would stop the control plane.
    first.cli(&["node", "remove", "t3"]);
    // A removed node stops by itself, saying why.
    let exit = others[1].wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|status| !status.success()),
        "the removed node did not stop by itself ({exit:?})"
    );
    let mut last = Value::Null;
    let shrunk = wait_until(Duration::from_secs(60), || {
        last = status(&first);
        last["nodes"]["total"] == 2
            && last["voters"].as_array().map(Vec::len) == Some(1)
            && last["voters"][0] == last["leader"]
    });
    assert!(
        shrunk,
        "two nodes, not one voter: {last:#}\n{}",
        first.log_tail()
    );

    // `pair` lost its tiebreaker: its two replicas are both needed, and
    // `status` says so, and why.
    let shown = first.cli_json(&["volume", "show", "pair"]);
    assert_eq!(tiebreaker_of(&shown), None, "{shown:#}");
    let warnings = last["warnings"].to_string();
    assert!(
        warnings.contains("volume pair is one failure from losing its quorum")
            && warnings.contains("it has no tiebreaker"),
        "{last:#}"
    );

    // A node joins: the leader gives `pair` its tiebreaker back.
    others.push(joiner(&first, "t4"));
    let mut shown = Value::Null;
    let restored = wait_until(Duration::from_secs(60), || {
        shown = first.cli_json(&["volume", "show", "pair"]);
        tiebreaker_of(&shown).as_deref() == Some("t4")
    });
    assert!(
        restored,
        "no tiebreaker came back: {shown:#}\n{}",
        first.log_tail()
    );
    let settled = wait_settled(&first, 3, 3);
    assert!(
        !settled["warnings"].to_string().contains("quorum"),
        "{settled:#}"
    );

    // A grow past the largest volume is refused before anything changes.
    let refused = run_fail(&mut first.cli_cmd(&["volume", "grow", "pair", "--size", "2P"]));
    assert!(
        refused
            .stderr
            .contains("larger than the largest volume, 1125899906842624 bytes"),
        "{}",
        refused.stderr
    );
    let shown = first.cli_json(&["volume", "show", "pair"]);
    assert_eq!(shown["size_bytes"], 16 << 20, "{shown:#}");
    assert_eq!(shown["state"], "ready", "{shown:#}");

    // A volume with a snapshot is deleted only when the request says so.
    first.cli(&["volume", "attach", "pair", "--node", "t1"]);
    let mut out = None;
    let taken = wait_until(Duration::from_secs(30), || {
        let attempt = exec(
            &mut first.cli_cmd(&["snapshot", "create", "pair", "keep-me"]),
            CLI_TIMEOUT,
        );
        let done = attempt.success();
        out = Some(attempt);
        done
    });
    assert!(taken, "{}", out.unwrap().describe("snapshot create"));
    first.cli(&["volume", "detach", "pair"]);
    let refused = run_fail(&mut first.cli_cmd(&["volume", "delete", "pair"]));
    assert!(
        refused.stderr.contains("snapshot(s) keep-me")
            && refused.stderr.contains("--with-snapshots"),
        "{}",
        refused.stderr
    );
    assert!(volume_names(&first).contains("pair"));
    first.cli(&["volume", "delete", "pair", "--with-snapshots"]);
    let gone = wait_until(Duration::from_secs(30), || {
        !volume_names(&first).contains("pair")
    });
    assert!(gone, "pair was not deleted");
}
