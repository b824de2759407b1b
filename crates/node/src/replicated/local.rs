//! [`LocalLink`]: the data link from a primary to the copy on its own node,
//! in-process. It runs the replica service's code (fencing, unsettled
//! writes, persisting the accepted generation, every store operation)
//! exactly as a remote link does, without a socket: a plain write that the
//! store admits without waiting, or a read the page cache serves, is done
//! on the engine's task at once; anything else (FUA, flushes, trims,
//! reads from the device, hellos that persist) goes to the link's worker
//! thread. Once something waits there, everything after it waits too, so
//! the store sees the link's operations in the order they were sent, as on
//! a remote link.
//!
//! This is the DRBD model of the local disk: the primary writes it
//! directly, and a replicated 4 KiB write costs no thread switch on the
//! primary's own copy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use trireme_replication::driver::replica::{ReplicaDriver, Step};
use trireme_replication::{FromReplica, Payload, ReplicaSide, ToReplica};
use trireme_store::Volume;
use trireme_types::{Attempt, BlockTarget, VolumeName};

use super::clock::Clock;
use super::serve::{replica_error, ReplicaService};
use crate::NodeError;

/// What the worker reports: a reply to deliver (if any) and whether the
/// link closes; `None` when the worker ended (the link is down).
pub(crate) type LocalOutcome = Option<(Option<FromReplica>, bool)>;

struct Job {
    message: ToReplica,
    /// Admitted on the engine's task already (a write the store could not
    /// take without waiting).
    admitted: bool,
}

pub(crate) struct LocalLink {
    link: u64,
    side: Arc<Mutex<ReplicaSide>>,
    volume: Option<Arc<Volume>>,
    jobs: mpsc::Sender<Job>,
    /// Jobs handed to the worker and not yet carried out.
    queued: Arc<AtomicUsize>,
    /// The replica service's clock, for what is admitted here.
    clock: Clock,
    driver: ReplicaDriver,
}

