//! The node's membership in its cluster: the Raft member, the signed
//! node-to-node HTTP client, forwarding of writes to the leader, and the
//! background work of membership (heartbeats, liveness, voters).
//!
//! - [`identity`] holds `DATA/cluster.json`.
//! - [`auth`] has join tokens, request signatures, the admin token.
//! - [`peer`] is the signed HTTP client, and the Raft network over it.
//! - [`start`] is creating a cluster, joining one, or rejoining after a restart.
//! - [`protocol`] has the paths and bodies of the `/internal/v1` endpoints
//!   other nodes call (the routes serving them are the REST API's).
//! - [`leader`] does what only the leader does: liveness, eviction, voters.

pub mod auth;
pub mod identity;
pub mod leader;
pub mod peer;
pub mod protocol;
pub mod replication_port;
pub mod start;
#[cfg(test)]
pub(crate) mod test_state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trireme_control::raft::{ClientWriteError, Raft, RaftError, StateReader};
use trireme_control::{Actor, Command, CommandError, Reply};
use trireme_types::{NodeId, NodeName};

use identity::Identity;
use peer::PeerClient;

/// How long a write waits for a leader (elections take a few seconds).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// A leader whose last majority acknowledgement is older than this is cut off.
pub const QUORUM_ACK_FRESH: Duration = Duration::from_secs(3);
/// How long a write waits for this node to apply it after it committed.
pub const APPLY_WAIT: Duration = Duration::from_secs(5);
/// How often every node tells the leader it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A node the leader has not heard from for this long is offline. A VM's
/// failover waits for it (an attach elsewhere is refused while the
/// primary's node is online), so it is short: six missed heartbeats. With
/// a new leader's election (1-2 s), the grace it gives every node, and its
/// look every 500 ms, a dead leader's volumes can be attached elsewhere
/// about 6.5 s after the crash (a follower's after about 3 s); the promise
/// is 10 s (`crates/cli/tests/takeover.rs` measures both).
pub const OFFLINE_AFTER: Duration = Duration::from_secs(3);
const _: () = assert!(OFFLINE_AFTER.as_millis() >= 4 * HEARTBEAT_INTERVAL.as_millis());

#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub name: NodeName,
    pub labels: BTreeMap<String, String>,
    /// `ADDRESS` of any member and the join token, for a first start.
    pub join: Option<(String, String)>,
    pub trust_loopback: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Refused(#[from] CommandError),
    #[error("the control plane has no leader (waited {waited:?}): {detail}. Check that a majority of the voters ({voters}) is running and reachable")]
    NoLeader {
        waited: Duration,
        detail: String,
        voters: String,
    },
    #[error("joining failed: {0}")]
    Join(String),
    #[error("control plane: {0}")]
    Internal(String),
}

tokio::task_local! {
    /// Who asked for the writes made while serving one REST request: set
    /// by the API's authentication around the handler, so that the event
    /// log names the token or the local client instead of the node.
    pub static REQUESTER: Actor;
}

/// This node's handle on the cluster.
pub struct Cluster {
    pub identity: Identity,
    pub raft: Raft,
    pub state: StateReader,
    pub peers: PeerClient,
    pub config: ClusterConfig,
    /// Where the node's REST API listens, as recorded in the cluster state.
    pub api_address: String,
    pub nbd_address: Option<String>,
    pub liveness: leader::Liveness,
}

impl Cluster {
    pub fn node_id(&self) -> NodeId {
        self.identity.node_id
    }

