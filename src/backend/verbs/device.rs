//! Opening a device: context, limits, port and GID.

use std::ffi::CStr;
use std::sync::Arc;

use rdma_sys::{ibv_context, ibv_device_attr, ibv_gid, ibv_port_attr};

use super::pd::VerbsPd;
use super::qp::VerbsQp;
use super::{VerbsAsyncEvents, VerbsCq, VerbsSrq};
use crate::backend::{QpConfig, SrqConfig};
use crate::error::Error;

/// The error of a verb that returns an errno. Some providers return it
/// negated (rxe's post paths, in some rdma-core versions): either sign
/// names the same errno, except -1, which means "see errno".
pub(super) fn verbs_error(verb: &'static str, errno: i32) -> Error {
    let source = if errno == -1 {
        std::io::Error::last_os_error()
    } else {
        std::io::Error::from_raw_os_error(errno.saturating_abs())
    };
    Error::Verbs { verb, source }
}

pub(super) fn last_error(verb: &'static str) -> Error {
    Error::Verbs {
        verb,
        source: std::io::Error::last_os_error(),
    }
}

/// What a device can do, from `ibv_query_device`; queue pairs are checked
/// against it.
///
/// ```
/// use rdma_ring::backend::verbs::DeviceLimits;
/// let limits = DeviceLimits {
///     max_qp_wr: 16384, max_sge: 32, max_cqe: 65536, max_srq_wr: 16384, max_srq_sge: 27,
///     max_qp_rd_atom: 128, max_qp_init_rd_atom: 128, atomics: true, max_sge_rd: 32,
/// };
/// assert!(limits.atomics);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Deepest queue a queue pair may have.
    pub max_qp_wr: u32,
    /// Scatter/gather elements per work request.
    pub max_sge: u32,
    /// Deepest completion queue.
    pub max_cqe: u32,
    /// Deepest shared receive queue (0: the device has none).
    pub max_srq_wr: u32,
    /// Scatter/gather elements per shared receive queue receive.
    pub max_srq_sge: u32,
    /// Outstanding RDMA READs and atomics a queue pair may answer.
    pub max_qp_rd_atom: u8,
    /// Outstanding RDMA READs and atomics a queue pair may issue.
    pub max_qp_init_rd_atom: u8,
    /// Whether the device runs 8-byte atomics.
    pub atomics: bool,
    /// Scatter/gather elements per RDMA READ work request.
    pub max_sge_rd: u32,
}

impl DeviceLimits {
    /// The READ/atomic depths of a queue pair configured with `config`:
    /// (how many it answers, how many it issues), within what the device
    /// allows, at least 1 each.
    ///
    /// ```
    /// use rdma_ring::backend::verbs::DeviceLimits;
    /// use rdma_ring::backend::QpConfig;
    /// let limits = DeviceLimits {
    ///     max_qp_wr: 16384, max_sge: 32, max_cqe: 65536, max_srq_wr: 16384, max_srq_sge: 27,
    ///     max_qp_rd_atom: 128, max_qp_init_rd_atom: 64, atomics: true, max_sge_rd: 32,
    /// };
    /// assert_eq!(limits.rd_atomic_depths(&QpConfig::default()), (16, 16));
    /// let deep = QpConfig { max_rd_atomic: u8::MAX, ..QpConfig::default() };
    /// assert_eq!(limits.rd_atomic_depths(&deep), (128, 64));
    /// ```
    pub fn rd_atomic_depths(&self, config: &crate::backend::QpConfig) -> (u8, u8) {
        let cap = config.max_rd_atomic.max(1);
        (
            self.max_qp_rd_atom.min(cap).max(1),
            self.max_qp_init_rd_atom.min(cap).max(1),
        )
    }
}

/// Which port and GID to use.
///
/// ```
/// use rdma_ring::backend::verbs::DeviceOptions;
/// let options = DeviceOptions { gid_index: Some(1), ..DeviceOptions::default() };
/// assert_eq!(options.port, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Port number (from 1).
    pub port: u8,
    /// GID table index; `None` picks a RoCE v2 IPv4-mapped GID if there is
    /// one (what RoCE needs to route), else index 0 (InfiniBand). Where
    /// the GID types cannot be read (no `/sys/class/infiniband`, as in
    /// some containers), it picks the first IPv4-mapped GID, which on a
    /// port with both RoCE versions may be the v1 one: both sides must
    /// use the same version, so name the index there.
    pub gid_index: Option<u8>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            port: 1,
            gid_index: None,
        }
    }
}

