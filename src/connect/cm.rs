//! Connecting through the RDMA connection manager (librdmacm), so that
//! standard rdma_cm peers can connect (feature `verbs`).
//!
//! The queue pair is this crate's own [`VerbsQp`]: rdma_cm resolves the
//! address and route and carries the connection handshake (with private
//! data), and the queue pair is moved to RTR and RTS with the attributes
//! rdma_cm computed (`rdma_init_qp_attr`). The result, [`CmQp`], is a
//! [`QueuePair`]: give it to a [`Ring`](crate::ring::Ring). Dropping it
//! disconnects.
//!
//! rdma_cm needs an address that routes to an RDMA device (on Soft-RoCE
//! the address of the interface `rxe` runs on; loopback does not route),
//! and the [`VerbsDevice`] passed in must be that device.
//!
//! A bonding failover that changes the bond's hardware address makes the
//! kernel renew the port's GIDs: a handshake under way then holds a stale
//! path, and fails at once with an [`Error::Handshake`] that says so (a
//! listener goes on past it); a new attempt resolves afresh. A listener
//! hears of the change and goes on, and a ring does not take it for its
//! peer's departure.
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_ring::backend::verbs::VerbsDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::connect::cm;
//! let dev = VerbsDevice::open("rxe1").unwrap();
//! let pd = dev.alloc_pd().unwrap();
//! let qp = cm::connect(&dev, &pd, "10.99.0.1:7472".parse().unwrap(), QpConfig::default(),
//!                      b"hello", Duration::from_secs(10)).unwrap();
//! println!("peer said {:?}", qp.peer_private_data());
//! ```

use std::ffi::CStr;
use std::net::SocketAddr;
use std::time::Duration;

use rdma_sys::{
    ibv_qp_attr, rdma_cm_event_type as ev, rdma_cm_id, rdma_conn_param, rdma_event_channel,
};

use crate::backend::verbs::{DeviceOptions, VerbsCq, VerbsDevice, VerbsPd, VerbsQp, VerbsSrq};
use crate::backend::{PostError, QpCaps, QpConfig, QueuePair, RecvWr, SendWr, Sge};
use crate::deadline::Deadline;
use crate::error::Error;

/// Private data rdma_cm carries in a connect request or reply, at most.
pub const MAX_PRIVATE_DATA: usize = 56;

fn cm_error(verb: &'static str) -> Error {
    Error::Verbs {
        verb,
        source: std::io::Error::last_os_error(),
    }
}

fn cm_failure(step: &'static str, reason: String) -> Error {
    Error::Handshake { step, reason }
}

/// Why a connect request was rejected, from the IB CM reason rdma_cm
/// passes as the event's status, and the private data the rejecting side
/// sent (rdma_cm pads it with zeros to 148 bytes; the padding is left
/// out).
fn rejection(status: i32, private: &[u8]) -> String {
    if status < 0 {
        // iWARP's reason is an errno.
        return format!(
            "the peer refused the connection ({})",
            std::io::Error::from_raw_os_error(-status)
        );
    }
    let why = match status {
        1 => "the listener has no queue pair for it",
        3 => "the listener's side is out of resources",
        4 => "the listener's side timed out",
        8 => "nothing listens at that address and port",
        10 => "a stale connection holds that queue pair number",
        26 => "the listener refused the path MTU",
        27 => "the listener cannot answer as many READs and atomics at once",
        28 => "the listener rejected it",
        30 => "a connection of the same identifier is already there",
        _ => "the listener's side rejected it",
    };
    let sent = private.len() - private.iter().rev().take_while(|&&b| b == 0).count();
    if sent == 0 {
        format!("{why} (IB CM reject reason {status})")
    } else {
        format!(
            "{why} (IB CM reject reason {status}; it said {:?})",
            String::from_utf8_lossy(&private[..sent])
        )
    }
}

/// A request's rdma_cm call refused as invalid before the answer went
/// out: the requester gave up (its id destroyed, its REJ reset the
/// request), which rdma_cm reports no other way, as it passes on no event
/// for a request until it is answered. The requester's doing, so a
/// handshake failure: a listener serves the next one.
fn requester_gone(err: Error) -> Error {
    match err {
        Error::Verbs { verb, source }
            if verb.starts_with("rdma_") && source.raw_os_error() == Some(libc::EINVAL) =>
        {
            cm_failure(
                "accepting",
                format!("the requester gave up before it was answered ({verb}: {source})"),
            )
        }
        other => other,
    }
}

/// The listener's own device went away: its fault, not a peer's (a
/// handshake error would tell the caller to accept again, for ever).
fn listener_device_removed() -> Error {
    device_removed("the listener's device was removed: it hears no more requests")
}

/// Our device went away, `what` saying whose: a fault of ours, not a
/// peer's.
fn device_removed(what: &'static str) -> Error {
    Error::Verbs {
        verb: "rdma_get_cm_event",
        source: std::io::Error::new(std::io::ErrorKind::NotFound, what),
    }
}

/// A handshake's step that failed because the network under it changed.
fn stale_path(step: &'static str) -> Error {
    cm_failure(
        step,
        "the network device under the connection changed its hardware address \
         (a bonding failover?), and the path taken is stale: connect again"
            .into(),
    )
}

/// An event other than the one `step` waits for. rdma_cm reports its own
/// timeouts as events too (an address, route or connection that found no
/// answer in time, with status `-ETIMEDOUT`, or a peer unreachable): those
/// are [`Error::HandshakeTimeout`], as a silent peer is on the TCP path,
/// not a refusal.
///
/// A handshake told that the network device under it changed its hardware
/// address (`ADDR_CHANGE`: a bonding failover, say) fails too, at once:
/// the kernel renews the port's GIDs then, and the path and GID the
/// handshake took before are stale. A new attempt resolves afresh.
fn unexpected(step: &'static str, kind: ev::Type, status: i32) -> Error {
    if kind == ev::RDMA_CM_EVENT_ADDR_CHANGE {
        return stale_path(step);
    }
    let reason = format!("got {} (status {status})", event_name(kind));
    if status == -libc::ETIMEDOUT || kind == ev::RDMA_CM_EVENT_UNREACHABLE {
        Error::HandshakeTimeout { step, reason }
    } else {
        cm_failure(step, reason)
    }
}

/// An event channel and an id on it, destroyed together (id first).
struct CmId {
    channel: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
}

// SAFETY: librdmacm ids and channels may be used from any thread; this
// value owns both and destroys them once.
unsafe impl Send for CmId {}
// Not `Sync`: `next_event`, `try_event` and `expect` call into librdmacm
// through `&self`, and nothing here orders two threads doing so at once.
static_assertions::assert_not_impl_any!(CmId: Sync);
static_assertions::assert_not_impl_any!(CmQp: Sync);
static_assertions::assert_not_impl_any!(CmListener: Sync);
static_assertions::assert_not_impl_any!(CmRequest: Sync);

