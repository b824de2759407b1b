//! Trust between nodes, joiners and clients: HMAC-SHA256 signatures under
//! the cluster secret (no CA to manage, nothing to expire by surprise).
//!
//! - **Cluster secret**: 32 random bytes made at cluster creation, kept in
//!   every member's `DATA/cluster.json` (mode 0600).
//! - **Join token** `TRM1-<cluster id>-<join secret>`: printed by members. A
//!   joiner signs its request with the join secret; a member checks the
//!   signature, the time (within [`JOIN_WINDOW_MS`]) and that the nonce was
//!   never used (the nonces live in the replicated state, so a replay is
//!   refused by every leader). The answer carries the cluster secret sealed
//!   (ChaCha20-Poly1305) under a key only the token holder can derive.
//! - **Node-to-node requests** carry `x-trireme-node`, `x-trireme-time` and
//!   `x-trireme-mac`: HMAC of method, path, time and body under the node's
//!   key, itself an HMAC of the node id under the cluster secret. A request
//!   from a node id that is not a member, with a bad MAC or a time more than
//!   [`REQUEST_WINDOW_MS`] away is refused.
//! - **Clients** present `Authorization: Bearer <admin token>` (an HMAC of
//!   a fixed label under the cluster secret, in `DATA/admin.token`).
//!   Requests from loopback are trusted unless the node runs with
//!   `--trust-loopback=false`, as the NBD export on loopback is.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use trireme_types::NodeId;

pub use trireme_control::model::JOIN_WINDOW_MS;

/// How far a signed node-to-node request's clock may be from ours.
pub const REQUEST_WINDOW_MS: u64 = 5 * 60 * 1000;
pub const HEADER_NODE: &str = "x-trireme-node";
pub const HEADER_TIME: &str = "x-trireme-time";
pub const HEADER_MAC: &str = "x-trireme-mac";
const TOKEN_PREFIX: &str = "TRM1";

type HmacSha256 = Hmac<Sha256>;

pub fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut buffer);
    hex::encode(buffer)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        // Length-prefixed, so ("ab","c") and ("a","bc") sign differently.
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    mac
}

fn mac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    hex::encode(mac(key, parts).finalize().into_bytes())
}

