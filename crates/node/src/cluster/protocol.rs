//! The node-to-node protocol over HTTP (`/internal/v1`): each endpoint's
//! path and the bodies that travel on it. The client side (`peer`, `start`,
//! `leader`, `Cluster::write`) and the server side (the routes in the REST
//! API's `internal` module) both use these, so neither depends on the other.

use serde::{Deserialize, Serialize};
use trireme_control::raft::CommandResult;
use trireme_control::NodeRegistration;
use trireme_types::NodeId;

pub const PATH_APPEND: &str = "/internal/v1/raft/append";
pub const PATH_VOTE: &str = "/internal/v1/raft/vote";
pub const PATH_SNAPSHOT: &str = "/internal/v1/raft/snapshot";
pub const PATH_WRITE: &str = "/internal/v1/write";
pub const PATH_JOIN: &str = "/internal/v1/join";
pub const PATH_HEARTBEAT: &str = "/internal/v1/heartbeat";
/// The leader's view of one node's heartbeats ([`LastHeard`]).
pub const PATH_LAST_HEARD: &str = "/internal/v1/last-heard";
/// The `code` a member answers (with 410 Gone) to a removed node.
pub const CODE_NODE_REMOVED: &str = "node_removed";

#[derive(Debug, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// The result, and the log index it was committed at.
    Applied(CommandResult, u64),
    /// This node is not the leader (any more): ask again.
    NotLeader,
    /// The leader could not commit it in time (no majority reachable). It
    /// may still commit later; it is not retried, so it never runs twice.
    NotCommitted(String),
    Failed(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    pub cluster_id: String,
    pub node: NodeRegistration,
    /// Fresh for every join; remembered by the cluster to refuse replays.
    pub nonce: String,
    pub time_ms: u64,
    /// [`super::auth::join_mac`] of [`JoinRequest::canonical`] under the join secret.
    pub mac: String,
}

impl JoinRequest {
    pub fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(&(&self.cluster_id, &self.node, &self.nonce, self.time_ms))
            .expect("a join request serialises")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinResponse {
    pub cluster_id: String,
    pub node_id: NodeId,
    /// The cluster secret, sealed for this join (see [`super::auth::seal_secret`]).
    pub sealed_secret: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node: NodeId,
}

/// What the leader knows of a node's heartbeats, for messages that tell
/// an admin how soon a silent node will be marked offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LastHeard {
    /// The leader's last heartbeat from it was this long ago.
    Ago { millis: u64 },
    /// Not heard since this leader started to watch it, this long ago (a
    /// new leader, or a node that just joined).
    NotSince { millis: u64 },
    /// The answering node is not the leader.
    NotLeader,
}
