//! [`BlockBuf`]: the bytes of a write, in memory aligned to 4 KiB.
//!
//! The store writes whole chunks straight to the device with `O_DIRECT`,
//! which takes only aligned memory. A write's data arrives from the socket
//! into a `BlockBuf` and goes to the device from there: no bounce copy on
//! the way. Everywhere else it is just a byte slice (`Deref<Target = [u8]>`).

use crate::huge_slab;
use std::alloc::Layout;
use std::ptr::NonNull;

/// A growable byte buffer whose first byte is aligned to [`BlockBuf::ALIGN`]
/// (like a `Vec<u8>`, which guarantees no alignment).
pub struct BlockBuf {
    /// `capacity` bytes allocated with `ALIGN` alignment, or dangling when
    /// `capacity` is 0.
    ptr: NonNull<u8>,
    /// Bytes allocated; always a multiple of `ALIGN`.
    capacity: usize,
    /// Bytes initialised, from the start.
    len: usize,
    /// The slot class when the memory is a slot of `huge_slab` (buffers of
    /// 64 KiB to 2 MiB: physically contiguous, so a device request from it
    /// is one segment), else `None` (the heap).
    slot: Option<u8>,
}

// SAFETY: a BlockBuf owns its allocation alone, as a Vec<u8> does.
unsafe impl Send for BlockBuf {}
// SAFETY: shared references only read.
unsafe impl Sync for BlockBuf {}

impl BlockBuf {
    /// The alignment of the first byte: a page, which covers the logical
    /// block size of every device `O_DIRECT` meets.
    pub const ALIGN: usize = 4096;

    pub const fn new() -> Self {
        BlockBuf {
            ptr: NonNull::dangling(),
            capacity: 0,
            len: 0,
            slot: None,
        }
    }

    pub fn with_capacity(bytes: usize) -> Self {
        let mut buffer = BlockBuf::new();
        buffer.reserve(bytes);
        buffer
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut buffer = BlockBuf::with_capacity(len);
        // SAFETY: the capacity covers len bytes, now all written.
        unsafe {
            std::ptr::write_bytes(buffer.ptr.as_ptr(), 0, len);
            buffer.len = len;
        }
        buffer
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes room for at least `additional` more bytes.
    pub fn reserve(&mut self, additional: usize) {
        let needed = self
            .len
            .checked_add(additional)
            .expect("BlockBuf capacity overflows usize");
        if needed <= self.capacity {
            return;
        }
        // Doubling keeps appends amortised, as for a Vec.
        let wanted = needed.max(self.capacity.saturating_mul(2));
        let capacity = wanted
            .checked_next_multiple_of(Self::ALIGN)
            .expect("BlockBuf capacity overflows usize");
        if let Some(class) = huge_slab::class_of(capacity) {
            if let Some(slot) = huge_slab::take(class) {
                // SAFETY: the slot holds class_bytes(class) >= capacity >
                // len bytes, and is nobody else's.
                unsafe { self.move_to(slot, huge_slab::class_bytes(class), Some(class as u8)) };
                return;
            }
        }
        let layout = Self::layout(capacity);
        let ptr = if self.capacity == 0 {
            // SAFETY: the layout's size is not zero.
            unsafe { std::alloc::alloc(layout) }
        } else if self.slot.is_some() {
            // SAFETY: the layout's size is not zero.
            let ptr = unsafe { std::alloc::alloc(layout) };
            let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            // SAFETY: the new memory holds capacity > len bytes, is the
            // heap's with this layout, and is nobody else's.
            unsafe { self.move_to(ptr, capacity, None) };
            return;
        } else {
            // SAFETY: ptr was allocated with the layout of self.capacity,
            // and the new size, a multiple of ALIGN, is not zero.
            unsafe { std::alloc::realloc(self.ptr.as_ptr(), Self::layout(self.capacity), capacity) }
        };
        self.ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        self.capacity = capacity;
        self.slot = None;
    }

    /// Copies the bytes in use to `to`, frees the old memory, and keeps
    /// `to` (a slot of class `slot`, or heap memory of `capacity` bytes
    /// with `Self::layout(capacity)` when `slot` is `None`).
    ///
    /// # Safety
    /// `to` holds at least `capacity` >= `self.len` bytes, does not overlap
    /// this buffer's memory, and is given to this buffer alone.
    unsafe fn move_to(&mut self, to: NonNull<u8>, capacity: usize, slot: Option<u8>) {
        // SAFETY: the caller's promise: room for len bytes, no overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), to.as_ptr(), self.len) };
        let len = self.len;
        self.release();
        self.ptr = to;
        self.len = len;
        self.capacity = capacity;
        self.slot = slot;
    }

    /// Frees the memory (to its slot list or the heap); the buffer is then
    /// empty, with no memory.
    fn release(&mut self) {
        if self.capacity != 0 {
            match self.slot.take() {
                Some(class) => huge_slab::give_back(class as usize, self.ptr),
                // SAFETY: allocated with exactly this layout.
                None => unsafe {
                    std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity))
                },
            }
        }
        self.ptr = NonNull::dangling();
        self.capacity = 0;
        self.len = 0;
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: reserve made room; the regions cannot overlap, as `bytes`
        // cannot borrow this buffer's spare capacity.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                bytes.len(),
            );
        }
        self.len += bytes.len();
    }

    /// Shortens the buffer to `len` bytes (no effect when it is shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, Self::ALIGN).expect("BlockBuf layout")
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        self.release();
    }
}

