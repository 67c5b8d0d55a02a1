//! Maps that hold entries for a while (a pod being deleted, an event waiting) grow to the
//! largest burst they saw, and a `HashMap` never gives its table back: after 4,000 pods were
//! deleted at once a virtual node kept about 5 KiB a pod of empty tables for good
//! (docs/benchmarks.md, "The live heap at rest, and what a deletion left behind").
//! [`shrink_after_removal`] gives it back.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// Tables at most this large are kept whatever their use: shrinking them saves nothing.
const KEEP: usize = 64;

/// Call after removing from `map`: once it uses a quarter of its table or less, the table is
/// halved to twice what it holds. Amortised O(1) a removal: a shrink rehashes `len` entries
/// after at least `3 * len` removals since the table was last this large.
pub fn shrink_after_removal<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    let capacity = map.capacity();
    if capacity > KEEP && map.len() * 4 <= capacity {
        map.shrink_to((map.len() * 2).max(KEEP));
    }
}

/// [`shrink_after_removal`] for a set.
pub fn shrink_set_after_removal<K: Eq + Hash, S: BuildHasher>(set: &mut HashSet<K, S>) {
    let capacity = set.capacity();
    if capacity > KEEP && set.len() * 4 <= capacity {
        set.shrink_to((set.len() * 2).max(KEEP));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_emptied_after_a_burst_is_given_back_and_a_busy_one_is_left_alone() {
        let mut map: HashMap<u32, [u8; 256]> = (0..10_000).map(|i| (i, [0; 256])).collect();
        let burst = map.capacity();
        // Half of it removed: still in use, kept (the capacity counted falls a little as
        // removals leave tombstones, the table is the same).
        for i in 0..5_000 {
            map.remove(&i);
            shrink_after_removal(&mut map);
        }
        assert!(map.capacity() >= 10_000, "{} of {burst}", map.capacity());
        for i in 5_000..10_000 {
            map.remove(&i);
            shrink_after_removal(&mut map);
        }
        assert!(map.is_empty());
        assert!(map.capacity() <= 2 * KEEP, "{} of {burst}", map.capacity());
        // A small table is not shrunk at each removal.
        map.extend((0..40).map(|i| (i, [0; 256])));
        let small = map.capacity();
        map.remove(&0);
        shrink_after_removal(&mut map);
        assert_eq!(map.capacity(), small);
    }

    #[test]
    fn a_set_emptied_after_a_burst_is_given_back() {
        let mut set: HashSet<u32> = (0..10_000).collect();
        for i in 0..10_000 {
            set.remove(&i);
            shrink_set_after_removal(&mut set);
        }
        assert!(set.capacity() <= 2 * KEEP, "{}", set.capacity());
    }

    #[test]
    fn shrinking_keeps_every_entry() {
        let mut map: HashMap<u32, u32> = (0..1_000).map(|i| (i, i * 3)).collect();
        for i in 0..900 {
            map.remove(&i);
            shrink_after_removal(&mut map);
        }
        assert!(map.capacity() < 1_000);
        assert_eq!(map.len(), 100);
        assert!((900..1_000).all(|i| map.get(&i) == Some(&(i * 3))));
    }
}
