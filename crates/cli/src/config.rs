//! The client config file: the API addresses and token a machine's `trireme`
//! commands use when neither `--api`/`--token` nor `TRIREME_API`/
//! `TRIREME_TOKEN` is given, so commands on a node of an installed cluster
//! need no `--api`. The .deb ships /etc/trireme/client.toml.
//!
//! ```toml
//! api = ["10.0.0.1:7450", "10.0.0.2:7450"]   # or "10.0.0.1:7450,10.0.0.2:7450"
//! token_file = "/var/lib/trireme/admin.token" # or token = "..."
//! ```

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use clap::ArgMatches;
use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::args::{parse_token, ApiAddresses, Cli};

/// Where the file is read from unless TRIREME_CLIENT_CONFIG names another.
pub const DEFAULT_PATH: &str = "/etc/trireme/client.toml";
/// Names another file; set but empty, no file is read.
pub const PATH_ENV: &str = "TRIREME_CLIENT_CONFIG";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    api: Option<ApiList>,
    token: Option<String>,
    token_file: Option<PathBuf>,
}

/// `api` as one comma-separated string (as `--api` takes) or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ApiList {
    One(String),
    Many(Vec<String>),
}

/// What the file gives: only what it sets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClientConfig {
    pub api: Option<ApiAddresses>,
    pub token: Option<String>,
}

impl ClientConfig {
    /// Reads the file TRIREME_CLIENT_CONFIG names, or the default one. A
    /// missing default file is no configuration (a machine that is not a
    /// node has none); a missing file that was named is an error.
    pub fn load() -> Result<ClientConfig> {
        let (path, named) = match std::env::var_os(PATH_ENV) {
            Some(path) if path.is_empty() => return Ok(ClientConfig::default()),
            Some(path) => (PathBuf::from(path), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !named => {
                return Ok(ClientConfig::default())
            }
            Err(error) => bail!(
                "cannot read the client config file {}: {error}; fix it, name another one \
                 with {PATH_ENV}=FILE, or read none with {PATH_ENV}=",
                path.display()
            ),
        };
        ClientConfig::parse(&text, &path)
    }

    fn parse(text: &str, path: &Path) -> Result<ClientConfig> {
        let where_ = || format!("client config file {}", path.display());
        let file: ConfigFile = toml::from_str(text).with_context(|| {
            format!(
                "{} is not valid: it takes `api` (\"HOST:PORT,...\" or a list) and \
                 `token` or `token_file`",
                where_()
            )
        })?;
        let api = match file.api {
            None => None,
            Some(list) => {
                let joined = match list {
                    ApiList::One(text) => text,
                    ApiList::Many(list) => list.join(","),
                };
                Some(
                    ApiAddresses::parse(&joined)
                        .map_err(anyhow::Error::msg)
                        .with_context(|| format!("`api` in the {}", where_()))?,
                )
            }
        };
        let token = match (file.token, file.token_file) {
            (Some(_), Some(_)) => bail!(
                "the {} sets both `token` and `token_file`: keep one",
                where_()
            ),
            (Some(token), None) => Some(token),
            (None, Some(token_file)) => {
                Some(std::fs::read_to_string(&token_file).with_context(|| {
                    format!(
                        "cannot read `token_file` {} of the {} (the admin token is \
                     DATA_DIR/admin.token of any node, readable by root only)",
                        token_file.display(),
                        where_()
                    )
                })?)
            }
            (None, None) => None,
        };
        let token = token
            .map(|token| {
                parse_token(&token)
                    .map_err(anyhow::Error::msg)
                    .with_context(|| format!("the token of the {}", where_()))
            })
            .transpose()?;
        Ok(ClientConfig { api, token })
    }

    /// Fills in what the command line and the environment left unset: a
    /// flag or an environment variable always wins over the file.
    pub fn apply(self, cli: &mut Cli, matches: &ArgMatches) {
        let given = |id: &str| {
            matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        if let Some(api) = self.api {
            if !given("api") {
                cli.api = api;
            }
        }
        if let Some(token) = self.token {
            if !given("token") {
                cli.token = Some(token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClientConfig> {
        ClientConfig::parse(text, Path::new("client.toml"))
    }

    #[test]
    fn api_as_a_string_or_a_list() {
        let one = parse("api = \"10.0.0.1,10.0.0.2:7451\"").unwrap();
        let many = parse("api = [\"10.0.0.1\", \"10.0.0.2:7451\"]").unwrap();
        assert_eq!(one, many);
        assert_eq!(
            one.api.unwrap().urls(),
            ["http://10.0.0.1:7450", "http://10.0.0.2:7451"]
        );
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        assert_eq!(parse("# nothing\n").unwrap(), ClientConfig::default());
    }

    #[test]
    fn mistakes_name_the_file_and_what_was_wrong() {
        let error = format!("{:#}", parse("apis = \"a\"").unwrap_err());
        assert!(
            error.contains("client.toml") && error.contains("apis"),
            "{error}"
        );
        let error = format!("{:#}", parse("api = \"a:0\"").unwrap_err());
        assert!(error.contains("`api`") && error.contains("port"), "{error}");
        let error = format!(
            "{:#}",
            parse("token = \"a\"\ntoken_file = \"/x\"").unwrap_err()
        );
        assert!(error.contains("keep one"), "{error}");
        let error = format!(
            "{:#}",
            parse("token_file = \"/nonexistent/t\"").unwrap_err()
        );
        assert!(error.contains("/nonexistent/t"), "{error}");
    }
}
