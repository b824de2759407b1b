//! The NBD server: serves [`BlockTarget`](trireme_types::BlockTarget)s to
//! QEMU, `nbd-client`, libnbd tools (`nbdinfo`, `nbdcopy`, `nbdfuse`) and
//! fio over TCP (default `127.0.0.1:10809`) and a unix socket.
//!
//! The protocol itself is the sans-IO codec in `trireme_proto::nbd`; this
//! crate owns the sockets, the tasks and the limits.
//!
//! - [`server`]: [`NbdConfig`], [`NbdServer`] (bind, then serve until the
//!   shutdown future completes) and [`serve`]. The accept loops, the bound on
//!   connections ([`server::MAX_CONNECTIONS`]) and the shutdown grace period.
//! - [`registry`]: [`ExportRegistry`], what the node implements to map an
//!   export name (a volume name) to a `BlockTarget`.
//! - `connection`: one client: the handshake, then a reader that decodes
//!   requests and hands each to a blocking thread, and a writer task that
//!   sends replies as they complete, out of order. In-flight requests and
//!   payload bytes are bounded per connection.
//! - [`io_stats`]: [`VolumeIo`], per-volume request accounting (operations,
//!   bytes, latency histograms, in flight) on atomics, read by `/metrics`.
//! - `dispatch`: runs one request against the target on a blocking thread
//!   and encodes its reply; maps `TargetError` to NBD errors.
//!
//! ```no_run
//! # async fn example(registry: std::sync::Arc<dyn trireme_export::ExportRegistry>) {
//! use trireme_export::{NbdConfig, NbdServer};
//! let server = NbdServer::bind(&NbdConfig::default()).await.unwrap();
//! println!("NBD on {:?}", server.tcp_local_addr());
//! server.serve(registry, async { let _ = tokio::signal::ctrl_c().await; }).await.unwrap();
//! # }
//! ```

mod connection;
mod dispatch;
pub mod io_stats;
pub mod registry;
pub mod server;

pub use io_stats::{IoKind, VolumeIo, VolumeIoSnapshot};
pub use registry::ExportRegistry;
pub use server::{serve, ExportError, NbdConfig, NbdServer};
