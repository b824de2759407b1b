//! Node-to-node HTTP: every request signed (see [`super::auth`]), JSON in
//! and out, and the Raft network on top of it.

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use trireme_control::raft::{RaftError, TypeConfig};
use trireme_types::NodeId;

use super::auth;
use super::protocol::{CODE_NODE_REMOVED, PATH_APPEND, PATH_SNAPSHOT, PATH_VOTE};

/// A peer that does not answer within this time is treated as unreachable.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot reach {address}: {source}")]
    Unreachable {
        address: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{address} answered {status}: {body}")]
    Status {
        address: String,
        status: u16,
        body: String,
    },
    #[error("{address} sent an unreadable answer: {detail}")]
    BadAnswer { address: String, detail: String },
    /// The member at `address` says this node was removed from the cluster.
    #[error("{address} answered that this node was removed from the cluster: {body}")]
    Removed { address: String, body: String },
}

/// Signs and sends requests to other members.
#[derive(Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    secret: Vec<u8>,
    me: NodeId,
    /// Set, with who said it, when a member answers that this node was
    /// removed; the daemon records it and stops (see `daemon::serve`).
    removed: Arc<watch::Sender<Option<String>>>,
}

impl PeerClient {
    pub fn new(secret: Vec<u8>, me: NodeId) -> PeerClient {
        let http = reqwest::Client::builder()
            .timeout(PEER_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(4)
            .build()
            .expect("an HTTP client without TLS always builds");
        PeerClient {
            http,
            secret,
            me,
            removed: Arc::new(watch::channel(None).0),
        }
    }

    /// Says that this node was removed (`reason`: who said so). The first
    /// reason is kept.
    pub fn note_removed(&self, reason: String) {
        self.removed.send_if_modified(|removed| {
            let first = removed.is_none();
            if first {
                *removed = Some(reason);
            }
            first
        });
    }

    /// Why this node was removed, once a member or the local state said so.
    pub fn removed(&self) -> watch::Receiver<Option<String>> {
        self.removed.subscribe()
    }

    /// An unsigned client, for the join request (the joiner has no secret yet).
    pub fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(PEER_TIMEOUT)
            .build()
            .expect("an HTTP client without TLS always builds")
    }

    pub async fn post<Q: Serialize, A: DeserializeOwned>(
        &self,
        address: &str,
        path: &str,
        body: &Q,
    ) -> Result<A, PeerError> {
        let body = serde_json::to_vec(body).expect("request bodies serialise");
        let time = auth::now_ms();
        let mac = auth::sign_request(&self.secret, self.me, "POST", path, time, &body);
        let response = self
            .http
            .post(format!("http://{address}{path}"))
            .header(auth::HEADER_NODE, self.me.0.to_string())
            .header(auth::HEADER_TIME, time.to_string())
            .header(auth::HEADER_MAC, mac)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|source| PeerError::Unreachable {
                address: address.to_string(),
                source,
            })?;
        let answer = read_answer(address, response).await;
        if let Err(PeerError::Removed { address, body }) = &answer {
            self.note_removed(format!("the member at {address} answered: {body}"));
        }
        answer
    }
}

pub async fn read_answer<A: DeserializeOwned>(
    address: &str,
    response: reqwest::Response,
) -> Result<A, PeerError> {
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|source| PeerError::Unreachable {
            address: address.to_string(),
            source,
        })?;
    if !status.is_success() {
        let json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
        let field = |name: &str| {
            json.as_ref()
                .and_then(|value| value.get(name)?.as_str().map(String::from))
        };
        let body = field("error").unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        if status == reqwest::StatusCode::GONE
            && field("code").as_deref() == Some(CODE_NODE_REMOVED)
        {
            return Err(PeerError::Removed {
                address: address.to_string(),
                body,
            });
        }
        return Err(PeerError::Status {
            address: address.to_string(),
            status: status.as_u16(),
            body,
        });
    }
    serde_json::from_slice(&bytes).map_err(|error| PeerError::BadAnswer {
        address: address.to_string(),
        detail: error.to_string(),
    })
}

/// openraft's network: one [`Connection`] per target.
#[derive(Clone)]
pub struct Network {
    pub peers: PeerClient,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Connection {
        Connection {
            peers: self.peers.clone(),
            target,
            address: node.addr.clone(),
        }
    }
}

pub struct Connection {
    peers: PeerClient,
    target: u64,
    address: String,
}

impl Connection {
    async fn call<Q, A, E>(&self, path: &str, request: &Q) -> Result<A, RPCError<u64, BasicNode, E>>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<A, E> = self
            .peers
            .post(&self.address, path, request)
            .await
            .map_err(|error| match error {
                // openraft backs off from an unreachable peer, and retries
                // at once after a network error.
                PeerError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
                _ => RPCError::Network(NetworkError::new(&error)),
            })?;
        answer.map_err(|error| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                BasicNode::new(&self.address),
                error,
            ))
        })
    }
}

type RpcResult<A, E = openraft::error::Infallible> =
    Result<A, RPCError<u64, BasicNode, RaftError<E>>>;

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        self.call(PATH_APPEND, &request).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.call(PATH_SNAPSHOT, &request).await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        self.call(PATH_VOTE, &request).await
    }
}
