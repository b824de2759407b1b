//! The engine's driver, where it meets the control plane: the command a
//! node proposes for each of the engine's [`Proposal`]s, how the control
//! plane's answer reaches the engine, and what a change of the volume's
//! record means for it. The node's engine (over the Raft-replicated
//! cluster state) and the simulator (over its arbiter, which runs the
//! control crate's own `apply`) both go through [`PrimaryDriver`]; each
//! implements [`ControlPlane`] and keeps only its own I/O (links, persists,
//! client replies).

use crate::primary::{Primary, Proposal, ProposalResult, View};
use std::collections::BTreeMap;
use trireme_control::{
    Command, CommandError, ReplicaKind, ReplicaObserved, SyncProgress as ControlProgress,
    VolumeRecord,
};
use trireme_types::{NodeId, VolumeName};

/// Why the control plane did not commit a proposal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// The state machine refused the command.
    #[error(transparent)]
    Refused(#[from] CommandError),
    /// No answer: no leader, a timeout, a lost reply. The engine retries.
    #[error("the control plane did not answer: {0}")]
    Unavailable(String),
}

/// What an engine's driver needs of the control plane.
pub trait ControlPlane {
    /// Proposes `command`, attributed to this node. When `wants_answer`,
    /// the answer must reach [`PrimaryDriver::answered`] with `id`
    /// whenever it comes (or never, if it is lost: the engine asks again).
    fn propose(&mut self, id: u64, command: Command, wants_answer: bool);
    /// The wall clock, in milliseconds: progress reports are stamped with
    /// it.
    fn wall_clock_ms(&self) -> u64;
}

/// What the volume's record says to its engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordChange {
    /// The volume is gone or going: the engine stops.
    Stop(String),
    /// The volume was detached from this node at the engine's generation:
    /// the engine leaves cleanly.
    Detach,
    /// The members, the in-sync set or the generation changed.
    View(View),
}

/// Rules the driver can be told to break, to show that the simulator
/// catches each (crates/sim's bug-switch tests). Off by default; only with
/// the `bug-switches` feature.
#[cfg(feature = "bug-switches")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrimaryBugs {
    /// A MarkOutdated the control plane refused (fenced: a newer primary
    /// took over, or the member is the last up to date) reaches the engine
    /// as committed: it then completes writes without that member.
    pub ignore_refused_outdate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    Outdate,
    InSync(NodeId),
}

/// The engine's dealings with the control plane, for one volume on one
/// node.
#[derive(Debug)]
pub struct PrimaryDriver {
    me: NodeId,
    volume: VolumeName,
    /// Proposals whose answer the engine waits for.
    asked: BTreeMap<u64, Asked>,
    #[cfg(feature = "bug-switches")]
    bugs: PrimaryBugs,
}

impl PrimaryDriver {
    pub fn new(me: NodeId, volume: VolumeName) -> PrimaryDriver {
        PrimaryDriver {
            me,
            volume,
            asked: BTreeMap::new(),
            #[cfg(feature = "bug-switches")]
            bugs: PrimaryBugs::default(),
        }
    }

    #[cfg(feature = "bug-switches")]
    pub fn with_bugs(mut self, bugs: PrimaryBugs) -> PrimaryDriver {
        self.bugs = bugs;
        self
    }

    pub fn volume(&self) -> &VolumeName {
        &self.volume
    }

    /// The engine's `Action::Propose`: the command this node proposes for
    /// it, at the engine's generation, handed to `control`.
    pub fn propose(
        &mut self,
        primary: &Primary,
        id: u64,
        proposal: Proposal,
        control: &mut (impl ControlPlane + ?Sized),
    ) {
        let name = self.volume.clone();
        let generation = primary.generation();
        let by = self.me;
        let (command, asked) = match proposal {
            Proposal::MarkOutdated { node } => (
                Command::MarkOutdated {
                    name,
                    generation,
                    node,
                    by,
                },
                Some(Asked::Outdate),
            ),
            Proposal::MarkInSync { node } => (
                Command::MarkInSync {
                    name,
                    generation,
                    node,
                    by,
                },
                Some(Asked::InSync(node)),
            ),
            Proposal::Progress { node, progress } => (
                Command::ReportSync {
                    name,
                    node,
                    progress: progress.map(|p| ControlProgress {
                        done_bytes: p.done_bytes,
                        total_bytes: p.total_bytes,
                        rate_bytes_per_sec: p.rate_bytes_per_sec,
                        reported_ms: control.wall_clock_ms(),
                    }),
                },
                None,
            ),
        };
        if let Some(asked) = asked {
            self.asked.insert(id, asked);
        }
        control.propose(id, command, asked.is_some());
    }

