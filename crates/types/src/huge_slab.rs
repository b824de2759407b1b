//! Memory for large `BlockBuf`s (the `buffer` module): slots of 64 KiB
//! to 2 MiB carved from 2 MiB regions that the kernel is asked to back
//! with transparent huge pages (`MADV_HUGEPAGE`), so that a buffer is one
//! physically contiguous piece of memory.
//!
//! Why: a write's data goes to the device with `O_DIRECT` straight from
//! its buffer, and the block layer makes one segment of each physically
//! contiguous run. From ordinary heap memory a 128 KiB write is 32
//! scattered pages, a 1 MiB device request up to 254 segments (the
//! virtio disk's limit), each a descriptor the device must walk. On this
//! project's test machine three streams of 1 MiB `O_DIRECT` writes ran at
//! 1,876-1,926 MiB/s from such memory and 2,440-2,553 MiB/s from huge
//! pages (fio `--iomem=malloc` against `--iomem=mmaphuge`).
//!
//! Slots are kept for reuse, never given back to the system: the memory
//! held is the peak of large buffers alive at once, which the store bounds
//! (its held-data limit) and the network layer bounds (requests in
//! flight). Where `mmap` fails, or the kernel has no huge page to give,
//! buffers come from the heap or from small pages, as before: correct,
//! only slower.

use std::ptr::NonNull;
use std::sync::Mutex;

/// The smallest slot: smaller buffers come from the heap.
pub(crate) const SLOT_MIN_BYTES: usize = 64 << 10;
/// The largest slot, and a region's size (one huge page).
pub(crate) const SLOT_MAX_BYTES: usize = 2 << 20;
/// Slot sizes, powers of two from the smallest to the largest.
const CLASSES: usize = (SLOT_MAX_BYTES / SLOT_MIN_BYTES).trailing_zeros() as usize + 1;

/// Free slots of each size, by address (a `usize`: the list only keeps
/// addresses; whoever takes one owns its memory).
static FREE: [Mutex<Vec<usize>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

/// The slot size class of a buffer of `capacity` bytes, if slots serve it.
pub(crate) fn class_of(capacity: usize) -> Option<usize> {
    if !(SLOT_MIN_BYTES..=SLOT_MAX_BYTES).contains(&capacity) {
        return None;
    }
    let size = capacity.next_power_of_two();
    Some((size / SLOT_MIN_BYTES).trailing_zeros() as usize)
}

/// The bytes of a slot of class `class`.
pub(crate) fn class_bytes(class: usize) -> usize {
    SLOT_MIN_BYTES << class
}

/// A free slot of class `class`, or `None` if no region could be mapped.
pub(crate) fn take(class: usize) -> Option<NonNull<u8>> {
    let mut free = FREE[class]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(address) = free.pop() {
        return NonNull::new(address as *mut u8);
    }
    let region = map_region()?;
    let size = class_bytes(class);
    // The region's other slots go to the free list; the first is taken.
    for slot in (1..SLOT_MAX_BYTES / size).rev() {
        free.push(region.as_ptr() as usize + slot * size);
    }
    Some(region)
}

/// Gives slot `slot` of class `class`, taken with [`take`], back for reuse.
pub(crate) fn give_back(class: usize, slot: NonNull<u8>) {
    FREE[class]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(slot.as_ptr() as usize);
}

/// A new 2 MiB region aligned to 2 MiB (a huge page can only back an
/// aligned range), advised for transparent huge pages.
fn map_region() -> Option<NonNull<u8>> {
    let length = 2 * SLOT_MAX_BYTES;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory; its ends outside the aligned
    // region are unmapped before anyone sees them, and the advice only
    // changes how the kernel backs the region.
    unsafe {
        let raw = libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(SLOT_MAX_BYTES);
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        let end = start + length;
        let aligned_end = aligned + SLOT_MAX_BYTES;
        if end > aligned_end {
            libc::munmap(aligned_end as *mut libc::c_void, end - aligned_end);
        }
        // Advice refused (THP off): small pages, still correct.
        libc::madvise(
            aligned as *mut libc::c_void,
            SLOT_MAX_BYTES,
            libc::MADV_HUGEPAGE,
        );
        NonNull::new(aligned as *mut u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_64_kib_to_2_mib_in_powers_of_two() {
        assert_eq!(class_of(SLOT_MIN_BYTES - 4096), None);
        assert_eq!(class_of(SLOT_MIN_BYTES), Some(0));
        assert_eq!(class_of(SLOT_MIN_BYTES + 4096), Some(1));
        assert_eq!(class_of(128 << 10), Some(1));
        assert_eq!(class_of(SLOT_MAX_BYTES), Some(CLASSES - 1));
        assert_eq!(class_of(SLOT_MAX_BYTES + 4096), None);
        for class in 0..CLASSES {
            assert_eq!(class_of(class_bytes(class)), Some(class));
        }
    }

    #[test]
    fn slots_of_a_region_are_distinct_aligned_and_reused() {
        let class = class_of(256 << 10).unwrap();
        let slots: Vec<NonNull<u8>> = (0..8).map(|_| take(class).unwrap()).collect();
        let mut addresses: Vec<usize> = slots.iter().map(|slot| slot.as_ptr() as usize).collect();
        addresses.sort_unstable();
        for pair in addresses.windows(2) {
            assert!(pair[1] - pair[0] >= class_bytes(class), "slots overlap");
        }
        assert!(addresses
            .iter()
            .all(|address| address % class_bytes(class) == 0));
        let last = slots[7];
        give_back(class, last);
        assert_eq!(take(class), Some(last), "a slot given back is reused");
    }
}
