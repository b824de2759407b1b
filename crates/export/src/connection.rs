//! One client connection: handshake, then the transmission phase.
//!
//! ```text
//!  socket ─► reader (this task): decode ─► validate ─► permits ─► try inline, else spawn_blocking(dispatch)
//!                                                                        │ reply
//!  socket ◄─ writer task ◄──────────── unbounded channel ◄───────────────┘
//! ```
//!
//! The channel is unbounded but what it holds is not: every reply carries
//! the permits taken before its request ran, released only once the reply
//! is written. When the permits run out the reader stops reading, and TCP
//! pushes back on the client.
//!
//! Ending: on NBD_CMD_DISC, end of stream, a read error, a fatal decode
//! error or server shutdown, the reader stops and drops its sender. Requests
//! in flight finish on their blocking threads; the writer sends their replies
//! and ends once the last sender is gone, or at its first write error, after
//! which late replies are dropped with their permits.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::{debug, warn};
use trireme_proto::nbd::constants::{MAX_PAYLOAD_BYTES, REQUEST_HEADER_BYTES};
use trireme_proto::nbd::{
    reply, validate_request, ErrorCode, Handshake, HandshakeStep, Negotiated, Request,
    RequestDecoder, RequestKind,
};

use crate::dispatch::{self, BufferPool, Outgoing, Permits, ReplyContext};
use crate::io_stats::IoKind;
use crate::registry::{ExportRegistry, RegistryCatalog};

/// A client that has not finished the handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read from the socket at a time during the handshake.
const HANDSHAKE_READ_BYTES: usize = 4096;
/// Space reserved in the input buffer before each transmission-phase read.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Writes at least this large have their payloads read straight into
/// their own buffers (see `read_requests`); smaller ones come many per read.
const DIRECT_READ_MIN_PAYLOAD_BYTES: usize = 64 * 1024;
/// Requests accepted but not yet answered, per connection (QEMU keeps 16
/// in flight, nbdcopy 64 per connection).
pub(crate) const MAX_IN_FLIGHT_REQUESTS: usize = 128;
/// READ lengths and WRITE payloads held in memory per connection.
pub(crate) const MAX_IN_FLIGHT_PAYLOAD_BYTES: usize = 128 * 1024 * 1024;
/// Buffered bytes before the writer pushes replies to the socket.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;

// One maximal request must always fit, or the reader would wait forever.
const _: () = assert!(MAX_IN_FLIGHT_PAYLOAD_BYTES >= MAX_PAYLOAD_BYTES as usize);

pub(crate) async fn run<R, W>(
    mut reader: R,
    mut writer: W,
    registry: Arc<dyn ExportRegistry>,
    mut stop: watch::Receiver<bool>,
    peer: String,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut input = BytesMut::new();
    let negotiation = tokio::select! {
        result = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            handshake(&mut reader, &mut writer, registry.as_ref(), &mut input),
        ) => result,
        () = stopped(&mut stop) => return,
    };
    let negotiated = match negotiation {
        Ok(Ok(Some(negotiated))) => negotiated,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            debug!(%peer, %error, "NBD handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "NBD handshake timed out");
            return;
        }
    };
    // The export may have gone between the handshake's lookup and now.
    let target = match registry.open(&negotiated.export_name) {
        Ok(target) => target,
        Err(reason) => {
            warn!(%peer, export = %negotiated.export_name, %reason, "export vanished after the handshake");
            return;
        }
    };
    debug!(%peer, export = %negotiated.export_name, structured = negotiated.structured_replies, "NBD transmission starts");
    let buffers = BufferPool::default();
    // Snapshots (`VOLUME@SNAPSHOT`) count with their volume: the label
    // set stays one per volume.
    let io = registry.volume_io(
        negotiated
            .export_name
            .split_once('@')
            .map_or(negotiated.export_name.as_str(), |(volume, _)| volume),
    );
    let (replies, reply_receiver) = mpsc::unbounded_channel();
    let writer_task = tokio::spawn(write_replies(writer, reply_receiver, buffers.clone()));
    let session = Session {
        context: ReplyContext {
            target,
            export_name: Arc::from(negotiated.export_name.as_str()),
            structured_replies: negotiated.structured_replies,
            base_allocation_context_id: negotiated.base_allocation_context_id,
            buffers,
            io,
        },
        negotiated,
        requests: Arc::new(Semaphore::new(MAX_IN_FLIGHT_REQUESTS)),
        payload_bytes: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PAYLOAD_BYTES)),
        replies,
    };
    session.read_requests(reader, input, stop, &peer).await;
    // With the reader's sender gone, the writer ends after the last
    // in-flight request has replied.
    drop(session);
    if let Err(error) = writer_task.await {
        warn!(%peer, %error, "NBD reply writer task failed");
    }
    debug!(%peer, "NBD connection closed");
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // A dropped sender means the server is gone: stop as well.
    let _ = stop.wait_for(|stopped| *stopped).await;
}

