//! The control plane as the node's replication sees it, and all it sees
//! of it:
//!
//! - [`ControlPort`]: this node's id, the cluster state (read and
//!   watched), proposals of commands, and the secret data links are signed
//!   with. [`Cluster`] implements it; the node's replication holds an
//!   `Arc<dyn ControlPort>`, never the `Cluster` itself.
//! - [`EnginePort`]: a volume's engine's [`ControlPlane`]: proposals go to
//!   the Raft leader as commands of this node, and their answers come back
//!   to the engine. The replication simulator implements the same trait
//!   over its arbiter.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use trireme_control::raft::StateReader;
use trireme_control::{Command, Reply};
use trireme_replication::driver::primary::{ControlPlane, ProposeError};
use trireme_types::NodeId;

use super::{auth, Cluster, ClusterError};

/// A proposal's outcome, once committed (or refused, or not committed).
pub type Proposed<'a> = Pin<Box<dyn Future<Output = Result<Reply, ClusterError>> + Send + 'a>>;

/// What replication needs of the control plane.
pub trait ControlPort: Send + Sync + 'static {
    /// This node's id in the cluster.
    fn node_id(&self) -> NodeId;

    /// This node's copy of the cluster state: `read` it, or `subscribe`
    /// to be told when it changes.
    fn state(&self) -> &StateReader;

    /// Commits `command` through the leader, wherever it is, attributed
    /// to this node, and returns what applying it gave.
    fn propose(&self, command: Command) -> Proposed<'_>;

    /// The cluster secret data links are signed with (`wire::LinkOpen`).
    fn link_secret(&self) -> Vec<u8>;
}

impl ControlPort for Cluster {
    fn node_id(&self) -> NodeId {
        Cluster::node_id(self)
    }

    fn state(&self) -> &StateReader {
        &self.state
    }

    fn propose(&self, command: Command) -> Proposed<'_> {
        Box::pin(self.write(command))
    }

    fn link_secret(&self) -> Vec<u8> {
        self.identity.secret_bytes()
    }
}

/// Where a proposal's answer goes: the engine's input queue.
pub type Answers = Arc<dyn Fn(u64, Result<(), ProposeError>) + Send + Sync>;

pub struct EnginePort {
    control: Arc<dyn ControlPort>,
    answers: Answers,
}

impl EnginePort {
    pub fn new(control: Arc<dyn ControlPort>, answers: Answers) -> EnginePort {
        EnginePort { control, answers }
    }
}

impl ControlPlane for EnginePort {
    fn propose(&mut self, id: u64, command: Command, wants_answer: bool) {
        let control = self.control.clone();
        let answers = self.answers.clone();
        tokio::spawn(async move {
            let result = control.propose(command).await;
            if !wants_answer {
                return;
            }
            let answer = match result {
                Ok(_) => Ok(()),
                Err(ClusterError::Refused(error)) => Err(ProposeError::Refused(error)),
                Err(error) => {
                    tracing::warn!(%error, "a replication proposal found no leader; retrying");
                    Err(ProposeError::Unavailable(error.to_string()))
                }
            };
            answers(id, answer);
        });
    }

    fn wall_clock_ms(&self) -> u64 {
        auth::now_ms()
    }
}
