//! The Raft wiring: openraft's type configuration, and its log and state
//! machine kept in one redb database per node (`DATA/control.redb`).
//!
//! - The log, the vote and the commit index are written in a redb
//!   transaction per append, durable before openraft is told so.
//! - The state machine ([`ClusterState`]) lives in memory. It is persisted
//!   as snapshots (written in the same database); after a restart the node
//!   loads the last snapshot and replays the committed log after it, so it
//!   has its local copy of the cluster state before any leader exists.
//! - Readers (the REST API, the agent) get a [`StateReader`]: a shared,
//!   read-locked view, plus a watch channel that ticks on every apply.
//!
//! The network is not here: `trireme-node` carries Raft messages over its
//! HTTP API, and the simulator over its in-memory network. Both implement
//! openraft's `RaftNetworkFactory` for [`TypeConfig`].

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use tokio::sync::watch;

use crate::command::{Command, CommandError, Reply};
use crate::model::ClusterState;

/// The outcome of one command, as every node computed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult(pub Result<Reply, CommandError>);

openraft::declare_raft_types!(
    /// Raft types of the control plane. Node ids are trireme's `NodeId`
    /// numbers; a member's address is its REST API's `HOST:PORT`.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = BasicNode,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<u64, E>;
pub type ClientWriteError = openraft::error::ClientWriteError<u64, BasicNode>;
pub type Membership = openraft::Membership<u64, BasicNode>;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "last_purged";
const KEY_SNAPSHOT: &str = "snapshot";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("control database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("control database: {0}")]
    Database(String),
}

/// Opens (or creates) the control database and returns openraft's two
/// storage halves and a reader of the state.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore, StateReader), StoreError> {
    let db = Database::create(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let db = Arc::new(db);
    let txn = db
        .begin_write()
        .map_err(|error| StoreError::Database(error.to_string()))?;
    {
        txn.open_table(LOG)
            .map_err(|error| StoreError::Database(error.to_string()))?;
        txn.open_table(META)
            .map_err(|error| StoreError::Database(error.to_string()))?;
    }
    txn.commit()
        .map_err(|error| StoreError::Database(error.to_string()))?;

    let snapshot: Option<StoredSnapshot> =
        read_meta(&db, KEY_SNAPSHOT).map_err(|error| StoreError::Database(error.to_string()))?;
    let mut machine = Machine::default();
    if let Some(snapshot) = &snapshot {
        let data: SnapshotData = serde_json::from_slice(&snapshot.data).map_err(|error| {
            StoreError::Database(format!("the snapshot is unreadable: {error}"))
        })?;
        machine.state = data.state;
        machine.last_applied = snapshot.meta.last_log_id;
        machine.membership = snapshot.meta.last_membership.clone();
    }
    let (applied_sender, applied_receiver) = watch::channel(applied_index(&machine.last_applied));
    let shared = Arc::new(Shared {
        machine: RwLock::new(machine),
        applied: applied_sender,
    });
    Ok((
        LogStore { db: db.clone() },
        StateMachineStore {
            db,
            shared: shared.clone(),
            snapshot,
        },
        StateReader {
            shared,
            applied: applied_receiver,
        },
    ))
}

fn applied_index(log_id: &Option<LogId<u64>>) -> u64 {
    log_id.map(|id| id.index).unwrap_or(0)
}

fn read_meta<T: serde::de::DeserializeOwned>(
    db: &Database,
    key: &str,
) -> Result<Option<T>, String> {
    let txn = db.begin_read().map_err(|error| error.to_string())?;
    let table = txn.open_table(META).map_err(|error| error.to_string())?;
    let Some(value) = table.get(key).map_err(|error| error.to_string())? else {
        return Ok(None);
    };
    serde_json::from_slice(value.value())
        .map(Some)
        .map_err(|error| format!("{key}: {error}"))
}

fn write_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> Result<(), String> {
    let bytes = serde_json::to_vec(value).map_err(|error| error.to_string())?;
    let txn = db.begin_write().map_err(|error| error.to_string())?;
    {
        let mut table = txn.open_table(META).map_err(|error| error.to_string())?;
        table
            .insert(key, bytes.as_slice())
            .map_err(|error| error.to_string())?;
    }
    txn.commit().map_err(|error| error.to_string())
}

fn read_error(error: impl ToString) -> StorageError<u64> {
    StorageIOError::read(&std::io::Error::other(error.to_string())).into()
}

fn write_error(error: impl ToString) -> StorageError<u64> {
    StorageIOError::write(&std::io::Error::other(error.to_string())).into()
}

#[derive(Default)]
struct Machine {
    state: ClusterState,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
}

struct Shared {
    machine: RwLock<Machine>,
    /// The index of the last applied entry.
    applied: watch::Sender<u64>,
}

/// A read-only view of this node's copy of the cluster state.
#[derive(Clone)]
pub struct StateReader {
    shared: Arc<Shared>,
    applied: watch::Receiver<u64>,
}

/// A locked view; hold it briefly.
pub struct StateView<'a> {
    guard: RwLockReadGuard<'a, Machine>,
}

impl std::ops::Deref for StateView<'_> {
    type Target = ClusterState;
    fn deref(&self) -> &ClusterState {
        &self.guard.state
    }
}

impl StateView<'_> {
    pub fn membership(&self) -> &Membership {
        self.guard.membership.membership()
    }
    pub fn last_applied(&self) -> u64 {
        applied_index(&self.guard.last_applied)
    }
}

