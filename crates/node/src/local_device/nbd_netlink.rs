//! The kernel's `nbd` generic netlink family (include/uapi/linux/nbd-netlink.h,
//! drivers/block/nbd.c): CONNECT hands it connected sockets and it answers
//! the index of the device it chose; RECONFIGURE gives a device a new
//! socket in place of a dead one, new timeouts, or a new size (a volume
//! grown while the device is in use); DISCONNECT releases a device; STATUS
//! lists the configured devices; LINK_DEAD is its multicast event when a
//! connection dies.
//!
//! Every call is blocking (neli's synchronous router) and opens its own
//! netlink socket: they are rare (an attach, a release, a daemon start),
//! and the callers run them on tokio's blocking pool.

use std::os::fd::RawFd;
use std::time::Duration;

use neli::consts::{genl::Cmd, genl::NlAttrType, nl::NlmF, socket::NlFamily};
use neli::genl::{AttrTypeBuilder, Genlmsghdr, GenlmsghdrBuilder, Nlattr, NlattrBuilder};
use neli::neli_enum;
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::{Buffer, GenlBuffer};
use neli::utils::Groups;

pub const FAMILY_NAME: &str = "nbd";
pub const FAMILY_VERSION: u8 = 1;
pub const MULTICAST_GROUP: &str = "nbd_mc_group";

#[neli_enum(serialized_type = "u8")]
pub enum Command {
    Unspec = 0,
    Connect = 1,
    Disconnect = 2,
    Reconfigure = 3,
    LinkDead = 4,
    Status = 5,
}
impl Cmd for Command {}

/// NBD_ATTR_*: the attributes of every command.
#[neli_enum(serialized_type = "u16")]
pub enum Attribute {
    Unspec = 0,
    /// u32
    Index = 1,
    /// u64
    SizeBytes = 2,
    /// u64
    BlockSizeBytes = 3,
    /// u64, seconds
    Timeout = 4,
    /// u64
    ServerFlags = 5,
    /// u64
    ClientFlags = 6,
    /// nested: NBD_SOCK_ITEM
    Sockets = 7,
    /// u64, seconds
    DeadConnTimeout = 8,
    /// nested: NBD_DEVICE_ITEM
    DeviceList = 9,
}
impl NlAttrType for Attribute {}

/// NBD_SOCK_ITEM and NBD_DEVICE_ITEM: one entry of a nested list.
#[neli_enum(serialized_type = "u16")]
pub enum ListItem {
    Unspec = 0,
    Entry = 1,
}
impl NlAttrType for ListItem {}

/// NBD_SOCK_*: inside an NBD_SOCK_ITEM.
#[neli_enum(serialized_type = "u16")]
pub enum Socket {
    Unspec = 0,
    /// u32
    Fd = 1,
}
impl NlAttrType for Socket {}

/// NBD_DEVICE_*: inside an NBD_DEVICE_ITEM.
#[neli_enum(serialized_type = "u16")]
pub enum DeviceAttribute {
    Unspec = 0,
    /// u32
    Index = 1,
    /// u8
    Connected = 2,
}
impl NlAttrType for DeviceAttribute {}

pub type Message = Genlmsghdr<Command, Attribute>;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error(
        "the kernel has no generic netlink family \"nbd\" (is the nbd module loaded? `modprobe nbd`): {0}"
    )]
    NoFamily(String),
    #[error("{doing}: the kernel answered {}", std::io::Error::from_raw_os_error(*.errno))]
    Refused { doing: String, errno: i32 },
    #[error("{doing}: {message}")]
    Failed { doing: String, message: String },
}

impl NetlinkError {
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// The settings of a device, as CONNECT takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectSettings {
    pub size_bytes: u64,
    pub block_size_bytes: u64,
    pub transmission_flags: u16,
    pub request_timeout: Duration,
    pub dead_connection_timeout: Duration,
}

fn build_error(error: impl std::fmt::Display) -> NetlinkError {
    NetlinkError::Failed {
        doing: "building a netlink message".into(),
        message: error.to_string(),
    }
}

fn attribute<T: NlAttrType, P: neli::Size + neli::ToBytes>(
    kind: T,
    payload: P,
) -> Result<Nlattr<T, Buffer>, NetlinkError> {
    NlattrBuilder::default()
        .nla_type(
            AttrTypeBuilder::default()
                .nla_type(kind)
                .build()
                .map_err(build_error)?,
        )
        .nla_payload(payload)
        .build()
        .map_err(build_error)
}

