//! Recycled buffers for large frames (crate-private).
//!
//! Every DATA frame the mux builds and every WebSocket message the transport reads needs a
//! buffer of up to 256 KiB (more for larger configured frames). Fresh allocations of that
//! size are expensive far beyond the allocation call: glibc serves them with `mmap` or
//! hands freed heap back to the kernel (`madvise`), so each frame also pays page faults and
//! the zeroing of new pages, and lands in cold memory — measured at ~15% of the tunnel's
//! CPU per byte. A [`Buf`] of a large size comes from a per-size-class free list instead and
//! goes back to it when it is dropped, also after [`Buf::freeze`] (via `Bytes::from_owner`:
//! when the last `Bytes` that references it is dropped), so the same warm memory is reused.
//!
//! Bounds: size classes are powers of two (plus [`SLACK`] for headers), so a buffer is at
//! most twice the size asked for; each class keeps at most [`KEEP_PER_CLASS`] bytes idle per
//! process; sizes up to [`POOL_MIN`] and above the largest class are plain allocations.

use std::ops::{Deref, DerefMut};
use std::sync::{LazyLock, Mutex, PoisonError};

use bytes::Bytes;

/// Buffers up to this size are plain allocations: malloc serves small blocks from warm
/// free lists already.
pub(crate) const POOL_MIN: usize = 16 * 1024;
/// Room for frame headers beyond the power-of-two class size (a mux frame is its 5-byte
/// header plus a payload of up to `max_frame_payload`, usually a power of two).
const SLACK: usize = 64;
/// Smallest class: 32 KiB (+ SLACK).
const MIN_SHIFT: u32 = 15;
/// Largest class: 1 MiB (+ SLACK), the transport's message limit.
const MAX_SHIFT: u32 = 20;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Idle bytes kept per class and process.
const KEEP_PER_CLASS: usize = 4 * 1024 * 1024;

/// Free lists, one per class.
struct Pool {
    free: [Mutex<Vec<Vec<u8>>>; CLASSES],
}

impl Pool {
    fn new() -> Pool {
        Pool {
            free: std::array::from_fn(|_| Mutex::new(Vec::new())),
        }
    }

    fn take(&'static self, len: usize) -> Buf {
        match class_of(len) {
            None => Buf {
                vec: Vec::with_capacity(len),
                class: None,
                pool: self,
            },
            Some(class) => {
                let recycled = self.free[class]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop();
                Buf {
                    vec: recycled.unwrap_or_else(|| Vec::with_capacity(class_capacity(class))),
                    class: Some(class),
                    pool: self,
                }
            }
        }
    }

    fn put(&self, class: usize, vec: &mut Vec<u8>) {
        let mut free = self.free[class]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if (free.len() + 1) * class_capacity(class) <= KEEP_PER_CLASS {
            let mut vec = std::mem::take(vec);
            vec.clear();
            free.push(vec);
        }
    }
}

static GLOBAL: LazyLock<Pool> = LazyLock::new(Pool::new);

fn class_capacity(class: usize) -> usize {
    (1usize << (MIN_SHIFT as usize + class)) + SLACK
}

/// The class for a buffer of `len` bytes, if it is pooled.
fn class_of(len: usize) -> Option<usize> {
    if len <= POOL_MIN {
        return None;
    }
    (0..CLASSES).find(|&c| class_capacity(c) >= len)
}

/// A byte buffer (a `Vec<u8>`) that is recycled when large; see the module docs.
pub(crate) struct Buf {
    vec: Vec<u8>,
    class: Option<usize>,
    pool: &'static Pool,
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf")
            .field("len", &self.vec.len())
            .field("class", &self.class)
            .finish()
    }
}

impl Buf {
    /// An empty buffer with room for at least `len` bytes.
    pub(crate) fn with_capacity(len: usize) -> Buf {
        GLOBAL.take(len)
    }

    /// The contents as `Bytes`, without a copy; a pooled buffer returns to its free list
    /// when the last `Bytes` referencing it is dropped.
    pub(crate) fn freeze(self) -> Bytes {
        match self.class {
            Some(_) => Bytes::from_owner(self),
            None => {
                let mut this = self;
                Bytes::from(std::mem::take(&mut this.vec))
            }
        }
    }
}

impl Deref for Buf {
    type Target = Vec<u8>;

    fn deref(&self) -> &Vec<u8> {
        &self.vec
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.vec
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.vec
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let Some(class) = self.class else {
            return;
        };
        // A buffer that grew past its class (a coalescing append) is not the class's size
        // any more: let it go.
        if self.vec.capacity() == class_capacity(class) {
            self.pool.put(class, &mut self.vec);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bound_the_waste() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(POOL_MIN), None);
        assert_eq!(class_of(POOL_MIN + 1), Some(0));
        // A 256 KiB mux frame with its header fits the 256 KiB class.
        assert_eq!(class_of(256 * 1024 + 5), Some(3));
        assert_eq!(class_of(256 * 1024 + SLACK + 1), Some(4));
        assert_eq!(class_of(class_capacity(CLASSES - 1)), Some(CLASSES - 1));
        assert_eq!(class_of(class_capacity(CLASSES - 1) + 1), None);
        for len in (POOL_MIN + 1..2 << 20).step_by(4093) {
            if let Some(c) = class_of(len) {
                let cap = class_capacity(c);
                assert!(cap >= len && cap < 2 * len + SLACK, "{len} -> {cap}");
            }
        }
    }

    #[test]
    fn buffers_come_back_after_the_last_bytes_is_dropped() {
        // A pool of this test's own, so that other tests cannot take the buffer meanwhile.
        let pool: &'static Pool = Box::leak(Box::new(Pool::new()));
        let len = 300 * 1024;
        let class = class_of(len).unwrap();
        let mut b = pool.take(len);
        b.extend_from_slice(&[7u8; 1000]);
        let ptr = b.as_ptr();
        let bytes = b.freeze();
        let slice = bytes.slice(10..20);
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(bytes);
        let idle = || pool.free[class].lock().unwrap().len();
        assert_eq!(idle(), 0, "a slice still references it");
        drop(slice);
        assert_eq!(idle(), 1);
        let again = pool.take(len);
        assert_eq!(again.as_ptr(), ptr, "the same memory again");
        assert!(again.is_empty());
        assert!(again.capacity() >= len);
        drop(again);

        // The class keeps at most KEEP_PER_CLASS idle.
        let many: Vec<Buf> = (0..64).map(|_| pool.take(len)).collect();
        drop(many);
        assert_eq!(idle(), KEEP_PER_CLASS / class_capacity(class));

        // A buffer that outgrew its class is not kept.
        let before = idle();
        let mut grown = pool.take(len);
        grown.reserve(class_capacity(class) + 1);
        drop(grown);
        assert_eq!(idle(), before - 1);

        // Small buffers are plain; freezing them does not copy.
        let mut small = Buf::with_capacity(100);
        small.extend_from_slice(b"abc");
        let p = small.as_ptr();
        let frozen = small.freeze();
        assert_eq!(frozen.as_ptr(), p);
    }
}
