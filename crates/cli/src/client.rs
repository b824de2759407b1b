//! A blocking client of the cluster's REST API. It keeps each answer's JSON
//! text, so `--output json` prints exactly what the node said.
//!
//! The client knows one or more node addresses (`--api a:7450,b:7450`): any
//! node answers for the whole cluster, so there is no virtual IP. It tries
//! them in order and moves to the next one on any failure of the connection
//! (refused, reset, timed out, no such host, TLS, a broken pipe, an answer
//! cut off before its end): a node that cannot finish an answer is as good
//! as down, and the admin asked for the next one. An answer from a live
//! node, error or not, is the cluster's answer and ends the command.
//!
//! A request whose connection broke after it was sent may have been applied
//! by that node before it went away; sent again, the cluster refuses what is
//! already done (a volume that exists, a replica already placed) rather than
//! doing it twice, so the worst case is a refusal that says so.

use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::Cell;
use std::time::Duration;
use trireme_node::api::model::ErrorBody;
use ureq::http::{Response, StatusCode};
use ureq::{Agent, Body, RequestBuilder};

use crate::args::ApiAddresses;

/// Long enough for a loaded node; a node that does not accept in this time
/// is as good as down. Requests themselves get no limit: a scan reads a pool.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Client {
    /// Base URLs (`http://host:port`), in the order given.
    nodes: Vec<String>,
    /// The node that answered last: later requests of the same command
    /// start there instead of waiting for the dead ones again.
    preferred: Cell<usize>,
    /// `Bearer TOKEN`, when a token was given.
    authorization: Option<String>,
    agent: Agent,
}

/// An answer with its HTTP status and JSON text (`None` for 204 No Content).
pub struct Answer {
    pub status: u16,
    pub json: Option<String>,
}

impl Answer {
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        let text = self.json.as_deref().unwrap_or("null");
        serde_json::from_str(text).with_context(|| {
            format!("the node's answer is not what this trireme expects (is it another version?): {text}")
        })
    }

    /// 202 Accepted: the change is recorded but not finished everywhere.
    pub fn accepted(&self) -> bool {
        self.status == 202
    }
}

impl Client {
    pub fn new(addresses: &ApiAddresses, token: Option<&str>) -> Client {
        let agent: Agent = Agent::config_builder()
            // Error answers carry a JSON message: read it rather than fail.
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .build()
            .into();
        Client {
            nodes: addresses.urls().to_vec(),
            preferred: Cell::new(0),
            authorization: token.map(|token| format!("Bearer {token}")),
            agent,
        }
    }

    pub fn get(&self, path: &str) -> Result<Answer> {
        self.send(path, |url| self.authorize(self.agent.get(url)).call())
    }

    pub fn delete(&self, path: &str) -> Result<Answer> {
        self.send(path, |url| self.authorize(self.agent.delete(url)).call())
    }

    pub fn post(&self, path: &str, body: &impl Serialize) -> Result<Answer> {
        self.send(path, |url| {
            self.authorize(self.agent.post(url)).send_json(body)
        })
    }

    pub fn put(&self, path: &str, body: &impl Serialize) -> Result<Answer> {
        self.send(path, |url| {
            self.authorize(self.agent.put(url)).send_json(body)
        })
    }

    pub fn post_empty(&self, path: &str) -> Result<Answer> {
        self.send(path, |url| {
            self.authorize(self.agent.post(url)).send_empty()
        })
    }

    fn authorize<B>(&self, request: RequestBuilder<B>) -> RequestBuilder<B> {
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }

