//! Becoming a member at start-up, in one of three ways:
//! 1. `DATA/cluster.json` exists: this node is a member; open the control
//!    database and rejoin (the log and the state are local).
//! 2. `--join ADDRESS --token TOKEN`: ask a member to add this node; the
//!    answer gives the node id and the sealed cluster secret.
//! 3. Neither: create a one-node cluster, with this node as its only voter.
//!
//! A member restarting on its data directory (1.) first makes sure it was
//! not removed while it was down: it refuses to start when `cluster.json`
//! records a removal, when its own copy of the state does, or when a member
//! answers that it was removed (recording that, so the next start refuses
//! too without asking anyone). Only then does the daemon start engines and
//! serve: a removed node's state is stale (volumes deleted since, primaries
//! moved) and nothing it says may be believed.

use openraft::BasicNode;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use trireme_control::{raft, Command, NodeRegistration};
use trireme_types::NodeId;

use super::identity::Identity;
use super::leader::Liveness;
use super::peer::{self, Network, PeerClient};
use super::protocol::{Heartbeat, JoinRequest, JoinResponse, PATH_HEARTBEAT, PATH_JOIN};
use super::{auth, Cluster, ClusterConfig, ClusterError};
use crate::NodeError;

pub const CONTROL_DB_FILE: &str = "control.redb";
/// How long a new cluster's first node waits to elect itself.
const FIRST_LEADER_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn start(
    config: ClusterConfig,
    data_dir: &Path,
    api_address: String,
    nbd_address: Option<String>,
    data_address: Option<String>,
) -> Result<Arc<Cluster>, NodeError> {
    let registration = NodeRegistration {
        name: config.name.clone(),
        api_address: api_address.clone(),
        nbd_address: nbd_address.clone(),
        data_address,
        labels: config.labels.clone(),
    };
    let existing = Identity::load(data_dir)?;
    if let Some(refusal) = existing
        .as_ref()
        .and_then(|identity| identity.removed_error(data_dir))
    {
        return Err(refusal);
    }
    let (identity, fresh) = match existing {
        Some(identity) => {
            if config.join.is_some() {
                tracing::warn!(cluster = %identity.cluster_id, "already a member: --join and --token are ignored");
            }
            (identity, false)
        }
        None => match &config.join {
            Some((address, token)) => (join(address, token, &registration).await?, true),
            None => {
                let identity = Identity {
                    cluster_id: auth::random_hex(8),
                    node_id: NodeId(1),
                    secret: auth::random_hex(32),
                    founder: true,
                    removed: None,
                };
                identity.save(data_dir)?;
                (identity, true)
            }
        },
    };
    if fresh && !identity.founder {
        identity.save(data_dir)?;
    }

    let (log_store, state_machine, reader) = raft::open(&data_dir.join(CONTROL_DB_FILE))
        .map_err(|error| NodeError::Internal(error.to_string()))?;
    let peers = PeerClient::new(identity.secret_bytes(), identity.node_id);
    let raft_config = Arc::new(
        raft::config(&identity.cluster_id)
            .validate()
            .map_err(|error| NodeError::Internal(error.to_string()))?,
    );
    let raft = raft::Raft::new(
        identity.node_id.0,
        raft_config,
        Network {
            peers: peers.clone(),
        },
        log_store,
        state_machine,
    )
    .await
    .map_err(|error| NodeError::Internal(format!("Raft did not start: {error}")))?;

    let cluster = Arc::new(Cluster {
        identity,
        raft,
        state: reader,
        peers,
        config,
        api_address,
        nbd_address,
        liveness: Liveness::default(),
    });

    if cluster.identity.founder && cluster.state.read().cluster_id.is_empty() {
        create(&cluster, registration).await?;
    }
    if !fresh {
        if let Err(refusal) = confirm_membership(&cluster, data_dir).await {
            if let Err(error) = cluster.raft.shutdown().await {
                tracing::warn!(%error, "Raft did not stop cleanly");
            }
            return Err(refusal);
        }
    }
    Ok(cluster)
}

/// A member restarted with `--label`s other than the recorded ones
/// proposes them: they replace the recorded labels. Without `--label` the
/// recorded ones stay (they may have been set with `trireme node label`).
/// Placement is not changed; `status` names volumes that no longer satisfy
/// their group.
pub async fn propose_labels(cluster: &Cluster) {
    let me = cluster.node_id();
    let wanted = &cluster.config.labels;
    let recorded = cluster
        .state
        .read()
        .nodes
        .get(&me)
        .map(|node| node.labels.clone());
    let Some(recorded) = recorded else {
        return;
    };
    if wanted.is_empty() || *wanted == recorded {
        return;
    }
    let command = Command::SetNodeLabels {
        node: me,
        labels: wanted.clone(),
    };
    match cluster.write(command).await {
        Ok(_) => tracing::info!(?recorded, ?wanted, "this node's labels changed"),
        Err(error) => {
            tracing::warn!(%error, ?wanted, "the new labels were not recorded; restart again, or set them with `trireme node label`")
        }
    }
}

