//! Weighted Maglev lookup tables (Eisenbud et al., NSDI '16), built in userspace.
//!
//! Each backend walks its own permutation of the table (offset and skip from its address
//! hash) and claims the first free slot on its turn. Weights decide how many turns a backend
//! gets per round: a backend of weight `w` earns `w` credits a round and spends `max_weight`
//! credits per slot, so shares follow weights while the walk order stays each backend's own.
//! That own order is what keeps disruption small when the set changes.

use alloc::vec;
use alloc::vec::Vec;

use crate::hash::{MAGLEV_OFFSET_SEED, MAGLEV_SKIP_SEED, addr_hash};
use crate::limits::{MAX_BACKENDS_PER_VIP, valid_ring_size};

/// Slot value meaning "no backend"; backend ids start at 1.
pub const EMPTY_SLOT: u32 = 0;

/// Most weight one backend may carry (keeps credit arithmetic far from overflow).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// One backend as the table builder sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevBackend {
    /// Value written into the slots this backend owns (its backend id, never 0).
    pub id: u32,
    /// Its address words; they, not the id, decide its permutation, so a backend keeps its
    /// slots across restarts even if ids are handed out differently.
    pub addr: [u32; 4],
    /// Relative share of new flows; 0 means draining (no slots).
    pub weight: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MaglevError {
    #[error("table size {size} is not an accepted prime (13..=65537)")]
    BadSize { size: u32 },
    #[error("{count} backends exceed the limit of {MAX_BACKENDS_PER_VIP} per VIP")]
    TooManyBackends { count: usize },
    #[error("backend id 0 is reserved for empty slots")]
    ReservedId,
    #[error("backend {id} has weight {weight}, above the maximum {MAX_WEIGHT}")]
    WeightTooLarge { id: u32, weight: u32 },
    #[error("two backends share the address of backend {id}")]
    DuplicateAddress { id: u32 },
}

struct Walker {
    id: u32,
    weight: u64,
    /// The next slot of the walk, `(offset + k * skip) % m`, kept without a division.
    pos: u64,
    skip: u64,
    credit: u64,
}

/// Builds the table of `size` slots. With no backend of non-zero weight every slot is
/// [`EMPTY_SLOT`].
pub fn build(backends: &[MaglevBackend], size: u32) -> Result<Vec<u32>, MaglevError> {
    validate(backends, size)?;
    let m = u64::from(size);
    let mut table = vec![EMPTY_SLOT; size as usize];

    // Sorted by address so the result does not depend on the order backends were added.
    let mut live: Vec<&MaglevBackend> = backends.iter().filter(|b| b.weight > 0).collect();
    live.sort_unstable_by_key(|b| b.addr);
    let Some(max_weight) = live.iter().map(|b| u64::from(b.weight)).max() else {
        return Ok(table);
    };
    let mut walkers: Vec<Walker> = live
        .iter()
        .map(|b| Walker {
            id: b.id,
            weight: u64::from(b.weight),
            pos: u64::from(addr_hash(&b.addr, MAGLEV_OFFSET_SEED)) % m,
            skip: u64::from(addr_hash(&b.addr, MAGLEV_SKIP_SEED)) % (m - 1) + 1,
            credit: 0,
        })
        .collect();

    let mut filled = 0u64;
    while filled < m {
        for w in &mut walkers {
            w.credit += w.weight;
            while w.credit >= max_weight && filled < m {
                w.credit -= max_weight;
                // `skip` is coprime with the prime `m`, so the walk visits every slot and
                // finds a free one within `m` steps.
                loop {
                    let slot = w.pos as usize;
                    w.pos += w.skip;
                    if w.pos >= m {
                        w.pos -= m;
                    }
                    if table[slot] == EMPTY_SLOT {
                        table[slot] = w.id;
                        filled += 1;
                        break;
                    }
                }
            }
        }
    }
    Ok(table)
}

fn validate(backends: &[MaglevBackend], size: u32) -> Result<(), MaglevError> {
    if !valid_ring_size(size) {
        return Err(MaglevError::BadSize { size });
    }
    if backends.len() > MAX_BACKENDS_PER_VIP as usize {
        return Err(MaglevError::TooManyBackends { count: backends.len() });
    }
    for b in backends {
        if b.id == EMPTY_SLOT {
            return Err(MaglevError::ReservedId);
        }
        if b.weight > MAX_WEIGHT {
            return Err(MaglevError::WeightTooLarge { id: b.id, weight: b.weight });
        }
    }
    // Sorted by address, then position: the first backend (in input order) whose address an
    // earlier one has is the one named.
    let mut by_addr: Vec<(&[u32; 4], usize)> = backends.iter().enumerate().map(|(i, b)| (&b.addr, i)).collect();
    by_addr.sort_unstable();
    let repeated = by_addr.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| w[1].1).min();
    match repeated {
        Some(i) => Err(MaglevError::DuplicateAddress { id: backends[i].id }),
        None => Ok(()),
    }
}