pub(super) struct DeviceInner {
    pub(super) ctx: *mut ibv_context,
    pub(super) name: String,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    pub(super) gid: [u8; 16],
    pub(super) lid: u16,
    pub(super) active_mtu: u32,
    /// The port's largest message.
    pub(super) max_msg_sz: u32,
    pub(super) limits: DeviceLimits,
}

// SAFETY: libibverbs contexts are thread-safe; the pointer is owned by this
// value and closed once, in `Drop`.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; shared use only calls thread-safe verbs.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: every PD, CQ and QP holds an `Arc` of this value, so they
        // are all gone; the context is closed exactly once.
        unsafe { rdma_sys::ibv_close_device(self.ctx) };
    }
}

/// An RDMA device opened through libibverbs, with the port and GID its
/// queue pairs use.
///
/// ```no_run
/// use rdma_ring::backend::verbs::VerbsDevice;
/// let dev = VerbsDevice::open("rxe0").unwrap();
/// println!("{} gid index {} limits {:?}", dev.name(), dev.gid_index(), dev.limits());
/// ```
#[derive(Clone)]
pub struct VerbsDevice {
    pub(super) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.inner.name)
            .field("port", &self.inner.port)
            .field("gid_index", &self.inner.gid_index)
            .finish()
    }
}

impl VerbsDevice {
    /// Opens the device called `name` with default options.
    pub fn open(name: &str) -> Result<Self, Error> {
        Self::open_with(name, DeviceOptions::default())
    }

    /// Opens the first device libibverbs lists, if there is one.
    pub fn open_first() -> Result<Option<Self>, Error> {
        match super::device_names()?.first() {
            Some(name) => Self::open(name).map(Some),
            None => Ok(None),
        }
    }