/// An event channel whose descriptor does not block, so that a poll that
/// loses an event to another thread, or a check for a disconnect, never
/// blocks in `rdma_get_cm_event`.
fn event_channel() -> Result<*mut rdma_event_channel, Error> {
    // SAFETY: no arguments; NULL on failure.
    let channel = unsafe { rdma_sys::rdma_create_event_channel() };
    if channel.is_null() {
        return Err(cm_error("rdma_create_event_channel"));
    }
    // SAFETY: the channel's descriptor is open; only its flags change.
    let fd = unsafe { (*channel).fd };
    // SAFETY: as above.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        let err = cm_error("fcntl(O_NONBLOCK) on the rdma_cm event channel");
        // SAFETY: created above, unused.
        unsafe { rdma_sys::rdma_destroy_event_channel(channel) };
        return Err(err);
    }
    Ok(channel)
}

impl CmId {
    fn new() -> Result<CmId, Error> {
        let channel = event_channel()?;
        let mut this = CmId {
            channel,
            id: std::ptr::null_mut(),
        };
        // SAFETY: the channel is live; `id` is a valid out-pointer.
        let ret = unsafe {
            rdma_sys::rdma_create_id(
                channel,
                &mut this.id,
                std::ptr::null_mut(),
                rdma_sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(cm_error("rdma_create_id"));
        }
        Ok(this)
    }

    /// An id from a connect request, moved to a channel of its own so it
    /// does not depend on the listener's.
    fn adopt(id: *mut rdma_cm_id) -> Result<CmId, Error> {
        let channel = match event_channel() {
            Ok(channel) => channel,
            Err(e) => {
                // SAFETY: the id came from a connect request and is ours to destroy.
                unsafe { rdma_sys::rdma_destroy_id(id) };
                return Err(e);
            }
        };
        let this = CmId { channel, id };
        // SAFETY: both are live; migrating moves the id's events to `channel`.
        if unsafe { rdma_sys::rdma_migrate_id(id, channel) } != 0 {
            return Err(cm_error("rdma_migrate_id"));
        }
        Ok(this)
    }

    /// The port rdma_cm bound this id to.
    fn port(&self) -> u8 {
        // SAFETY: the id is live.
        unsafe { (*self.id).port_num }
    }

    /// The device and port rdma_cm bound this id to, opened; if it bound
    /// none, [`Error::Incompatible`] with `unbound`.
    fn open_device(&self, unbound: &'static str) -> Result<VerbsDevice, Error> {
        let name = self.device_name().ok_or(Error::Incompatible(unbound))?;
        let options = DeviceOptions {
            port: self.port(),
            ..DeviceOptions::default()
        };
        VerbsDevice::open_with(&name, options)
    }

    /// The name of the device rdma_cm bound this id to.
    fn device_name(&self) -> Option<String> {
        // SAFETY: the id is live; `verbs` is set once an address is bound or
        // resolved, and its device has a NUL-terminated name.
        unsafe {
            let ctx = (*self.id).verbs;
            if ctx.is_null() {
                return None;
            }
            let name = rdma_sys::ibv_get_device_name((*ctx).device);
            Some(CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    /// The address of the peer this id is connected or connecting to:
    /// the requester's, for an id from a connect request. `None` for an
    /// address that is not IP (InfiniBand's native addressing).
    fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; rdma_cm fills its route's destination
        // with a socket address whose family field says which member of
        // the union is set, and each member read is one of that family.
        unsafe {
            let dst = &(*self.id).route.addr.dst_addr_union;
            match i32::from(dst.dst_addr.sa_family) {
                libc::AF_INET => {
                    let sin = &dst.dst_sin;
                    let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
                }
                libc::AF_INET6 => {
                    let sin6 = &dst.dst_sin6;
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    // With its scope, so that a link-local peer can be
                    // reached again.
                    Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                        ip,
                        u16::from_be(sin6.sin6_port),
                        sin6.sin6_flowinfo,
                        sin6.sin6_scope_id,
                    )))
                }
                _ => None,
            }
        }
    }

    /// Waits up to `timeout` for the next event on this id's channel, in
    /// `step` (which a timeout names).
    fn next_event(&self, step: &'static str, timeout: Duration) -> Result<Event, Error> {
        let deadline = Deadline::after(timeout);
        loop {
            // Another thread may take an event we were woken for: the
            // channel does not block, so that only means "wait again".
            if let Some(event) = self.try_event()? {
                return Ok(event);
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(Error::HandshakeTimeout {
                    step,
                    reason: format!("no rdma_cm event came in time ({timeout:?} was left)"),
                });
            }
            wait_readable(self.fd(), left)?;
        }
    }

    /// The channel's descriptor.
    fn fd(&self) -> EventFd {
        // SAFETY: the channel is live.
        EventFd(unsafe { (*self.channel).fd })
    }

    /// The next event if one is pending; never blocks.
    fn try_event(&self) -> Result<Option<Event>, Error> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the channel does not block; `raw` is a valid out-pointer.
        if unsafe { rdma_sys::rdma_get_cm_event(self.channel, &mut raw) } != 0 {
            let err = std::io::Error::last_os_error();
            if matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) {
                return Ok(None);
            }
            return Err(Error::Verbs {
                verb: "rdma_get_cm_event",
                source: err,
            });
        }
        // SAFETY: a valid event until acknowledged below; the connection
        // parameters are the union member for connection events, and their
        // private data pointer is valid for its length until the ack.
        let event = unsafe {
            let e = &*raw;
            let conn = e.param.conn;
            let private = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                )
                .to_vec()
            };
            Event {
                kind: e.event,
                status: e.status,
                id: e.id,
                private,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
            }
        };
        // SAFETY: acknowledged exactly once.
        unsafe { rdma_sys::rdma_ack_cm_event(raw) };
        Ok(Some(event))
    }

    /// `err`, the failure of a handshake's step, unless the step failed
    /// on a stale path: rdma_cm said that the network device under this
    /// id changed its address, or the device no longer has the GID the
    /// path named (`ENODATA`: the kernel renews a port's GIDs when its
    /// address changes; a request's id may fail so before it hears
    /// `ADDR_CHANGE`). The error
    /// says so then, and is a failed handshake, which a listener goes on
    /// past. The event looked at is taken whatever it is: the handshake
    /// fails either way.
    fn or_stale_path(&self, step: &'static str, err: Error) -> Error {
        let event = self.try_event();
        if matches!(event, Ok(Some(ref e)) if e.kind == ev::RDMA_CM_EVENT_DEVICE_REMOVAL) {
            // Not the path, nor the peer: the device under the id went.
            return device_removed("the device under the connection was removed");
        }
        let address_changed = matches!(
            event,
            Ok(Some(event)) if event.kind == ev::RDMA_CM_EVENT_ADDR_CHANGE
        );
        let gid_gone = matches!(
            &err,
            Error::Verbs { source, .. } if source.raw_os_error() == Some(libc::ENODATA)
        );
        if address_changed || gid_gone {
            stale_path(step)
        } else {
            err
        }
    }

    fn expect(
        &self,
        want: ev::Type,
        step: &'static str,
        timeout: Duration,
    ) -> Result<Event, Error> {
        let event = self.next_event(step, timeout)?;
        if event.kind != want {
            return Err(unexpected(step, event.kind, event.status));
        }
        Ok(event)
    }
}

