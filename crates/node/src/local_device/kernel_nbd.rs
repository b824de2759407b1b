//! A volume as a block device through the kernel's `nbd` module: the
//! daemon opens its own NBD export of the volume (a unix socket
//! connection, handshake done here), hands the connected socket to the
//! kernel over generic netlink, and the kernel serves `/dev/nbdN` from it.
//!
//! The connection is the only thing that ends with the daemon. The kernel
//! keeps the device, its queue and every mount on it; with a dead-connection
//! timeout set, I/O on a dead connection waits (up to
//! [`DEAD_CONNECTION_TIMEOUT`]) for a new one instead of failing. A
//! restarted daemon finds its devices by their records
//! (`DATA/devices/<volume>/kernel-nbd`, the index) and gives each a fresh
//! connection (RECONFIGURE); the kernel's LINK_DEAD event does the same
//! while the daemon runs (a request that outlived [`REQUEST_TIMEOUT`]).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::nbd_client::{self, HandshakeError};
use super::nbd_netlink::{self, ConnectSettings, NetlinkError};

/// How long I/O waits for a new connection after the old one died (a
/// daemon restart) before the kernel fails it, unless the node is told
/// otherwise. Long enough for a restart under a service manager (stop,
/// start, open the pools, serve again).
pub const DEAD_CONNECTION_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one request may go unanswered on a connection before the
/// kernel takes the connection for dead and resends the request on the
/// next one, unless the node is told otherwise. Requests in flight when
/// the daemon died wait this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The request timeouts a node accepts, in seconds. Not 0: the kernel
/// would then never give a connection up, and a request the daemon lost
/// would hang for good. At most an hour: a longer wait is a hang.
pub const REQUEST_TIMEOUT_SECONDS: std::ops::RangeInclusive<u64> = 1..=3600;
/// The dead-connection timeouts a node accepts, in seconds. Not 0: I/O
/// would then fail the moment the daemon stops, even for a restart. At
/// most a day: I/O that waits longer for a daemon serves nobody.
pub const DEAD_CONNECTION_TIMEOUT_SECONDS: std::ops::RangeInclusive<u64> = 1..=86_400;
/// How long an attach waits for the daemon to serve a just-attached volume.
pub const SERVED_WAIT: Duration = Duration::from_secs(20);
/// How long a restarted daemon keeps trying to reconnect a device whose
/// volume it does not serve yet.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(90);
/// The record of a volume's kernel device under its state directory.
const RECORD_FILE: &str = "kernel-nbd";
/// The kernel's answer to RECONFIGURE when no connection of the device is
/// dead (some kernels swallow it and answer 0).
const ENOSPC: i32 = 28;

/// The timeouts the kernel is given for each device: at CONNECT, and
/// again at every reconnect, so that a daemon restarted with other values
/// applies them to the devices an earlier run made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNbdTimeouts {
    /// See [`REQUEST_TIMEOUT`].
    pub request: Duration,
    /// See [`DEAD_CONNECTION_TIMEOUT`].
    pub dead_connection: Duration,
}

impl Default for KernelNbdTimeouts {
    fn default() -> Self {
        KernelNbdTimeouts {
            request: REQUEST_TIMEOUT,
            dead_connection: DEAD_CONNECTION_TIMEOUT,
        }
    }
}

/// A timeout outside what a node accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    #[error("'{0}' is not a number of seconds (e.g. 10)")]
    NotSeconds(String),
    #[error(
        "a request timeout of 0 s would let the kernel wait for a lost request for ever; \
         give {min} to {max} seconds (default {default})",
        min = REQUEST_TIMEOUT_SECONDS.start(),
        max = REQUEST_TIMEOUT_SECONDS.end(),
        default = REQUEST_TIMEOUT.as_secs()
    )]
    RequestZero,
    #[error(
        "a request timeout of {0} s is longer than the {max} s a node accepts (default {default})",
        max = REQUEST_TIMEOUT_SECONDS.end(),
        default = REQUEST_TIMEOUT.as_secs()
    )]
    RequestTooLong(u64),
    #[error(
        "a dead-connection timeout of 0 s would fail all I/O the moment the daemon stops, \
         even for a restart; give {min} to {max} seconds (default {default})",
        min = DEAD_CONNECTION_TIMEOUT_SECONDS.start(),
        max = DEAD_CONNECTION_TIMEOUT_SECONDS.end(),
        default = DEAD_CONNECTION_TIMEOUT.as_secs()
    )]
    DeadConnectionZero,
    #[error(
        "a dead-connection timeout of {0} s is longer than the {max} s (a day) a node accepts \
         (default {default})",
        max = DEAD_CONNECTION_TIMEOUT_SECONDS.end(),
        default = DEAD_CONNECTION_TIMEOUT.as_secs()
    )]
    DeadConnectionTooLong(u64),
}