    /// The leader, as far as this node knows. A leader that has not heard
    /// from a majority within [`QUORUM_ACK_FRESH`] is not counted: cut off,
    /// it cannot commit anything, though openraft still calls it leader.
    pub fn leader(&self) -> Option<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader?;
        if leader != self.node_id().0 {
            return Some(NodeId(leader));
        }
        let alone = metrics.membership_config.membership().voter_ids().count() <= 1;
        let fresh = metrics
            .millis_since_quorum_ack
            .is_some_and(|millis| millis <= QUORUM_ACK_FRESH.as_millis() as u64);
        (alone || fresh).then_some(NodeId(leader))
    }

    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id())
    }

    pub fn admin_token(&self) -> String {
        auth::admin_token(&self.identity.secret_bytes())
    }

    pub fn join_token(&self) -> String {
        auth::JoinToken {
            cluster_id: self.identity.cluster_id.clone(),
            secret: self.state.read().join_secret.clone(),
        }
        .to_string()
    }

    fn voters_text(&self) -> String {
        let state = self.state.read();
        let names: Vec<String> = state
            .membership()
            .voter_ids()
            .map(|id| state.node_name(NodeId(id)))
            .collect();
        names.join(", ")
    }

    /// Commits a command through the leader, wherever it is, and returns
    /// what applying it gave. Waits up to [`WRITE_TIMEOUT`] for a leader.
    ///
    /// The command goes attributed (`Command::Attributed`): to the REST
    /// client being served ([`REQUESTER`]), or else to this node, stamped
    /// with this node's clock. That is what the event log records.
    pub async fn write(&self, command: Command) -> Result<Reply, ClusterError> {
        let command = match command {
            Command::Attributed { .. } => command,
            command => Command::Attributed {
                actor: REQUESTER
                    .try_with(|actor| *actor)
                    .unwrap_or(Actor::Node(self.node_id())),
                now_ms: auth::now_ms(),
                command: Box::new(command),
            },
        };
        let started = Instant::now();
        let mut last_problem;
        loop {
            let remaining = WRITE_TIMEOUT.saturating_sub(started.elapsed());
            // A leader cut off from its majority accepts the write but can
            // never commit it: bound the wait.
            let attempt = tokio::time::timeout(remaining, self.raft.client_write(command.clone()));
            let Ok(attempt) = attempt.await else {
                return Err(ClusterError::NoLeader {
                    waited: WRITE_TIMEOUT,
                    detail: "this node leads but cannot reach a majority of the voters. The change is not committed yet, but it may still take effect when a majority is back: look (e.g. `trireme volume show`) before you retry it".into(),
                    voters: self.voters_text(),
                });
            };
            match attempt {
                Ok(response) => {
                    self.wait_applied(response.log_id.index).await;
                    return response.data.0.map_err(ClusterError::Refused);
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                    match forward.leader_node {
                        Some(leader) => {
                            match self
                                .peers
                                .post::<_, protocol::WriteOutcome>(
                                    &leader.addr,
                                    protocol::PATH_WRITE,
                                    &command,
                                )
                                .await
                            {
                                Ok(protocol::WriteOutcome::Applied(result, index)) => {
                                    self.wait_applied(index).await;
                                    return result.0.map_err(ClusterError::Refused);
                                }
                                Ok(protocol::WriteOutcome::NotLeader) => {
                                    last_problem = format!(
                                        "node {} at {} is no longer the leader",
                                        forward.leader_id.unwrap_or_default(),
                                        leader.addr
                                    );
                                }
                                Ok(protocol::WriteOutcome::NotCommitted(detail)) => {
                                    return Err(ClusterError::NoLeader {
                                        waited: started.elapsed(),
                                        detail,
                                        voters: self.voters_text(),
                                    })
                                }
                                Ok(protocol::WriteOutcome::Failed(error)) => {
                                    return Err(ClusterError::Internal(error))
                                }
                                Err(error) => {
                                    last_problem = format!(
                                        "the leader at {} did not answer: {error}",
                                        leader.addr
                                    );
                                }
                            }
                        }
                        None => last_problem = "no leader is known".into(),
                    }
                }
                Err(RaftError::APIError(other)) => {
                    return Err(ClusterError::Internal(other.to_string()))
                }
                Err(RaftError::Fatal(fatal)) => {
                    return Err(ClusterError::Internal(format!("Raft stopped: {fatal}")))
                }
            }
            if started.elapsed() > WRITE_TIMEOUT {
                return Err(ClusterError::NoLeader {
                    waited: WRITE_TIMEOUT,
                    detail: last_problem,
                    voters: self.voters_text(),
                });
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Waits (briefly) until this node's copy of the state has applied log
    /// index `index`, so that whoever wrote through this node reads its own
    /// write from it next.
    async fn wait_applied(&self, index: u64) {
        let mut applied = self.state.subscribe();
        let _ =
            tokio::time::timeout(APPLY_WAIT, applied.wait_for(|applied| *applied >= index)).await;
    }

    /// Waits until this node's copy of the state satisfies `done`, or
    /// `timeout` passes; returns whether it did.
    /// This node's answer to [`protocol::PATH_LAST_HEARD`]: only a leader
    /// hears heartbeats.
    pub fn last_heard_here(&self, node: NodeId) -> protocol::LastHeard {
        if !self.is_leader() {
            return protocol::LastHeard::NotLeader;
        }
        if node == self.node_id() {
            return protocol::LastHeard::Ago { millis: 0 };
        }
        self.liveness.last_heard(node, Instant::now())
    }

    /// When the leader last heard from `node`, asked of the leader
    /// wherever it is; `None` when there is no leader or it did not answer.
    pub async fn last_heard(&self, node: NodeId) -> Option<protocol::LastHeard> {
        let leader = self.leader()?;
        let answer = if leader == self.node_id() {
            self.last_heard_here(node)
        } else {
            let address = self
                .state
                .read()
                .membership()
                .get_node(&leader.0)
                .map(|member| member.addr.clone())?;
            self.peers
                .post(
                    &address,
                    protocol::PATH_LAST_HEARD,
                    &protocol::Heartbeat { node },
                )
                .await
                .ok()?
        };
        (answer != protocol::LastHeard::NotLeader).then_some(answer)
    }

    pub async fn wait_for_state(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&trireme_control::ClusterState) -> bool,
    ) -> bool {
        let mut changes = self.state.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if done(&self.state.read()) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return done(&self.state.read()),
            }
        }
    }
}

pub type SharedCluster = Arc<Cluster>;

/// Whether `state` records that `node` was removed: its id was handed out
/// (ids are never reused) and it is no longer a member. A state that has
/// not yet applied the node's join says nothing about it.
pub fn was_removed(state: &trireme_control::ClusterState, node: NodeId) -> bool {
    !state.cluster_id.is_empty() && node.0 < state.next_node_id && !state.nodes.contains_key(&node)
}