async fn handshake<R, W>(
    reader: &mut R,
    writer: &mut W,
    registry: &dyn ExportRegistry,
    input: &mut BytesMut,
) -> std::io::Result<Option<Negotiated>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let catalog = RegistryCatalog(registry);
    let mut handshake = Handshake::new();
    let mut step = HandshakeStep::NeedMore;
    let mut buffer = vec![0u8; HANDSHAKE_READ_BYTES];
    loop {
        let output = handshake.take_output();
        if !output.is_empty() {
            writer.write_all(&output).await?;
            writer.flush().await?;
        }
        match step {
            HandshakeStep::NeedMore => {}
            HandshakeStep::Transmission(negotiated) => {
                input.extend_from_slice(&handshake.take_leftover());
                return Ok(Some(negotiated));
            }
            HandshakeStep::Close(reason) => {
                debug!(%reason, "NBD handshake ended");
                return Ok(None);
            }
        }
        let read = reader.read(&mut buffer).await?;
        if read == 0 {
            return Ok(None);
        }
        step = handshake.receive(&buffer[..read], &catalog);
    }
}

struct Session {
    context: ReplyContext,
    negotiated: Negotiated,
    requests: Arc<Semaphore>,
    payload_bytes: Arc<Semaphore>,
    replies: mpsc::UnboundedSender<Outgoing>,
}

impl Session {
    async fn read_requests<R: AsyncRead + Unpin>(
        &self,
        mut reader: R,
        mut input: BytesMut,
        mut stop: watch::Receiver<bool>,
        peer: &str,
    ) {
        let mut decoder = RequestDecoder::new();
        // The client sends large writes: read each header alone, so that
        // the payload after it goes from the socket straight into the
        // request's buffer instead of through `input`.
        let mut large_writes = false;
        loop {
            loop {
                match decoder.decode(&mut input) {
                    Ok(Some(request)) if request.kind == RequestKind::Disconnect => {
                        debug!(%peer, "client sent NBD_CMD_DISC");
                        return;
                    }
                    Ok(Some(request)) => {
                        large_writes = matches!(&request.kind,
                            RequestKind::Write { data, .. } if data.len() >= DIRECT_READ_MIN_PAYLOAD_BYTES);
                        self.submit(request).await
                    }
                    Ok(None) => break,
                    Err(error) if error.is_fatal() => {
                        warn!(%peer, %error, "closing NBD connection");
                        return;
                    }
                    Err(error) => {
                        warn!(%peer, %error, "rejecting NBD request");
                        if let trireme_proto::nbd::DecodeError::UnknownCommand { cookie, .. } =
                            error
                        {
                            self.reject(cookie, ErrorCode::Invalid, "unknown command")
                                .await;
                        }
                    }
                }
            }
            input.reserve(READ_CHUNK_BYTES);
            let read = async {
                if input.is_empty() {
                    if let Some((payload, missing)) = decoder.payload_buffer() {
                        payload.reserve(missing.min(READ_CHUNK_BYTES));
                        return reader.read_buf(&mut payload.limit(missing)).await;
                    }
                }
                if large_writes && input.len() < REQUEST_HEADER_BYTES {
                    let header_rest = REQUEST_HEADER_BYTES - input.len();
                    return reader.read_buf(&mut (&mut input).limit(header_rest)).await;
                }
                reader.read_buf(&mut input).await
            };
            tokio::select! {
                read = read => match read {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(error) => {
                        debug!(%peer, %error, "NBD read failed");
                        return;
                    }
                },
                () = stopped(&mut stop) => return,
            }
        }
    }

    /// A request the handshake's size refused, checked again against the
    /// export's size now: a volume grows while clients stay connected (a
    /// kernel `nbd` device is told its new size and sends requests up to
    /// it on the connection it has). None when the export did not grow.
    /// Volumes never shrink, so what the handshake allowed stays allowed.
    fn validate_grown(&self, request: &Request) -> Option<Result<(), ErrorCode>> {
        let size_bytes = self.context.target.size_bytes();
        if size_bytes <= self.negotiated.export.size_bytes {
            return None;
        }
        let mut grown = self.negotiated.clone();
        grown.export.size_bytes = size_bytes;
        Some(validate_request(request, &grown))
    }