/// An rdma_cm event channel's descriptor, to wait on without holding what
/// owns the channel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventFd(std::os::fd::RawFd);

/// Waits up to `up_to` for `fd` to have an event to take (or to be
/// interrupted); takes nothing.
fn wait_readable(fd: EventFd, up_to: Duration) -> Result<(), Error> {
    super::readiness::wait_readable(&[fd.0], up_to).map_err(|source| Error::Verbs {
        verb: "poll on the rdma_cm event channel",
        source,
    })
}

/// How long an accept's wait for the peer's confirmation sleeps on the
/// channel at most before it asks again: a look for departed peers may
/// take the event it was woken for, leaving it in the queue pair's stash
/// and the channel quiet.
const CONFIRMATION_POLL: Duration = Duration::from_millis(10);

/// Waits up to `timeout` for the peer to confirm an answered request
/// ([`CmQp::answer`]), asking `confirmed` (which may lock what holds the
/// queue pair, for that call only) and sleeping on `fd` in between.
pub(crate) fn await_confirmation(
    fd: EventFd,
    timeout: Duration,
    mut confirmed: impl FnMut() -> Result<bool, Error>,
) -> Result<(), Error> {
    let deadline = Deadline::after(timeout);
    loop {
        if confirmed()? {
            return Ok(());
        }
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(Error::HandshakeTimeout {
                step: "establishing the connection",
                reason: format!("the peer did not confirm it within {timeout:?}"),
            });
        }
        wait_readable(fd, left.min(CONFIRMATION_POLL))?;
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: destroyed once each, the id before its channel.
        unsafe {
            if !self.id.is_null() {
                rdma_sys::rdma_destroy_id(self.id);
            }
            rdma_sys::rdma_destroy_event_channel(self.channel);
        }
    }
}

struct Event {
    kind: ev::Type,
    status: i32,
    id: *mut rdma_cm_id,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
}

fn event_name(kind: ev::Type) -> String {
    // SAFETY: returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(rdma_sys::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            (
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

fn check_private(data: &[u8]) -> Result<(), Error> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(cm_failure(
            "preparing the connection",
            format!(
                "{} bytes of private data; rdma_cm carries at most {MAX_PRIVATE_DATA}",
                data.len()
            ),
        ));
    }
    Ok(())
}

fn check_device(id: &CmId, dev: &VerbsDevice) -> Result<(), Error> {
    match id.device_name() {
        Some(name) if name == dev.name() && id.port() == dev.port() => Ok(()),
        other => Err(cm_failure(
            "matching the device",
            format!(
                "rdma_cm routed the connection through {:?} port {}, but the queue pair is on {:?} port {}",
                other.unwrap_or_else(|| "no device".into()),
                id.port(),
                dev.name(),
                dev.port()
            ),
        )),
    }
}

/// READ/atomic depths: (responder resources, initiator depth).
type Depths = (u8, u8);

/// The depths to accept a request with, given ours (`local`: what we can
/// answer, what we can issue) and the request event's. The kernel reports
/// a request's depths from the listener's side: its
/// `responder_resources` is how many READs and atomics the requester
/// will issue (we answer that many, up to what we can), its
/// `initiator_depth` how many the requester can answer (we issue no more,
/// nor more than we can). At least one each.
fn accept_depths(local: Depths, responder_resources: u8, initiator_depth: u8) -> Depths {
    (
        local.0.min(responder_resources.max(1)),
        local.1.min(initiator_depth.max(1)),
    )
}

fn conn_param(qp: &VerbsQp, depths: Depths, config: &QpConfig, private: &[u8]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if private.is_empty() {
            std::ptr::null()
        } else {
            private.as_ptr().cast()
        },
        private_data_len: private.len() as u8,
        responder_resources: depths.0,
        initiator_depth: depths.1,
        flow_control: 1,
        retry_count: config.retry_cnt.min(7),
        rnr_retry_count: config.rnr_retry.min(7),
        srq: u8::from(qp.caps().srq.is_some()),
        qp_num: qp.qpn(),
    }
}

