//! Whether a volume's placement still satisfies its resource group. The
//! placer enforces the group when replicas are placed; a node's labels or
//! the group may change afterwards (`trireme node label`, a restart with
//! other `--label`s, `trireme group modify`), and the replicas stay where
//! they are. Moving data is the admin's decision: this check says which
//! replica breaks which rule, for `status`.

use crate::model::{ClusterState, VolumeRecord};
use trireme_types::NodeId;

/// One rule of the group that a diskful replica breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misplaced {
    /// The node whose replica should move.
    pub node: NodeId,
    /// What is wrong, in the words of the group's settings.
    pub reason: String,
}

/// The replicas of `volume` that break its group's rules (label keys that
/// must differ, pools, device class). Empty for a volume being deleted or
/// whose group is gone. Replicas on nodes no longer in the state are
/// skipped (their removal is reported elsewhere).
pub fn misplaced_replicas(state: &ClusterState, volume: &VolumeRecord) -> Vec<Misplaced> {
    let Some(group) = state.groups.get(&volume.group) else {
        return Vec::new();
    };
    if volume.deleting {
        return Vec::new();
    }
    let mut problems = Vec::new();
    let mut seen: Vec<(NodeId, &str, &str)> = Vec::new();
    for replica in volume.diskful() {
        let Some(node) = state.nodes.get(&replica.node) else {
            continue;
        };
        for key in &group.replicas_on_different {
            match node.labels.get(key) {
                None => problems.push(Misplaced {
                    node: node.id,
                    reason: format!("node {} has no label '{key}'", node.name),
                }),
                Some(value) => {
                    if let Some((other, _, _)) = seen
                        .iter()
                        .find(|(_, seen_key, seen_value)| *seen_key == key && *seen_value == value)
                    {
                        problems.push(Misplaced {
                            node: node.id,
                            reason: format!(
                                "nodes {} and {} both have {key}={value}",
                                state.node_name(*other),
                                node.name
                            ),
                        });
                    } else {
                        seen.push((node.id, key, value));
                    }
                }
            }
        }
        let Some(pool_name) = &replica.pool else {
            continue;
        };
        if !group.pools.is_empty() && !group.pools.contains(pool_name) {
            problems.push(Misplaced {
                node: node.id,
                reason: format!(
                    "its replica on {} is in pool {pool_name}, not one of the group's pools",
                    node.name
                ),
            });
        }
        let pool_class = node.pools.get(pool_name).map(|pool| pool.class);
        if let (Some(wanted), Some(class)) = (group.class, pool_class) {
            if wanted != class {
                problems.push(Misplaced {
                    node: node.id,
                    reason: format!(
                        "its replica on {} is in pool {pool_name} of class {class}, and the group wants {wanted}",
                        node.name
                    ),
                });
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, NodeRegistration, PoolReport};
    use crate::model::{PoolRecord, ResourceGroup};
    use std::collections::BTreeMap;
    use trireme_types::{DeviceClass, GroupName, NodeName, PoolName, VolumeName};

    fn zone(name: &str, zone: &str) -> NodeRegistration {
        NodeRegistration {
            name: NodeName::new(name).unwrap(),
            api_address: format!("{name}:7450"),
            nbd_address: None,
            data_address: None,
            labels: BTreeMap::from([("zone".to_string(), zone.to_string())]),
        }
    }

    /// Three nodes in zones a, b, c, a group spreading over zones, and a
    /// volume on all three.
    fn spread() -> ClusterState {
        let mut state = ClusterState::default();
        let mut apply = |command| state.apply(command).unwrap();
        apply(Command::Bootstrap {
            cluster_id: "c".into(),
            join_secret: "s".into(),
            node: zone("n1", "a"),
            now_ms: 0,
        });
        for (index, (name, zone_name)) in [("n2", "b"), ("n3", "c")].into_iter().enumerate() {
            apply(Command::AddNode {
                node: zone(name, zone_name),
                nonce: format!("nonce{index}"),
                now_ms: 0,
            });
        }
        for id in 1..=3 {
            apply(Command::ReportPools {
                node: NodeId(id),
                pools: vec![PoolReport {
                    name: PoolName::new("p").unwrap(),
                    record: PoolRecord {
                        class: DeviceClass::Ssd,
                        capacity_bytes: 1 << 30,
                        free_bytes: 1 << 30,
                        online: true,
                        reported_ms: 0,
                    },
                }],
            });
        }
        apply(Command::CreateGroup {
            group: ResourceGroup {
                name: GroupName::new("zoned").unwrap(),
                place_count: 3,
                min_place_count: 3,
                replicas_on_different: vec!["zone".into()],
                ..ResourceGroup::default_group()
            },
        });
        apply(Command::CreateVolume {
            name: VolumeName::new("v").unwrap(),
            size_bytes: 1 << 20,
            group: Some(GroupName::new("zoned").unwrap()),
            replicas: None,
            nodes: None,
            pool: None,
            adopt: None,
            now_ms: 0,
        });
        state
    }

    fn problems(state: &ClusterState) -> Vec<Misplaced> {
        misplaced_replicas(state, state.volumes.values().next().unwrap())
    }

    #[test]
    fn a_placement_that_satisfies_its_group_has_no_problem() {
        assert_eq!(problems(&spread()), vec![]);
    }

    #[test]
    fn a_label_change_that_puts_two_replicas_in_one_zone_is_found() {
        let mut state = spread();
        state
            .apply(Command::SetNodeLabels {
                node: NodeId(3),
                labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            })
            .unwrap();
        let [problem] = problems(&state).try_into().unwrap();
        // Either of the two may move; the reason names both.
        assert!(
            [NodeId(1), NodeId(3)].contains(&problem.node),
            "{problem:?}"
        );
        assert!(
            problem.reason.contains("n1 and n3 both have zone=a")
                || problem.reason.contains("n3 and n1 both have zone=a"),
            "{problem:?}"
        );
        // A node that lost the label is named too.
        state
            .apply(Command::SetNodeLabels {
                node: NodeId(3),
                labels: BTreeMap::new(),
            })
            .unwrap();
        let [problem] = problems(&state).try_into().unwrap();
        assert!(
            problem.reason.contains("n3 has no label 'zone'"),
            "{problem:?}"
        );
    }

    #[test]
    fn a_group_change_is_checked_like_a_creation_and_rechecks_placement() {
        let mut state = spread();
        let mut group = state.groups[&GroupName::new("zoned").unwrap()].clone();
        group.place_count = 0;
        assert!(state
            .apply(Command::ModifyGroup {
                group: group.clone()
            })
            .is_err());
        group.place_count = 3;
        group.class = Some(DeviceClass::Nvme);
        state.apply(Command::ModifyGroup { group }).unwrap();
        let found = problems(&state);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].reason.contains("class ssd"), "{found:?}");
        let unknown = ResourceGroup {
            name: GroupName::new("nope").unwrap(),
            ..ResourceGroup::default_group()
        };
        assert!(state
            .apply(Command::ModifyGroup { group: unknown })
            .is_err());
    }

    #[test]
    fn labels_are_checked_as_the_command_line_checks_them() {
        let mut state = spread();
        let refused = state.apply(Command::SetNodeLabels {
            node: NodeId(1),
            labels: BTreeMap::from([("zone".to_string(), "a b".to_string())]),
        });
        assert!(refused.is_err());
        assert_eq!(state.nodes[&NodeId(1)].labels["zone"], "a");
    }
}
