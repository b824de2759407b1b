//! [`RegionSet`]: the dirty map. A volume is cut into regions of
//! [`REGION_BYTES`]; a set names the regions that may differ between a
//! replica and the up-to-date ones.
//!
//! 1 MiB regions keep the map small (one entry per MiB written while a
//! replica was away; a persisted map of a 1 TiB volume is at most 8 MiB as
//! a list, usually a few entries) and make a resync move whole, sequential
//! MiBs. The price is that one 4 KiB write dirties a whole MiB.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The granularity of dirty maps, resync and verify.
pub const REGION_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionSet {
    regions: BTreeSet<u64>,
}

impl RegionSet {
    pub fn new() -> Self {
        RegionSet::default()
    }

    /// Every region of a volume of `size_bytes`: what a full sync copies.
    pub fn all(size_bytes: u64) -> Self {
        RegionSet {
            regions: (0..size_bytes.div_ceil(REGION_BYTES)).collect(),
        }
    }

    /// Adds the regions `[offset, offset + length)` touches; returns the
    /// ones that were not already in the set.
    pub fn add_range(&mut self, offset: u64, length: u64) -> Vec<u64> {
        let mut added = Vec::new();
        for region in regions_of(offset, length) {
            if self.regions.insert(region) {
                added.push(region);
            }
        }
        added
    }

    pub fn insert(&mut self, region: u64) -> bool {
        self.regions.insert(region)
    }

    pub fn remove(&mut self, region: u64) -> bool {
        self.regions.remove(&region)
    }

    pub fn contains(&self, region: u64) -> bool {
        self.regions.contains(&region)
    }

    pub fn union_with(&mut self, other: &RegionSet) {
        self.regions.extend(other.regions.iter().copied());
    }

    pub fn len(&self) -> u64 {
        self.regions.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.regions.iter().copied()
    }

    /// The lowest region at or after `from`.
    pub fn next_from(&self, from: u64) -> Option<u64> {
        self.regions.range(from..).next().copied()
    }

    pub fn clear(&mut self) {
        self.regions.clear();
    }
}

impl FromIterator<u64> for RegionSet {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        RegionSet {
            regions: iter.into_iter().collect(),
        }
    }
}

/// The regions a byte range touches (none for an empty range).
pub fn regions_of(offset: u64, length: u64) -> std::ops::Range<u64> {
    if length == 0 {
        return 0..0;
    }
    offset / REGION_BYTES..(offset + length).div_ceil(REGION_BYTES)
}

/// The byte range of `region`, clipped to the volume's end.
pub fn region_range(region: u64, size_bytes: u64) -> (u64, u64) {
    let start = region * REGION_BYTES;
    let end = (start + REGION_BYTES).min(size_bytes);
    (start, end.saturating_sub(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_map_to_the_regions_they_touch() {
        assert_eq!(regions_of(0, 0), 0..0);
        assert_eq!(regions_of(0, 4096), 0..1);
        assert_eq!(regions_of(REGION_BYTES - 4096, 8192), 0..2);
        assert_eq!(regions_of(3 * REGION_BYTES, REGION_BYTES), 3..4);
        let mut set = RegionSet::new();
        assert_eq!(set.add_range(REGION_BYTES - 4096, 8192), vec![0, 1]);
        assert_eq!(set.add_range(0, 4096), Vec::<u64>::new());
        assert_eq!(RegionSet::all(REGION_BYTES * 2 + 1).len(), 3);
        assert_eq!(
            region_range(2, REGION_BYTES * 2 + 512),
            (2 * REGION_BYTES, 512)
        );
    }
}