fn seconds(text: &str) -> Result<u64, TimeoutError> {
    let number = text.trim();
    let number = number.strip_suffix('s').unwrap_or(number);
    number
        .parse()
        .map_err(|_| TimeoutError::NotSeconds(text.to_string()))
}

/// A request timeout in seconds (`10`, or `10s`).
pub fn parse_request_timeout(text: &str) -> Result<Duration, TimeoutError> {
    match seconds(text)? {
        0 => Err(TimeoutError::RequestZero),
        long if !REQUEST_TIMEOUT_SECONDS.contains(&long) => Err(TimeoutError::RequestTooLong(long)),
        fine => Ok(Duration::from_secs(fine)),
    }
}

/// A dead-connection timeout in seconds (`120`, or `120s`).
pub fn parse_dead_connection_timeout(text: &str) -> Result<Duration, TimeoutError> {
    match seconds(text)? {
        0 => Err(TimeoutError::DeadConnectionZero),
        long if !DEAD_CONNECTION_TIMEOUT_SECONDS.contains(&long) => {
            Err(TimeoutError::DeadConnectionTooLong(long))
        }
        fine => Ok(Duration::from_secs(fine)),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelNbdError {
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("{doing} {}: {source}", path.display())]
    Record {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kernel connected volume '{volume}' but did not say which /dev/nbdN it chose")]
    NoIndex { volume: String },
}

/// `/dev/nbdN` of a device index.
pub fn device_path(index: u32) -> String {
    format!("/dev/nbd{index}")
}

fn record_path(state_dir: &Path, volume: &str) -> PathBuf {
    state_dir.join(volume).join(RECORD_FILE)
}

fn read_record(state_dir: &Path, volume: &str) -> Option<u32> {
    std::fs::read_to_string(record_path(state_dir, volume))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn write_record(state_dir: &Path, volume: &str, index: u32) -> Result<(), KernelNbdError> {
    let path = record_path(state_dir, volume);
    let record = |doing, path: &Path| {
        let path = path.to_path_buf();
        move |source| KernelNbdError::Record {
            doing,
            path,
            source,
        }
    };
    let dir = state_dir.join(volume);
    std::fs::create_dir_all(&dir).map_err(record("creating", &dir))?;
    // Written whole, then renamed: a crash leaves the old record or the new.
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, format!("{index}\n")).map_err(record("writing", &temporary))?;
    std::fs::rename(&temporary, &path).map_err(record("renaming", &temporary))
}

fn remove_record(state_dir: &Path, volume: &str) {
    let _ = std::fs::remove_file(record_path(state_dir, volume));
    let _ = std::fs::remove_dir(state_dir.join(volume));
}

/// Every recorded (volume, index), whether or not the kernel still has it.
pub fn records(state_dir: &Path) -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    let mut records: Vec<(String, u32)> = entries
        .filter_map(|entry| {
            let volume = entry.ok()?.file_name().to_string_lossy().into_owned();
            let index = read_record(state_dir, &volume)?;
            Some((volume, index))
        })
        .collect();
    records.sort();
    records
}

/// Runs a blocking netlink or socket call on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KernelNbdError> + Send + 'static,
) -> Result<T, KernelNbdError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))
}

/// The indexes the kernel has configured now (none when it has no `nbd`
/// module loaded).
async fn configured() -> Result<Vec<u32>, KernelNbdError> {
    blocking(|| {
        let answers = match nbd_netlink::call(
            "listing the nbd devices (NBD_CMD_STATUS)",
            nbd_netlink::status_message()?,
        ) {
            Err(NetlinkError::NoFamily(_)) => return Ok(Vec::new()),
            answers => answers?,
        };
        Ok(nbd_netlink::devices_of(&answers)
            .into_iter()
            .filter(|(_, connected)| *connected)
            .map(|(index, _)| index)
            .collect())
    })
    .await
}

/// Every recorded device the kernel still has, as (volume, device path).
/// Records the kernel no longer has (a host reboot) are dropped.
pub async fn devices(state_dir: &Path) -> Result<Vec<(String, String)>, KernelNbdError> {
    let records = records(state_dir);
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let configured = configured().await?;
    let mut devices = Vec::new();
    for (volume, index) in records {
        if configured.contains(&index) {
            devices.push((volume, device_path(index)));
        } else {
            tracing::info!(
                volume,
                index,
                "dropping the record of a device the kernel no longer has"
            );
            remove_record(state_dir, &volume);
        }
    }
    Ok(devices)
}

