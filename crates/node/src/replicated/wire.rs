//! Data links on the wire: length-prefixed frames, and the signed preamble
//! that opens a link.
//!
//! A primary opens one TCP connection per volume and replica node. Its
//! first frame is a [`LinkOpen`] (JSON) signed with the cluster secret, so
//! only members can write to a replica; the replica answers one frame, an
//! empty one for yes or a reason for no. After that, each frame is one
//! encoded `ToReplica` or `FromReplica` message.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use tokio::io::{AsyncRead, AsyncReadExt};
use trireme_replication::message::MAX_FRAME_BYTES;
use trireme_types::NodeId;

use crate::cluster::auth;

/// A link's preamble may be this old (clock skew between nodes included).
const PREAMBLE_MAX_AGE_MS: u64 = 5 * 60 * 1000;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkOpen {
    pub volume: String,
    pub from: NodeId,
    pub time_ms: u64,
    pub mac: String,
}

impl LinkOpen {
    pub fn signed(cluster_secret: &[u8], volume: &str, from: NodeId) -> LinkOpen {
        let time_ms = auth::now_ms();
        LinkOpen {
            volume: volume.to_string(),
            from,
            time_ms,
            mac: auth::sign_request(cluster_secret, from, "LINK", volume, time_ms, b""),
        }
    }

    pub fn verify(&self, cluster_secret: &[u8]) -> Result<(), String> {
        let age = auth::now_ms().abs_diff(self.time_ms);
        if age > PREAMBLE_MAX_AGE_MS {
            return Err(format!(
                "link preamble is {age} ms old; are the nodes' clocks far apart?"
            ));
        }
        if !auth::request_mac_matches(
            cluster_secret,
            self.from,
            "LINK",
            &self.volume,
            self.time_ms,
            b"",
            &self.mac,
        ) {
            return Err("link preamble has a bad signature".into());
        }
        Ok(())
    }
}

/// Appends a frame: its length (u32, little endian), then `body`.
pub fn push_frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let length = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&length.to_le_bytes());
}

fn check_length(length: usize) -> io::Result<()> {
    if length > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    Ok(())
}

/// Reads one frame into `buffer` (blocking).
pub fn read_frame(reader: &mut impl Read, buffer: &mut Vec<u8>) -> io::Result<()> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length)?;
    let length = u32::from_le_bytes(length) as usize;
    check_length(length)?;
    buffer.clear();
    buffer.resize(length, 0);
    reader.read_exact(buffer)
}

pub fn write_frame(writer: &mut impl Write, body: &[u8]) -> io::Result<()> {
    writer.write_all(&(body.len() as u32).to_le_bytes())?;
    writer.write_all(body)
}

/// Reads one frame (async).
pub async fn read_frame_async(
    reader: &mut (impl AsyncRead + Unpin),
    buffer: &mut Vec<u8>,
) -> io::Result<()> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length).await?;
    let length = u32::from_le_bytes(length) as usize;
    check_length(length)?;
    buffer.clear();
    buffer.resize(length, 0);
    reader.read_exact(buffer).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut out = Vec::new();
        push_frame(&mut out, |body| body.extend_from_slice(b"hello"));
        let mut buffer = Vec::new();
        read_frame(&mut out.as_slice(), &mut buffer).unwrap();
        assert_eq!(buffer, b"hello");
        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes();
        assert!(read_frame(&mut huge.as_slice(), &mut buffer).is_err());
    }

    #[test]
    fn a_preamble_signed_with_another_secret_is_refused() {
        let open = LinkOpen::signed(b"secret-a", "vol", NodeId(2));
        assert!(open.verify(b"secret-a").is_ok());
        assert!(open.verify(b"secret-b").is_err());
    }
}
