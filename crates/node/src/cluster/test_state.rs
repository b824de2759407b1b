//! Cluster states for unit tests of what the node decides from the state.

use trireme_control::{ClusterState, Command, NodeRegistration};
use trireme_types::NodeName;

/// A cluster of two nodes, `a` (id 1, the first) and `b` (id 2), with
/// nothing else.
pub fn two_nodes() -> ClusterState {
    let mut state = ClusterState::default();
    let registration = |name: &str| NodeRegistration {
        name: NodeName::new(name).unwrap(),
        api_address: "127.0.0.1:9".into(),
        nbd_address: None,
        data_address: None,
        labels: Default::default(),
    };
    state
        .apply(Command::Bootstrap {
            cluster_id: "c".into(),
            join_secret: "s".into(),
            node: registration("a"),
            now_ms: 0,
        })
        .unwrap();
    state
        .apply(Command::AddNode {
            node: registration("b"),
            nonce: "n".into(),
            now_ms: 0,
        })
        .unwrap();
    state
}