    /// Validates, waits for permits, then runs the request on a blocking thread.
    async fn submit(&self, request: Request) {
        let checked = match validate_request(&request, &self.negotiated) {
            Err(code) => self.validate_grown(&request).unwrap_or(Err(code)),
            fine => fine,
        };
        if let Err(code) = checked {
            self.reject(request.cookie, code, "request rejected by the server")
                .await;
            return;
        }
        let payload_bytes = match &request.kind {
            RequestKind::Read { length, .. } => *length as usize,
            RequestKind::Write { data, .. } => data.len(),
            _ => 0,
        };
        let Some(mut permits) = self.permits(payload_bytes).await else {
            return;
        };
        if let (Some(io), Some((kind, bytes))) = (&self.context.io, accounted(&request.kind)) {
            permits._in_flight = io.begin(kind, bytes);
        }
        // Plain writes and cached reads complete right here, without a
        // trip to a blocking thread and back.
        let request = match dispatch::try_inline(&self.context, request) {
            Ok(mut outgoing) => {
                outgoing.permits = Some(permits);
                let _ = self.replies.send(outgoing);
                return;
            }
            Err(request) => request,
        };
        // Targets that complete requests on their own threads take them
        // here, without an I/O thread waiting on each.
        let (request, permits) = if self.context.target.submits() {
            match dispatch::submit(&self.context, request, permits, &self.replies) {
                Ok(()) => return,
                Err(back) => back,
            }
        } else {
            (request, permits)
        };
        let context = self.context.clone();
        let replies = self.replies.clone();
        tokio::task::spawn_blocking(move || {
            let mut outgoing = dispatch::execute(&context, request);
            outgoing.permits = Some(permits);
            // The writer may be gone (client vanished): the reply is dropped.
            let _ = replies.send(outgoing);
        });
    }

    async fn reject(&self, cookie: u64, code: ErrorCode, message: &str) {
        let Some(permits) = self.permits(0).await else {
            return;
        };
        let mut outgoing = Outgoing::default();
        if self.context.structured_replies {
            reply::structured_error(&mut outgoing.header, cookie, code, message);
        } else {
            reply::simple_reply(&mut outgoing.header, cookie, Some(code));
        }
        outgoing.permits = Some(permits);
        let _ = self.replies.send(outgoing);
    }

    async fn permits(&self, payload_bytes: usize) -> Option<Permits> {
        let request = self.requests.clone().acquire_owned().await.ok()?;
        let payload = if payload_bytes == 0 {
            None
        } else {
            // Validation capped payloads at MAX_PAYLOAD_BYTES, below u32::MAX.
            let count = u32::try_from(payload_bytes).ok()?;
            Some(
                self.payload_bytes
                    .clone()
                    .acquire_many_owned(count)
                    .await
                    .ok()?,
            )
        };
        Some(Permits {
            _request: request,
            _payload: payload,
            _in_flight: None,
        })
    }
}

/// What a request counts as at the edge: its kind and the bytes it moves.
fn accounted(kind: &RequestKind) -> Option<(IoKind, u64)> {
    match kind {
        RequestKind::Read { length, .. } => Some((IoKind::Read, u64::from(*length))),
        RequestKind::Write { data, .. } => Some((IoKind::Write, data.len() as u64)),
        RequestKind::Flush => Some((IoKind::Flush, 0)),
        RequestKind::Trim { length, .. } => Some((IoKind::Trim, u64::from(*length))),
        RequestKind::WriteZeroes { length, .. } => Some((IoKind::WriteZeroes, u64::from(*length))),
        RequestKind::BlockStatus { .. } | RequestKind::Disconnect => None,
    }
}

async fn write_replies<W: AsyncWrite + Unpin>(
    writer: W,
    mut replies: mpsc::UnboundedReceiver<Outgoing>,
    buffers: BufferPool,
) {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    while let Some(outgoing) = replies.recv().await {
        if let Err(error) = write_one(&mut writer, &outgoing).await {
            debug!(%error, "NBD reply write failed; dropping the remaining replies");
            return;
        }
        if let Some(data) = outgoing.data {
            buffers.put(data);
        }
        // Flush only when nothing else is ready, so bursts share syscalls.
        if replies.is_empty() && writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.flush().await;
    let _ = writer.shutdown().await;
}

async fn write_one<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    outgoing: &Outgoing,
) -> std::io::Result<()> {
    writer.write_all(&outgoing.header).await?;
    if let Some(data) = &outgoing.data {
        writer.write_all(data).await?;
    }
    Ok(())
}