/// NBD_ATTR_SOCKETS holding one NBD_SOCK_ITEM per socket.
fn sockets(fds: &[RawFd]) -> Result<Nlattr<Attribute, Buffer>, NetlinkError> {
    let mut list = attribute(Attribute::Sockets, Vec::<u8>::new())?;
    for fd in fds {
        let item = attribute(ListItem::Entry, Vec::<u8>::new())?
            .nest(&attribute(Socket::Fd, *fd as u32)?)
            .map_err(build_error)?;
        list = list.nest(&item).map_err(build_error)?;
    }
    Ok(list)
}

fn message(
    command: Command,
    attributes: Vec<Nlattr<Attribute, Buffer>>,
) -> Result<Message, NetlinkError> {
    GenlmsghdrBuilder::default()
        .cmd(command)
        .version(FAMILY_VERSION)
        .attrs(attributes.into_iter().collect::<GenlBuffer<_, _>>())
        .build()
        .map_err(build_error)
}

pub fn connect_message(settings: &ConnectSettings, fds: &[RawFd]) -> Result<Message, NetlinkError> {
    message(
        Command::Connect,
        vec![
            attribute(Attribute::SizeBytes, settings.size_bytes)?,
            attribute(Attribute::BlockSizeBytes, settings.block_size_bytes)?,
            attribute(
                Attribute::ServerFlags,
                u64::from(settings.transmission_flags),
            )?,
            attribute(Attribute::Timeout, settings.request_timeout.as_secs())?,
            attribute(
                Attribute::DeadConnTimeout,
                settings.dead_connection_timeout.as_secs(),
            )?,
            sockets(fds)?,
        ],
    )
}

/// RECONFIGURE with fresh sockets for the dead ones (the kernel keeps a
/// live one and ignores the new socket) and, with `timeouts`, the request
/// and dead-connection timeouts: a restarted daemon's settings reach the
/// devices an earlier run made. The kernel applies the timeouts before it
/// looks at the sockets, so they hold even when no connection was dead.
pub fn reconfigure_message(
    index: u32,
    fds: &[RawFd],
    timeouts: Option<(Duration, Duration)>,
) -> Result<Message, NetlinkError> {
    let mut attributes = vec![attribute(Attribute::Index, index)?, sockets(fds)?];
    if let Some((request, dead_connection)) = timeouts {
        attributes.push(attribute(Attribute::Timeout, request.as_secs())?);
        attributes.push(attribute(
            Attribute::DeadConnTimeout,
            dead_connection.as_secs(),
        )?);
    }
    message(Command::Reconfigure, attributes)
}

/// RECONFIGURE with a new size only: the kernel sets the device's
/// capacity and tells the block layer (`nbd_genl_size_set`, in
/// RECONFIGURE since Linux 5.3), while the device stays connected and
/// mounted. The block size stays as CONNECT set it.
pub fn resize_message(index: u32, size_bytes: u64) -> Result<Message, NetlinkError> {
    message(
        Command::Reconfigure,
        vec![
            attribute(Attribute::Index, index)?,
            attribute(Attribute::SizeBytes, size_bytes)?,
        ],
    )
}

pub fn disconnect_message(index: u32) -> Result<Message, NetlinkError> {
    message(
        Command::Disconnect,
        vec![attribute(Attribute::Index, index)?],
    )
}

pub fn status_message() -> Result<Message, NetlinkError> {
    message(Command::Status, Vec::new())
}

fn router(doing: &str) -> Result<(NlRouter, u16), NetlinkError> {
    let (router, _) =
        NlRouter::connect(NlFamily::Generic, None, Groups::empty()).map_err(|error| {
            NetlinkError::Failed {
                doing: format!("{doing}: opening a generic netlink socket"),
                message: error.to_string(),
            }
        })?;
    let family = router
        .resolve_genl_family(FAMILY_NAME)
        .map_err(|error| NetlinkError::NoFamily(error.to_string()))?;
    Ok((router, family))
}

/// Sends `request` and collects the kernel's answers (after its ACK).
pub fn call(doing: &str, request: Message) -> Result<Vec<Message>, NetlinkError> {
    let (router, family) = router(doing)?;
    let replies = router
        .send::<_, _, u16, Message>(family, NlmF::ACK, NlPayload::Payload(request))
        .map_err(|error| NetlinkError::Failed {
            doing: doing.to_string(),
            message: error.to_string(),
        })?;
    let mut answers = Vec::new();
    for reply in replies {
        match reply {
            Ok(reply) => {
                if let Some(payload) = reply.get_payload() {
                    answers.push(payload.clone());
                }
            }
            Err(neli::err::RouterError::Nlmsgerr(error)) => {
                return Err(NetlinkError::Refused {
                    doing: doing.to_string(),
                    errno: -*error.error(),
                })
            }
            Err(error) => {
                return Err(NetlinkError::Failed {
                    doing: doing.to_string(),
                    message: error.to_string(),
                })
            }
        }
    }
    Ok(answers)
}

