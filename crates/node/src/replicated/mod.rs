//! The node's replication: the engines of the volumes attached here and
//! the replica service for the copies held here. The protocol itself is
//! `trireme-replication`; this module gives it sockets, disks and the
//! control plane, which it sees only through
//! [`ControlPort`](crate::cluster::replication_port::ControlPort) (the
//! state, proposals, this node's id and the link secret).
//!
//! - [`meta`]: `DATA/replication.redb` (accepted generations, dirty maps).
//! - [`wire`]: frames and the signed link preamble.
//! - [`serve`]: the replica side of data links, on the local store.
//! - [`engine`]: a primary engine under tokio.
//! - `local`: the engine's link to this node's own copy, in-process.
//! - [`volume`]: an attached volume as an NBD target.
//! - [`snapshots`]: snapshots, rollbacks and fencing on this node.
//! - `clock`: the clock of timeouts and read leases (`CLOCK_BOOTTIME`).
//! - [`resync`]: resyncs of detached volumes (a resync-only engine on the
//!   node of an up-to-date replica).

mod clock;
pub mod engine;
mod local;
pub mod meta;
pub mod resync;
pub mod serve;
pub mod snapshots;
pub mod volume;
pub mod wire;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use trireme_control::{Command, ReplicaKind, VolumeRecord};
use trireme_types::{BlockTarget, NodeId, VolumeName};

pub use engine::EngineHandle;
pub use meta::ReplicationMeta;
use serve::ReplicaService;

use crate::cluster::auth;
use crate::cluster::replication_port::ControlPort;
use crate::{Node, NodeError};

pub struct Replication {
    /// Itself, for the NBD targets it hands out (they find an engine's
    /// successor here).
    this: std::sync::Weak<Replication>,
    node: Arc<Node>,
    /// `HOST:PORT` other nodes open data links to.
    data_address: String,
    meta: Arc<ReplicationMeta>,
    control: Arc<dyn ControlPort>,
    service: Arc<ReplicaService>,
    engines: Mutex<BTreeMap<VolumeName, Arc<EngineHandle>>>,
    /// Snapshots this node's engines are taking (asked once each).
    taking: Mutex<std::collections::BTreeSet<(VolumeName, trireme_types::SnapshotId)>>,
}

impl Replication {
    /// The node's replication, once the node is a member of its cluster
    /// (links are signed with the cluster secret); `data_address` is where
    /// other nodes reach this one's [`Replication::listen`].
    pub fn open(
        node: Arc<Node>,
        control: Arc<dyn ControlPort>,
        data_address: String,
    ) -> Result<Arc<Replication>, NodeError> {
        let meta = Arc::new(ReplicationMeta::open(node.data_dir())?);
        let service = ReplicaService::new(node.clone(), control.clone(), meta.clone());
        Ok(Arc::new_cyclic(|this| Replication {
            this: this.clone(),
            node,
            data_address,
            meta,
            control,
            service,
            engines: Mutex::new(BTreeMap::new()),
            taking: Mutex::new(Default::default()),
        }))
    }

    /// Serves data links on `listener`.
    pub fn listen(&self, listener: TcpListener) {
        self.service.listen(listener);
    }

    fn engine(&self, name: &VolumeName) -> Option<Arc<EngineHandle>> {
        let engines = self.engines.lock().expect("engines lock");
        engines
            .get(name)
            .filter(|engine| !engine.is_stopped())
            .cloned()
    }

    /// The engine of a volume attached here, while it runs.
    pub fn engine_handle(&self, name: &VolumeName) -> Option<Arc<EngineHandle>> {
        self.engine(name)
    }

    /// The running engines (of volumes attached here, or resyncing from here).
    pub fn engines(&self) -> Vec<Arc<EngineHandle>> {
        let engines = self.engines.lock().expect("engines lock");
        engines
            .values()
            .filter(|engine| !engine.is_stopped())
            .cloned()
            .collect()
    }

    /// The NBD target of a volume attached here, while its engine runs
    /// (a resync-only engine serves no client).
    pub fn target(&self, name: &VolumeName) -> Option<Arc<dyn BlockTarget>> {
        let engine = self.target_engine(name)?;
        Some(Arc::new(volume::ReplicatedVolume::new(
            name.clone(),
            self.this.clone(),
            engine,
        )))
    }

    /// The running engine that serves clients of `name` here.
    fn target_engine(&self, name: &VolumeName) -> Option<Arc<EngineHandle>> {
        self.engine(name).filter(|engine| !engine.resync_only)
    }

    /// Whether `name` is attached here by the local copy of the state.
    pub fn attached_here(&self, name: &VolumeName) -> Option<bool> {
        let state = self.control.state().read();
        let volume = state.volumes.get(name)?;
        Some(volume.is_attached_on(self.control.node_id()))
    }