fn mac_matches(key: &[u8], parts: &[&[u8]], expected_hex: &str) -> bool {
    match hex::decode(expected_hex) {
        // `verify_slice` compares in constant time.
        Ok(expected) => mac(key, parts).verify_slice(&expected).is_ok(),
        Err(_) => false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub cluster_id: String,
    pub secret: String,
}

#[derive(Debug, thiserror::Error)]
#[error("the join token is malformed: expected TRM1-<cluster id>-<secret>, as `trireme cluster join-token` prints it")]
pub struct BadToken;

impl JoinToken {
    pub fn parse(text: &str) -> Result<JoinToken, BadToken> {
        let mut parts = text.trim().split('-');
        let (Some(TOKEN_PREFIX), Some(cluster_id), Some(secret), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(BadToken);
        };
        let hexadecimal =
            |text: &str| !text.is_empty() && text.chars().all(|c| c.is_ascii_hexdigit());
        if !hexadecimal(cluster_id) || !hexadecimal(secret) || secret.len() != 64 {
            return Err(BadToken);
        }
        Ok(JoinToken {
            cluster_id: cluster_id.to_string(),
            secret: secret.to_lowercase(),
        })
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{TOKEN_PREFIX}-{}-{}", self.cluster_id, self.secret)
    }
}

/// The signature of a join request over everything it asks for.
pub fn join_mac(join_secret: &str, canonical_request: &[u8]) -> String {
    mac_hex(join_secret.as_bytes(), &[b"join", canonical_request])
}

pub fn join_mac_matches(join_secret: &str, canonical_request: &[u8], mac: &str) -> bool {
    mac_matches(join_secret.as_bytes(), &[b"join", canonical_request], mac)
}

fn seal_key(join_secret: &str, join_nonce: &str) -> Key {
    let bytes = mac(join_secret.as_bytes(), &[b"seal", join_nonce.as_bytes()])
        .finalize()
        .into_bytes();
    *Key::from_slice(&bytes)
}

/// Seals the cluster secret for the joiner that sent `join_nonce`.
pub fn seal_secret(join_secret: &str, join_nonce: &str, cluster_secret: &[u8]) -> String {
    let cipher = ChaCha20Poly1305::new(&seal_key(join_secret, join_nonce));
    let mut nonce = [0u8; 12];
    rand::thread_rng().fill_bytes(&mut nonce);
    let sealed = cipher
        .encrypt(Nonce::from_slice(&nonce), cluster_secret)
        .expect("sealing 32 bytes cannot fail");
    format!("{}{}", hex::encode(nonce), hex::encode(sealed))
}

pub fn unseal_secret(join_secret: &str, join_nonce: &str, sealed: &str) -> Option<Vec<u8>> {
    let bytes = hex::decode(sealed).ok()?;
    if bytes.len() < 12 {
        return None;
    }
    let cipher = ChaCha20Poly1305::new(&seal_key(join_secret, join_nonce));
    cipher
        .decrypt(Nonce::from_slice(&bytes[..12]), &bytes[12..])
        .ok()
}

fn node_key(cluster_secret: &[u8], node: NodeId) -> Vec<u8> {
    mac(cluster_secret, &[b"node", &node.0.to_be_bytes()])
        .finalize()
        .into_bytes()
        .to_vec()
}

fn body_digest(body: &[u8]) -> Vec<u8> {
    Sha256::digest(body).to_vec()
}

/// The MAC of a node-to-node request: method, path, time and a digest of
/// the body, under the sending node's key.
fn request_mac(
    cluster_secret: &[u8],
    node: NodeId,
    method: &str,
    path: &str,
    time_ms: u64,
    body: &[u8],
) -> HmacSha256 {
    let key = node_key(cluster_secret, node);
    mac(
        &key,
        &[
            method.as_bytes(),
            path.as_bytes(),
            &time_ms.to_be_bytes(),
            &body_digest(body),
        ],
    )
}

/// The MAC header value of a node-to-node request.
pub fn sign_request(
    cluster_secret: &[u8],
    node: NodeId,
    method: &str,
    path: &str,
    time_ms: u64,
    body: &[u8],
) -> String {
    hex::encode(
        request_mac(cluster_secret, node, method, path, time_ms, body)
            .finalize()
            .into_bytes(),
    )
}

pub fn request_mac_matches(
    cluster_secret: &[u8],
    node: NodeId,
    method: &str,
    path: &str,
    time_ms: u64,
    body: &[u8],
    mac_value: &str,
) -> bool {
    match hex::decode(mac_value) {
        // `verify_slice` compares in constant time.
        Ok(expected) => request_mac(cluster_secret, node, method, path, time_ms, body)
            .verify_slice(&expected)
            .is_ok(),
        Err(_) => false,
    }
}

/// The token clients present; derived, so every member knows it.
pub fn admin_token(cluster_secret: &[u8]) -> String {
    format!("trmadm-{}", mac_hex(cluster_secret, &[b"admin"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        let token = JoinToken {
            cluster_id: random_hex(8),
            secret: random_hex(32),
        };
        assert_eq!(JoinToken::parse(&token.to_string()).unwrap(), token);
        for bad in ["", "TRM1", "TRM2-ab-cd", "TRM1-xyz-00", "TRM1-ab-cd-ef"] {
            assert!(JoinToken::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sealed_secret_opens_only_with_the_right_token_and_nonce() {
        let secret = [7u8; 32];
        let sealed = seal_secret("join", "nonce-1", &secret);
        assert_eq!(unseal_secret("join", "nonce-1", &sealed).unwrap(), secret);
        assert!(unseal_secret("other", "nonce-1", &sealed).is_none());
        assert!(unseal_secret("join", "nonce-2", &sealed).is_none());
    }

    #[test]
    fn request_signatures_bind_node_path_time_and_body() {
        let secret = [1u8; 32];
        let mac = sign_request(&secret, NodeId(2), "POST", "/x", 10, b"body");
        assert!(request_mac_matches(
            &secret,
            NodeId(2),
            "POST",
            "/x",
            10,
            b"body",
            &mac
        ));
        // (secret, node, path, time, body), each differing in one field.
        type Request<'a> = (&'a [u8], NodeId, &'a str, u64, &'a [u8]);
        let tampered: [Request; 5] = [
            (&secret, NodeId(3), "/x", 10, b"body"),
            (&secret, NodeId(2), "/y", 10, b"body"),
            (&secret, NodeId(2), "/x", 11, b"body"),
            (&secret, NodeId(2), "/x", 10, b"bodY"),
            (&[2u8; 32], NodeId(2), "/x", 10, b"body"),
        ];
        for (key, node, path, time, body) in tampered {
            assert!(!request_mac_matches(
                key, node, "POST", path, time, body, &mac
            ));
        }
    }
}
