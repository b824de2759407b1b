//! The control plane as a volume's replication engine sees it
//! ([`ControlPlane`]): proposals go to the Raft leader as commands of this
//! node, and their answers come back to the engine. The replication
//! simulator implements the same trait over its arbiter.

use std::sync::Arc;
use trireme_control::Command;
use trireme_replication::driver::primary::{ControlPlane, ProposeError};

use super::{auth, Cluster, ClusterError};

/// Where a proposal's answer goes: the engine's input queue.
pub type Answers = Arc<dyn Fn(u64, Result<(), ProposeError>) + Send + Sync>;

pub struct EnginePort {
    cluster: Arc<Cluster>,
    answers: Answers,
}

impl EnginePort {
    pub fn new(cluster: Arc<Cluster>, answers: Answers) -> EnginePort {
        EnginePort { cluster, answers }
    }
}

impl ControlPlane for EnginePort {
    fn propose(&mut self, id: u64, command: Command, wants_answer: bool) {
        let cluster = self.cluster.clone();
        let answers = self.answers.clone();
        tokio::spawn(async move {
            let result = cluster.write(command).await;
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
