//! Links to replicas on other nodes: one TCP connection each, opened with
//! a signed preamble. Frames wait in the link's outbox for its flusher
//! task, which writes all that is queued with one vectored write (a
//! write's data from its own buffer, never copied into the frame); from a
//! thread outside the runtime, or on a link with nothing else unanswered,
//! they go into the socket at once. A reader task hands the replica's
//! replies to the engine, a burst at a time.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use trireme_replication::FromReplica;
use trireme_types::{NodeId, VolumeName};

use super::super::wire::{push_frame, read_frame_async, Frames, LinkOpen, WriteSlices};
use super::{Core, Input, LinkSender};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The reader's buffer: many acknowledgements, or one large read reply in
/// a few socket reads.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// Replies handed to the engine at once at most.
const READ_BATCH: usize = 256;

/// The sending side of an open link.
pub(crate) struct RemoteLink {
    writer: Arc<OwnedWriteHalf>,
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
}

/// Frames the socket has not taken yet. Its size is bounded by the
/// engine's limit on unacknowledged bytes per link: a frame is
/// unacknowledged until long after it left here.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Frames>,
    /// How much of the first frames in `queue` is written.
    written: usize,
    /// No more frames come: the flusher ends once the queue is out.
    finishing: bool,
    /// The socket failed; the link is going down.
    broken: bool,
}

impl Outbox {
    /// One vectored write of what is queued; the bytes the socket took.
    /// Called for every burst a link sends: its buffers are listed on the
    /// stack, not in an allocation.
    fn write_to(&mut self, writer: &OwnedWriteHalf) -> std::io::Result<usize> {
        let mut slices = WriteSlices::new();
        let mut skip = self.written;
        for frames in &self.queue {
            frames.slices(skip, &mut slices);
            skip = 0;
            if slices.is_full() {
                break;
            }
        }
        let written = writer.try_write_vectored(slices.as_slices())?;
        self.advance(written);
        Ok(written)
    }

    fn advance(&mut self, mut written: usize) {
        while let Some(front) = self.queue.front() {
            let left = front.len() - self.written;
            if written < left {
                self.written += written;
                return;
            }
            written -= left;
            self.written = 0;
            self.queue.pop_front();
        }
    }
}

fn lock(outbox: &Mutex<Outbox>) -> std::sync::MutexGuard<'_, Outbox> {
    outbox.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RemoteLink {
    /// Sends `frames` after everything sent before; an error means the
    /// socket is broken.
    ///
    /// Called from a task (the NBD server's, a link reader's), the frames
    /// are left to the flusher task, which runs on this worker as soon as
    /// the caller's task yields: by then the caller has usually handed the
    /// engine every request of its burst, and one system call sends them
    /// all, instead of one per request. From any other thread, or when
    /// the caller says the link is `quiet` (no message of a burst will
    /// follow), they go into the socket at once if nothing is queued,
    /// rather than wait for the flusher and a worker woken for it.
    pub fn send(&self, frames: Frames, quiet: bool) -> Result<(), ()> {
        let mut outbox = lock(&self.outbox);
        if outbox.broken {
            return Err(());
        }
        let idle = outbox.queue.is_empty();
        outbox.queue.push_back(frames);
        if idle && (quiet || tokio::task::try_id().is_none()) {
            match outbox.write_to(&self.writer) {
                Ok(_) if outbox.queue.is_empty() => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    outbox.broken = true;
                    return Err(());
                }
            }
        }
        drop(outbox);
        self.wake.notify_one();
        Ok(())
    }

    /// No more frames: the flusher writes what is queued, then ends and
    /// reports the link down.
    pub fn finish(self) {
        lock(&self.outbox).finishing = true;
        self.wake.notify_one();
    }

    /// The link is dropped at once (its tasks are aborted by its slot).
    pub fn close(self) {}
}

/// Writes what the engine queued whenever the socket has room.
async fn flush(
    writer: Arc<OwnedWriteHalf>,
    outbox: Arc<Mutex<Outbox>>,
    wake: Arc<Notify>,
) -> std::io::Result<()> {
    loop {
        loop {
            {
                let mut out = lock(&outbox);
                if out.queue.is_empty() {
                    if out.finishing {
                        return Ok(());
                    }
                    break;
                }
                match out.write_to(&writer) {
                    Ok(_) => continue,
                    Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                    Err(error) => {
                        out.broken = true;
                        return Err(error);
                    }
                }
            }
            writer.writable().await?;
        }
        // A notification sent since the check above is kept for this.
        wake.notified().await;
    }
}