    /// Sends to the preferred node, then to the others in order while the
    /// connection to them fails.
    fn send(
        &self,
        path: &str,
        call: impl Fn(&str) -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Answer> {
        let first = self.preferred.get();
        let order = std::iter::once(first).chain((0..self.nodes.len()).filter(|&i| i != first));
        let mut unreachable = Vec::new();
        for index in order {
            let base = &self.nodes[index];
            let answer = call(&format!("{base}/api/v1{path}")).and_then(read_whole);
            match answer {
                Ok((status, text)) => {
                    self.preferred.set(index);
                    return finish(base, status, text);
                }
                Err(error) if connection_failed(&error) => unreachable.push((base.as_str(), error)),
                Err(error) => bail!("the request to the trireme node at {base} failed: {error}"),
            }
        }
        Err(none_reached(&unreachable))
    }
}

/// The status and the whole body: an answer cut off halfway is a broken
/// connection, like one that never began.
fn read_whole(mut response: Response<Body>) -> Result<(StatusCode, String), ureq::Error> {
    let status = response.status();
    let text = response.body_mut().read_to_string()?;
    Ok((status, text))
}

/// Whether the connection to the node failed (before, while or after the
/// request was sent), rather than the request being wrong on this side:
/// the next node may answer.
fn connection_failed(error: &ureq::Error) -> bool {
    matches!(
        error,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
            | ureq::Error::Tls(_)
            | ureq::Error::TlsRequired
            | ureq::Error::ConnectProxyFailed(_)
            | ureq::Error::LargeResponseHeader(..)
    )
}

fn none_reached(tried: &[(&str, ureq::Error)]) -> anyhow::Error {
    match tried {
        [(base, error)] => anyhow!(
            "cannot reach the trireme node at {base}: {error}; is `trireme node run` running? \
             (--api takes several nodes: --api a:7450,b:7450)"
        ),
        _ => anyhow!(
            "cannot reach any trireme node; tried {}; is `trireme node run` running on them?",
            tried
                .iter()
                .map(|(base, error)| format!("{base} ({error})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn finish(base: &str, status: StatusCode, text: String) -> Result<Answer> {
    if status.is_success() {
        let json = (!text.trim().is_empty()).then_some(text);
        return Ok(Answer {
            status: status.as_u16(),
            json,
        });
    }
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => bail!("{}", body.error),
        Err(_) => bail!("the node at {base} answered {status}: {}", text.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn io(kind: ErrorKind) -> ureq::Error {
        ureq::Error::Io(std::io::Error::from(kind))
    }

    #[test]
    fn every_connection_failure_moves_on_to_the_next_node() {
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
            ErrorKind::TimedOut,
            ErrorKind::UnexpectedEof,
        ] {
            assert!(connection_failed(&io(kind)), "{kind:?}");
        }
        assert!(connection_failed(&ureq::Error::Timeout(
            ureq::Timeout::Connect
        )));
        assert!(connection_failed(&ureq::Error::Timeout(
            ureq::Timeout::RecvResponse
        )));
        assert!(connection_failed(&ureq::Error::HostNotFound));
        assert!(connection_failed(&ureq::Error::Tls("handshake")));
        // Wrong on this side: another node would refuse it just the same.
        assert!(!connection_failed(&ureq::Error::BadUri("x".into())));
        assert!(!connection_failed(&ureq::Error::BodyExceedsLimit(1)));
    }

    #[test]
    fn a_dead_list_names_every_address_tried() {
        let addresses = ApiAddresses::parse("127.0.0.1:1,http://127.0.0.1:2").unwrap();
        let client = Client::new(&addresses, None);
        let error = client.get("/status").err().expect("nothing listens there");
        let text = format!("{error:#}");
        assert!(text.contains("http://127.0.0.1:1"), "{text}");
        assert!(text.contains("http://127.0.0.1:2"), "{text}");
    }

    #[test]
    fn the_token_goes_into_the_authorization_header() {
        let addresses = ApiAddresses::parse("127.0.0.1:1").unwrap();
        let client = Client::new(&addresses, Some("abc"));
        assert_eq!(client.authorization.as_deref(), Some("Bearer abc"));
        assert!(Client::new(&addresses, None).authorization.is_none());
    }
}
