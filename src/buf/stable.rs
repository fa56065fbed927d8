//! Memory whose address does not change: what a NIC needs.

use std::any::Any;

/// Memory at a fixed address that the device may read.
///
/// # Safety
///
/// An implementation promises that:
///
/// * `stable_ptr()` points to `stable_len()` initialized bytes, and both
///   return the same values every time they are called on the same value
///   through shared references (a method taking `&mut self` may shrink
///   it: nobody can call one while a registration owns the value);
/// * moving the value does not move those bytes (they live on the heap or
///   in static memory), so a registration made before a move stays valid;
/// * the bytes stay allocated until the value is dropped, and nothing else
///   frees, reallocates or writes them while the value is alive.
///
/// ```
/// use rdma_ring::buf::StableBuf;
/// let v = vec![1u8, 2, 3];
/// assert_eq!(v.stable_len(), 3);
/// ```
pub unsafe trait StableBuf: Any + Send {
    /// Address of the first byte.
    fn stable_ptr(&self) -> *const u8;
    /// Number of bytes.
    fn stable_len(&self) -> usize;
}

/// Memory at a fixed address that the device may also write.
///
/// # Safety
///
/// Everything [`StableBuf`] promises, and `stable_mut_ptr()` returns the
/// same address as `stable_ptr()`, valid for writes of `stable_len()` bytes.
///
/// ```
/// use rdma_ring::buf::{StableBuf, StableBufMut};
/// let mut v = vec![0u8; 16];
/// assert_eq!(v.stable_mut_ptr() as *const u8, v.stable_ptr());
/// ```
pub unsafe trait StableBufMut: StableBuf {
    /// Address of the first byte, for writing.
    fn stable_mut_ptr(&mut self) -> *mut u8;
}

// SAFETY: a Vec's heap buffer does not move when the Vec moves, and the
// buffer is reallocated only by methods that need `&mut Vec`, which nobody
// calls while the Vec is owned by a registration (it is never handed out).
unsafe impl StableBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}
// SAFETY: as for `StableBuf`; `as_mut_ptr` is the same address.
unsafe impl StableBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: a boxed slice lives on the heap and cannot be resized.
unsafe impl StableBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}
// SAFETY: as for `StableBuf`.
unsafe impl StableBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: a boxed array lives on the heap and has a fixed size.
unsafe impl<const N: usize> StableBuf for Box<[u8; N]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_len(&self) -> usize {
        N
    }
}
// SAFETY: as for `StableBuf`.
unsafe impl<const N: usize> StableBufMut for Box<[u8; N]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: the words live on the heap and cannot be resized; any bit pattern
// is a valid u64, so the device may write them freely. The memory is
// 8-byte aligned, which is what atomics need.
unsafe impl StableBuf for Box<[u64]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr().cast()
    }
    fn stable_len(&self) -> usize {
        self.len() * 8
    }
}
// SAFETY: as for `StableBuf`.
unsafe impl StableBufMut for Box<[u64]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr().cast()
    }
}

// SAFETY: one heap word, 8-byte aligned; any bit pattern is a valid u64.
unsafe impl StableBuf for Box<u64> {
    fn stable_ptr(&self) -> *const u8 {
        (&**self as *const u64).cast()
    }
    fn stable_len(&self) -> usize {
        8
    }
}
// SAFETY: as for `StableBuf`.
unsafe impl StableBufMut for Box<u64> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        (&mut **self as *mut u64).cast()
    }
}

// SAFETY: static memory never moves nor is freed, and `&'static [u8]` is
// immutable, so nothing writes it.
unsafe impl StableBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_survive_moves() {
        let v = vec![7u8; 32];
        let before = v.stable_ptr();
        let moved = Box::new(v);
        assert_eq!(moved.stable_ptr(), before);
    }

    #[test]
    fn word_is_aligned() {
        let w = Box::new(5u64);
        assert_eq!(w.stable_ptr() as usize % 8, 0);
        assert_eq!(w.stable_len(), 8);
    }
}
