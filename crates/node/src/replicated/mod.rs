//! The node's replication: the engines of the volumes attached here and
//! the replica service for the copies held here. The protocol itself is
//! `trireme-replication`; this module gives it sockets, disks and the
//! control plane.
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
use std::sync::{Arc, Mutex, OnceLock};
use trireme_control::{Command, ReplicaKind, VolumeRecord};
use trireme_types::{BlockTarget, NodeId, VolumeName};

pub use engine::EngineHandle;
pub use meta::ReplicationMeta;
use serve::ReplicaService;

use crate::cluster::{auth, Cluster};
use crate::{Node, NodeError};

pub struct Replication {
    /// Itself, for the NBD targets it hands out (they find an engine's
    /// successor here).
    this: std::sync::Weak<Replication>,
    node: Arc<Node>,
    /// `HOST:PORT` other nodes open data links to.
    data_address: OnceLock<String>,
    meta: Arc<ReplicationMeta>,
    cluster: OnceLock<(Arc<Cluster>, Arc<ReplicaService>)>,
    engines: Mutex<BTreeMap<VolumeName, Arc<EngineHandle>>>,
    /// Snapshots this node's engines are taking (asked once each).
    taking: Mutex<std::collections::BTreeSet<(VolumeName, trireme_types::SnapshotId)>>,
}

impl Replication {
    pub fn open(node: Arc<Node>) -> Result<Arc<Replication>, NodeError> {
        let meta = Arc::new(ReplicationMeta::open(node.data_dir())?);
        Ok(Arc::new_cyclic(|this| Replication {
            this: this.clone(),
            node,
            data_address: OnceLock::new(),
            meta,
            cluster: OnceLock::new(),
            engines: Mutex::new(BTreeMap::new()),
            taking: Mutex::new(Default::default()),
        }))
    }

    /// Starts serving data links on `listener`, once the node is a member
    /// (links are signed with the cluster secret).
    pub fn start(&self, cluster: Arc<Cluster>, listener: TcpListener, data_address: String) {
        let _ = self.data_address.set(data_address);
        let service = ReplicaService::new(
            self.node.clone(),
            cluster.clone(),
            self.meta.clone(),
            cluster.identity.secret_bytes(),
        );
        service.listen(listener);
        let _ = self.cluster.set((cluster, service));
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
        let (cluster, _) = self.cluster.get()?;
        let state = cluster.state.read();
        let volume = state.volumes.get(name)?;
        Some(volume.is_attached_on(cluster.node_id()))
    }

    /// A replica deleted here: its replication state goes too.
    pub fn forget(&self, name: &VolumeName) {
        if let Some((_, service)) = self.cluster.get() {
            if let Err(error) = service.forget(name) {
                tracing::warn!(%error, volume = %name, "cannot forget replication state");
            }
        }
    }

    /// Starts the engines of volumes attached here, and forgets the ones
    /// that stopped. Called by the agent on every change of the state.
    pub async fn reconcile(&self) -> Result<(), NodeError> {
        let Some((cluster, service)) = self.cluster.get() else {
            return Ok(());
        };
        let me = cluster.node_id();
        let (attached, settings_rate): (Vec<(VolumeRecord, trireme_control::QuorumPolicy)>, u64) = {
            let state = cluster.state.read();
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
        self.report_data_address(cluster).await;
        {
            let mut engines = self.engines.lock().expect("engines lock");
            engines.retain(|_, engine| !engine.is_stopped());
        }
        let finished = self.drive_resyncs(cluster).await;
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
                if let Err(error) = cluster
                    .write(Command::ReattachVolume {
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
                cluster: cluster.clone(),
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
    async fn report_data_address(&self, cluster: &Arc<Cluster>) {
        let Some(mine) = self.data_address.get() else {
            return;
        };
        let me = cluster.node_id();
        let recorded = cluster
            .state
            .read()
            .nodes
            .get(&me)
            .map(|node| node.data_address.clone());
        if recorded.is_some_and(|recorded| recorded.as_deref() != Some(mine.as_str())) {
            if let Err(error) = cluster
                .write(Command::SetDataAddress {
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

    pub fn node_id(&self) -> Option<NodeId> {
        self.cluster.get().map(|(cluster, _)| cluster.node_id())
    }
}