/// Moves `qp` to RTR and RTS with the attributes rdma_cm computed for `id`
/// (first taking, in INIT, rdma_cm's P_Key index and port: on an
/// InfiniBand partition the connection's P_Key need not be at index 0),
/// and, when accepting, the READ/atomic depths agreed with the requester;
/// the ACK timeout is `config`'s and the RNR timer ours, not rdma_cm's
/// (an ACK timeout following the path's packet lifetime, about two
/// seconds on Soft-RoCE, and an RNR timer of 655 ms), so a dead peer is
/// noticed, and a send that found no receive is tried again, as soon as
/// on a queue pair connected by endpoints.
fn ready_qp(
    id: &CmId,
    qp: &VerbsQp,
    depths: Option<Depths>,
    config: &QpConfig,
) -> Result<(), Error> {
    use rdma_sys::ibv_qp_attr_mask as m;
    use rdma_sys::ibv_qp_state::{IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
    for (state, verb) in [
        (IBV_QPS_INIT, "rdma_init_qp_attr(INIT)"),
        (IBV_QPS_RTR, "rdma_init_qp_attr(RTR)"),
        (IBV_QPS_RTS, "rdma_init_qp_attr(RTS)"),
    ] {
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: the id is connected or connecting; both are valid out-pointers.
        if unsafe { rdma_sys::rdma_init_qp_attr(id.id, &mut attr, &mut mask) } != 0 {
            return Err(cm_error(verb));
        }
        if state == IBV_QPS_INIT {
            // INIT to INIT takes rdma_cm's P_Key index and port, not its
            // access flags: the queue pair keeps allowing every remote
            // operation (memory registrations decide).
            mask = (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT).0 as i32;
        } else if state == IBV_QPS_RTR {
            if let Some((responder, _)) = depths {
                attr.max_dest_rd_atomic = responder;
            }
            attr.min_rnr_timer = crate::backend::verbs::MIN_RNR_TIMER;
            mask |= m::IBV_QP_MIN_RNR_TIMER.0 as i32;
            // rdma_init_qp_attr's RTR attributes include the path (AV).
            if config.traffic_class != 0 {
                attr.ah_attr.grh.traffic_class = config.traffic_class;
            }
            if config.service_level != 0 {
                attr.ah_attr.sl = config.service_level;
            }
        } else {
            if let Some((_, initiator)) = depths {
                attr.max_rd_atomic = initiator;
            }
            attr.timeout = config.ack_timeout;
            // The connection's messages carry the retry counts each side
            // asked for to the *other* side's queue pair: ours are set
            // here, as the config says.
            attr.retry_cnt = config.retry_cnt.min(7);
            attr.rnr_retry = config.rnr_retry.min(7);
            mask |= (m::IBV_QP_TIMEOUT | m::IBV_QP_RETRY_CNT | m::IBV_QP_RNR_RETRY).0 as i32;
        }
        qp.modify_raw(&mut attr, mask, "ibv_modify_qp (rdma_cm attributes)")?;
    }
    qp.mark_connected();
    Ok(())
}

/// Resolves the address and route to an rdma_cm listener at `addr`: the
/// first step of connecting in steps. Create the queue pair on the route
/// ([`CmRoute::create_qp`] or [`CmRoute::create_qp_on`]), put it in a ring
/// and post the receives the peer's first messages need, then
/// [`CmQp::connect`].
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm;
/// let timeout = Duration::from_secs(10);
/// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), timeout).unwrap();
/// let dev = route.open_device().unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let qp = route.create_qp(&dev, &pd, QpConfig::default()).unwrap();
/// // Post the receives the peer's first messages need here, then connect.
/// qp.connect(b"hello", timeout).unwrap();
/// ```
pub fn resolve(addr: SocketAddr, timeout: Duration) -> Result<CmRoute, Error> {
    let id = CmId::new()?;
    let (mut dst, _) = sockaddr(&addr);
    // One deadline for both steps: `timeout` bounds the whole resolution.
    let deadline = Deadline::after(timeout);
    let ms = |left: Duration| left.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: the id is live; `dst` holds a valid address of its family.
    if unsafe {
        rdma_sys::rdma_resolve_addr(
            id.id,
            std::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            ms(deadline.remaining()),
        )
    } != 0
    {
        return Err(cm_error("rdma_resolve_addr"));
    }
    id.expect(
        ev::RDMA_CM_EVENT_ADDR_RESOLVED,
        "resolving the address",
        deadline.remaining(),
    )?;
    // SAFETY: the address is resolved.
    if unsafe { rdma_sys::rdma_resolve_route(id.id, ms(deadline.remaining())) } != 0 {
        return Err(cm_error("rdma_resolve_route"));
    }
    id.expect(
        ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
        "resolving the route",
        deadline.remaining(),
    )?;
    Ok(CmRoute { id })
}

/// Connects to an rdma_cm listener at `addr` in one call, sending
/// `private_data` (at most [`MAX_PRIVATE_DATA`] bytes) with the request.
/// The queue pair has a completion queue of its own. To post receives
/// before the peer may send, or to use a shared completion queue, connect
/// in steps: [`resolve`], [`CmRoute::create_qp_on`], [`CmQp::connect`].
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::net::SocketAddr;
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm;
/// # let dev = VerbsDevice::open("rxe0").unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// let addr: SocketAddr = "10.99.0.1:7472".parse().unwrap();
/// let timeout = Duration::from_secs(10);
/// // More private data than rdma_cm carries is refused before anything is sent.
/// let too_long = [0u8; cm::MAX_PRIVATE_DATA + 1];
/// assert!(cm::connect(&dev, &pd, addr, QpConfig::default(), &too_long, timeout).is_err());
/// let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"hello", timeout).unwrap();
/// assert!(qp.qp().is_connected());
/// ```
pub fn connect(
    dev: &VerbsDevice,
    pd: &VerbsPd,
    addr: SocketAddr,
    config: QpConfig,
    private_data: &[u8],
    timeout: Duration,
) -> Result<CmQp, Error> {
    check_private(private_data)?;
    let deadline = Deadline::after(timeout);
    let route = resolve(addr, timeout)?;
    // A request is sent only with time left to wait for its answer.
    out_of_time("connecting", &deadline, timeout)?;
    let qp = route.create_qp(dev, pd, config)?;
    qp.connect(private_data, deadline.remaining())?;
    Ok(qp)
}

/// A timeout in `step` if `deadline`, of `timeout` in all, has passed.
fn out_of_time(step: &'static str, deadline: &Deadline, timeout: Duration) -> Result<(), Error> {
    if deadline.expired() {
        return Err(Error::HandshakeTimeout {
            step,
            reason: format!("the {timeout:?} given ran out before it"),
        });
    }
    Ok(())
}

/// A route to a listener, resolved by [`resolve`]: create the queue pair
/// on it.
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm;
/// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), Duration::from_secs(10)).unwrap();
/// # let dev = route.open_device().unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// let qp = route.create_qp(&dev, &pd, QpConfig::default()).unwrap();
/// // In INIT until `connect`, so receives can be posted first.
/// assert!(!qp.qp().is_connected());
/// ```
pub struct CmRoute {
    id: CmId,
}

impl std::fmt::Debug for CmRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmRoute")
            .field("device", &self.id.device_name())
            .finish()
    }
}

impl CmRoute {
    /// The RDMA device rdma_cm routed through ([`open_device`](Self::open_device)
    /// opens it, on the port rdma_cm chose).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::connect::cm;
    /// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), Duration::from_secs(10)).unwrap();
    /// // rdma_cm chose the device from the address; the queue pair must be
    /// // on it (and on the port it chose: `open_device`).
    /// println!("through {:?}", route.device_name());
    /// ```
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }

    /// Opens the device and port rdma_cm routed through (on a device of
    /// several ports, not always port 1): the queue pair must be on them.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm;
    /// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), Duration::from_secs(10)).unwrap();
    /// let dev = route.open_device().unwrap();
    /// assert_eq!(Some(dev.name().to_string()), route.device_name());
    /// ```
    pub fn open_device(&self) -> Result<VerbsDevice, Error> {
        self.id.open_device("the route names no RDMA device")
    }

    /// A queue pair for this connection, in INIT, with a completion queue
    /// of its own. `dev` must be the device the route goes through.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::buf::RegisteredBuf;
    /// use rdma_ring::connect::cm;
    /// use rdma_ring::op::Recv;
    /// use rdma_ring::ring::{Ring, RingConfig};
    /// # let timeout = std::time::Duration::from_secs(10);
    /// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), timeout).unwrap();
    /// # let dev = route.open_device().unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let mut ring = Ring::new(route.create_qp(&dev, &pd, QpConfig::default()).unwrap(), RingConfig::default());
    /// ring.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap())).unwrap();
    /// ring.submit().unwrap(); // posted in INIT, before the peer can send
    /// ring.qp().connect(b"hello", timeout).unwrap();
    /// ```
    pub fn create_qp(
        self,
        dev: &VerbsDevice,
        pd: &VerbsPd,
        config: QpConfig,
    ) -> Result<CmQp, Error> {
        check_device(&self.id, dev)?;
        let qp = dev.create_qp(pd, config)?;
        Ok(CmQp::new(qp, self.id, Role::Connecting, config, Vec::new()))
    }

    /// A queue pair for this connection, in INIT, on a shared completion
    /// queue (and shared receive queue, if given).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm;
    /// use rdma_ring::ring::{Ring, RingConfig};
    /// # let timeout = std::time::Duration::from_secs(10);
    /// # let dev = rdma_ring::backend::verbs::VerbsDevice::open("rxe0").unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// // Two connections, one completion queue, one ring.
    /// let mut ring = Ring::with_cq(dev.create_cq(1024).unwrap(), RingConfig::default());
    /// for addr in ["10.99.0.1:7472", "10.99.0.2:7472"] {
    ///     let route = cm::resolve(addr.parse().unwrap(), timeout).unwrap();
    ///     let qp = route.create_qp_on(&dev, &pd, ring.cq(), None, QpConfig::default()).unwrap();
    ///     let handle = ring.attach(qp).unwrap();
    ///     ring.qp_of(handle).unwrap().connect(b"hello", timeout).unwrap();
    /// }
    /// assert_eq!(ring.qps().len(), 2);
    /// ```
    pub fn create_qp_on(
        self,
        dev: &VerbsDevice,
        pd: &VerbsPd,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> Result<CmQp, Error> {
        check_device(&self.id, dev)?;
        let qp = dev.create_qp_on(pd, cq, srq, config)?;
        Ok(CmQp::new(qp, self.id, Role::Connecting, config, Vec::new()))
    }
}