/// The kernel device of `volume`, if this daemon made one.
pub async fn find(state_dir: &Path, volume: &str) -> Result<Option<String>, KernelNbdError> {
    Ok(devices(state_dir)
        .await?
        .into_iter()
        .find(|(name, _)| name == volume)
        .map(|(_, path)| path))
}

/// Opens the export, waiting up to `wait` for the daemon to serve it.
async fn open_when_served(
    nbd_socket: &Path,
    volume: &str,
    wait: Duration,
) -> Result<nbd_client::Opened, KernelNbdError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let socket = nbd_socket.to_path_buf();
        let export = volume.to_string();
        let opened = blocking(move || Ok(nbd_client::open(&socket, &export)?)).await;
        match opened {
            Err(KernelNbdError::Handshake(
                HandshakeError::NoExport { .. } | HandshakeError::Connect { .. },
            )) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            done => return done,
        }
    }
}

/// The block size the kernel is told: 4 KiB when the size allows it (what
/// file systems use), else 512.
fn block_size_of(size_bytes: u64) -> u64 {
    if size_bytes.is_multiple_of(4096) {
        4096
    } else {
        512
    }
}

/// Connects a kernel device to `volume` (or finds the one made before).
pub async fn attach(
    state_dir: &Path,
    nbd_socket: &Path,
    volume: &str,
    timeouts: KernelNbdTimeouts,
) -> Result<String, KernelNbdError> {
    if let Some(path) = find(state_dir, volume).await? {
        return Ok(path);
    }
    let opened = open_when_served(nbd_socket, volume, SERVED_WAIT).await?;
    let settings = ConnectSettings {
        size_bytes: opened.size_bytes,
        block_size_bytes: block_size_of(opened.size_bytes),
        transmission_flags: opened.transmission_flags,
        request_timeout: timeouts.request,
        dead_connection_timeout: timeouts.dead_connection,
    };
    let doing = format!("connecting an nbd device to volume '{volume}' (NBD_CMD_CONNECT)");
    let answers = blocking(move || {
        let message = nbd_netlink::connect_message(&settings, &[opened.stream.as_raw_fd()])?;
        // The kernel holds its own reference to the socket once CONNECT
        // returns; ours closes when `opened` drops after the call.
        let answers = nbd_netlink::call(&doing, message)?;
        drop(opened);
        Ok(answers)
    })
    .await?;
    let index = nbd_netlink::index_of(&answers).ok_or_else(|| KernelNbdError::NoIndex {
        volume: volume.to_string(),
    })?;
    if let Err(error) = write_record(state_dir, volume, index) {
        // Without a record no later run could find it: give it back now.
        let _ = disconnect(index).await;
        return Err(error);
    }
    tracing::info!(volume, index, "connected a kernel nbd device");
    Ok(device_path(index))
}

async fn disconnect(index: u32) -> Result<(), KernelNbdError> {
    blocking(move || {
        nbd_netlink::call(
            &format!("releasing /dev/nbd{index} (NBD_CMD_DISCONNECT)"),
            nbd_netlink::disconnect_message(index)?,
        )?;
        Ok(())
    })
    .await
}

/// Releases the kernel device of `volume`; nothing to do when there is none.
pub async fn detach(state_dir: &Path, volume: &str) -> Result<(), KernelNbdError> {
    let Some(index) = read_record(state_dir, volume) else {
        return Ok(());
    };
    if configured().await?.contains(&index) {
        disconnect(index).await?;
    }
    remove_record(state_dir, volume);
    tracing::info!(volume, index, "released a kernel nbd device");
    Ok(())
}

