//! The client side of the NBD handshake, just enough to hand a connection
//! to the kernel: fixed newstyle, one `NBD_OPT_GO` for the volume's export,
//! no structured replies (the kernel's `nbd` driver reads simple replies
//! only). What comes back is a socket in the transmission phase and what
//! the kernel must be told about the export (its size and transmission
//! flags).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use trireme_proto::nbd::constants::{
    CLIENT_FLAG_FIXED_NEWSTYLE, CLIENT_FLAG_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES,
    IHAVEOPT_MAGIC, INFO_EXPORT, NBD_MAGIC, OPTION_REPLY_MAGIC, OPT_GO, REP_ACK, REP_ERR_UNKNOWN,
    REP_INFO,
};

/// How long one read or write of the handshake may take: the daemon
/// answers its own socket at once unless it is stuck.
const HANDSHAKE_IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest option reply read: an error text or an info block. A
/// longer one is a broken server, not something to allocate for.
const MAX_REPLY_BYTES: u32 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("connecting to this node's NBD socket {socket}: {source}")]
    Connect {
        socket: String,
        source: std::io::Error,
    },
    #[error("NBD handshake with this node's socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("NBD handshake with this node's socket: {0}")]
    Protocol(String),
    /// The export is not (yet) served: the agent applies an attach a
    /// moment after it is committed.
    #[error("this node does not serve an NBD export named '{volume}' (yet): {message}")]
    NoExport { volume: String, message: String },
}

/// An export opened for transmission.
#[derive(Debug)]
pub struct Opened {
    pub stream: UnixStream,
    pub size_bytes: u64,
    /// The transmission flags, as the kernel's NBD_ATTR_SERVER_FLAGS wants.
    pub transmission_flags: u16,
}

fn read_u16(stream: &mut UnixStream) -> std::io::Result<u16> {
    let mut bytes = [0; 2];
    stream.read_exact(&mut bytes)?;
    Ok(u16::from_be_bytes(bytes))
}

fn read_u32(stream: &mut UnixStream) -> std::io::Result<u32> {
    let mut bytes = [0; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn read_u64(stream: &mut UnixStream) -> std::io::Result<u64> {
    let mut bytes = [0; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

/// The bytes of `NBD_OPT_GO` for `export`, asking for no information
/// beyond the mandatory NBD_INFO_EXPORT.
pub fn go_option(export: &str) -> Vec<u8> {
    let name = export.as_bytes();
    let mut data = Vec::with_capacity(6 + name.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(&0u16.to_be_bytes());
    let mut option = Vec::with_capacity(16 + data.len());
    option.extend_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    option.extend_from_slice(&OPT_GO.to_be_bytes());
    option.extend_from_slice(&(data.len() as u32).to_be_bytes());
    option.extend_from_slice(&data);
    option
}

/// Connects to `socket` and opens `export` for transmission.
pub fn open(socket: &Path, export: &str) -> Result<Opened, HandshakeError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| HandshakeError::Connect {
        socket: socket.display().to_string(),
        source,
    })?;
    stream.set_read_timeout(Some(HANDSHAKE_IO_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDSHAKE_IO_TIMEOUT))?;
    if read_u64(&mut stream)? != NBD_MAGIC || read_u64(&mut stream)? != IHAVEOPT_MAGIC {
        return Err(HandshakeError::Protocol(
            "the server did not greet in newstyle".into(),
        ));
    }
    let server_flags = read_u16(&mut stream)?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::Protocol(
            "the server does not offer fixed newstyle".into(),
        ));
    }
    let mut client_flags = CLIENT_FLAG_FIXED_NEWSTYLE;
    if server_flags & FLAG_NO_ZEROES != 0 {
        client_flags |= CLIENT_FLAG_NO_ZEROES;
    }
    stream.write_all(&client_flags.to_be_bytes())?;
    stream.write_all(&go_option(export))?;
    let mut export_info = None;
    loop {
        if read_u64(&mut stream)? != OPTION_REPLY_MAGIC {
            return Err(HandshakeError::Protocol("a bad option reply magic".into()));
        }
        let option = read_u32(&mut stream)?;
        let reply_type = read_u32(&mut stream)?;
        let length = read_u32(&mut stream)?;
        if option != OPT_GO {
            return Err(HandshakeError::Protocol(format!(
                "a reply to option {option}, not to NBD_OPT_GO"
            )));
        }
        if length > MAX_REPLY_BYTES {
            return Err(HandshakeError::Protocol(format!(
                "an option reply of {length} bytes"
            )));
        }
        let mut data = vec![0; length as usize];
        stream.read_exact(&mut data)?;
        match reply_type {
            REP_ACK => break,
            REP_INFO => {
                if let Some(info) = parse_export_info(&data) {
                    export_info = Some(info);
                }
            }
            REP_ERR_UNKNOWN => {
                return Err(HandshakeError::NoExport {
                    volume: export.to_string(),
                    message: String::from_utf8_lossy(&data).into_owned(),
                })
            }
            error if error & (1 << 31) != 0 => {
                return Err(HandshakeError::Protocol(format!(
                    "NBD_OPT_GO refused ({error:#x}): {}",
                    String::from_utf8_lossy(&data)
                )))
            }
            other => {
                return Err(HandshakeError::Protocol(format!(
                    "an unexpected reply type {other} to NBD_OPT_GO"
                )))
            }
        }
    }
    let (size_bytes, transmission_flags) = export_info.ok_or_else(|| {
        HandshakeError::Protocol("NBD_OPT_GO succeeded without NBD_INFO_EXPORT".into())
    })?;
    // The kernel owns the socket from here on: its own timeouts apply.
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(Opened {
        stream,
        size_bytes,
        transmission_flags,
    })
}

/// NBD_INFO_EXPORT: type (u16), size (u64), transmission flags (u16).
fn parse_export_info(data: &[u8]) -> Option<(u64, u16)> {
    if data.len() != 12 || u16::from_be_bytes([data[0], data[1]]) != INFO_EXPORT {
        return None;
    }
    let size = u64::from_be_bytes(data[2..10].try_into().ok()?);
    let flags = u16::from_be_bytes([data[10], data[11]]);
    Some((size, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_names_the_export_and_asks_for_no_more_information() {
        let bytes = go_option("pvc-1");
        assert_eq!(&bytes[0..8], b"IHAVEOPT");
        assert_eq!(u32::from_be_bytes(bytes[8..12].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_be_bytes(bytes[12..16].try_into().unwrap()),
            4 + 5 + 2
        );
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 5);
        assert_eq!(&bytes[20..25], b"pvc-1");
        assert_eq!(&bytes[25..27], &[0, 0]);
    }

    #[test]
    fn only_a_whole_export_info_block_is_read() {
        let mut block = vec![0, 0];
        block.extend_from_slice(&(64u64 << 20).to_be_bytes());
        block.extend_from_slice(&0x012du16.to_be_bytes());
        assert_eq!(parse_export_info(&block), Some((64 << 20, 0x012d)));
        assert_eq!(parse_export_info(&block[..11]), None);
        block[1] = 3;
        assert_eq!(parse_export_info(&block), None);
    }
}
