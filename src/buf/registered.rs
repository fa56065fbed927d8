//! Memory you own, registered for local use.

use std::fmt;

use super::{sealed, Base, BaseBuf, IoBuf, IoBufMut, OwnedBuf, StableBuf, StableBufMut};
use crate::backend::{Access, MemoryRegion, PdId, ProtectionDomain, Sge};
use crate::error::{Error, Rejected};

/// Memory you own, registered with local write rights and no remote
/// rights: the NIC touches it only while an operation owns it.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::RegisteredBuf;
/// let pd = SoftDevice::new().alloc_pd();
/// let mut buf = RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap();
/// buf[..5].copy_from_slice(b"hello");
/// let memory: Vec<u8> = buf.into_inner().unwrap(); // deregisters
/// assert_eq!(&memory[..5], b"hello");
/// ```
pub struct RegisteredBuf {
    // One pointer wide, so that operations and completions carrying it stay
    // small and cheap to move.
    inner: Box<RegisteredInner>,
}

struct RegisteredInner {
    // Field order is load-bearing: the registration is dropped (the memory
    // deregistered) before the memory itself is freed.
    region: Box<dyn MemoryRegion>,
    mem: Box<dyn StableBufMut>,
    ptr: *mut u8,
    len: usize,
    lkey: u32,
    pd: PdId,
}

// SAFETY: `ptr` points into `mem`, which this value owns alone; moving the
// value to another thread moves that sole ownership (`StableBuf: Send`).
unsafe impl Send for RegisteredInner {}
// SAFETY: through `&RegisteredInner` only shared reads of the bytes happen;
// `mem` itself is never touched through a shared reference.
unsafe impl Sync for RegisteredInner {}

impl RegisteredBuf {
    /// Registers `mem` in `pd` for local access. On failure the memory comes
    /// back inside the error.
    pub fn new<M: StableBufMut>(
        pd: &dyn ProtectionDomain,
        mut mem: M,
    ) -> Result<Self, Rejected<M>> {
        let len = mem.stable_len();
        if len == 0 {
            return Err(Rejected::new(Error::EmptyBuffer, mem));
        }
        let ptr = mem.stable_mut_ptr();
        // SAFETY: `mem` moves into the returned value and is freed only after
        // the region is dropped (field order); `StableBufMut` promises the
        // bytes do not move with it. The registration grants no remote
        // rights, and safe code reaches the bytes only while no operation
        // owns the buffer.
        match unsafe { pd.register_raw(ptr, len, Access::LOCAL_WRITE) } {
            Ok(region) => Ok(RegisteredBuf {
                inner: Box::new(RegisteredInner {
                    lkey: region.lkey(),
                    pd: region.pd(),
                    region,
                    mem: Box::new(mem),
                    ptr,
                    len,
                }),
            }),
            Err(e) => Err(Rejected::new(e, mem)),
        }
    }

    /// Deregisters and returns the memory, if it is of type `M`.
    pub fn into_inner<M: StableBufMut>(self) -> Result<M, Self> {
        if !(&*self.inner.mem as &dyn std::any::Any).is::<M>() {
            return Err(self);
        }
        let RegisteredInner { region, mem, .. } = *self.inner;
        drop(region);
        let any: Box<dyn std::any::Any> = mem;
        Ok(*any.downcast::<M>().expect("type checked above"))
    }

    /// The local key, for diagnostics.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }
}

impl std::ops::Deref for RegisteredBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes while `mem` lives
        // (`StableBuf`), and no device writes them now: the registration is
        // local-only and an in-flight operation would own this value.
        unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) }
    }
}

impl std::ops::DerefMut for RegisteredBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.inner.ptr, self.inner.len) }
    }
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("len", &self.inner.len)
            .field("lkey", &self.inner.lkey)
            .finish()
    }
}

/// Memory registered with no write rights at all: a source for writes and
/// sends (static data, say), never a target.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::ReadOnlyBuf;
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = ReadOnlyBuf::new(&pd, &b"constant payload"[..]).unwrap();
/// assert_eq!(&buf[..8], b"constant");
/// ```
pub struct ReadOnlyBuf {
    inner: Box<ReadOnlyInner>,
}