/// Gives the device of `volume` a fresh connection in place of a dead
/// one. On a device whose connection is alive the kernel keeps the old
/// one and this does nothing, so it is safe to call whenever in doubt.
pub async fn reconnect(
    state_dir: &Path,
    nbd_socket: &Path,
    volume: &str,
    wait: Duration,
    timeouts: KernelNbdTimeouts,
) -> Result<(), KernelNbdError> {
    let Some(index) = read_record(state_dir, volume) else {
        return Ok(());
    };
    if !configured().await?.contains(&index) {
        remove_record(state_dir, volume);
        return Ok(());
    }
    let opened = open_when_served(nbd_socket, volume, wait).await?;
    let doing = format!("reconnecting /dev/nbd{index} to volume '{volume}' (NBD_CMD_RECONFIGURE)");
    let result = blocking(move || {
        let message = nbd_netlink::reconfigure_message(
            index,
            &[opened.stream.as_raw_fd()],
            Some((timeouts.request, timeouts.dead_connection)),
        )?;
        let result = nbd_netlink::call(&doing, message);
        drop(opened);
        Ok(result?)
    })
    .await;
    match result {
        Ok(_) => {
            tracing::info!(volume, index, "gave a kernel nbd device a fresh connection");
            Ok(())
        }
        Err(KernelNbdError::Netlink(error)) if error.errno() == Some(ENOSPC) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The size of `/dev/nbd<index>` as the kernel has it now (0 when it is
/// not connected; None when there is no such device).
pub fn kernel_size(index: u32) -> Option<u64> {
    let sectors = std::fs::read_to_string(format!("/sys/block/nbd{index}/size")).ok()?;
    // /sys/block/*/size counts 512-byte sectors whatever the block size.
    sectors
        .trim()
        .parse::<u64>()
        .ok()
        .map(|sectors| sectors * 512)
}

/// Gives the device of `volume` the size its export serves now, when that
/// is more than the device has (the volume grew): RECONFIGURE with the new
/// size, on the live device, which stays connected and mounted. The size
/// is what a fresh handshake with this daemon's NBD server shows, never
/// the cluster's word alone: the kernel sends requests up to the size it
/// is given, and the server must take them. Answers the new size when the
/// device grew, None when there was nothing to do.
pub async fn grow(
    state_dir: &Path,
    nbd_socket: &Path,
    volume: &str,
) -> Result<Option<u64>, KernelNbdError> {
    let Some(index) = read_record(state_dir, volume) else {
        return Ok(None);
    };
    let device_bytes = match kernel_size(index) {
        Some(bytes) if bytes > 0 => bytes,
        _ => return Ok(None),
    };
    let opened = open_when_served(nbd_socket, volume, Duration::ZERO).await?;
    let served = opened.size_bytes;
    drop(opened);
    // The block size CONNECT set stays: the new size is a whole number of
    // its blocks (volume sizes are multiples of 4 KiB anyway).
    let size = served - served % block_size_of(device_bytes);
    if size <= device_bytes {
        return Ok(None);
    }
    let doing = format!(
        "growing /dev/nbd{index} of volume '{volume}' to {size} bytes (NBD_CMD_RECONFIGURE)"
    );
    blocking(move || {
        nbd_netlink::call(&doing, nbd_netlink::resize_message(index, size)?)?;
        Ok(())
    })
    .await?;
    tracing::info!(
        volume,
        index,
        from_bytes = device_bytes,
        to_bytes = size,
        "grew a kernel nbd device to its volume's new size"
    );
    Ok(Some(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_volume_and_index_and_nothing_else_counts() {
        let state = tempfile::tempdir().unwrap();
        write_record(state.path(), "pvc-1", 3).unwrap();
        write_record(state.path(), "pvc-2", 0).unwrap();
        std::fs::create_dir_all(state.path().join("fuse-only")).unwrap();
        std::fs::create_dir_all(state.path().join("garbled")).unwrap();
        std::fs::write(record_path(state.path(), "garbled"), "x\n").unwrap();
        assert_eq!(
            records(state.path()),
            vec![("pvc-1".to_string(), 3), ("pvc-2".to_string(), 0)]
        );
        remove_record(state.path(), "pvc-1");
        assert!(!state.path().join("pvc-1").exists());
    }

    #[test]
    fn timeouts_outside_the_limits_are_refused_saying_why() {
        assert_eq!(parse_request_timeout("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_request_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_request_timeout("0"), Err(TimeoutError::RequestZero));
        assert_eq!(
            parse_request_timeout("3601"),
            Err(TimeoutError::RequestTooLong(3601))
        );
        assert!(matches!(
            parse_request_timeout("ten"),
            Err(TimeoutError::NotSeconds(_))
        ));
        assert_eq!(
            parse_dead_connection_timeout("600"),
            Ok(Duration::from_secs(600))
        );
        assert_eq!(
            parse_dead_connection_timeout("0"),
            Err(TimeoutError::DeadConnectionZero)
        );
        assert_eq!(
            parse_dead_connection_timeout("86401"),
            Err(TimeoutError::DeadConnectionTooLong(86401))
        );
        assert!(parse_dead_connection_timeout("-1").is_err());
        let message = TimeoutError::RequestZero.to_string();
        assert!(
            message.contains("1 to 3600 seconds (default 10)"),
            "{message}"
        );
        assert_eq!(
            KernelNbdTimeouts::default(),
            KernelNbdTimeouts {
                request: REQUEST_TIMEOUT,
                dead_connection: DEAD_CONNECTION_TIMEOUT
            }
        );
    }

    #[test]
    fn the_block_size_divides_the_size() {
        assert_eq!(block_size_of(64 << 20), 4096);
        assert_eq!(block_size_of((64 << 20) + 512), 512);
        assert_eq!(device_path(7), "/dev/nbd7");
    }
}
