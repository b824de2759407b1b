//! The crc32c of every data block, cached in 4 KiB pages.
//!
//! On disk the checksum region holds one little-endian u32 per physical
//! block. In memory a bounded number of pages is cached; changed pages stay
//! pinned (dirty) until a checkpoint has written them, so a page is never
//! re-read from disk while the disk copy is older than memory.

use crate::disk::Disk;
use crate::layout::{Layout, BLOCK_BYTES};
use std::collections::{HashMap, VecDeque};
use std::io;

const CRCS_PER_PAGE: u64 = BLOCK_BYTES / 4;
/// Pages cached before clean ones are evicted: 64 MiB, the checksums of
/// 64 GiB of data. Dirty pages may exceed it until the next checkpoint.
pub const CACHE_PAGES_MAX: usize = 16 * 1024;

struct Page {
    crcs: Box<[u32]>,
    dirty: bool,
    /// Bumped on each change, so a checkpoint knows whether the page changed
    /// again while it was being written.
    version: u64,
}

pub struct ChecksumTable {
    pages: HashMap<u64, Page>,
    /// Load order, for evicting the oldest clean page.
    clock: VecDeque<u64>,
    capacity_pages: usize,
}

/// A dirty page copied out for writing.
pub struct PageWrite {
    pub page: u64,
    pub version: u64,
    pub bytes: Vec<u8>,
}

impl ChecksumTable {
    pub fn new(capacity_pages: usize) -> ChecksumTable {
        ChecksumTable {
            pages: HashMap::new(),
            clock: VecDeque::new(),
            capacity_pages: capacity_pages.max(1),
        }
    }

    fn page_offset(layout: &Layout, page: u64) -> u64 {
        layout.checksum_offset + page * BLOCK_BYTES
    }

    fn load(&mut self, disk: &dyn Disk, layout: &Layout, page: u64) -> io::Result<&mut Page> {
        if !self.pages.contains_key(&page) {
            self.evict_if_full();
            let mut bytes = vec![0u8; BLOCK_BYTES as usize];
            disk.read_at(&mut bytes, Self::page_offset(layout, page))?;
            let crcs = bytes
                .chunks_exact(4)
                .map(|four| u32::from_le_bytes(four.try_into().expect("4 bytes")))
                .collect();
            self.pages.insert(
                page,
                Page {
                    crcs,
                    dirty: false,
                    version: 0,
                },
            );
            self.clock.push_back(page);
        }
        Ok(self.pages.get_mut(&page).expect("just loaded"))
    }

    fn evict_if_full(&mut self) {
        let mut looked = 0;
        while self.pages.len() >= self.capacity_pages && looked < self.clock.len() {
            let Some(candidate) = self.clock.pop_front() else {
                break;
            };
            looked += 1;
            match self.pages.get(&candidate) {
                Some(page) if page.dirty => self.clock.push_back(candidate),
                Some(_) => {
                    self.pages.remove(&candidate);
                }
                None => {}
            }
        }
    }

    pub fn get(
        &mut self,
        disk: &dyn Disk,
        layout: &Layout,
        physical_block: u64,
    ) -> io::Result<u32> {
        let page = self.load(disk, layout, physical_block / CRCS_PER_PAGE)?;
        Ok(page.crcs[(physical_block % CRCS_PER_PAGE) as usize])
    }

    pub fn set(
        &mut self,
        disk: &dyn Disk,
        layout: &Layout,
        physical_block: u64,
        crc: u32,
    ) -> io::Result<()> {
        self.set_run(disk, layout, physical_block, &[crc])
    }

    /// Sets the crcs of consecutive physical blocks from `first_block`:
    /// one page lookup per page they span, not one per block (a whole
    /// chunk's 16 blocks share one page).
    pub fn set_run(
        &mut self,
        disk: &dyn Disk,
        layout: &Layout,
        first_block: u64,
        crcs: &[u32],
    ) -> io::Result<()> {
        let mut block = first_block;
        let mut crcs = crcs;
        while !crcs.is_empty() {
            let page = self.load(disk, layout, block / CRCS_PER_PAGE)?;
            let from = (block % CRCS_PER_PAGE) as usize;
            let count = crcs.len().min(page.crcs.len() - from);
            page.crcs[from..from + count].copy_from_slice(&crcs[..count]);
            page.dirty = true;
            page.version += 1;
            block += count as u64;
            crcs = &crcs[count..];
        }
        Ok(())
    }

    pub fn dirty_pages(&self) -> usize {
        self.pages.values().filter(|page| page.dirty).count()
    }

    /// Copies of every dirty page, for a checkpoint to write.
    pub fn collect_dirty(&self) -> Vec<PageWrite> {
        let mut writes: Vec<PageWrite> = self
            .pages
            .iter()
            .filter(|(_, page)| page.dirty)
            .map(|(number, page)| PageWrite {
                page: *number,
                version: page.version,
                bytes: page.crcs.iter().flat_map(|crc| crc.to_le_bytes()).collect(),
            })
            .collect();
        writes.sort_unstable_by_key(|write| write.page);
        writes
    }

    pub fn write_pages(disk: &dyn Disk, layout: &Layout, writes: &[PageWrite]) -> io::Result<()> {
        for write in writes {
            disk.write_at(&write.bytes, Self::page_offset(layout, write.page))?;
        }
        Ok(())
    }

    /// After `writes` are durable: unpin the pages that did not change since.
    pub fn mark_clean(&mut self, writes: &[PageWrite]) {
        for write in writes {
            if let Some(page) = self.pages.get_mut(&write.page) {
                if page.version == write.version {
                    page.dirty = false;
                }
            }
        }
        self.evict_if_full();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::FileDisk;

    #[test]
    fn a_run_across_pages_sets_what_single_sets_would() {
        let file = tempfile::tempfile().unwrap();
        let layout = Layout::compute(1 << 30).unwrap();
        file.set_len(layout.data_offset).unwrap();
        let disk = FileDisk::new(file);
        let (mut runs, mut singles) = (ChecksumTable::new(4), ChecksumTable::new(4));
        // From 10 blocks before a page's end to 5 after the next one's.
        let first = CRCS_PER_PAGE - 10;
        let crcs: Vec<u32> = (0..CRCS_PER_PAGE as u32 + 15).map(|i| i * 7 + 1).collect();
        runs.set_run(&disk, &layout, first, &crcs).unwrap();
        for (index, crc) in crcs.iter().enumerate() {
            singles
                .set(&disk, &layout, first + index as u64, *crc)
                .unwrap();
        }
        for block in first - 2..first + crcs.len() as u64 + 2 {
            // Blocks outside the run keep what the device holds: zeros.
            let expected = block
                .checked_sub(first)
                .and_then(|index| crcs.get(index as usize))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                runs.get(&disk, &layout, block).unwrap(),
                expected,
                "block {block}"
            );
            assert_eq!(
                singles.get(&disk, &layout, block).unwrap(),
                expected,
                "block {block}"
            );
        }
        assert_eq!(runs.dirty_pages(), 3);
        assert_eq!(runs.collect_dirty().len(), singles.collect_dirty().len());
    }
}
