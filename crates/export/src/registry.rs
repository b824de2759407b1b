//! How the server finds exports: the node implements [`ExportRegistry`].

use std::sync::Arc;

use trireme_proto::nbd::{ExportCatalog, ExportInfo};
use trireme_types::BlockTarget;

use crate::io_stats::VolumeIo;

/// The exports a node offers, by name (the node maps volume name → volume).
pub trait ExportRegistry: Send + Sync + 'static {
    /// The target for `name`, or why no such export is offered now: a
    /// sentence the NBD client shows its user. Called on the network
    /// reactor: it must not block.
    fn open(&self, name: &str) -> Result<Arc<dyn BlockTarget>, String>;
    /// Names listed to clients (NBD_OPT_LIST).
    fn names(&self) -> Vec<String>;
    /// Where the requests of export `name` are counted; looked up once per
    /// connection. None: not counted.
    fn volume_io(&self, _name: &str) -> Option<Arc<VolumeIo>> {
        None
    }
}

/// Adapts a registry to the handshake's catalog.
pub(crate) struct RegistryCatalog<'a>(pub(crate) &'a dyn ExportRegistry);

impl ExportCatalog for RegistryCatalog<'_> {
    fn lookup(&self, name: &str) -> Result<ExportInfo, String> {
        let target = self.0.open(name)?;
        Ok(ExportInfo {
            size_bytes: target.size_bytes(),
            read_only: target.read_only(),
        })
    }

    fn names(&self) -> Vec<String> {
        self.0.names()
    }
}