impl LocalLink {
    /// Opens the link; `deliver` is called from the worker thread with
    /// each reply, and once with `None` when the link is gone.
    pub(crate) fn open(
        service: Arc<ReplicaService>,
        name: VolumeName,
        volume: Option<Arc<Volume>>,
        deliver: impl Fn(LocalOutcome) + Send + 'static,
    ) -> Result<LocalLink, NodeError> {
        let side = service.side(&name)?;
        let clock = service.clock();
        let driver = service.driver().clone();
        let link = service.next_link_id();
        let (jobs, receiver) = mpsc::channel::<Job>();
        let queued = Arc::new(AtomicUsize::new(0));
        let worker_side = side.clone();
        let worker_volume = volume.clone();
        let worker_queued = queued.clone();
        std::thread::Builder::new()
            .name("data-local".into())
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    let (reply, close) = if job.admitted {
                        let volume = worker_volume.as_deref().expect("admitted data");
                        (Some(super::serve::execute(volume, job.message)), false)
                    } else {
                        service.handle(
                            &name,
                            worker_volume.as_deref(),
                            &worker_side,
                            link,
                            job.message,
                        )
                    };
                    worker_queued.fetch_sub(1, Ordering::AcqRel);
                    deliver(Some((reply, close)));
                    if close {
                        break;
                    }
                }
                worker_side.lock().expect("side lock").link_closed(link);
                deliver(None);
            })
            .map_err(|error| {
                NodeError::Internal(format!("spawn the local link's worker: {error}"))
            })?;
        Ok(LocalLink {
            link,
            side,
            volume,
            jobs,
            queued,
            clock,
            driver,
        })
    }

    /// Carries out `message` at once when that needs no waiting and returns
    /// its reply (and whether the link closes); otherwise queues it on the
    /// worker, which delivers the reply later, and returns `None`.
    pub(crate) fn send(&self, message: ToReplica) -> Option<(Option<FromReplica>, bool)> {
        if self.queued.load(Ordering::Acquire) == 0 {
            if let Some(volume) = &self.volume {
                match self.try_inline(volume, message) {
                    Ok(done) => return Some(done),
                    Err(job) => return self.queue(job),
                }
            }
        }
        self.queue(Job {
            message,
            admitted: false,
        })
    }

    fn queue(&self, job: Job) -> Option<(Option<FromReplica>, bool)> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.jobs.send(job).is_err() {
            // The worker ended (it closed the link); its end is reported.
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        None
    }

    /// `message`, through the replica driver, as the service handles it.
    fn receive(&self, message: ToReplica, now: u64) -> Step {
        let mut side = self.side.lock().expect("side lock");
        self.driver
            .receive(&mut side, self.link, message, now, self.volume.is_some())
    }

    fn try_inline(
        &self,
        volume: &Volume,
        message: ToReplica,
    ) -> Result<(Option<FromReplica>, bool), Job> {
        let now = self.clock.now_ms();
        match message {
            ToReplica::Ping { .. } => match self.receive(message, now) {
                Step::Reply(pong) => Ok((Some(pong), false)),
                Step::Refuse(refusal) => Ok((Some(refusal), true)),
                other => unreachable!("a ping is answered or refused, not {other:?}"),
            },
            ToReplica::Write {
                seq,
                offset,
                payload: Payload::Data(ref data),
                fua: false,
                ..
            } => {
                let data = data.clone();
                match self.receive(message.clone(), now) {
                    Step::Store(_) => {}
                    Step::Refuse(refusal) => return Ok((Some(refusal), true)),
                    other => unreachable!("a write is carried out or refused, not {other:?}"),
                }
                // The store keeps the payload's own buffer, which the
                // primary's record of the write shares: no copy.
                match volume.try_write_shared(offset, data) {
                    Attempt::Done(result) => Ok((
                        Some(FromReplica::Ack {
                            seq,
                            result: result.map_err(replica_error),
                        }),
                        false,
                    )),
                    Attempt::WouldBlock(_) => Err(Job {
                        message,
                        admitted: true,
                    }),
                }
            }
            ToReplica::Flush { seq } => {
                match self.receive(message.clone(), now) {
                    Step::Store(_) => {}
                    Step::Refuse(refusal) => return Ok((Some(refusal), true)),
                    other => unreachable!("a flush is carried out or refused, not {other:?}"),
                }
                // An eager device flush (the journal writer's, while
                // clients flush often) usually got there first: then the
                // answer needs no trip to the worker and back.
                match volume.try_flush() {
                    Attempt::Done(result) => Ok((
                        Some(FromReplica::Ack {
                            seq,
                            result: result.map_err(replica_error),
                        }),
                        false,
                    )),
                    Attempt::WouldBlock(()) => Err(Job {
                        message,
                        admitted: true,
                    }),
                }
            }
            ToReplica::Read { id, offset, length } if length <= READ_INLINE_MAX_BYTES => {
                if offset
                    .checked_add(length)
                    .is_none_or(|end| end > volume.size_bytes())
                {
                    return Err(Job {
                        message,
                        admitted: false,
                    });
                }
                let mut buffer = vec![0u8; length as usize];
                match volume.try_read(offset, &mut buffer) {
                    Some(Ok(())) => {
                        // Reads change nothing on the replica side but its
                        // fencing check.
                        if let Step::Refuse(refusal) = self.receive(message, now) {
                            return Ok((Some(refusal), true));
                        }
                        Ok((
                            Some(FromReplica::ReadReply {
                                id,
                                result: Ok(trireme_replication::ReadData::Data(buffer)),
                            }),
                            false,
                        ))
                    }
                    _ => Err(Job {
                        message,
                        admitted: false,
                    }),
                }
            }
            message => Err(Job {
                message,
                admitted: false,
            }),
        }
    }
}

/// Reads up to this size may be served from the page cache inline; larger
/// ones go to the worker (a resync's 1 MiB regions among them).
const READ_INLINE_MAX_BYTES: u64 = 128 << 10;
