//! trireme's CSI driver (`csi.trireme.io`): the Identity, Controller and
//! Node services of the Container Storage Interface on a unix socket.
//!
//! - [`api`]: the cluster's REST API, the driver's only way to the cluster.
//! - [`names`]: CSI names and ids to trireme names.
//! - [`status`]: the CSI status code of each API failure.
//! - [`identity`]: the driver's name and capabilities.
//! - [`controller`]: volumes, attachments, snapshots, capacity, expansion
//!   (`create`, `publish`, `snapshots`, `topology` inside).
//! - [`node`]: staging a volume: its block device from the node daemon on
//!   this host, file systems, bind mounts.
//!
//! The NBD server and the bridge to a block device (nbdfuse + a loop
//! device) stay in the node daemon on the host: this process only asks
//! for the device and mounts, so a restart of the driver, or of the
//! container it runs in, interrupts no I/O.

pub mod api;
pub mod controller;
pub mod identity;
pub mod names;
pub mod node;
pub mod status;

pub mod csi {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

/// Which services this process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Controller,
    Node,
    All,
}

impl Mode {
    pub fn controller(self) -> bool {
        matches!(self, Mode::Controller | Mode::All)
    }

    pub fn node(self) -> bool {
        matches!(self, Mode::Node | Mode::All)
    }
}

/// Whether volumes in use may grow: what Identity advertises (one answer
/// for the whole plugin, asked of the controller by csi-resizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Expansion {
    /// Volumes grow while published: the file system grows at once
    /// (NodeExpandVolume on the mounted volume). Every node must have the
    /// kernel `nbd` module: an nbdfuse device keeps its size until staged
    /// again.
    Online,
    /// Volumes grow only while no pod uses them; the file system grows at
    /// the next stage.
    Offline,
    /// Online if this host has the kernel `nbd` module
    /// (`/sys/module/nbd`), else offline.
    Auto,
}

impl Expansion {
    /// `Auto` decided by this host.
    pub fn resolve(self) -> Expansion {
        match self {
            Expansion::Auto if std::path::Path::new("/sys/module/nbd").exists() => {
                Expansion::Online
            }
            Expansion::Auto => Expansion::Offline,
            chosen => chosen,
        }
    }
}

/// What the node service needs to know about its machine.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The trireme node name of this machine: the CSI node id.
    pub node_name: String,
}

/// The driver: one value serves all three services.
#[derive(Debug, Clone)]
pub struct Driver {
    pub mode: Mode,
    /// Online or offline (never `Auto`: resolved at start).
    pub expansion: Expansion,
    pub api: api::Api,
    pub node: Option<NodeConfig>,
}

impl Driver {
    /// The API with the token of an RPC's secrets (key `token`), if any.
    pub fn api_for(&self, secrets: &std::collections::HashMap<String, String>) -> api::Api {
        self.api
            .with_token(secrets.get("token").map(String::as_str))
    }
}