/// An rdma_cm listener.
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm::CmListener;
/// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
/// let dev = listener.open_device().unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let qp = listener.accept(&dev, &pd, QpConfig::default(), b"welcome", Duration::from_secs(60)).unwrap();
/// assert!(qp.qp().is_connected());
/// ```
pub struct CmListener {
    id: CmId,
    /// Set once rdma_cm said the device went away: the listening id hears
    /// nothing more, so every later request fails at once rather than
    /// waiting out its timeout for nothing.
    removed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener").finish_non_exhaustive()
    }
}

impl CmListener {
    /// Listens on `addr` (an address of an RDMA device's interface).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("0.0.0.0:7472".parse().unwrap()).unwrap();
    /// // On the wildcard address, requests may arrive through any device.
    /// assert_eq!(listener.device_name(), None);
    /// ```
    pub fn bind(addr: SocketAddr) -> Result<CmListener, Error> {
        let id = CmId::new()?;
        let (mut sa, _) = sockaddr(&addr);
        // SAFETY: the id is live; `sa` holds a valid address of its family.
        if unsafe {
            rdma_sys::rdma_bind_addr(id.id, (&mut sa as *mut libc::sockaddr_storage).cast())
        } != 0
        {
            return Err(cm_error("rdma_bind_addr"));
        }
        // SAFETY: the id is bound.
        if unsafe { rdma_sys::rdma_listen(id.id, 64) } != 0 {
            return Err(cm_error("rdma_listen"));
        }
        Ok(CmListener {
            id,
            removed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The RDMA device the listener is bound to, when it was bound to an
    /// address of one device's interface (`None` for a wildcard address).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// // Bound to one interface's address, so to that interface's device.
    /// let dev = listener.open_device().unwrap();
    /// ```
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }

    /// Opens the device and port the listener is bound to (fails for a
    /// wildcard address): requests arriving there are accepted on them.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let dev = listener.open_device().unwrap();
    /// ```
    pub fn open_device(&self) -> Result<VerbsDevice, Error> {
        self.id.open_device(
            "the listener is bound to a wildcard address, not to one RDMA device's interface",
        )
    }

    /// The event channel's descriptor: readable when a request (or
    /// another event) waits.
    pub(crate) fn event_fd(&self) -> std::os::fd::RawFd {
        self.id.fd().0
    }

    /// Whether rdma_cm said the listener's device was removed: it hears
    /// no more requests, and [`request`](Self::request) fails at once.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// while !listener.removed() {
    ///     if let Ok(request) = listener.request(Duration::from_secs(1)) {
    ///         drop(request); // rejected
    ///     }
    /// }
    /// ```
    pub fn removed(&self) -> bool {
        self.removed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The next connection request, within `timeout`: the first step of
    /// accepting in steps. Create the queue pair for it
    /// ([`CmRequest::create_qp`] or [`CmRequest::create_qp_on`]), put it in
    /// a ring and post the receives the peer's first messages need, then
    /// [`CmQp::accept`]. A request dropped unanswered is rejected.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::buf::RegisteredBuf;
    /// use rdma_ring::connect::cm::CmListener;
    /// use rdma_ring::op::Recv;
    /// use rdma_ring::ring::{Ring, RingConfig};
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// # let dev = request.open_device().unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let mut ring = Ring::new(request.create_qp(&dev, &pd, QpConfig::default()).unwrap(), RingConfig::default());
    /// ring.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap())).unwrap();
    /// ring.submit().unwrap(); // posted in INIT, before the peer can send
    /// ring.qp().accept(b"welcome", Duration::from_secs(10)).unwrap();
    /// ```
    pub fn request(&self, timeout: Duration) -> Result<CmRequest, Error> {
        let step = "waiting for a connect request";
        if self.removed() {
            return Err(listener_device_removed());
        }
        let deadline = Deadline::after(timeout);
        // A listening id hears of its address changing too (a bonding
        // failover, say): that ends no listener. Only the device's
        // removal does.
        let request = loop {
            let event = self.id.next_event(step, deadline.remaining())?;
            match event.kind {
                ev::RDMA_CM_EVENT_CONNECT_REQUEST => break event,
                ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    self.removed
                        .store(true, std::sync::atomic::Ordering::Release);
                    return Err(listener_device_removed());
                }
                _ => {}
            }
        };
        let id = CmId::adopt(request.id)?;
        Ok(CmRequest {
            id: Some(id),
            private: request.private,
            initiator_depth: request.initiator_depth,
            responder_resources: request.responder_resources,
        })
    }

    /// Accepts the next connection request within `timeout` in one call,
    /// answering with `private_data`; the request's own private data is in
    /// the result. The queue pair has a completion queue of its own; to
    /// post receives before accepting, or to use a shared completion
    /// queue, accept in steps ([`CmListener::request`]).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// # let dev = listener.open_device().unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let qp = listener.accept(&dev, &pd, QpConfig::default(), b"welcome", Duration::from_secs(60)).unwrap();
    /// // rdma_cm pads the request's private data with zeros: compare a prefix.
    /// assert!(qp.peer_private_data().starts_with(b"hello"));
    /// ```
    pub fn accept(
        &self,
        dev: &VerbsDevice,
        pd: &VerbsPd,
        config: QpConfig,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmQp, Error> {
        check_private(private_data)?;
        let deadline = Deadline::after(timeout);
        let request = self.request(timeout)?;
        // Answered only with time left to hear the confirmation: dropped
        // now, the request is rejected, which the requester hears at once.
        out_of_time("accepting", &deadline, timeout)?;
        let qp = request.create_qp(dev, pd, config)?;
        qp.accept(private_data, deadline.remaining())?;
        Ok(qp)
    }
}

/// A connection request a listener received, not yet answered.
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm::CmListener;
/// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
/// # let dev = listener.open_device().unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// while let Ok(request) = listener.request(Duration::from_secs(60)) {
///     if request.private_data().starts_with(b"hello") {
///         let qp = request.create_qp(&dev, &pd, QpConfig::default()).unwrap();
///         qp.accept(b"welcome", Duration::from_secs(10)).unwrap();
///     } // any other request is dropped, which rejects it
/// }
/// ```
pub struct CmRequest {
    /// `None` once handed to a queue pair.
    id: Option<CmId>,
    private: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
}

impl std::fmt::Debug for CmRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmRequest")
            .field("private_data", &self.private)
            .finish_non_exhaustive()
    }
}

impl CmRequest {
    /// The private data the requester sent (padded by rdma_cm; see
    /// [`CmQp::peer_private_data`]).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// // Padding makes the length unknowable, so the peer sent a length byte first.
    /// let (len, rest) = request.private_data().split_first().unwrap();
    /// assert_eq!(rest.get(..usize::from(*len)), Some(&b"hello"[..]));
    /// ```
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// The RDMA device the request arrived on.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("0.0.0.0:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// // On the wildcard address, each request names the device it came through.
    /// let dev = request.open_device().unwrap();
    /// ```
    pub fn device_name(&self) -> Option<String> {
        self.id.as_ref().and_then(CmId::device_name)
    }

