//! README's cluster quick start, as a person types it: from nothing to a
//! three-node highly available cluster with a three-replica volume in five
//! commands and no configuration file. The three machines are three
//! processes here, so each `node run` also gets its own addresses and data
//! directory.

mod common;

use common::*;
use serde_json::Value;

/// The join command node 1 prints: `trireme node run --join A --token T`.
fn printed_join(first: &TestNode) -> (String, String) {
    let log = std::fs::read_to_string(first.log_path()).unwrap();
    let line = log
        .lines()
        .find(|line| line.contains("add a machine with: trireme node run --join"))
        .unwrap_or_else(|| panic!("node 1 printed no join command:\n{log}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| {
        let at = words.iter().position(|word| *word == flag).unwrap();
        words[at + 1].to_string()
    };
    (after("--join"), after("--token"))
}

#[test]
fn three_nodes_and_a_three_replica_volume_in_five_commands() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    for command in [
        "trireme node run",
        "--join",
        "--token",
        "trireme volume create",
        "trireme status",
    ] {
        assert!(
            readme.contains(command),
            "README's quick start lacks `{command}`"
        );
    }

    // 1. The first machine creates the cluster and prints the join command.
    let first = TestNode::start_with(NodeSpec {
        name: Some("pve1".into()),
        ..NodeSpec::default()
    });
    let join = printed_join(&first);
    // 2 and 3. The other machines run the printed command.
    let _second = TestNode::start_with(NodeSpec {
        name: Some("pve2".into()),
        join: Some(join.clone()),
        ..NodeSpec::default()
    });
    let third = TestNode::start_with(NodeSpec {
        name: Some("pve3".into()),
        join: Some(join),
        ..NodeSpec::default()
    });

    // The third node makes three voters; give the leader its half-second.
    let settled = wait_until(std::time::Duration::from_secs(30), || {
        third.cli_json(&["status"])["voters"]
            .as_array()
            .map(Vec::len)
            == Some(3)
    });
    assert!(settled, "no three voters: {}", third.log_tail());

    // 4. A volume, no flags but its name and size: three replicas.
    let volume: Value = third.cli_json(&["volume", "create", "vm-101-disk-0", "--size", "64M"]);
    let replicas = volume["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3, "{volume:#}");
    assert!(
        replicas
            .iter()
            .all(|replica| replica["observed"] == "ready"),
        "{volume:#}"
    );

    // 5. The status screen, as people read it.
    let mut status = cmd(trireme_bin(), &["--api", &first.api_url(), "status"]);
    let screen = run(&mut status);
    assert!(screen.contains("HEALTH_OK"), "{screen}");
    for name in ["pve1", "pve2", "pve3"] {
        assert!(screen.contains(name), "status lacks {name}:\n{screen}");
    }
}