/// Records durably that this node was removed, and returns the refusal to
/// run that every later start gives too.
pub fn record_removal(cluster: &Cluster, data_dir: &Path, reason: String) -> NodeError {
    let mut identity = cluster.identity.clone();
    if let Err(error) = identity.record_removal(data_dir, reason) {
        tracing::error!(%error, "cannot record in the data directory that this node was removed");
    }
    identity
        .removed_error(data_dir)
        .expect("a removal was just recorded")
}

/// A restarted member asks the other members whether it still is one (a
/// signed heartbeat: a member answers 410 to a removed node), and looks at
/// its own copy of the state. With no member reachable it goes on: a
/// removed node cannot commit anything without them, and the first one
/// that answers later stops it (see `daemon::serve`).
async fn confirm_membership(cluster: &Arc<Cluster>, data_dir: &Path) -> Result<(), NodeError> {
    let me = cluster.node_id();
    let peers: Vec<String> = {
        let state = cluster.state.read();
        if super::was_removed(&state, me) {
            drop(state);
            return Err(record_removal(
                cluster,
                data_dir,
                "this node's own copy of the cluster state records its removal".into(),
            ));
        }
        state
            .nodes
            .values()
            .filter(|node| node.id != me)
            .map(|node| node.api_address.clone())
            .collect()
    };
    if peers.is_empty() {
        return Ok(());
    }
    let mut asked = tokio::task::JoinSet::new();
    for address in peers {
        let client = cluster.peers.clone();
        asked.spawn(async move {
            client
                .post::<_, bool>(&address, PATH_HEARTBEAT, &Heartbeat { node: me })
                .await
        });
    }
    let mut confirmed = 0;
    while let Some(answer) = asked.join_next().await {
        if matches!(answer, Ok(Ok(_))) {
            confirmed += 1;
        }
    }
    // A member that says "removed" read it from the committed log; one
    // that says "member" may be as stale as this node: the removal wins.
    let removed = cluster.peers.removed().borrow().clone();
    if let Some(reason) = removed {
        return Err(record_removal(cluster, data_dir, reason));
    }
    if confirmed == 0 {
        tracing::warn!(
            "no other member answered; starting on this node's own copy of the cluster state"
        );
    }
    Ok(())
}

/// A new cluster: this node alone votes, then writes the first entry.
async fn create(cluster: &Arc<Cluster>, registration: NodeRegistration) -> Result<(), NodeError> {
    let me = cluster.node_id().0;
    let initialized = cluster
        .raft
        .is_initialized()
        .await
        .map_err(|error| NodeError::Internal(error.to_string()))?;
    if !initialized {
        let members = BTreeMap::from([(me, BasicNode::new(&cluster.api_address))]);
        cluster
            .raft
            .initialize(members)
            .await
            .map_err(|error| NodeError::Internal(format!("cannot create the cluster: {error}")))?;
    }
    let elected = cluster
        .raft
        .wait(Some(FIRST_LEADER_TIMEOUT))
        .current_leader(me, "the first node elects itself")
        .await;
    if let Err(error) = elected {
        return Err(NodeError::Internal(format!(
            "the new cluster did not elect this node: {error}"
        )));
    }
    let command = Command::Bootstrap {
        cluster_id: cluster.identity.cluster_id.clone(),
        join_secret: auth::random_hex(32),
        node: registration,
        now_ms: auth::now_ms(),
    };
    match cluster.write(command).await {
        Ok(_) => {
            tracing::info!(cluster = %cluster.identity.cluster_id, "cluster created");
            Ok(())
        }
        Err(error) => Err(NodeError::Internal(error.to_string())),
    }
}

/// Asks the member at `address` to add this node.
async fn join(
    address: &str,
    token: &str,
    registration: &NodeRegistration,
) -> Result<Identity, NodeError> {
    let token = auth::JoinToken::parse(token)
        .map_err(|error| NodeError::InvalidRequest(error.to_string()))?;
    let mut request = JoinRequest {
        cluster_id: token.cluster_id.clone(),
        node: registration.clone(),
        nonce: auth::random_hex(16),
        time_ms: auth::now_ms(),
        mac: String::new(),
    };
    request.mac = auth::join_mac(&token.secret, &request.canonical());
    let address = address
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let failed = |detail: String| NodeError::Internal(ClusterError::Join(detail).to_string());
    let response = peer::PeerClient::http()
        .post(format!("http://{address}{PATH_JOIN}"))
        .json(&request)
        .send()
        .await
        .map_err(|error| failed(format!("cannot reach {address}: {error}")))?;
    let answer: JoinResponse = peer::read_answer(&address, response)
        .await
        .map_err(|error| match error {
            peer::PeerError::Status { body, .. } => failed(body),
            other => failed(other.to_string()),
        })?;
    let secret = auth::unseal_secret(&token.secret, &request.nonce, &answer.sealed_secret)
        .ok_or_else(|| failed("the cluster's answer could not be opened with this token".into()))?;
    tracing::info!(cluster = %answer.cluster_id, node = %answer.node_id, "joined the cluster");
    Ok(Identity {
        cluster_id: answer.cluster_id,
        node_id: answer.node_id,
        secret: hex::encode(secret),
        founder: false,
        removed: None,
    })
}
