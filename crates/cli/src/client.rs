//! A blocking client of the node's REST API. It keeps each answer's JSON
//! text, so `--output json` prints exactly what the node said.

use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
use trireme_node::api::model::ErrorBody;
use ureq::http::Response;
use ureq::{Agent, Body};

/// Long enough for a loaded node; a node that does not accept in this time
/// is as good as down. Requests themselves get no limit: a scan reads a pool.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Client {
    base_url: String,
    agent: Agent,
}

/// An answer with its JSON text (`None` for 204 No Content).
pub struct Answer {
    pub json: Option<String>,
}

impl Answer {
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        let text = self.json.as_deref().unwrap_or("null");
        serde_json::from_str(text).with_context(|| {
            format!("the node's answer is not what this trireme expects (is it another version?): {text}")
        })
    }
}

impl Client {
    pub fn new(base_url: &str) -> Client {
        let agent: Agent = Agent::config_builder()
            // Error answers carry a JSON message: read it rather than fail.
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .build()
            .into();
        Client {
            base_url: base_url.trim_end_matches('/').to_string(),
            agent,
        }
    }

    pub fn get(&self, path: &str) -> Result<Answer> {
        let url = self.url(path);
        self.finish(self.agent.get(&url).call())
    }

    pub fn delete(&self, path: &str) -> Result<Answer> {
        let url = self.url(path);
        self.finish(self.agent.delete(&url).call())
    }

    pub fn post(&self, path: &str, body: &impl Serialize) -> Result<Answer> {
        let url = self.url(path);
        self.finish(self.agent.post(&url).send_json(body))
    }

    pub fn post_empty(&self, path: &str) -> Result<Answer> {
        let url = self.url(path);
        self.finish(self.agent.post(&url).send_empty())
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base_url)
    }

    fn finish(&self, result: Result<Response<Body>, ureq::Error>) -> Result<Answer> {
        let mut response = result.map_err(|error| {
            anyhow!(
                "cannot reach the trireme node at {}: {error}; is `trireme node run` running?",
                self.base_url
            )
        })?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the answer of the node at {}", self.base_url))?;
        if status.is_success() {
            let json = (!text.trim().is_empty()).then_some(text);
            return Ok(Answer { json });
        }
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => bail!("{}", body.error),
            Err(_) => bail!(
                "the node at {} answered {status}: {}",
                self.base_url,
                text.trim()
            ),
        }
    }
}