impl StateReader {
    pub fn read(&self) -> StateView<'_> {
        StateView {
            guard: self
                .shared
                .machine
                .read()
                .unwrap_or_else(|e| e.into_inner()),
        }
    }

    pub fn snapshot(&self) -> ClusterState {
        self.read().clone()
    }

    /// Ticks whenever entries are applied (the value is the applied index).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.clone()
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotData {
    state: ClusterState,
}

#[derive(Serialize, Deserialize, Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
}

/// The Raft log, vote and commit index.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(LOG).map_err(read_error)?;
        let mut entries = Vec::new();
        for item in table.range(range).map_err(read_error)? {
            let (_, value) = item.map_err(read_error)?;
            entries.push(serde_json::from_slice(value.value()).map_err(read_error)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let last_purged_log_id: Option<LogId<u64>> =
            read_meta(&self.db, KEY_PURGED).map_err(read_error)?;
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(LOG).map_err(read_error)?;
        let last = match table.last().map_err(read_error)? {
            Some((_, value)) => {
                let entry: Entry<TypeConfig> =
                    serde_json::from_slice(value.value()).map_err(read_error)?;
                Some(entry.log_id)
            }
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        write_meta(&self.db, KEY_VOTE, vote).map_err(write_error)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        read_meta(&self.db, KEY_VOTE).map_err(read_error)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        write_meta(&self.db, KEY_COMMITTED, &committed).map_err(write_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(read_meta::<Option<LogId<u64>>>(&self.db, KEY_COMMITTED)
            .map_err(read_error)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let txn = self.db.begin_write().map_err(write_error)?;
        {
            let mut table = txn.open_table(LOG).map_err(write_error)?;
            for entry in entries {
                let bytes = serde_json::to_vec(&entry).map_err(write_error)?;
                table
                    .insert(entry.log_id.index, bytes.as_slice())
                    .map_err(write_error)?;
            }
        }
        // redb commits durably (fsync) by default: the entries are on disk
        // before openraft counts them.
        let result = txn
            .commit()
            .map_err(|error| std::io::Error::other(error.to_string()));
        let failed = result.as_ref().err().map(|error| error.to_string());
        callback.log_io_completed(result);
        match failed {
            Some(error) => Err(write_error(error)),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let txn = self.db.begin_write().map_err(write_error)?;
        {
            let mut table = txn.open_table(LOG).map_err(write_error)?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(write_error)?;
        }
        txn.commit().map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let bytes = serde_json::to_vec(&Some(log_id)).map_err(write_error)?;
        let txn = self.db.begin_write().map_err(write_error)?;
        {
            let mut meta = txn.open_table(META).map_err(write_error)?;
            meta.insert(KEY_PURGED, bytes.as_slice())
                .map_err(write_error)?;
            let mut table = txn.open_table(LOG).map_err(write_error)?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(write_error)?;
        }
        txn.commit().map_err(write_error)
    }
}

/// The state machine: the cluster state in memory, snapshots in redb.
pub struct StateMachineStore {
    db: Arc<Database>,
    shared: Arc<Shared>,
    snapshot: Option<StoredSnapshot>,
}

/// Builds a snapshot from a copy of the state taken when it was asked for.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    shared: Arc<Shared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let (data, last_log_id, membership) = {
            let machine = self
                .shared
                .machine
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let data = serde_json::to_vec(&SnapshotData {
                state: machine.state.clone(),
            })
            .map_err(read_error)?;
            (data, machine.last_applied, machine.membership.clone())
        };
        let snapshot_id = match last_log_id {
            Some(id) => format!(
                "{}-{}-{}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        write_meta(&self.db, KEY_SNAPSHOT, &stored).map_err(write_error)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let machine = self
            .shared
            .machine
            .read()
            .unwrap_or_else(|e| e.into_inner());
        Ok((machine.last_applied, machine.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut results = Vec::new();
        let last_index = {
            let mut machine = self
                .shared
                .machine
                .write()
                .unwrap_or_else(|e| e.into_inner());
            for entry in entries {
                machine.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => results.push(CommandResult(Ok(Reply::Done))),
                    EntryPayload::Normal(command) => {
                        results.push(CommandResult(machine.state.apply(command)));
                    }
                    EntryPayload::Membership(membership) => {
                        machine.membership = StoredMembership::new(Some(entry.log_id), membership);
                        results.push(CommandResult(Ok(Reply::Done)));
                    }
                }
            }
            applied_index(&machine.last_applied)
        };
        self.shared.applied.send_replace(last_index);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let parsed: SnapshotData = serde_json::from_slice(&data).map_err(read_error)?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        write_meta(&self.db, KEY_SNAPSHOT, &stored).map_err(write_error)?;
        let index = {
            let mut machine = self
                .shared
                .machine
                .write()
                .unwrap_or_else(|e| e.into_inner());
            machine.state = parsed.state;
            machine.last_applied = meta.last_log_id;
            machine.membership = meta.last_membership.clone();
            applied_index(&machine.last_applied)
        };
        self.snapshot = Some(stored);
        self.shared.applied.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let stored: Option<StoredSnapshot> =
            read_meta(&self.db, KEY_SNAPSHOT).map_err(read_error)?;
        self.snapshot = stored.clone();
        Ok(stored.map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

/// The Raft timing and snapshot policy trireme uses. Elections are quick
/// (a new leader within a few seconds of losing one), and a snapshot every
/// 1,000 entries keeps the log and restarts short.
pub fn config(cluster_id: &str) -> openraft::Config {
    openraft::Config {
        cluster_name: format!("trireme-{cluster_id}"),
        heartbeat_interval: 250,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
        max_in_snapshot_log_to_keep: 500,
        purge_batch_size: 256,
        ..Default::default()
    }
}
