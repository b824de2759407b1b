//! The cluster's REST API, as the driver uses it: a few calls of
//! `/api/v1`, with the node addresses tried in turn.
//!
//! Like the CLI's client, it moves on to the next address only when the
//! connection fails; an answer from a live node, error or not, is the
//! cluster's answer. The answer bodies are declared here, with only the
//! fields the driver reads: the driver never links the node crate.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// A node that does not accept a connection in this time is as good as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Creating a volume waits for its replicas (the node waits up to 30 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a probe of a primary's node may take before it counts as dead.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot reach any trireme node (tried {tried}); check --api / TRIREME_API and that `trireme node run` runs there")]
    Unreachable { tried: String },
    /// The cluster answered with an error: `status`, its stable `code` and
    /// its message (which names what to do).
    #[error("{message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    #[error("the trireme node's answer to {path} is not what this driver expects (another version?): {detail}")]
    Unexpected { path: String, detail: String },
}

impl ApiError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::Refused { status: 404, .. })
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            ApiError::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
    #[serde(default)]
    code: String,
}

#[derive(Debug, Clone)]
pub struct Api {
    /// Base URLs (`http://host:port`), in the order given.
    bases: Vec<String>,
    token: Option<String>,
    http: reqwest::Client,
}

/// `--api`: `http://h1:7450,h2:7450`; a missing scheme means http.
pub fn parse_addresses(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .map(|address| {
            let base = if address.contains("://") {
                address.to_string()
            } else {
                format!("http://{address}")
            };
            base.trim_end_matches('/').to_string()
        })
        .collect()
}

impl Api {
    pub fn new(bases: Vec<String>, token: Option<String>) -> Api {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("a reqwest client with timeouts only always builds");
        Api { bases, token, http }
    }

    /// The same cluster with the token an RPC's secrets carry (`token`).
    pub fn with_token(&self, token: Option<&str>) -> Api {
        match token {
            Some(token) => Api {
                token: Some(token.trim().to_string()),
                ..self.clone()
            },
            None => self.clone(),
        }
    }

    /// The one node whose API listens at `address` (a node's own daemon),
    /// with the same token.
    pub fn at(&self, address: &str) -> Api {
        Api {
            bases: parse_addresses(address),
            ..self.clone()
        }
    }

    pub async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ApiError> {
        let body = serde_json::to_vec(body).expect("request bodies always serialise");
        let text = self.send(reqwest::Method::PUT, path, Some(body)).await?;
        parse(path, &text)
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let text = self.send(reqwest::Method::GET, path, None).await?;
        parse(path, &text)
    }

    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ApiError> {
        let body = serde_json::to_vec(body).expect("request bodies always serialise");
        let text = self.send(reqwest::Method::POST, path, Some(body)).await?;
        parse(path, &text)
    }

    pub async fn delete(&self, path: &str) -> Result<(), ApiError> {
        self.send(reqwest::Method::DELETE, path, None).await?;
        Ok(())
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<String, ApiError> {
        let mut tried = Vec::new();
        for base in &self.bases {
            let mut request = self
                .http
                .request(method.clone(), format!("{base}/api/v1{path}"));
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => {
                    tried.push(format!("{base}: {error}"));
                    continue;
                }
            };
            let status = response.status();
            let text = match response.text().await {
                Ok(text) => text,
                // Cut off before its end: as good as down.
                Err(error) => {
                    tried.push(format!("{base}: {error}"));
                    continue;
                }
            };
            if status.is_success() {
                return Ok(text);
            }
            return Err(match serde_json::from_str::<ErrorBody>(&text) {
                Ok(body) => ApiError::Refused {
                    status: status.as_u16(),
                    code: body.code,
                    message: body.error,
                },
                Err(_) => ApiError::Refused {
                    status: status.as_u16(),
                    code: String::new(),
                    message: format!("the node at {base} answered {status}: {}", text.trim()),
                },
            });
        }
        Err(ApiError::Unreachable {
            tried: tried.join(", "),
        })
    }

    /// Whether the node whose API listens at `address` answers at all: a
    /// refused or timed-out connection means its daemon is gone.
    pub async fn node_answers(&self, address: &str) -> bool {
        let base = parse_addresses(address).pop().unwrap_or_default();
        let probe = self
            .http
            .get(format!("{base}/api/v1/health"))
            .timeout(PROBE_TIMEOUT)
            .send()
            .await;
        probe.is_ok()
    }
}

fn parse<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, ApiError> {
    let text = if text.trim().is_empty() { "null" } else { text };
    serde_json::from_str(text).map_err(|error| ApiError::Unexpected {
        path: path.to_string(),
        detail: error.to_string(),
    })
}

/// The parts of a volume the driver reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Volume {
    pub name: String,
    pub size_bytes: u64,
    /// `ready`, `degraded`, `syncing`, `no-quorum`, `failed`, ...
    pub state: String,
    #[serde(default)]
    pub replicas: Vec<Replica>,
    #[serde(default)]
    pub primaries: Vec<String>,
    #[serde(default)]
    pub group: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Replica {
    pub node: String,
    /// `diskful`, `diskless` or `tiebreaker`.
    pub kind: String,
    #[serde(default)]
    pub state: String,
}

impl Volume {
    pub fn diskful_nodes(&self) -> impl Iterator<Item = &str> {
        self.replicas
            .iter()
            .filter(|replica| replica.kind == "diskful")
            .map(|replica| replica.node.as_str())
    }

    /// Degraded or worse: fewer up-to-date copies than placed.
    pub fn abnormal(&self) -> Option<String> {
        match self.state.as_str() {
            "ready" | "creating" | "deleting" => None,
            state => Some(format!(
                "volume '{}' is {state}: see `trireme volume show {}`",
                self.name, self.name
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct AttachAnswer {
    #[serde(default)]
    pub fenced: Vec<Fenced>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Fenced {
    pub node: String,
    pub state: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Snapshot {
    pub volume: String,
    pub name: String,
    /// `creating`, `ready`, `failed` or `deleting`.
    pub state: String,
    #[serde(default)]
    pub error: Option<String>,
    pub created_unix_seconds: u64,
    pub size_bytes: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Node {
    pub name: String,
    pub api_address: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `online`, `offline` or `evicted`.
    pub state: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Group {
    pub name: String,
    pub place_count: usize,
    #[serde(default)]
    pub class: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodeDetail {
    #[serde(default)]
    pub pool_list: Vec<NodePool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodePool {
    pub class: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub online: bool,
}

#[derive(Debug, Serialize)]
pub struct CreateVolume<'a> {
    pub name: &'a str,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
pub struct Attach<'a> {
    pub node: &'a str,
    pub allow_two_primaries: bool,
    pub force_takeover: bool,
}

#[derive(Debug, Serialize)]
pub struct Detach<'a> {
    pub node: &'a str,
}

#[derive(Debug, Serialize)]
pub struct Grow {
    pub size_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct CreateSnapshot<'a> {
    pub name: &'a str,
}

#[derive(Debug, Serialize)]
pub struct Clone<'a> {
    pub name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_get_a_scheme_and_lose_a_trailing_slash() {
        assert_eq!(
            parse_addresses("h1:7450, http://h2:7450/ ,"),
            vec!["http://h1:7450", "http://h2:7450"]
        );
    }
}