    /// A replica deleted here: its replication state goes too.
    pub fn forget(&self, name: &VolumeName) {
        if let Err(error) = self.service.forget(name) {
            tracing::warn!(%error, volume = %name, "cannot forget replication state");
        }
    }

    /// Starts the engines of volumes attached here, and forgets the ones
    /// that stopped. Called by the agent on every change of the state.
    pub async fn reconcile(&self) -> Result<(), NodeError> {
        let (control, service) = (&self.control, &self.service);
        let me = control.node_id();
        let (attached, settings_rate): (Vec<(VolumeRecord, trireme_control::QuorumPolicy)>, u64) = {
            let state = control.state().read();
            let attached = state
                .volumes
                .values()
                .filter(|volume| !volume.deleting && volume.primaries.iter().any(|p| p.node == me))
                .map(|volume| {
                    let policy = state
                        .groups
                        .get(&volume.group)
                        .map(|group| group.on_no_quorum)
                        .unwrap_or(trireme_control::QuorumPolicy::IoError);
                    (volume.clone(), policy)
                })
                .collect();
            (attached, state.settings.resync_rate_bytes_per_sec)
        };
        self.report_data_address().await;
        {
            let mut engines = self.engines.lock().expect("engines lock");
            engines.retain(|_, engine| !engine.is_stopped());
        }
        let finished = self.drive_resyncs().await;
        for (record, policy) in attached {
            let running = self.engine(&record.name);
            if running.is_some_and(|engine| engine.generation == record.generation) {
                continue;
            }
            if finished.contains(&record.name) {
                // A resync that is over is not started again; its end is
                // retried.
                continue;
            }
            let name = record.name.clone();
            let ran_before = service.primary_at(&name)? == Some(record.generation);
            if ran_before {
                // An engine of this node already ran at this generation
                // (before a restart, or it stopped): a new generation fences
                // whatever it left in flight. The next round starts it.
                tracing::info!(volume = %name, generation = %record.generation, "restarting the primary at a new generation");
                if let Err(error) = control
                    .propose(Command::ReattachVolume {
                        name: name.clone(),
                        node: me,
                        now_ms: auth::now_ms(),
                    })
                    .await
                {
                    tracing::warn!(%error, volume = %name, "reattach failed; retrying");
                }
                continue;
            }
            service.set_primary_at(&name, record.generation)?;
            let diskful_here = record
                .replica(me)
                .is_some_and(|replica| replica.kind == ReplicaKind::Diskful);
            let local = if diskful_here {
                let node = self.node.clone();
                let lookup = name.clone();
                tokio::task::spawn_blocking(move || node.open_volume(lookup.as_str()))
                    .await
                    .map_err(|error| NodeError::Internal(error.to_string()))?
            } else {
                None
            };
            if diskful_here && local.is_none() {
                // The agent has not created the local copy yet.
                continue;
            }
            let engine = engine::start(engine::EngineStart {
                control: control.clone(),
                replicas: service.clone(),
                meta: self.meta.clone(),
                record,
                policy,
                resync_rate: settings_rate,
                local,
            })?;
            self.engines
                .lock()
                .expect("engines lock")
                .insert(name, engine);
        }
        Ok(())
    }

    /// A node that restarted on another data port says so.
    async fn report_data_address(&self) {
        let mine = &self.data_address;
        let me = self.control.node_id();
        let recorded = self
            .control
            .state()
            .read()
            .nodes
            .get(&me)
            .map(|node| node.data_address.clone());
        if recorded.is_some_and(|recorded| recorded.as_deref() != Some(mine.as_str())) {
            if let Err(error) = self
                .control
                .propose(Command::SetDataAddress {
                    node: me,
                    data_address: Some(mine.clone()),
                })
                .await
            {
                tracing::warn!(%error, "cannot record this node's data address; retrying");
            }
        }
    }

    /// The node stops: every engine detaches cleanly (its requests done,
    /// every replica flushed and told goodbye), so that after a restart
    /// the copies are known whole and nothing is resynced. Engines that do
    /// not finish within `grace` are left; their replicas count as crashed.
    pub async fn shutdown(&self, grace: std::time::Duration) {
        let engines: Vec<Arc<EngineHandle>> = {
            let engines = self.engines.lock().expect("engines lock");
            engines.values().cloned().collect()
        };
        for engine in &engines {
            engine.shut_down();
        }
        let deadline = tokio::time::Instant::now() + grace;
        while engines.iter().any(|engine| !engine.is_stopped()) {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("some volumes did not detach cleanly in time; their replicas resync after the restart");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.control.node_id()
    }
}
