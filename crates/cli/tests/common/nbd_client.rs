//! A small synchronous NBD client for tests: fixed newstyle handshake with
//! NBD_OPT_GO, simple replies only (no structured replies negotiated), and
//! READ, WRITE (optionally FUA), FLUSH, TRIM, WRITE_ZEROES, DISC.
//!
//! One request at a time per connection, so which write was acknowledged
//! before which flush is exact — that is what the crash checker needs.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1;

pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;

pub const EIO: u32 = 5;
pub const ENOSPC: u32 = 28;

/// What went wrong with one request.
#[derive(Debug)]
pub enum NbdError {
    /// The server answered with this NBD error number (EIO = 5, ENOSPC = 28...).
    Server(u32),
    /// The connection failed (reset, timeout, protocol violation).
    Io(io::Error),
}

impl From<io::Error> for NbdError {
    fn from(e: io::Error) -> Self {
        NbdError::Io(e)
    }
}

impl std::fmt::Display for NbdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NbdError::Server(e) => write!(f, "server error {e}"),
            NbdError::Io(e) => write!(f, "connection error: {e}"),
        }
    }
}

pub struct NbdClient {
    s: TcpStream,
    pub size: u64,
    pub flags: u16,
    cookie: u64,
}

fn proto(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl NbdClient {
    /// Connect to 127.0.0.1:port and open export `name` with NBD_OPT_GO.
    pub fn connect(port: u16, name: &str) -> io::Result<NbdClient> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        let mut c = NbdClient {
            s,
            size: 0,
            flags: 0,
            cookie: 1,
        };
        c.handshake(name)?;
        Ok(c)
    }

    fn read_u16(&mut self) -> io::Result<u16> {
        let mut b = [0u8; 2];
        self.s.read_exact(&mut b)?;
        Ok(u16::from_be_bytes(b))
    }
    fn read_u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.s.read_exact(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn read_u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    fn handshake(&mut self, name: &str) -> io::Result<()> {
        let m = self.read_u64()?;
        if m != NBDMAGIC {
            return Err(proto(format!("bad server magic {m:#x}")));
        }
        let m = self.read_u64()?;
        if m != IHAVEOPT {
            return Err(proto(format!("not newstyle: {m:#x}")));
        }
        let hflags = self.read_u16()?;
        if hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(proto("server is not fixed newstyle".into()));
        }
        let cflags = (hflags & (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)) as u32;
        self.s.write_all(&cflags.to_be_bytes())?;

        // NBD_OPT_GO: name length, name, no info requests.
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut msg = Vec::new();
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
        msg.extend_from_slice(&data);
        self.s.write_all(&msg)?;

        let mut got_export = false;
        loop {
            let magic = self.read_u64()?;
            if magic != OPT_REPLY_MAGIC {
                return Err(proto(format!("bad option reply magic {magic:#x}")));
            }
            let opt = self.read_u32()?;
            if opt != OPT_GO {
                return Err(proto(format!("reply to option {opt}, expected GO")));
            }
            let typ = self.read_u32()?;
            let len = self.read_u32()? as usize;
            if len > 1 << 20 {
                return Err(proto(format!("option reply too long: {len}")));
            }
            let mut body = vec![0u8; len];
            self.s.read_exact(&mut body)?;
            if typ & 0x8000_0000 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "NBD_OPT_GO refused: error reply {typ:#x}: {}",
                        String::from_utf8_lossy(&body)
                    ),
                ));
            }
            match typ {
                REP_ACK => break,
                REP_INFO => {
                    if len >= 2 && u16::from_be_bytes([body[0], body[1]]) == INFO_EXPORT {
                        if len < 12 {
                            return Err(proto("short NBD_INFO_EXPORT".into()));
                        }
                        self.size = u64::from_be_bytes(body[2..10].try_into().unwrap());
                        self.flags = u16::from_be_bytes([body[10], body[11]]);
                        got_export = true;
                    }
                }
                other => return Err(proto(format!("unexpected option reply type {other}"))),
            }
        }
        if !got_export {
            return Err(proto("server sent no NBD_INFO_EXPORT".into()));
        }
        Ok(())
    }

    /// Send one request; returns the cookie.
    fn send(
        &mut self,
        flags: u16,
        typ: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> io::Result<u64> {
        let cookie = self.cookie;
        self.cookie += 1;
        let mut msg = Vec::with_capacity(28 + data.len());
        msg.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        msg.extend_from_slice(&flags.to_be_bytes());
        msg.extend_from_slice(&typ.to_be_bytes());
        msg.extend_from_slice(&cookie.to_be_bytes());
        msg.extend_from_slice(&offset.to_be_bytes());
        msg.extend_from_slice(&len.to_be_bytes());
        msg.extend_from_slice(data);
        self.s.write_all(&msg)?;
        Ok(cookie)
    }

    /// Read one simple reply header; returns the error field.
    fn reply(&mut self, cookie: u64) -> io::Result<u32> {
        let magic = self.read_u32()?;
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(proto(format!("bad reply magic {magic:#x}")));
        }
        let err = self.read_u32()?;
        let c = self.read_u64()?;
        if c != cookie {
            return Err(proto(format!("reply cookie {c} != {cookie}")));
        }
        Ok(err)
    }

    fn simple(
        &mut self,
        flags: u16,
        typ: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> Result<(), NbdError> {
        let cookie = self.send(flags, typ, offset, len, data)?;
        match self.reply(cookie)? {
            0 => Ok(()),
            e => Err(NbdError::Server(e)),
        }
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, NbdError> {
        let cookie = self.send(0, CMD_READ, offset, len, &[])?;
        match self.reply(cookie)? {
            0 => {
                let mut buf = vec![0u8; len as usize];
                self.s.read_exact(&mut buf)?;
                Ok(buf)
            }
            e => Err(NbdError::Server(e)),
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), NbdError> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.simple(flags, CMD_WRITE, offset, data.len() as u32, data)
    }

    pub fn flush(&mut self) -> Result<(), NbdError> {
        self.simple(0, CMD_FLUSH, 0, 0, &[])
    }

    pub fn trim(&mut self, offset: u64, len: u32) -> Result<(), NbdError> {
        self.simple(0, CMD_TRIM, offset, len, &[])
    }

    pub fn write_zeroes(&mut self, offset: u64, len: u32, fua: bool) -> Result<(), NbdError> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.simple(flags, CMD_WRITE_ZEROES, offset, len, &[])
    }

    /// NBD_CMD_DISC: polite goodbye (no reply).
    pub fn disconnect(mut self) {
        let _ = self.send(0, CMD_DISC, 0, 0, &[]);
    }
}

/// A 4 KiB block that names itself: magic, block number, generation, then
/// filler derived from both. Generation 0 is the all-zero block.
pub fn pattern(block: u64, gen: u64) -> Vec<u8> {
    let mut v = vec![0u8; 4096];
    if gen == 0 {
        return v;
    }
    v[0..8].copy_from_slice(b"TRIREME!");
    v[8..16].copy_from_slice(&block.to_le_bytes());
    v[16..24].copy_from_slice(&gen.to_le_bytes());
    let mut rng = super::Rng::new(block.wrapping_mul(1_000_003) ^ gen.rotate_left(32));
    rng.fill(&mut v[24..]);
    v
}

/// Decode a block written with [`pattern`]: Some((block, gen)) when the whole
/// block is exactly one such pattern (gen 0 = zeroes), None when torn/garbage.
pub fn decode(buf: &[u8]) -> Option<(u64, u64)> {
    if buf.iter().all(|&b| b == 0) {
        return Some((u64::MAX, 0));
    }
    if &buf[0..8] != b"TRIREME!" {
        return None;
    }
    let block = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let gen = u64::from_le_bytes(buf[16..24].try_into().unwrap());
    if pattern(block, gen) == buf {
        Some((block, gen))
    } else {
        None
    }
}