impl Default for BlockBuf {
    fn default() -> Self {
        BlockBuf::new()
    }
}

impl std::ops::Deref for BlockBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the first len bytes are initialised; a dangling pointer
        // is valid for an empty slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref, and &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for BlockBuf {
    fn clone(&self) -> Self {
        BlockBuf::from(&self[..])
    }
}

impl PartialEq for BlockBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for BlockBuf {}

impl std::fmt::Debug for BlockBuf {
    /// The length only: a write's bytes are no use in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockBuf({} bytes)", self.len)
    }
}

impl From<&[u8]> for BlockBuf {
    fn from(bytes: &[u8]) -> Self {
        let mut buffer = BlockBuf::with_capacity(bytes.len());
        buffer.extend_from_slice(bytes);
        buffer
    }
}

impl From<Vec<u8>> for BlockBuf {
    /// Copies: a `Vec`'s memory has no alignment to keep.
    fn from(bytes: Vec<u8>) -> Self {
        BlockBuf::from(&bytes[..])
    }
}

impl<const N: usize> From<[u8; N]> for BlockBuf {
    fn from(bytes: [u8; N]) -> Self {
        BlockBuf::from(&bytes[..])
    }
}

// SAFETY: chunk_mut hands out only the spare capacity past len, and
// advance_mut moves len only over bytes the caller has initialised (its
// contract), never past the capacity.
unsafe impl bytes::BufMut for BlockBuf {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize - self.len
    }

    unsafe fn advance_mut(&mut self, count: usize) {
        let len = self.len + count;
        assert!(
            len <= self.capacity,
            "advance_mut past the capacity ({len} > {})",
            self.capacity
        );
        self.len = len;
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        if self.len == self.capacity {
            self.reserve(Self::ALIGN);
        }
        // SAFETY: the capacity past len is allocated and unused.
        unsafe {
            bytes::buf::UninitSlice::from_raw_parts_mut(
                self.ptr.as_ptr().add(self.len),
                self.capacity - self.len,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use proptest::prelude::*;

    #[test]
    fn every_buffer_with_memory_starts_on_a_page() {
        for size in [1, 100, 4096, 4097, 65536, 1 << 20] {
            let buffer = BlockBuf::with_capacity(size);
            assert_eq!(buffer.as_ptr() as usize % BlockBuf::ALIGN, 0, "size {size}");
            assert_eq!(buffer.capacity() % BlockBuf::ALIGN, 0);
            assert!(buffer.capacity() >= size);
            assert!(buffer.is_empty());
        }
    }

    #[test]
    fn buffers_of_64_kib_to_2_mib_are_slots_and_keep_their_bytes_as_they_grow() {
        let mut buffer = BlockBuf::new();
        let mut model = Vec::new();
        // From the heap, through every slot size, past 2 MiB to the heap.
        for round in 0..700u32 {
            let piece = [round as u8; 4099];
            buffer.extend_from_slice(&piece);
            model.extend_from_slice(&piece);
            let in_slot = buffer.slot.is_some();
            let slot_sized = (64 << 10..=2 << 20).contains(&buffer.capacity());
            assert_eq!(in_slot, slot_sized, "capacity {}", buffer.capacity());
            assert_eq!(buffer.as_ptr() as usize % BlockBuf::ALIGN, 0);
        }
        assert!(buffer.capacity() > 2 << 20);
        assert_eq!(&buffer[..], &model[..]);
        let slot = BlockBuf::zeroed(128 << 10);
        assert!(slot.slot.is_some() && slot.iter().all(|&byte| byte == 0));
    }

    #[test]
    fn zeroed_is_zeros() {
        let buffer = BlockBuf::zeroed(10_000);
        assert_eq!(buffer.len(), 10_000);
        assert!(buffer.iter().all(|&byte| byte == 0));
        assert!(BlockBuf::zeroed(0).is_empty());
    }

    #[test]
    fn put_through_buf_mut_grows_and_keeps_alignment() {
        let mut buffer = BlockBuf::new();
        for round in 0..3000u32 {
            buffer.put_u32_le(round);
        }
        assert_eq!(buffer.len(), 12_000);
        assert_eq!(buffer.as_ptr() as usize % BlockBuf::ALIGN, 0);
        for (round, bytes) in buffer.chunks_exact(4).enumerate() {
            assert_eq!(u32::from_le_bytes(bytes.try_into().unwrap()), round as u32);
        }
    }

    #[test]
    fn debug_shows_the_length_not_the_bytes() {
        assert_eq!(
            format!("{:?}", BlockBuf::from([1u8, 2, 3])),
            "BlockBuf(3 bytes)"
        );
    }

    proptest! {
        /// Appends in any pieces, through either path, give the bytes of a
        /// Vec fed the same pieces; clone and truncate agree too.
        #[test]
        fn behaves_as_a_vec(pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..9000), 0..8), cut in 0usize..80_000) {
            let mut buffer = BlockBuf::new();
            let mut model = Vec::new();
            for (index, piece) in pieces.iter().enumerate() {
                if index % 2 == 0 {
                    buffer.extend_from_slice(piece);
                } else {
                    buffer.put_slice(piece);
                }
                model.extend_from_slice(piece);
                prop_assert_eq!(&buffer[..], &model[..]);
            }
            prop_assert_eq!(buffer.clone(), BlockBuf::from(model.clone()));
            buffer.truncate(cut);
            model.truncate(cut);
            prop_assert_eq!(&buffer[..], &model[..]);
        }
    }
}
