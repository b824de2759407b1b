//! The NBD side of the node: which volume an export name means, and the
//! listeners the NBD server of `trireme-export` serves on.
//!
//! [`NodeExports`] maps an export name to the volume of that name, opened
//! once and cached by [`Node`]; a deleted volume drops out of the cache.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use trireme_types::BlockTarget;

use crate::{Node, NodeError};

/// Export name → volume, for the NBD server.
pub struct NodeExports {
    node: Arc<Node>,
}

impl NodeExports {
    pub fn new(node: Arc<Node>) -> Self {
        NodeExports { node }
    }

    pub fn open(&self, name: &str) -> Option<Arc<dyn BlockTarget>> {
        let volume: Arc<dyn BlockTarget> = self.node.open_volume(name)?;
        Some(volume)
    }

    pub fn names(&self) -> Vec<String> {
        self.node.volume_names()
    }
}

/// Where the NBD server listens.
#[derive(Debug, Clone)]
pub struct NbdListen {
    pub tcp: Option<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
}

/// The NBD listeners, bound and not yet serving.
pub struct BoundNbd {
    pub tcp: Option<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    server: NbdServer,
}

/// A stale socket file from a crashed run would make bind fail; only a
/// socket is removed, never a regular file someone named by mistake.
fn remove_stale_socket(path: &std::path::Path) -> Result<(), NodeError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|error| NodeError::io(format!("remove stale socket {}", path.display()), error)),
        Ok(_) => Err(NodeError::InvalidPath(format!(
            "NBD socket path {} exists and is not a socket: remove it or choose another --nbd-socket",
            path.display()
        ))),
        Err(_) => Ok(()),
    }
}

// Until trireme-export's server lands, the node binds the listeners itself
// and refuses connections politely (closes them), so that addresses, the
// ready line and shutdown already behave as they will.
struct NbdServer {
    tcp: Option<tokio::net::TcpListener>,
    unix: Option<tokio::net::UnixListener>,
    exports: NodeExports,
}

pub async fn bind(listen: NbdListen, exports: NodeExports) -> Result<BoundNbd, NodeError> {
    let tcp = match listen.tcp {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|error| NodeError::io(format!("listen for NBD on {address}"), error))?,
        ),
        None => None,
    };
    let unix = match &listen.unix_socket {
        Some(path) => {
            remove_stale_socket(path)?;
            Some(tokio::net::UnixListener::bind(path).map_err(|error| {
                NodeError::io(format!("listen for NBD on {}", path.display()), error)
            })?)
        }
        None => None,
    };
    let tcp_address = match &tcp {
        Some(listener) => Some(
            listener
                .local_addr()
                .map_err(|error| NodeError::io("read the NBD listen address", error))?,
        ),
        None => None,
    };
    Ok(BoundNbd {
        tcp: tcp_address,
        unix_socket: listen.unix_socket,
        server: NbdServer { tcp, unix, exports },
    })
}

impl BoundNbd {
    /// Serves until `shutdown` completes, then closes the listeners.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), NodeError> {
        let NbdServer { tcp, unix, exports } = self.server;
        tracing::warn!(
            exports = exports.names().len(),
            "the NBD server is not built in yet: connections are closed"
        );
        let accept_tcp = async {
            match &tcp {
                Some(listener) => loop {
                    let _ = listener.accept().await;
                },
                None => std::future::pending::<()>().await,
            }
        };
        let accept_unix = async {
            match &unix {
                Some(listener) => loop {
                    let _ = listener.accept().await;
                },
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = shutdown => {}
            _ = accept_tcp => {}
            _ = accept_unix => {}
        }
        if let Some(path) = &self.unix_socket {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }
}
