//! Listening sockets, the accept loop and shutdown.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::connection;
use crate::registry::ExportRegistry;

/// The IANA NBD port, on loopback: exports are not reachable from other
/// machines unless the operator says so.
pub const DEFAULT_TCP_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 10809));
/// Connections served at once; a connection beyond this is closed on accept.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long connections get to finish their in-flight requests once the
/// server is told to stop; then they are cut.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors) so the loop
/// does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Where to listen. Either listener may be absent, not both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdConfig {
    pub tcp_listen: Option<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            tcp_listen: Some(DEFAULT_TCP_LISTEN),
            unix_socket: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("binding the NBD TCP listener on {address}")]
    BindTcp {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("binding the NBD unix socket at {}", path.display())]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the NBD server has no listener configured (neither TCP nor unix socket)")]
    NoListener,
}

/// A bound NBD server, not yet serving. Binding first lets callers learn the
/// port chosen for `127.0.0.1:0` (and announce it) before they build what
/// the exports need; the registry comes with [`NbdServer::serve`].
pub struct NbdServer {
    tcp: Option<TcpListener>,
    unix: Option<(UnixListener, PathBuf)>,
}

/// Binds and serves until `shutdown` completes.
pub async fn serve(
    config: NbdConfig,
    registry: Arc<dyn ExportRegistry>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ExportError> {
    NbdServer::bind(&config)
        .await?
        .serve(registry, shutdown)
        .await
}

impl NbdServer {
    pub async fn bind(config: &NbdConfig) -> Result<Self, ExportError> {
        if config.tcp_listen.is_none() && config.unix_socket.is_none() {
            return Err(ExportError::NoListener);
        }
        let tcp = match config.tcp_listen {
            Some(address) => Some(
                TcpListener::bind(address)
                    .await
                    .map_err(|source| ExportError::BindTcp { address, source })?,
            ),
            None => None,
        };
        let unix = match &config.unix_socket {
            Some(path) => Some((bind_unix(path)?, path.clone())),
            None => None,
        };
        Ok(NbdServer { tcp, unix })
    }

    /// The bound TCP address (with the real port when 0 was asked for).
    pub fn tcp_local_addr(&self) -> Option<SocketAddr> {
        self.tcp
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    pub fn unix_socket_path(&self) -> Option<&Path> {
        self.unix.as_ref().map(|(_, path)| path.as_path())
    }

    /// Accepts clients and serves them the exports of `registry` until
    /// `shutdown` completes, then lets connections finish in-flight
    /// requests for up to [`SHUTDOWN_GRACE`].
    pub async fn serve(
        self,
        registry: Arc<dyn ExportRegistry>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ExportError> {
        let (stop_sender, stop_receiver) = watch::channel(false);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        info!(tcp = ?self.tcp_local_addr(), unix = ?self.unix_socket_path(), "NBD server listening");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = accept_tcp(self.tcp.as_ref()) => match accepted {
                    Ok((stream, peer)) => {
                        // Replies are latency-bound; Nagle would hold them back.
                        if let Err(error) = stream.set_nodelay(true) {
                            debug!(%peer, %error, "could not set TCP_NODELAY");
                        }
                        let Some(slot) = take_slot(&slots) else { continue };
                        let (reader, writer) = stream.into_split();
                        let (registry, stop) = (registry.clone(), stop_receiver.clone());
                        connections.spawn(async move {
                            let _slot: OwnedSemaphorePermit = slot;
                            connection::run(reader, writer, registry, stop, peer.to_string()).await;
                        });
                    }
                    Err(error) => accept_failed(error).await,
                },
                accepted = accept_unix(self.unix.as_ref().map(|(listener, _)| listener)) => match accepted {
                    Ok(stream) => {
                        let Some(slot) = take_slot(&slots) else { continue };
                        let (reader, writer) = stream.into_split();
                        let (registry, stop) = (registry.clone(), stop_receiver.clone());
                        connections.spawn(async move {
                            let _slot: OwnedSemaphorePermit = slot;
                            connection::run(reader, writer, registry, stop, "unix".to_owned()).await;
                        });
                    }
                    Err(error) => accept_failed(error).await,
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        info!(connections = connections.len(), "NBD server stopping");
        let _ = stop_sender.send(true);
        drop(self.tcp);
        if let Some((listener, path)) = self.unix {
            drop(listener);
            let _ = std::fs::remove_file(&path);
        }
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                connections = connections.len(),
                "NBD connections did not finish in time; cutting them"
            );
            connections.shutdown().await;
        }
        Ok(())
    }
}

fn take_slot(slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    let slot = slots.clone().try_acquire_owned().ok();
    if slot.is_none() {
        warn!("refusing an NBD connection: {MAX_CONNECTIONS} connections already open");
    }
    slot
}

async fn accept_failed(error: std::io::Error) {
    warn!(%error, "accepting an NBD connection failed");
    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
}

async fn accept_tcp(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_unix(listener: Option<&UnixListener>) -> std::io::Result<UnixStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Binds a unix socket, replacing a stale socket file left by a previous
/// run, but never another kind of file.
fn bind_unix(path: &Path) -> Result<UnixListener, ExportError> {
    let failed = |source| ExportError::BindUnix {
        path: path.to_owned(),
        source,
    };
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if metadata.file_type().is_socket() {
            std::fs::remove_file(path).map_err(failed)?;
        }
    }
    UnixListener::bind(path).map_err(failed)
}