    /// The control plane answered proposal `id`: the engine learns it, in
    /// its terms. Returns the node that was let into the in-sync set, if
    /// this answer did that.
    pub fn answered(
        &mut self,
        primary: &mut Primary,
        id: u64,
        answer: Result<(), ProposeError>,
        now_ms: u64,
    ) -> Option<NodeId> {
        let asked = self.asked.remove(&id);
        let result = match answer {
            Ok(()) => ProposalResult::Committed,
            // Fenced: a newer generation, or a primary the record no longer
            // names.
            Err(ProposeError::Refused(
                CommandError::StaleGeneration { .. } | CommandError::NotPrimary { .. },
            )) => ProposalResult::Stale,
            Err(ProposeError::Refused(error)) => ProposalResult::Refused(error.to_string()),
            Err(ProposeError::Unavailable(_)) => ProposalResult::Unavailable,
        };
        #[cfg(feature = "bug-switches")]
        let result = match result {
            ProposalResult::Stale | ProposalResult::Refused(_)
                if self.bugs.ignore_refused_outdate && asked == Some(Asked::Outdate) =>
            {
                ProposalResult::Committed
            }
            result => result,
        };
        let joined = match (asked, &result) {
            (Some(Asked::InSync(node)), ProposalResult::Committed) => Some(node),
            _ => None,
        };
        primary.proposal_result(id, result, now_ms);
        joined
    }

    /// The volume's record changed (`None`: deleted): what it means for
    /// the engine.
    pub fn record_change(&self, primary: &Primary, record: Option<&VolumeRecord>) -> RecordChange {
        match record {
            None => RecordChange::Stop("the volume was deleted".into()),
            Some(record) if record.deleting => {
                RecordChange::Stop("the volume is being deleted".into())
            }
            Some(record) => {
                let view = view_of(record);
                if view.generation == primary.generation() && !view.primaries.contains(&self.me) {
                    RecordChange::Detach
                } else {
                    RecordChange::View(view)
                }
            }
        }
    }

    /// Gives the engine the volume's record (see [`Self::record_change`]).
    pub fn record(
        &self,
        primary: &mut Primary,
        record: Option<&VolumeRecord>,
        now_ms: u64,
    ) -> RecordChange {
        let change = self.record_change(primary, record);
        match &change {
            RecordChange::Stop(reason) => primary.stop(reason.clone()),
            RecordChange::Detach => primary.detach(now_ms),
            RecordChange::View(view) => primary.view(view.clone(), now_ms),
        }
        change
    }
}

/// The view an engine works with, from the volume's record.
pub fn view_of(record: &VolumeRecord) -> View {
    View {
        generation: record.generation,
        primaries: record.primaries.iter().map(|p| p.node).collect(),
        diskful: record.diskful().map(|r| r.node).collect(),
        tiebreakers: record
            .replicas
            .iter()
            .filter(|r| r.kind == ReplicaKind::Tiebreaker)
            .map(|r| r.node)
            .collect(),
        in_sync: record.in_sync.clone(),
        size_bytes: record.size_bytes,
        // A replica is recorded ready only at the volume's size (its node
        // reports the size it holds, and a smaller one counts as not
        // ready; a grow sets every replica pending again).
        growing: record
            .diskful()
            .filter(|r| r.observed != ReplicaObserved::Ready)
            .map(|r| r.node)
            .collect(),
    }
}