/// Whether `buffer` starts with a whole frame.
fn whole_frame(buffer: &[u8]) -> bool {
    buffer.len() >= 4
        && buffer.len() - 4 >= u32::from_le_bytes(buffer[..4].try_into().expect("4 bytes")) as usize
}

/// Hands the replica's replies to the engine, every burst that arrived
/// together in one go.
async fn read(node: NodeId, epoch: u64, reader: OwnedReadHalf, core: Weak<Core>) {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut frame = Vec::new();
    let mut batch = Vec::new();
    loop {
        if read_frame_async(&mut reader, &mut frame).await.is_err() {
            break;
        }
        match FromReplica::decode(&frame) {
            Ok(message) => batch.push(message),
            Err(error) => {
                tracing::warn!(%node, %error, "bad message from a replica; closing the link");
                break;
            }
        }
        if batch.len() >= READ_BATCH || !whole_frame(reader.buffer()) {
            let Some(core) = core.upgrade() else { return };
            core.deliver(Input::Messages(node, epoch, std::mem::take(&mut batch)));
        }
    }
    if let Some(core) = core.upgrade() {
        if !batch.is_empty() {
            core.deliver(Input::Messages(node, epoch, batch));
        }
        core.deliver(Input::LinkDown(node, epoch));
    }
}

pub(super) struct Connect {
    pub to: NodeId,
    pub epoch: u64,
    pub me: NodeId,
    pub volume: VolumeName,
    pub address: Option<String>,
    pub secret: Vec<u8>,
    pub core: Weak<Core>,
}

/// Opens the link in a task; it reports the link up (with its sender) or
/// down to the engine.
pub(super) fn spawn_connect(connect: Connect) -> JoinHandle<()> {
    tokio::spawn(async move {
        let Connect {
            to,
            epoch,
            me,
            volume,
            address,
            secret,
            core,
        } = connect;
        let result = match address {
            None => Err(format!("node {to} has no data address yet")),
            Some(address) => open(&address, &secret, &volume, me).await,
        };
        let Some(engine) = core.upgrade() else { return };
        let stream = match result {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(node = %to, %error, "data link failed");
                engine.deliver(Input::LinkDown(to, epoch));
                return;
            }
        };
        let (reader, writer) = stream.into_split();
        let writer = Arc::new(writer);
        let outbox = Arc::new(Mutex::new(Outbox::default()));
        let wake = Arc::new(Notify::new());
        let link = RemoteLink {
            writer: writer.clone(),
            outbox: outbox.clone(),
            wake: wake.clone(),
        };
        // Up before the reader starts: its replies must find the link up.
        engine.deliver(Input::LinkUp(to, epoch, LinkSender::Remote(link)));
        let flusher_core = core.clone();
        let flusher = tokio::spawn(async move {
            if let Err(error) = flush(writer, outbox, wake).await {
                tracing::debug!(node = %to, %error, "data link write failed");
            }
            if let Some(core) = flusher_core.upgrade() {
                core.deliver(Input::LinkDown(to, epoch));
            }
        });
        let reader = tokio::spawn(read(to, epoch, reader, core));
        engine.lock().adopt_tasks(to, epoch, vec![flusher, reader]);
    })
}

async fn open(
    address: &str,
    secret: &[u8],
    volume: &VolumeName,
    me: NodeId,
) -> Result<tokio::net::TcpStream, String> {
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("connecting to {address} timed out"))?
        .map_err(|error| format!("connecting to {address}: {error}"))?;
    stream
        .set_nodelay(true)
        .map_err(|error| error.to_string())?;
    let open =
        serde_json::to_vec(&LinkOpen::signed(secret, volume.as_str(), me)).expect("serialisable");
    let mut frame = Vec::new();
    push_frame(&mut frame, |body| body.extend_from_slice(&open));
    stream
        .write_all(&frame)
        .await
        .map_err(|error| error.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(CONNECT_TIMEOUT, read_frame_async(&mut stream, &mut answer))
        .await
        .map_err(|_| format!("{address} did not answer the link preamble"))?
        .map_err(|error| error.to_string())?;
    if !answer.is_empty() {
        return Err(format!(
            "{address} refused the link: {}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::whole_frame;

    #[test]
    fn a_whole_frame_is_told_from_a_partial_one() {
        assert!(!whole_frame(&[]));
        assert!(!whole_frame(&[3, 0, 0]));
        assert!(!whole_frame(&[3, 0, 0, 0, 1, 2]));
        assert!(whole_frame(&[3, 0, 0, 0, 1, 2, 3]));
        assert!(whole_frame(&[0, 0, 0, 0]));
        assert!(whole_frame(&[1, 0, 0, 0, 9, 2, 0]));
    }
}