struct ReadOnlyInner {
    // Field order is load-bearing, as in `RegisteredInner`.
    region: Box<dyn MemoryRegion>,
    mem: Box<dyn StableBuf>,
    ptr: *const u8,
    len: usize,
    lkey: u32,
    pd: PdId,
}

// SAFETY: as for `RegisteredInner`; the bytes are never written at all.
unsafe impl Send for ReadOnlyInner {}
// SAFETY: only shared reads ever happen.
unsafe impl Sync for ReadOnlyInner {}

impl ReadOnlyBuf {
    /// Registers `mem` in `pd` with no write rights.
    pub fn new<M: StableBuf>(pd: &dyn ProtectionDomain, mem: M) -> Result<Self, Rejected<M>> {
        let len = mem.stable_len();
        if len == 0 {
            return Err(Rejected::new(Error::EmptyBuffer, mem));
        }
        let ptr = mem.stable_ptr();
        // SAFETY: `mem` outlives the region (field order) and its bytes do not
        // move (`StableBuf`). No write rights are granted, so the device only
        // reads the bytes, which shared references may read concurrently.
        match unsafe { pd.register_raw(ptr.cast_mut(), len, Access::empty()) } {
            Ok(region) => Ok(ReadOnlyBuf {
                inner: Box::new(ReadOnlyInner {
                    lkey: region.lkey(),
                    pd: region.pd(),
                    region,
                    mem: Box::new(mem),
                    ptr,
                    len,
                }),
            }),
            Err(e) => Err(Rejected::new(e, mem)),
        }
    }

    /// Deregisters and returns the memory, if it is of type `M`.
    pub fn into_inner<M: StableBuf>(self) -> Result<M, Self> {
        if !(&*self.inner.mem as &dyn std::any::Any).is::<M>() {
            return Err(self);
        }
        let ReadOnlyInner { region, mem, .. } = *self.inner;
        drop(region);
        let any: Box<dyn std::any::Any> = mem;
        Ok(*any.downcast::<M>().expect("type checked above"))
    }
}

impl std::ops::Deref for ReadOnlyBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes while `mem` lives, and
        // nothing writes them (no write rights, `StableBuf` contract).
        unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) }
    }
}

impl fmt::Debug for ReadOnlyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyBuf")
            .field("len", &self.inner.len)
            .finish()
    }
}

/// The `IoBuf`/`BaseBuf` plumbing shared by the whole-buffer types.
macro_rules! impl_base_buf {
    ($ty:ident, $variant:ident) => {
        impl sealed::Sealed for $ty {}

        impl IoBuf for $ty {
            #[inline]
            fn bytes_len(&self) -> usize {
                self.len()
            }
            #[inline]
            fn sge(&self) -> Sge {
                Sge {
                    addr: self.as_ptr() as u64,
                    len: self.len() as u32,
                    lkey: self.base_lkey(),
                }
            }
            #[inline]
            fn pd(&self) -> PdId {
                self.base_pd()
            }
            #[inline]
            fn into_owned(self) -> OwnedBuf {
                OwnedBuf::whole(Base::$variant(self))
            }
            #[inline]
            fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf> {
                let (base, start, end) = buf.into_base();
                match base {
                    Base::$variant(b) if start == 0 && end == b.len() => Ok(b),
                    other => Err(OwnedBuf::new(other, start, end)),
                }
            }
        }

        impl BaseBuf for $ty {
            fn into_base(self) -> Base {
                Base::$variant(self)
            }
            fn from_base(base: Base) -> Result<Self, Base> {
                match base {
                    Base::$variant(b) => Ok(b),
                    other => Err(other),
                }
            }
        }
    };
}
pub(crate) use impl_base_buf;

impl RegisteredBuf {
    #[inline]
    fn base_lkey(&self) -> u32 {
        self.inner.lkey
    }
    #[inline]
    fn base_pd(&self) -> PdId {
        self.inner.pd
    }
}

impl ReadOnlyBuf {
    #[inline]
    fn base_lkey(&self) -> u32 {
        self.inner.lkey
    }
    #[inline]
    fn base_pd(&self) -> PdId {
        self.inner.pd
    }
}

impl_base_buf!(RegisteredBuf, Registered);
impl_base_buf!(ReadOnlyBuf, ReadOnly);
impl IoBufMut for RegisteredBuf {}
