//! Topology: each node is a segment `topology.trireme.io/node=NAME` plus
//! `topology.trireme.io/KEY=VALUE` for each of its trireme labels (so a
//! `zone` label becomes `topology.trireme.io/zone`).

use std::collections::{BTreeMap, HashMap};

use crate::api::Node;
use crate::csi::{Topology, TopologyRequirement};

pub const PREFIX: &str = "topology.trireme.io/";
pub const NODE_KEY: &str = "topology.trireme.io/node";

pub fn segments(name: &str, labels: &BTreeMap<String, String>) -> HashMap<String, String> {
    let mut segments: HashMap<String, String> = labels
        .iter()
        .map(|(key, value)| (format!("{PREFIX}{key}"), value.clone()))
        .collect();
    segments.insert(NODE_KEY.to_string(), name.to_string());
    segments
}

pub fn of_node(node: &Node) -> Topology {
    Topology {
        segments: segments(&node.name, &node.labels),
    }
}

fn matches(node: &Node, topology: &Topology) -> bool {
    let own = segments(&node.name, &node.labels);
    topology
        .segments
        .iter()
        .all(|(key, value)| own.get(key) == Some(value))
}

/// The nodes to place `count` replicas on for `requirement`: the
/// requisite ones first (the preferred among them before the others, in
/// the order given), then other online nodes. Any node can attach any
/// volume (a diskless primary reads and writes through the replicas), so
/// a requisite segment narrower than the replica count is met by the
/// replicas placed inside it. `None` when the requirement leaves the
/// placer free (every online node qualifies and none is preferred).
pub fn placement(
    requirement: Option<&TopologyRequirement>,
    nodes: &[Node],
    count: usize,
) -> Result<Option<Vec<String>>, String> {
    let Some(requirement) = requirement else {
        return Ok(None);
    };
    let online: Vec<&Node> = nodes.iter().filter(|node| node.state == "online").collect();
    let requisite = |node: &Node| {
        requirement.requisite.is_empty() || requirement.requisite.iter().any(|t| matches(node, t))
    };
    if requirement.preferred.is_empty() && online.iter().all(|node| requisite(node)) {
        return Ok(None);
    }
    let mut chosen: Vec<String> = Vec::new();
    fn choose(chosen: &mut Vec<String>, node: &Node) {
        if !chosen.contains(&node.name) {
            chosen.push(node.name.clone());
        }
    }
    for topology in &requirement.preferred {
        for node in online
            .iter()
            .filter(|node| requisite(node) && matches(node, topology))
        {
            choose(&mut chosen, node);
        }
    }
    for node in online.iter().filter(|node| requisite(node)) {
        choose(&mut chosen, node);
    }
    if chosen.is_empty() {
        return Err(
            "no online node matches the requisite topology: see `trireme node list` for the \
             nodes' labels (topology.trireme.io/KEY)"
                .to_string(),
        );
    }
    for node in &online {
        choose(&mut chosen, node);
    }
    if chosen.len() < count {
        return Err(format!(
            "the volume needs {count} replicas but only {} node(s) are online ({}): lower the \
             StorageClass parameter `replicas` or bring nodes back",
            chosen.len(),
            chosen.join(", ")
        ));
    }
    chosen.truncate(count);
    Ok(Some(chosen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str) -> Node {
        Node {
            name: name.into(),
            api_address: String::new(),
            labels: [("zone".to_string(), zone.to_string())].into(),
            state: "online".into(),
            capacity_bytes: 0,
            free_bytes: 0,
        }
    }

    fn topology(key: &str, value: &str) -> Topology {
        Topology {
            segments: [(format!("{PREFIX}{key}"), value.to_string())].into(),
        }
    }

    #[test]
    fn preferred_nodes_come_first_and_requisite_ones_bound_the_choice() {
        let nodes = [node("a", "z1"), node("b", "z2"), node("c", "z2")];
        let requirement = TopologyRequirement {
            requisite: vec![topology("zone", "z2")],
            preferred: vec![topology("node", "c")],
        };
        assert_eq!(
            placement(Some(&requirement), &nodes, 2).unwrap(),
            Some(vec!["c".to_string(), "b".to_string()])
        );
        assert_eq!(
            placement(Some(&requirement), &nodes, 3).unwrap(),
            Some(vec!["c".to_string(), "b".to_string(), "a".to_string()])
        );
        assert!(placement(Some(&requirement), &nodes, 4).is_err());
        let nowhere = TopologyRequirement {
            requisite: vec![topology("zone", "z9")],
            preferred: vec![],
        };
        assert!(placement(Some(&nowhere), &nodes, 1).is_err());
        assert_eq!(placement(None, &nodes, 2).unwrap(), None);
        let everywhere = TopologyRequirement {
            requisite: vec![topology("zone", "z1"), topology("zone", "z2")],
            preferred: vec![],
        };
        assert_eq!(placement(Some(&everywhere), &nodes, 2).unwrap(), None);
    }
}