/// The slots whose owner differs between `old` and `new`, as (slot, new owner). Tables of
/// different sizes differ everywhere.
pub fn changed_slots<'a>(old: &'a [u32], new: &'a [u32]) -> impl Iterator<Item = (u32, u32)> + 'a {
    let same_size = old.len() == new.len();
    new.iter().enumerate().filter(move |&(i, &owner)| !same_size || old[i] != owner).map(|(i, &owner)| (i as u32, owner))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::limits::DEFAULT_RING_SIZE;

    fn backends(n: u32) -> Vec<MaglevBackend> {
        (1..=n).map(|i| MaglevBackend { id: i, addr: [0x0a00_0000 + i, 0, 0, 0], weight: 100 }).collect()
    }

    fn counts(table: &[u32]) -> HashMap<u32, usize> {
        let mut c = HashMap::new();
        for &id in table {
            *c.entry(id).or_default() += 1;
        }
        c
    }

    fn assert_shares_within(table: &[u32], set: &[MaglevBackend], tolerance: f64) {
        let total_weight: u64 = set.iter().map(|b| u64::from(b.weight)).sum();
        let c = counts(table);
        for b in set {
            let want = table.len() as f64 * b.weight as f64 / total_weight as f64;
            let got = *c.get(&b.id).unwrap_or(&0) as f64;
            assert!(
                (got - want).abs() <= want * tolerance,
                "backend {} got {got} slots, wants {want:.1} (±{:.1}%)",
                b.id,
                tolerance * 100.0
            );
        }
    }

    #[test]
    fn every_slot_filled_and_shares_within_one_percent_at_1000_backends() {
        let set = backends(1000);
        let table = build(&set, DEFAULT_RING_SIZE).unwrap();
        assert!(table.iter().all(|&id| id != EMPTY_SLOT));
        assert_shares_within(&table, &set, 0.01);
    }

    #[test]
    fn removing_one_backend_moves_at_most_one_percent_of_survivors_slots() {
        for n in [3u32, 10, 100, 1000] {
            let set = backends(n);
            let before = build(&set, DEFAULT_RING_SIZE).unwrap();
            for removed in [1, n / 2 + 1, n] {
                let rest: Vec<_> = set.iter().copied().filter(|b| b.id != removed).collect();
                let after = build(&rest, DEFAULT_RING_SIZE).unwrap();
                let survivors_slots = before.iter().filter(|&&id| id != removed).count();
                let moved = before.iter().zip(&after).filter(|&(&b, &a)| b != removed && b != a).count();
                let share = moved as f64 / survivors_slots as f64;
                assert!(share <= 0.01, "n={n} removed={removed}: {:.3}% moved", share * 100.0);
            }
        }
    }

    #[test]
    fn weighted_shares_follow_weights() {
        let mut set = backends(6);
        for (b, w) in set.iter_mut().zip([100, 200, 300, 50, 1, 1000]) {
            b.weight = w;
        }
        let table = build(&set, DEFAULT_RING_SIZE).unwrap();
        // Weight 1 of 1651 is ~40 slots; 1% of that is under one slot, so allow 3%.
        assert_shares_within(&table, &set, 0.03);
        let heavy: Vec<_> = set.iter().copied().filter(|b| b.weight >= 50).collect();
        assert_shares_within(&build(&heavy, DEFAULT_RING_SIZE).unwrap(), &heavy, 0.01);
    }

    #[test]
    fn zero_weight_backend_owns_nothing() {
        let mut set = backends(3);
        set[1].weight = 0;
        let c = counts(&build(&set, 251).unwrap());
        assert!(!c.contains_key(&2));
        assert_eq!(c.values().sum::<usize>(), 251);
    }

    #[test]
    fn no_live_backend_gives_empty_table() {
        assert!(build(&[], 13).unwrap().iter().all(|&s| s == EMPTY_SLOT));
    }

    #[test]
    fn order_of_backends_does_not_matter() {
        let set = backends(50);
        let mut reversed = set.clone();
        reversed.reverse();
        assert_eq!(build(&set, 4099).unwrap(), build(&reversed, 4099).unwrap());
    }

    #[test]
    fn bad_inputs_are_refused() {
        let set = backends(2);
        assert_eq!(build(&set, 100), Err(MaglevError::BadSize { size: 100 }));
        assert_eq!(build(&set, 65539), Err(MaglevError::BadSize { size: 65539 }));
        let mut zero = set.clone();
        zero[0].id = 0;
        assert_eq!(build(&zero, 13), Err(MaglevError::ReservedId));
        let mut dup = set.clone();
        dup[1].addr = dup[0].addr;
        assert_eq!(build(&dup, 13), Err(MaglevError::DuplicateAddress { id: 2 }));
        let mut heavy = set;
        heavy[0].weight = MAX_WEIGHT + 1;
        assert!(matches!(build(&heavy, 13), Err(MaglevError::WeightTooLarge { .. })));
        assert!(matches!(build(&backends(MAX_BACKENDS_PER_VIP + 1), 65537), Err(MaglevError::TooManyBackends { .. })));
    }

    #[test]
    fn changed_slots_lists_only_differences() {
        let old = [1, 2, 3, 1];
        let new = [1, 3, 3, 2];
        assert_eq!(changed_slots(&old, &new).collect::<Vec<_>>(), [(1, 3), (3, 2)]);
        assert_eq!(changed_slots(&[1], &[1, 2]).count(), 2);
    }
}
