//! Wire formats of trireme, as sans-IO codecs: bytes in, bytes and events
//! out, no sockets, no clocks, no runtime.
//!
//! - [`nbd`]: the Network Block Device protocol, server side — the
//!   fixed-newstyle handshake state machine ([`nbd::Handshake`]), the
//!   transmission-phase request decoder ([`nbd::RequestDecoder`]) and the
//!   reply encoders ([`nbd::reply`]). `trireme-export` drives them on tokio.

pub mod nbd;
