//! The engine's helpers that wait: the thread that persists dirty maps,
//! and the task that watches the control plane for the volume's record
//! and the resync rate. Both hold the engine weakly and end with it.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use tokio::sync::mpsc;
use trireme_control::VolumeRecord;
use trireme_replication::DirtyMap;
use trireme_types::{NodeId, VolumeName};

use super::super::ReplicationMeta;
use super::{Core, Input};
use crate::cluster::replication_port::ControlPort;

pub(crate) struct PersistJob {
    pub token: Option<u64>,
    pub peer: NodeId,
    pub map: Option<DirtyMap>,
}

/// Dirty maps are persisted one after the other, in the order the engine
/// asked: `persisted(token)` promises every earlier token is durable too.
pub(super) fn spawn_persister(
    meta: Arc<ReplicationMeta>,
    volume: VolumeName,
    core: Weak<Core>,
) -> mpsc::UnboundedSender<PersistJob> {
    let (sender, mut receiver) = mpsc::unbounded_channel::<PersistJob>();
    std::thread::Builder::new()
        .name("dirty-maps".into())
        .spawn(move || {
            while let Some(job) = receiver.blocking_recv() {
                // Coalesce: only the newest map per peer matters.
                let mut jobs = vec![job];
                while let Ok(job) = receiver.try_recv() {
                    jobs.push(job);
                }
                let mut newest: BTreeMap<NodeId, Option<DirtyMap>> = BTreeMap::new();
                let mut token = None;
                for job in jobs {
                    newest.insert(job.peer, job.map);
                    if job.token.is_some() {
                        token = job.token;
                    }
                }
                for (peer, map) in newest {
                    if let Err(error) = meta.set_dirty_map(&volume, peer, map.as_ref()) {
                        // Without its map the peer would resync too little:
                        // the engine must not go on as if it were durable.
                        tracing::error!(%error, %volume, "cannot persist a dirty map");
                        return;
                    }
                }
                if let Some(token) = token {
                    let Some(core) = core.upgrade() else { return };
                    core.deliver(Input::Persisted(token));
                }
            }
        })
        .expect("spawn the dirty-map thread");
    sender
}

/// Sends the volume's record to the engine whenever it changes, and the
/// cluster's resync rate. It compares against what the engine was started
/// with (`started`, `started_rate`), not against the state when this task
/// first runs: a change committed between the engine's start and then
/// (a new replica reported ready, say) would otherwise never reach the
/// engine, which would wait for it until something else changed.
pub(super) fn spawn_view_watch(
    control: Arc<dyn ControlPort>,
    started: VolumeRecord,
    started_rate: u64,
    core: Weak<Core>,
) {
    tokio::spawn(async move {
        let volume = started.name.clone();
        let mut changes = control.state().subscribe();
        // Whatever changed before the subscription is caught up with now.
        changes.mark_changed();
        let (mut last, mut last_rate) = (Some(started), started_rate);
        loop {
            if changes.changed().await.is_err() {
                return;
            }
            let (record, rate) = {
                let state = control.state().read();
                (
                    state.volumes.get(&volume).cloned(),
                    state.settings.resync_rate_bytes_per_sec,
                )
            };
            let Some(engine) = core.upgrade() else { return };
            if engine.lock().stopping {
                return;
            }
            if rate != last_rate {
                last_rate = rate;
                engine.deliver(Input::ResyncRate(rate));
            }
            if record == last {
                continue;
            }
            last = record.clone();
            let gone = record.is_none();
            engine.deliver(Input::View(record.map(Box::new)));
            if gone {
                return;
            }
        }
    });
}
