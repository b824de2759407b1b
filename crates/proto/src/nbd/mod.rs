//! The NBD protocol, server side, sans-IO.
//!
//! - [`constants`]: magics, option/command/reply numbers, error values and the
//!   limits this server enforces (every limit is a named constant).
//! - [`handshake`]: [`Handshake`], the fixed-newstyle negotiation state
//!   machine. Feed it client bytes; it queues bytes to send and ends in
//!   [`HandshakeStep::Transmission`] or [`HandshakeStep::Close`].
//! - [`request`]: [`RequestDecoder`], which turns a transmission-phase byte
//!   stream into [`Request`]s, and [`validate_request`], the range and flag
//!   checks a server applies before touching the export.
//! - [`reply`]: encoders for simple replies and structured reply chunks.
//!
//! The runtime (`trireme-export`) owns the sockets; nothing here blocks,
//! allocates without a bound, or trusts a length from the network.

pub mod constants;
pub mod handshake;
pub mod reply;
pub mod request;

pub use constants::ErrorCode;
pub use handshake::{CloseReason, ExportCatalog, ExportInfo, Handshake, HandshakeStep, Negotiated};
pub use reply::BlockStatusDescriptor;
pub use request::{validate_request, DecodeError, Request, RequestDecoder, RequestKind};
