//! The NBD side of the node: [`NodeExports`] maps an export name to the
//! volume of that name for the NBD server of `trireme-export`.
//!
//! Volumes are opened once and cached by [`Node`]; a deleted volume drops
//! out of the cache (its old handle answers `ShuttingDown`).

use std::sync::Arc;
use tokio::runtime::{Handle, RuntimeFlavor};
use trireme_export::ExportRegistry;
use trireme_types::BlockTarget;

use crate::Node;

pub use trireme_export::{NbdConfig, NbdServer};

/// Export name → volume, for the NBD server.
pub struct NodeExports {
    node: Arc<Node>,
}

impl NodeExports {
    pub fn new(node: Arc<Node>) -> Self {
        NodeExports { node }
    }
}

/// The server calls the registry on the network reactor. A cached volume
/// costs one uncontended lock; opening one reads pool metadata, so that
/// path tells tokio the thread blocks (other tasks move to other workers).
fn without_stalling_the_reactor<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

impl ExportRegistry for NodeExports {
    fn open(&self, name: &str) -> Option<Arc<dyn BlockTarget>> {
        let volume: Arc<dyn BlockTarget> = match self.node.cached_volume(name) {
            Some(volume) => volume,
            None => without_stalling_the_reactor(|| self.node.open_volume(name))?,
        };
        Some(volume)
    }

    fn names(&self) -> Vec<String> {
        without_stalling_the_reactor(|| self.node.volume_names())
    }
}