    /// The port the request arrived on.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("0.0.0.0:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// println!("on {:?} port {}", request.device_name(), request.port());
    /// ```
    pub fn port(&self) -> u8 {
        self.id.as_ref().map_or(0, CmId::port)
    }

    /// Opens the device and port the request arrived on: its queue pair
    /// must be on them.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("0.0.0.0:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// let dev = request.open_device().unwrap();
    /// ```
    pub fn open_device(&self) -> Result<VerbsDevice, Error> {
        self.id
            .as_ref()
            .ok_or(Error::Incompatible(
                "the request was handed to a queue pair",
            ))?
            .open_device("the connection request names no RDMA device")
    }

    /// The requester's address, if it is an IP address.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// println!("a request from {:?}", request.peer_addr());
    /// ```
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(CmId::peer_addr)
    }

    /// A queue pair for this request, in INIT, with a completion queue of
    /// its own. `dev` must be the device the request arrived on (else the
    /// request is rejected).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm::CmListener;
    /// # let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// let dev = request.open_device().unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let qp = request.create_qp(&dev, &pd, QpConfig::default()).unwrap();
    /// assert!(!qp.qp().is_connected()); // in INIT until accepted
    /// qp.accept(b"welcome", Duration::from_secs(10)).unwrap();
    /// assert!(qp.qp().is_connected());
    /// ```
    pub fn create_qp(
        mut self,
        dev: &VerbsDevice,
        pd: &VerbsPd,
        config: QpConfig,
    ) -> Result<CmQp, Error> {
        let id = self.id.take().expect("present until handed over");
        self.adopt(id, dev, |dev| dev.create_qp(pd, config), config)
    }

    /// A queue pair for this request, in INIT, on a shared completion queue
    /// (and shared receive queue, if given).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm::CmListener;
    /// use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = rdma_ring::backend::verbs::VerbsDevice::open("rxe0").unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// // Four peers, one completion queue, one ring.
    /// let mut ring = Ring::with_cq(dev.create_cq(4096).unwrap(), RingConfig::default());
    /// for _ in 0..4 {
    ///     let request = listener.request(Duration::from_secs(60)).unwrap();
    ///     let qp = request.create_qp_on(&dev, &pd, ring.cq(), None, QpConfig::default()).unwrap();
    ///     let handle = ring.attach(qp).unwrap();
    ///     ring.qp_of(handle).unwrap().accept(b"welcome", Duration::from_secs(10)).unwrap();
    /// }
    /// ```
    pub fn create_qp_on(
        mut self,
        dev: &VerbsDevice,
        pd: &VerbsPd,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> Result<CmQp, Error> {
        let id = self.id.take().expect("present until handed over");
        self.adopt(id, dev, |dev| dev.create_qp_on(pd, cq, srq, config), config)
    }

    fn adopt(
        &mut self,
        id: CmId,
        dev: &VerbsDevice,
        create: impl FnOnce(&VerbsDevice) -> Result<VerbsQp, Error>,
        config: QpConfig,
    ) -> Result<CmQp, Error> {
        let made = check_device(&id, dev).and_then(|()| create(dev));
        let qp = match made {
            Ok(qp) => qp,
            Err(e) => {
                // SAFETY: a pending request may be rejected once.
                unsafe { rdma_sys::rdma_reject(id.id, std::ptr::null(), 0) };
                return Err(e);
            }
        };
        let depths = accept_depths(
            dev.limits().rd_atomic_depths(&config),
            self.responder_resources,
            self.initiator_depth,
        );
        let private = std::mem::take(&mut self.private);
        Ok(CmQp::new(qp, id, Role::Accepting(depths), config, private))
    }

    /// Rejects the request.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// // Only peers of protocol version 1 get in; the others' connect fails.
    /// if request.private_data().first() != Some(&1) {
    ///     request.reject();
    /// }
    /// ```
    pub fn reject(self) {
        drop(self);
    }

    /// Rejects the request with `private_data`, which the requester's
    /// failed [`CmQp::connect`] leaves in its
    /// [`peer_private_data`](CmQp::peer_private_data): to say why. More
    /// than [`MAX_PRIVATE_DATA`] bytes is an error, and the request is
    /// rejected without them; so is a rejection rdma_cm refuses (a
    /// request its peer gave up on, say).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::connect::cm::CmListener;
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// request.reject_with(b"busy").unwrap();
    /// ```
    pub fn reject_with(mut self, private_data: &[u8]) -> Result<(), Error> {
        check_private(private_data)?;
        let Some(id) = self.id.take() else {
            return Ok(());
        };
        // SAFETY: a pending request may be rejected once (the id is
        // taken, so the drop does not reject it again); the private data
        // lives across the call, and its length fits a u8.
        let rejected = unsafe {
            rdma_sys::rdma_reject(
                id.id,
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        if rejected != 0 {
            return Err(cm_error("rdma_reject"));
        }
        Ok(())
    }
}

impl Drop for CmRequest {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            // SAFETY: a pending request may be rejected once; the id is
            // destroyed right after.
            unsafe { rdma_sys::rdma_reject(id.id, std::ptr::null(), 0) };
        }
    }
}

/// Which side of the handshake a [`CmQp`] is on, until it is connected.
enum Role {
    Connecting,
    Accepting(Depths),
}

/// A queue pair of an rdma_cm connection. Created by the one-call
/// [`connect`] and [`CmListener::accept`] (connected), or in steps, in
/// INIT, by [`CmRoute`] and [`CmRequest`]: then it may go into a ring and
/// have receives posted before [`connect`](Self::connect) or
/// [`accept`](Self::accept) lets the peer send. The ring notices when the
/// peer disconnects (or the device goes away) and moves the queue pair to
/// error. Dropping it disconnects.
///
/// ```no_run
/// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::cm;
/// use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = VerbsDevice::open("rxe0").unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// let addr = "10.99.0.1:7472".parse().unwrap();
/// let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"hello", Duration::from_secs(10)).unwrap();
/// // A queue pair like any other: a ring drives it.
/// let ring = Ring::new(qp, RingConfig::default());
/// assert!(ring.qp().qp().is_connected());
/// ```
pub struct CmQp {
    // Field order: the queue pair is destroyed before its id.
    qp: VerbsQp,
    id: CmId,
    role: Role,
    config: QpConfig,
    peer_private_data: std::sync::OnceLock<Vec<u8>>,
    answered: std::sync::atomic::AtomicBool,
    /// Whether an answered request waits for the peer's confirmation
    /// (ESTABLISHED).
    confirming: std::cell::Cell<bool>,
    /// The event that ends that wait, if the ring's look for departed
    /// peers ([`QueuePair::peer_disconnected`]) took it from the channel:
    /// kind and status, kept for [`CmQp::confirmed`].
    stashed: std::cell::Cell<Option<(ev::Type, i32)>>,
}

impl std::fmt::Debug for CmQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmQp").field("qp", &self.qp).finish()
    }
}