    /// Opens the device called `name`.
    pub fn open_with(name: &str, options: DeviceOptions) -> Result<Self, Error> {
        let mut count = 0;
        // SAFETY: writes the count; the list is freed below.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut count) };
        if list.is_null() {
            return Err(last_error("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        let mut found = false;
        for i in 0..count.max(0) as usize {
            // SAFETY: the list holds `count` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a valid device has a NUL-terminated name.
            let dev_name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(dev)) };
            if dev_name.to_bytes() == name.as_bytes() {
                found = true;
                // SAFETY: `dev` is valid until the list is freed; an opened
                // context stays valid after that.
                ctx = unsafe { rdma_sys::ibv_open_device(dev) };
                break;
            }
        }
        let open_error = found.then(|| last_error("ibv_open_device"));
        // SAFETY: freed once; contexts opened from it stay valid.
        unsafe { rdma_sys::ibv_free_device_list(list) };
        if !found {
            return Err(Error::NoSuchDevice(name.to_owned()));
        }
        if ctx.is_null() {
            return Err(open_error.expect("found"));
        }
        let mut inner = DeviceInner {
            ctx,
            name: name.to_owned(),
            port: options.port,
            gid_index: 0,
            gid: [0; 16],
            lid: 0,
            active_mtu: 0,
            max_msg_sz: 0,
            limits: DeviceLimits {
                max_qp_wr: 0,
                max_sge: 0,
                max_cqe: 0,
                max_srq_wr: 0,
                max_srq_sge: 0,
                max_qp_rd_atom: 0,
                max_qp_init_rd_atom: 0,
                atomics: false,
                max_sge_rd: 0,
            },
        };
        // From here on `inner` closes the context if anything fails.
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `attr` is a valid out-pointer.
        let ret = unsafe { rdma_sys::ibv_query_device(ctx, &mut attr) };
        if ret != 0 {
            return Err(verbs_error("ibv_query_device", ret));
        }
        inner.limits = DeviceLimits {
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            max_srq_wr: attr.max_srq_wr.max(0) as u32,
            max_srq_sge: attr.max_srq_sge.max(0) as u32,
            max_qp_rd_atom: attr.max_qp_rd_atom.clamp(0, 255) as u8,
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            atomics: attr.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            max_sge_rd: attr.max_sge_rd.max(0) as u32,
        };
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut port: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `port` is a valid out-pointer.
        let ret = unsafe { rdma_sys::___ibv_query_port(ctx, options.port, &mut port) };
        if ret != 0 {
            return Err(verbs_error("ibv_query_port", ret));
        }
        if port.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(Error::Verbs {
                verb: "ibv_query_port",
                source: std::io::Error::other(format!(
                    "port {} of {name} is not active",
                    options.port
                )),
            });
        }
        inner.lid = port.lid;
        inner.active_mtu = port.active_mtu;
        inner.max_msg_sz = port.max_msg_sz;
        let (index, gid) = match options.gid_index {
            Some(index) => (index, query_gid(ctx, options.port, index)?),
            None => pick_gid(ctx, name, options.port, port.gid_tbl_len)?,
        };
        // An unpopulated entry reads as all zeros, and succeeds: a peer
        // would be told a GID that routes nowhere, and the move to RTR
        // fail with a bare EINVAL.
        if gid == [0; 16] {
            return Err(Error::Verbs {
                verb: "ibv_query_gid",
                source: std::io::Error::other(format!(
                    "GID index {index} of port {} of {name} is empty",
                    options.port
                )),
            });
        }
        inner.gid_index = index;
        inner.gid = gid;
        Ok(VerbsDevice {
            inner: Arc::new(inner),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What the device can do.
    pub fn limits(&self) -> DeviceLimits {
        self.inner.limits
    }

    /// The port queue pairs use.
    pub fn port(&self) -> u8 {
        self.inner.port
    }

    /// The GID table index queue pairs use.
    pub fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }

    /// The GID queue pairs use.
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> Result<VerbsPd, Error> {
        VerbsPd::new(Arc::clone(&self.inner))
    }

    /// A new completion queue holding `entries` completions, with a
    /// completion channel, for any number of queue pairs
    /// ([`create_qp_on`](Self::create_qp_on)).
    pub fn create_cq(&self, entries: u32) -> Result<VerbsCq, Error> {
        VerbsCq::new(&self.inner, entries)
    }

    /// A new shared receive queue in `pd`.
    pub fn create_srq(&self, pd: &VerbsPd, config: SrqConfig) -> Result<VerbsSrq, Error> {
        VerbsSrq::new(pd, config)
    }

    /// A new RC queue pair in INIT (receives may be posted), with a
    /// completion queue of its own (`config.completion_entries()` deep, or
    /// the device's most, `max_cqe`, if that is fewer: the ring then keeps
    /// no more work in flight than the queue holds), which
    /// [`Ring::new`](crate::ring::Ring::new) takes.
    pub fn create_qp(&self, pd: &VerbsPd, config: QpConfig) -> Result<VerbsQp, Error> {
        let cq = self.create_cq(config.completion_entries().min(self.inner.limits.max_cqe))?;
        Ok(VerbsQp::new(pd, &cq, None, config)?.with_own_cq(cq))
    }

    /// A new RC queue pair in INIT completing on `cq` (shared with other
    /// queue pairs), taking its receives from `srq` if one is given (then
    /// `config.max_recv_wr` is ignored: it has no receive queue).
    pub fn create_qp_on(
        &self,
        pd: &VerbsPd,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> Result<VerbsQp, Error> {
        VerbsQp::new(pd, cq, srq, config)
    }

    /// The device's asynchronous event channel. Events go to one reader per
    /// device context: open it once.
    pub fn async_events(&self) -> Result<VerbsAsyncEvents, Error> {
        VerbsAsyncEvents::new(Arc::clone(&self.inner))
    }
}

pub(super) fn query_gid(ctx: *mut ibv_context, port: u8, index: u8) -> Result<[u8; 16], Error> {
    // SAFETY: all-zero is a valid GID.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // It returns -1, not an errno, and may leave errno as it was: cleared
    // first, so that an earlier call's error is not reported as its.
    // SAFETY: errno is this thread's; writing it is what C code does.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: `ctx` is open; `gid` is a valid out-pointer.
    let ret = unsafe { rdma_sys::ibv_query_gid(ctx, port, i32::from(index), &mut gid) };
    if ret != 0 {
        let source = std::io::Error::last_os_error();
        let source = match source.raw_os_error() {
            Some(0) | None => std::io::Error::from_raw_os_error(libc::EINVAL),
            Some(_) => source,
        };
        return Err(Error::Verbs {
            verb: "ibv_query_gid",
            source,
        });
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    Ok(unsafe { gid.raw })
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The RoCE v2 IPv4-mapped GID if there is one, else the first IPv4-mapped
/// one, else index 0.
fn pick_gid(
    ctx: *mut ibv_context,
    name: &str,
    port: u8,
    table_len: i32,
) -> Result<(u8, [u8; 16]), Error> {
    let mut first_mapped = None;
    for index in 0..table_len.clamp(0, 256) as u16 {
        let index = index as u8;
        let Ok(gid) = query_gid(ctx, port, index) else {
            continue;
        };
        if !is_ipv4_mapped(&gid) {
            continue;
        }
        let kind = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
        ))
        .unwrap_or_default();
        if kind.trim().eq_ignore_ascii_case("RoCE v2") {
            return Ok((index, gid));
        }
        first_mapped.get_or_insert((index, gid));
    }
    match first_mapped {
        Some(found) => Ok(found),
        None => Ok((0, query_gid(ctx, port, 0)?)),
    }
}
