//! Numbers of the NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`) and
//! the limits this server puts on what it accepts. Every wire integer is
//! big-endian.

// ---- Handshake magics -------------------------------------------------------

/// ASCII `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// ASCII `IHAVEOPT`: newstyle greeting, and the prefix of every client option.
pub const IHAVEOPT_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// ---- Handshake flags (server, 16 bits) and client flags (32 bits) -----------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;
/// Client flags this server understands; any other bit closes the session.
pub const CLIENT_FLAGS_KNOWN: u32 = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;

// ---- Options -----------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// ---- Option reply types -------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT + 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT + 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT + 3;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERROR_BIT + 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT + 9;

// ---- NBD_REP_INFO types ------------------------------------------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- Transmission flags (16 bits) ---------------------------------------------

pub const TRANSMISSION_HAS_FLAGS: u16 = 1 << 0;
pub const TRANSMISSION_READ_ONLY: u16 = 1 << 1;
pub const TRANSMISSION_SEND_FLUSH: u16 = 1 << 2;
pub const TRANSMISSION_SEND_FUA: u16 = 1 << 3;
pub const TRANSMISSION_SEND_TRIM: u16 = 1 << 5;
pub const TRANSMISSION_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TRANSMISSION_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TRANSMISSION_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- Requests ------------------------------------------------------------------

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// magic u32, flags u16, type u16, cookie u64, offset u64, length u32.
pub const REQUEST_HEADER_BYTES: usize = 28;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISCONNECT: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- Replies -----------------------------------------------------------------------

pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// magic u32, error u32, cookie u64.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// magic u32, flags u16, type u16, cookie u64, length u32.
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// ---- base:allocation ------------------------------------------------------------

pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id this server gives `base:allocation` in NBD_OPT_SET_META_CONTEXT.
/// Any value works; zero is avoided because LIST replies use it as "reserved".
pub const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// ---- Limits of this server ---------------------------------------------------------

/// Largest option payload accepted during the handshake. Real options are a
/// few hundred bytes; a longer one is a hostile or broken client and closes
/// the session, because skipping it would mean reading it.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Options accepted in one handshake before it is treated as a denial of
/// service (`nbdinfo --list` sends about three per export).
pub const MAX_OPTIONS_PER_HANDSHAKE: u32 = 8192;
/// Largest WRITE payload and READ length (the NBD de-facto maximum block size).
/// A longer WRITE cannot be skipped safely, so it closes the connection.
pub const MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;
/// Block size constraints advertised in NBD_INFO_BLOCK_SIZE.
pub const BLOCK_SIZE_MINIMUM_BYTES: u32 = 1;
pub const BLOCK_SIZE_PREFERRED_BYTES: u32 = 4096;
pub const BLOCK_SIZE_MAXIMUM_BYTES: u32 = MAX_PAYLOAD_BYTES;
/// Error messages sent to clients are cut to this many bytes (the spec
/// asks strings to stay under 256 bytes where possible).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 256;
/// Longest block-status descriptor: the u32 maximum rounded down to 4 KiB,
/// so split extents stay block-aligned.
pub const MAX_DESCRIPTOR_LENGTH_BYTES: u32 = u32::MAX / 4096 * 4096;
/// Descriptors in one BLOCK_STATUS reply chunk (8 bytes each: 512 KiB).
pub const MAX_DESCRIPTORS_PER_REPLY: usize = 64 * 1024;

const _: () = assert!(BLOCK_SIZE_MINIMUM_BYTES <= BLOCK_SIZE_PREFERRED_BYTES);
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES <= BLOCK_SIZE_MAXIMUM_BYTES);
const _: () = assert!(MAX_OPTION_BYTES as usize <= u32::MAX as usize);
const _: () = assert!(MAX_ERROR_MESSAGE_BYTES <= u16::MAX as usize);
const _: () = assert!(MAX_DESCRIPTOR_LENGTH_BYTES / 4096 * 4096 == MAX_DESCRIPTOR_LENGTH_BYTES);

// ---- Error values (the `error` field of replies) -------------------------------------

/// An NBD error value. The numbers are the protocol's, not the host's errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// Operation not permitted (write to a read-only export).
    Perm = 1,
    /// Input/output error.
    Io = 5,
    /// Cannot allocate memory.
    NoMemory = 12,
    /// Invalid argument (bad range, unknown command or flag).
    Invalid = 22,
    /// No space left (write past the end, pool full).
    NoSpace = 28,
    /// Value too large.
    Overflow = 75,
    /// Operation not supported (fast zero refused).
    NotSupported = 95,
    /// Server is shutting down.
    Shutdown = 108,
}

impl ErrorCode {
    pub fn as_u32(self) -> u32 {
        self as u32
    }
}