impl CmQp {
    fn new(qp: VerbsQp, id: CmId, role: Role, config: QpConfig, peer: Vec<u8>) -> Self {
        let peer_private_data = std::sync::OnceLock::new();
        if !peer.is_empty() {
            let _ = peer_private_data.set(peer);
        }
        CmQp {
            qp,
            id,
            role,
            config,
            peer_private_data,
            answered: std::sync::atomic::AtomicBool::new(false),
            confirming: std::cell::Cell::new(false),
            stashed: std::cell::Cell::new(None),
        }
    }

    /// Connects (the requesting side, after [`CmRoute::create_qp`]),
    /// sending `private_data`. Receives posted before this are in place
    /// before the peer can send.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm;
    /// let timeout = Duration::from_secs(10);
    /// let route = cm::resolve("10.99.0.1:7472".parse().unwrap(), timeout).unwrap();
    /// # let dev = route.open_device().unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let qp = route.create_qp(&dev, &pd, QpConfig::default()).unwrap();
    /// qp.connect(b"hello", timeout).unwrap();
    /// // A queue pair connects once.
    /// assert!(qp.connect(b"hello", timeout).is_err());
    /// ```
    pub fn connect(&self, private_data: &[u8], timeout: Duration) -> Result<(), Error> {
        use std::sync::atomic::Ordering;
        check_private(private_data)?;
        if !matches!(self.role, Role::Connecting) || self.answered.swap(true, Ordering::AcqRel) {
            return Err(cm_failure(
                "connecting",
                "this queue pair is not an unconnected requester".into(),
            ));
        }
        let mut param = conn_param(
            &self.qp,
            self.qp.device_limits().rd_atomic_depths(&self.config),
            &self.config,
            private_data,
        );
        // SAFETY: the route is resolved; `param` and its private data live
        // across the call.
        if unsafe { rdma_sys::rdma_connect(self.id.id, &mut param) } != 0 {
            let err = cm_error("rdma_connect");
            return Err(self.id.or_stale_path("connecting", err));
        }
        let event = self.id.next_event("connecting", timeout)?;
        match event.kind {
            ev::RDMA_CM_EVENT_CONNECT_RESPONSE | ev::RDMA_CM_EVENT_ESTABLISHED => {}
            ev::RDMA_CM_EVENT_REJECTED => {
                let failure = cm_failure("connecting", rejection(event.status, &event.private));
                // For the caller to read why (see `CmRequest::reject_with`).
                let _ = self.peer_private_data.set(event.private);
                return Err(failure);
            }
            other => return Err(unexpected("connecting", other, event.status)),
        }
        ready_qp(&self.id, &self.qp, None, &self.config)
            .map_err(|e| self.id.or_stale_path("connecting", e))?;
        if event.kind == ev::RDMA_CM_EVENT_CONNECT_RESPONSE {
            // SAFETY: the connect response arrived and the QP is in RTS.
            if unsafe { rdma_sys::rdma_establish(self.id.id) } != 0 {
                return Err(cm_error("rdma_establish"));
            }
        }
        let _ = self.peer_private_data.set(event.private);
        Ok(())
    }

    /// Accepts the request (the listening side, after
    /// [`CmRequest::create_qp`]), answering with `private_data`. Receives
    /// posted before this are in place before the peer can send.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm::CmListener;
    /// let timeout = Duration::from_secs(10);
    /// let listener = CmListener::bind("10.99.0.1:7472".parse().unwrap()).unwrap();
    /// let request = listener.request(Duration::from_secs(60)).unwrap();
    /// # let dev = request.open_device().unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let qp = request.create_qp(&dev, &pd, QpConfig::default()).unwrap();
    /// qp.accept(b"welcome", timeout).unwrap();
    /// // A request is answered once.
    /// assert!(qp.accept(b"welcome", timeout).is_err());
    /// ```
    pub fn accept(&self, private_data: &[u8], timeout: Duration) -> Result<(), Error> {
        self.answer(private_data)?;
        let confirmed = await_confirmation(self.id.fd(), timeout, || self.confirmed());
        // Given up: nothing waits for the events that may follow.
        self.confirming.set(false);
        confirmed
    }

    /// Answers the request, as [`accept`](Self::accept) does, without
    /// waiting for the peer's confirmation: the connection is established
    /// once [`confirmed`](Self::confirmed) says so. What holds the queue
    /// pair (a ring, behind a lock) need not be held while the peer
    /// takes its time: see [`await_confirmation`].
    pub(crate) fn answer(&self, private_data: &[u8]) -> Result<(), Error> {
        use std::sync::atomic::Ordering;
        check_private(private_data)?;
        let Role::Accepting(depths) = self.role else {
            return Err(cm_failure(
                "accepting",
                "this queue pair is not an unanswered request".into(),
            ));
        };
        if self.answered.swap(true, Ordering::AcqRel) {
            return Err(cm_failure(
                "accepting",
                "the request was answered already".into(),
            ));
        }
        // Failed before the answer went out, the request is still
        // unanswered: dropped, it is rejected, not disconnected.
        let unanswered = |err: Error| {
            self.answered.store(false, Ordering::Release);
            requester_gone(self.id.or_stale_path("accepting", err))
        };
        ready_qp(&self.id, &self.qp, Some(depths), &self.config).map_err(unanswered)?;
        let mut param = conn_param(&self.qp, depths, &self.config, private_data);
        self.confirming.set(true);
        // SAFETY: the request is pending; `param` lives across the call.
        if unsafe { rdma_sys::rdma_accept(self.id.id, &mut param) } != 0 {
            self.confirming.set(false);
            return Err(unanswered(cm_error("rdma_accept")));
        }
        Ok(())
    }

    /// Whether the peer confirmed the answered request: `Ok(false)` not
    /// yet; an error if rdma_cm said anything else (the peer rejected,
    /// left, or could not be reached). Never blocks.
    pub(crate) fn confirmed(&self) -> Result<bool, Error> {
        let (kind, status) = match self.stashed.take() {
            Some(event) => event,
            None => match self.id.try_event()? {
                Some(event) => (event.kind, event.status),
                None => return Ok(false),
            },
        };
        self.confirming.set(false);
        if kind == ev::RDMA_CM_EVENT_ESTABLISHED {
            return Ok(true);
        }
        Err(unexpected("establishing the connection", kind, status))
    }

    /// The event channel's descriptor, for [`await_confirmation`].
    pub(crate) fn event_fd(&self) -> EventFd {
        self.id.fd()
    }

