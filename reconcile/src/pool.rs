//! The ring pool: extents of the Maglev tables' array (`RingRef`s, in words of four slots)
//! handed out to VIPs, first fit, coalesced when freed. A VIP holds two: the table packets
//! read and the one the next change is written into.

use std::collections::BTreeMap;

use spillway_common::{limits::RING_SLOTS_PER_WORD, types::RingRef};

pub struct RingPool {
    /// Free extents: first word → words.
    free: BTreeMap<u32, u32>,
    words: u32,
}

impl RingPool {
    /// A pool of `words` words with `used` (tables found in the maps) taken; `None` when two
    /// of them overlap or one lies outside the pool.
    pub fn with_used(words: u32, used: impl IntoIterator<Item = RingRef>) -> Option<Self> {
        let mut used: Vec<(u32, u32)> = used.into_iter().map(|r| (r.base, RingRef::words(r.size))).collect();
        used.sort_unstable();
        let mut free = BTreeMap::new();
        let mut next = 0u32;
        for (base, len) in used {
            if base < next || base.checked_add(len)? > words {
                return None;
            }
            if base > next {
                free.insert(next, base - next);
            }
            next = base + len;
        }
        if next < words {
            free.insert(next, words - next);
        }
        Some(Self { free, words })
    }

    /// An extent for a table of `size` slots, if one is free.
    pub fn alloc(&mut self, size: u32) -> Option<RingRef> {
        let need = RingRef::words(size);
        let (&base, &len) = self.free.iter().find(|&(_, &len)| len >= need)?;
        self.free.remove(&base);
        if len > need {
            self.free.insert(base + need, len - need);
        }
        Some(RingRef { base, size })
    }

    /// Returns `table`'s extent, merging it with free neighbours.
    pub fn free(&mut self, table: RingRef) {
        let mut base = table.base;
        let mut len = RingRef::words(table.size);
        if let Some((&before, &before_len)) = self.free.range(..base).next_back()
            && before + before_len == base
        {
            self.free.remove(&before);
            base = before;
            len += before_len;
        }
        if let Some(after_len) = self.free.remove(&(base + len)) {
            len += after_len;
        }
        self.free.insert(base, len);
    }

    /// Slots not handed out.
    pub fn free_slots(&self) -> u64 {
        self.free.values().map(|&w| u64::from(w) * u64::from(RING_SLOTS_PER_WORD)).sum()
    }

    /// Slots of the whole pool.
    pub fn slots(&self) -> u64 {
        u64::from(self.words) * u64::from(RING_SLOTS_PER_WORD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(base: u32, size: u32) -> RingRef {
        RingRef { base, size }
    }

    #[test]
    fn first_fit_then_coalesce_back_to_one_extent() {
        let mut pool = RingPool::with_used(100, []).unwrap();
        let a = pool.alloc(13).unwrap();
        let b = pool.alloc(40).unwrap();
        let c = pool.alloc(13).unwrap();
        assert_eq!((a, b, c), (table(0, 13), table(4, 40), table(14, 13)));
        pool.free(b);
        // The hole is reused by what fits in it.
        assert_eq!(pool.alloc(17), Some(table(4, 17)));
        pool.free(table(4, 17));
        pool.free(a);
        pool.free(c);
        assert_eq!(pool.free.len(), 1);
        assert_eq!(pool.free_slots(), pool.slots());
    }

    #[test]
    fn a_full_pool_refuses() {
        let mut pool = RingPool::with_used(8, []).unwrap();
        assert!(pool.alloc(29).is_some());
        assert_eq!(pool.alloc(13), None);
        assert_eq!(pool.free_slots(), 0);
    }

    #[test]
    fn adopting_finds_the_gaps_and_refuses_overlaps() {
        let mut pool = RingPool::with_used(100, [table(50, 13), table(0, 13)]).unwrap();
        assert_eq!(pool.free_slots(), (100 - 8) * 4);
        assert_eq!(pool.alloc(180), Some(table(4, 180)));
        assert!(RingPool::with_used(100, [table(0, 13), table(3, 13)]).is_none());
        assert!(RingPool::with_used(100, [table(98, 13)]).is_none());
    }
}