/// The index CONNECT answers with.
pub fn index_of(answers: &[Message]) -> Option<u32> {
    answers.iter().find_map(|answer| {
        answer
            .attrs()
            .get_attr_handle()
            .get_attr_payload_as::<u32>(Attribute::Index)
            .ok()
    })
}

/// (index, connected) of every device STATUS lists.
pub fn devices_of(answers: &[Message]) -> Vec<(u32, bool)> {
    let mut devices = Vec::new();
    for answer in answers {
        let handle = answer.attrs().get_attr_handle();
        let Some(list) = handle.get_attribute(Attribute::DeviceList) else {
            continue;
        };
        let Ok(items) = list.get_attr_handle::<ListItem>() else {
            continue;
        };
        for item in items.get_attrs() {
            let Ok(fields) = item.get_attr_handle::<DeviceAttribute>() else {
                continue;
            };
            let Ok(index) = fields.get_attr_payload_as::<u32>(DeviceAttribute::Index) else {
                continue;
            };
            let connected = fields
                .get_attr_payload_as::<u8>(DeviceAttribute::Connected)
                .is_ok_and(|connected| connected != 0);
            devices.push((index, connected));
        }
    }
    devices
}

/// Blocks until the kernel reports a dead connection, and calls
/// `on_dead(index)` for each; returns only when the subscription fails.
pub fn watch_dead_links(mut on_dead: impl FnMut(u32)) -> NetlinkError {
    let doing = "listening for the nbd driver's dead-connection events";
    let (router, mut events) = match NlRouter::connect(NlFamily::Generic, None, Groups::empty()) {
        Ok(connected) => connected,
        Err(error) => {
            return NetlinkError::Failed {
                doing: doing.into(),
                message: error.to_string(),
            }
        }
    };
    let joined = router
        .resolve_nl_mcast_group(FAMILY_NAME, MULTICAST_GROUP)
        .map_err(|error| error.to_string())
        .and_then(|group| {
            router
                .add_mcast_membership(Groups::new_groups(&[group]))
                .map_err(|error| error.to_string())
        });
    if let Err(message) = joined {
        return NetlinkError::Failed {
            doing: doing.into(),
            message,
        };
    }
    loop {
        match events.next_typed::<u16, Message>() {
            Some(Ok(event)) => {
                let Some(payload) = event.get_payload() else {
                    continue;
                };
                if *payload.cmd() != Command::LinkDead {
                    continue;
                }
                if let Some(index) = index_of(std::slice::from_ref(payload)) {
                    on_dead(index);
                }
            }
            // A message of another family or a bad one: not ours to stop on.
            Some(Err(neli::err::RouterError::De(_))) => continue,
            Some(Err(error)) => {
                return NetlinkError::Failed {
                    doing: doing.into(),
                    message: error.to_string(),
                }
            }
            None => {
                return NetlinkError::Failed {
                    doing: doing.into(),
                    message: "the event channel closed".into(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The bytes of each message, read back field by field against the
    //! numbers of include/uapi/linux/nbd-netlink.h (and the generic netlink
    //! header: cmd u8, version u8, reserved u16; each attribute a u16
    //! length, a u16 type, the payload padded to 4 bytes).
    use super::*;
    use neli::ToBytes;
    use std::io::Cursor;

    fn bytes(message: &Message) -> Vec<u8> {
        let mut cursor = Cursor::new(Vec::new());
        message.to_bytes(&mut cursor).unwrap();
        cursor.into_inner()
    }

    /// (type without the nested bit, payload) of each attribute.
    fn attributes(mut bytes: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= 4 {
            let length = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
            let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & !(3 << 14);
            out.push((kind, bytes[4..length].to_vec()));
            bytes = &bytes[length.next_multiple_of(4).min(bytes.len())..];
        }
        out
    }

    fn u64_of(payload: &[u8]) -> u64 {
        u64::from_ne_bytes(payload.try_into().unwrap())
    }

    #[test]
    fn connect_carries_the_settings_and_one_socket_per_fd() {
        let settings = ConnectSettings {
            size_bytes: 64 << 20,
            block_size_bytes: 4096,
            transmission_flags: 0x012d,
            request_timeout: Duration::from_secs(10),
            dead_connection_timeout: Duration::from_secs(120),
        };
        let message = bytes(&connect_message(&settings, &[7]).unwrap());
        // NBD_CMD_CONNECT = 1, NBD_GENL_VERSION = 1.
        assert_eq!(&message[0..4], &[1, 1, 0, 0]);
        let attributes = attributes(&message[4..]);
        let kinds: Vec<u16> = attributes.iter().map(|(kind, _)| *kind).collect();
        // SIZE_BYTES 2, BLOCK_SIZE_BYTES 3, SERVER_FLAGS 5, TIMEOUT 4,
        // DEAD_CONN_TIMEOUT 8, SOCKETS 7.
        assert_eq!(kinds, [2, 3, 5, 4, 8, 7]);
        assert_eq!(u64_of(&attributes[0].1), 64 << 20);
        assert_eq!(u64_of(&attributes[1].1), 4096);
        assert_eq!(u64_of(&attributes[2].1), 0x012d);
        assert_eq!(u64_of(&attributes[3].1), 10);
        assert_eq!(u64_of(&attributes[4].1), 120);
        // SOCKETS → one NBD_SOCK_ITEM (1) → NBD_SOCK_FD (1) = 7 as u32.
        let items = super::tests::attributes(&attributes[5].1);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].0, 1);
        let fields = super::tests::attributes(&items[0].1);
        assert_eq!(fields, vec![(1, 7u32.to_ne_bytes().to_vec())]);
    }

    #[test]
    fn nested_lists_are_marked_nested() {
        let message = bytes(&reconfigure_message(3, &[9], None).unwrap());
        // NBD_CMD_RECONFIGURE = 3.
        assert_eq!(message[0], 3);
        // INDEX (1) first: 4-byte header + u32.
        assert_eq!(u16::from_ne_bytes([message[6], message[7]]), 1);
        assert_eq!(u32::from_ne_bytes(message[8..12].try_into().unwrap()), 3);
        // SOCKETS with NLA_F_NESTED (1 << 15).
        assert_eq!(u16::from_ne_bytes([message[14], message[15]]), 7 | 1 << 15);
        assert_eq!(attributes(&message[4..]).len(), 2);
    }

    #[test]
    fn reconfigure_carries_the_timeouts_and_resize_only_the_size() {
        let timeouts = (Duration::from_secs(30), Duration::from_secs(600));
        let message = bytes(&reconfigure_message(3, &[9], Some(timeouts)).unwrap());
        let attributes = attributes(&message[4..]);
        let kinds: Vec<u16> = attributes.iter().map(|(kind, _)| *kind).collect();
        // INDEX 1, SOCKETS 7, TIMEOUT 4, DEAD_CONN_TIMEOUT 8.
        assert_eq!(kinds, [1, 7, 4, 8]);
        assert_eq!(u64_of(&attributes[2].1), 30);
        assert_eq!(u64_of(&attributes[3].1), 600);

        let message = bytes(&resize_message(5, 512 << 20).unwrap());
        assert_eq!(&message[0..4], &[3, 1, 0, 0]);
        let attributes = super::tests::attributes(&message[4..]);
        // INDEX 1 = 5, SIZE_BYTES 2 = 512 MiB, and nothing else: no socket
        // (a live connection stays) and no block size (it stays as set).
        assert_eq!(attributes.len(), 2);
        assert_eq!(attributes[0], (1, 5u32.to_ne_bytes().to_vec()));
        assert_eq!(attributes[1].0, 2);
        assert_eq!(u64_of(&attributes[1].1), 512 << 20);
    }

    #[test]
    fn disconnect_and_status_name_their_commands() {
        let disconnect = bytes(&disconnect_message(5).unwrap());
        assert_eq!(disconnect[0], 2);
        assert_eq!(
            attributes(&disconnect[4..]),
            vec![(1, 5u32.to_ne_bytes().to_vec())]
        );
        assert_eq!(bytes(&status_message().unwrap()), vec![5, 1, 0, 0]);
    }

    #[test]
    fn a_status_answer_lists_index_and_connected() {
        let item = |index: u32, connected: u8| {
            attribute(ListItem::Entry, Vec::<u8>::new())
                .unwrap()
                .nest(&attribute(DeviceAttribute::Index, index).unwrap())
                .unwrap()
                .nest(&attribute(DeviceAttribute::Connected, connected).unwrap())
                .unwrap()
        };
        let list = attribute(Attribute::DeviceList, Vec::<u8>::new())
            .unwrap()
            .nest(&item(0, 1))
            .unwrap()
            .nest(&item(4, 0))
            .unwrap();
        let answer = message(Command::Status, vec![list]).unwrap();
        assert_eq!(devices_of(&[answer]), vec![(0, true), (4, false)]);
        let connected = message(
            Command::Connect,
            vec![attribute(Attribute::Index, 6u32).unwrap()],
        )
        .unwrap();
        assert_eq!(index_of(&[connected]), Some(6));
    }
}