    /// The private data the peer sent with its request or reply, or, after
    /// a [`connect`](Self::connect) the peer rejected, with its rejection
    /// (see [`CmRequest::reject_with`]). rdma_cm delivers it padded with
    /// zeros to the transport's fixed size (56 bytes in a request, 196 in a
    /// reply, 148 in a rejection on InfiniBand and RoCE), so frame what
    /// you send (a length prefix, or a fixed-size record).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm;
    /// # let dev = VerbsDevice::open("rxe0").unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let addr = "10.99.0.1:7472".parse().unwrap();
    /// let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"hello", Duration::from_secs(10)).unwrap();
    /// // The reply arrives padded with zeros: compare a prefix.
    /// assert!(qp.peer_private_data().starts_with(b"welcome"));
    /// ```
    pub fn peer_private_data(&self) -> &[u8] {
        self.peer_private_data.get().map_or(&[], Vec::as_slice)
    }

    /// The queue pair.
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use std::time::Duration;
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// use rdma_ring::connect::cm;
    /// # let dev = VerbsDevice::open("rxe0").unwrap();
    /// # let pd = dev.alloc_pd().unwrap();
    /// let addr = "10.99.0.1:7472".parse().unwrap();
    /// let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"hello", Duration::from_secs(10)).unwrap();
    /// assert!(qp.qp().is_connected());
    /// println!("QPN {} on {}", qp.qp().qpn(), dev.name());
    /// ```
    pub fn qp(&self) -> &VerbsQp {
        &self.qp
    }
}

// SAFETY: every post and state change goes to the inner `VerbsQp`, which
// keeps the contract; a disconnect only moves that queue pair to error,
// after which it reports every outstanding work request flushed.
unsafe impl QueuePair for CmQp {
    type Cq = VerbsCq;
    type Srq = VerbsSrq;

    fn caps(&self) -> QpCaps {
        self.qp.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.qp.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.qp.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.qp.set_error()
    }
    fn take_cq(&mut self) -> Option<VerbsCq> {
        self.qp.take_cq()
    }
    fn peer_disconnected(&mut self) -> Result<bool, Error> {
        // The peer left, or the device is going away: rdma_cm says so on
        // our channel, and with an external QP nothing else moves it to
        // error; the ring does, when told.
        let Some(event) = self.id.try_event()? else {
            return Ok(false);
        };
        // An accept waiting for the peer's confirmation without the ring
        // held: the event that ends its wait is kept for it.
        if self.confirming.get() {
            let kept = kept_for_confirmation(self.stashed.get(), (event.kind, event.status));
            self.stashed.set(Some(kept));
        }
        Ok(matches!(
            event.kind,
            ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
        ))
    }
}

/// Of the events a look for departed peers took while an accept waits
/// for confirmation, the one its wait ends with: the first, unless the
/// peer confirmed and then left (or the device went) before the accept
/// looked. The queue pair is dead then, and the handshake must fail, not
/// admit it.
fn kept_for_confirmation(kept: Option<(ev::Type, i32)>, new: (ev::Type, i32)) -> (ev::Type, i32) {
    match kept {
        Some(first)
            if first.0 == ev::RDMA_CM_EVENT_ESTABLISHED
                && matches!(
                    new.0,
                    ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
                ) =>
        {
            new
        }
        Some(first) => first,
        None => new,
    }
}

impl Drop for CmQp {
    fn drop(&mut self) {
        let answered = self.answered.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: an unanswered request may be rejected once; a connection
        // may be disconnected (twice is harmless). The QP is destroyed right
        // after, then the id.
        unsafe {
            if matches!(self.role, Role::Accepting(_)) && !answered {
                rdma_sys::rdma_reject(self.id.id, std::ptr::null(), 0);
            } else {
                rdma_sys::rdma_disconnect(self.id.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{accept_depths, ev, kept_for_confirmation, rejection, unexpected};
    use crate::error::Error;

    /// A rejection says why in words, and what the rejecting side sent
    /// without rdma_cm's zero padding.
    #[test]
    fn a_rejection_says_why_without_the_padding() {
        let nobody = rejection(8, &[0u8; 148]);
        assert_eq!(
            nobody,
            "nothing listens at that address and port (IB CM reject reason 8)"
        );
        let mut private = [0u8; 148];
        private[..4].copy_from_slice(b"full");
        assert_eq!(
            rejection(28, &private),
            "the listener rejected it (IB CM reject reason 28; it said \"full\")"
        );
        assert!(rejection(99, &[]).contains("reason 99"));
        // iWARP says why with an errno.
        let refused = rejection(-libc::ECONNREFUSED, &[]);
        assert!(refused.contains("refused"), "{refused}");
        assert!(!refused.contains("IB CM"), "{refused}");
    }

    /// rdma_cm's own timeouts come as events: a peer that is down or a
    /// route that found no answer is a timeout (as a silent peer is over
    /// TCP), not a refusal; a rejection stays one.
    #[test]
    fn rdma_cm_s_timeouts_are_timeouts_and_rejections_refusals() {
        for (kind, status) in [
            (ev::RDMA_CM_EVENT_ADDR_ERROR, -libc::ETIMEDOUT),
            (ev::RDMA_CM_EVENT_ROUTE_ERROR, -libc::ETIMEDOUT),
            (ev::RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
            (ev::RDMA_CM_EVENT_UNREACHABLE, 0),
        ] {
            let err = unexpected("connecting", kind, status);
            assert!(
                matches!(
                    err,
                    Error::HandshakeTimeout {
                        step: "connecting",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        for (kind, status) in [
            (ev::RDMA_CM_EVENT_REJECTED, 28),
            (ev::RDMA_CM_EVENT_ADDR_ERROR, -libc::ENETUNREACH),
            (ev::RDMA_CM_EVENT_DISCONNECTED, 0),
        ] {
            let err = unexpected("connecting", kind, status);
            assert!(
                matches!(
                    err,
                    Error::Handshake {
                        step: "connecting",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }

    /// A peer that confirms and leaves before the accept looks fails the
    /// accept; other events keep the first.
    #[test]
    fn a_confirmation_followed_by_a_departure_is_a_departure() {
        let established = (ev::RDMA_CM_EVENT_ESTABLISHED, 0);
        let left = (ev::RDMA_CM_EVENT_DISCONNECTED, 0);
        let removed = (ev::RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
        let rejected = (ev::RDMA_CM_EVENT_REJECTED, 28);
        let changed = (ev::RDMA_CM_EVENT_ADDR_CHANGE, 0);
        assert_eq!(kept_for_confirmation(None, established), established);
        assert_eq!(kept_for_confirmation(Some(established), left), left);
        assert_eq!(kept_for_confirmation(Some(established), removed), removed);
        assert_eq!(
            kept_for_confirmation(Some(established), changed),
            established
        );
        assert_eq!(kept_for_confirmation(Some(rejected), left), rejected);
    }

    #[test]
    fn a_request_s_depths_are_read_from_the_listener_s_side() {
        // A requester that issues 16 READs and answers 1 (reported to the
        // listener as responder_resources 16, initiator_depth 1).
        assert_eq!(accept_depths((16, 16), 16, 1), (16, 1));
        // The other way round.
        assert_eq!(accept_depths((16, 16), 1, 16), (1, 16));
        // Never beyond what this side can do.
        assert_eq!(accept_depths((4, 2), 16, 16), (4, 2));
        // At least one each.
        assert_eq!(accept_depths((16, 16), 0, 0), (1, 1));
    }
}
