//! trireme's node daemon: one process per machine that owns the local
//! storage pools, serves their volumes over NBD and answers the REST API.
//!
//! `trireme node run` calls [`daemon::run`]; everything else here is what it
//! wires together.
//!
//! ## Data directory
//!
//! ```text
//! DATA/
//!   cluster.json               cluster id, this node's id, the cluster secret (cluster)
//!   control.redb               the Raft log, vote and snapshots (cluster)
//!   admin.token                the token remote API clients present
//!   catalog.json               the pools of this node (name, id, class, paths);
//!                              replaced atomically: write catalog.json.tmp,
//!                              fsync it, rename over catalog.json, fsync DATA/
//!   pools/NAME/metadata.redb   each pool's metadata database (owned by the store)
//!   pools/default/pool.img     the default pool's sparse file, made on first start
//!   nbd.sock                   the NBD unix socket (unless --nbd-socket says otherwise)
//!   devices/VOLUME/kernel-nbd  the kernel nbd device (its index) this node made for
//!                              a volume (local_device), reconnected after a restart
//!   devices/VOLUME/fuse        or, without the kernel's nbd module, nbdfuse's mount;
//!                              its file is the loop device's backing file
//!   replication.redb           accepted generations and dirty maps (replication)
//!   node.lock                  held with flock while the node runs: one node
//!                              per data directory
//! ```
//!
//! Volumes live inside pools (the store keeps them); the catalog only knows
//! pools. Volume names are unique across the node's pools, because a volume's
//! name is its NBD export name.
//!
//! ## Modules
//! - [`error`]: `NodeError`, what a node operation can fail with.
//! - [`catalog`]: the pool catalog file and its atomic replacement.
//! - [`space`]: free space of a file system (statvfs), for the default pool.
//! - [`node`]: [`Node`], the pools (online or offline), volume placement and
//!   the cache of opened volumes that the NBD server reads through.
//! - [`cluster`]: membership: the Raft member, the signed node-to-node
//!   client and its protocol, joining, what only the leader does.
//! - [`agent`]: what every node does: reconcile its replicas toward the
//!   cluster state, report its pools.
//! - [`api`]: every HTTP route: the REST API (axum router, request
//!   validation, error mapping, OpenAPI document) under `/api/v1`, and the
//!   node-to-node routes under `/internal/v1`.
//! - [`nbd`]: adapts [`Node`] to the NBD server of `trireme-export`.
//! - [`replicated`]: the engines of volumes attached here, the replica
//!   side of data links, and `DATA/replication.redb`.
//! - [`local_device`]: block devices of volumes for users on this host (the
//!   CSI node plugin), over the node's own NBD socket: the kernel's `nbd`
//!   module (`/dev/nbdN`, set up over generic netlink) where the host has
//!   it, which grows a device in place and keeps I/O waiting across a
//!   daemon restart; else nbdfuse + a loop device.
//! - [`metrics`]: `GET /metrics` (Prometheus) and the I/O rates of
//!   `GET /api/v1/io`.
//! - [`daemon`]: start-up, listeners, the ready line, signals and shutdown.

pub mod agent;
pub mod api;
pub mod catalog;
pub mod cluster;
pub mod daemon;
pub mod error;
pub mod local_device;
pub mod metrics;
pub mod nbd;
pub mod node;
pub mod replicated;
pub mod space;

pub use daemon::{run, DaemonConfig};
pub use error::NodeError;
pub use node::Node;
