//! Memory you own, registered for local use.

use std::fmt;

use super::registration::Registration;
use super::{sealed, Base, BaseBuf, IoBufMut, OwnedBuf, SingleBuf, StableBuf, StableBufMut};
use crate::backend::{Access, PdId, ProtectionDomain, Sge};
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
    inner: Box<Registration>,
}

impl RegisteredBuf {
    /// Registers `mem` in `pd` for local access. On failure the memory comes
    /// back inside the error.
    pub fn new<M: StableBufMut>(pd: &dyn ProtectionDomain, mem: M) -> Result<Self, Rejected<M>> {
        // SAFETY: `StableBufMut` promises the bytes are `mem`'s own, stay put
        // while `mem` lives unmoved in its box, and are reached by nothing
        // else; safe code reaches them only through this value, which an
        // in-flight operation owns while the device may write them.
        let registered = unsafe {
            Registration::new(pd, mem, Access::LOCAL_WRITE, |m: &mut M| {
                (m.stable_mut_ptr(), m.stable_len())
            })
        };
        match registered {
            Ok(registration) => Ok(RegisteredBuf {
                inner: Box::new(registration),
            }),
            Err((e, mem)) => Err(Rejected::new(e, mem)),
        }
    }

    /// Deregisters and returns the memory, if it is of type `M`. If it is
    /// of another type, or deregistration fails, the buffer comes back,
    /// still registered.
    pub fn into_inner<M: StableBufMut>(self) -> Result<M, Rejected<Self>> {
        if !self.inner.holds::<M>() {
            let wanted = std::any::type_name::<M>();
            return Err(Rejected::new(Error::WrongMemoryType(wanted), self));
        }
        match self.inner.into_memory::<M>() {
            Ok(mem) => Ok(mem),
            Err((e, inner)) => Err(Rejected::new(
                e,
                RegisteredBuf {
                    inner: Box::new(inner),
                },
            )),
        }
    }

    /// The local key, for diagnostics.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey()
    }
}

impl std::ops::Deref for RegisteredBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the registration's bytes are valid while it lives
        // (`StableBuf`), and no device writes them now: the registration is
        // local-only and an in-flight operation would own this value.
        unsafe { std::slice::from_raw_parts(self.inner.ptr(), self.inner.len()) }
    }
}

impl std::ops::DerefMut for RegisteredBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.inner.ptr(), self.inner.len()) }
    }
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("len", &self.inner.len())
            .field("lkey", &self.inner.lkey())
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
    inner: Box<Registration>,
}

impl ReadOnlyBuf {
    /// Registers `mem` in `pd` with no write rights.
    pub fn new<M: StableBuf>(pd: &dyn ProtectionDomain, mem: M) -> Result<Self, Rejected<M>> {
        // SAFETY: `StableBuf` promises the bytes stay put while `mem` lives
        // unmoved in its box; no write rights are granted, so the device only
        // reads them, as shared references may at the same time.
        let registered = unsafe {
            Registration::new(pd, mem, Access::empty(), |m: &mut M| {
                (m.stable_ptr().cast_mut(), m.stable_len())
            })
        };
        match registered {
            Ok(registration) => Ok(ReadOnlyBuf {
                inner: Box::new(registration),
            }),
            Err((e, mem)) => Err(Rejected::new(e, mem)),
        }
    }

    /// Deregisters and returns the memory, if it is of type `M`; otherwise,
    /// or if deregistration fails, the buffer comes back.
    pub fn into_inner<M: StableBuf>(self) -> Result<M, Rejected<Self>> {
        if !self.inner.holds::<M>() {
            let wanted = std::any::type_name::<M>();
            return Err(Rejected::new(Error::WrongMemoryType(wanted), self));
        }
        match self.inner.into_memory::<M>() {
            Ok(mem) => Ok(mem),
            Err((e, inner)) => Err(Rejected::new(
                e,
                ReadOnlyBuf {
                    inner: Box::new(inner),
                },
            )),
        }
    }
}

impl std::ops::Deref for ReadOnlyBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the bytes are valid while the registration lives, and
        // nothing writes them (no write rights, `StableBuf` contract).
        unsafe { std::slice::from_raw_parts(self.inner.ptr(), self.inner.len()) }
    }
}

impl fmt::Debug for ReadOnlyBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyBuf")
            .field("len", &self.inner.len())
            .finish()
    }
}

/// The `IoBuf`/`BaseBuf` plumbing shared by the whole-buffer types.
macro_rules! impl_base_buf {
    ($ty:ident, $variant:ident) => {
        impl sealed::Sealed for $ty {}

        $crate::buf::single_io_buf!($ty);

        impl SingleBuf for $ty {
            #[inline]
            fn single_len(&self) -> usize {
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
        self.inner.lkey()
    }
    #[inline]
    fn base_pd(&self) -> PdId {
        self.inner.pd()
    }
}

impl ReadOnlyBuf {
    #[inline]
    fn base_lkey(&self) -> u32 {
        self.inner.lkey()
    }
    #[inline]
    fn base_pd(&self) -> PdId {
        self.inner.pd()
    }
}

impl_base_buf!(RegisteredBuf, Registered);
impl_base_buf!(ReadOnlyBuf, ReadOnly);
impl IoBufMut for RegisteredBuf {}
