//! The space-saving summary of one step of one shard of [`Tracker`](super::Tracker): the
//! counters of the heaviest keys, in fixed memory.

use hashbrown::HashTable;

use crate::key::Key;

/// A counted key of a [`Summary`].
pub(super) struct CountedKey {
    pub(super) key: Key,
    pub(super) hash: u64,
    pub(super) count: u64,
    pub(super) error: u64,
}

/// The position of an entry being moved in the heap, in the index.
const MOVING: u32 = u32::MAX;

/// The space-saving summary of one step of one shard: at most `capacity` entries in a min-heap
/// by count, found by key through `index` (positions in the heap). Its memory is allocated
/// whole when it is made, and never grows.
pub(super) struct Summary {
    pub(super) step: u64,
    pub(super) total: u64,
    /// Whether a key took another's counter: until then every key counted is held, exactly.
    pub(super) evicted: bool,
    pub(super) capacity: usize,
    pub(super) heap: Vec<CountedKey>,
    pub(super) index: HashTable<u32>,
}

impl Summary {
    pub(super) fn new(capacity: usize) -> Self {
        Summary {
            step: 0,
            total: 0,
            evicted: false,
            capacity,
            heap: Vec::with_capacity(capacity),
            // Twice what it holds: a table at most half full rehashes its tombstones in
            // place, where a fuller one would grow.
            index: HashTable::with_capacity(2 * capacity),
        }
    }

    pub(super) fn clear(&mut self, step: u64) {
        self.step = step;
        self.total = 0;
        self.evicted = false;
        self.heap.clear();
        self.index.clear();
    }

    /// The most a key without an entry may have been counted here: 0 until a key took
    /// another's counter, then the smallest count held.
    pub(super) fn floor(&self) -> u64 {
        if self.evicted {
            self.heap.first().map_or(0, |e| e.count)
        } else {
            0
        }
    }

    pub(super) fn find(&self, key: &Key, hash: u64) -> Option<&CountedKey> {
        let heap = &self.heap;
        let i = *self.index.find(hash, |&i| heap[i as usize].key == *key)?;
        Some(&heap[i as usize])
    }

    /// Counts `weight` denials of `key`.
    pub(super) fn add(&mut self, key: &Key, hash: u64, weight: u64) {
        self.total += weight;
        let heap = &self.heap;
        if let Some(&i) = self.index.find(hash, |&i| heap[i as usize].key == *key) {
            self.heap[i as usize].count += weight;
            self.sift_down(i as usize);
            return;
        }
        let entry = |count, error| CountedKey {
            key: key.clone(),
            hash,
            count,
            error,
        };
        if self.heap.len() < self.capacity {
            let i = self.heap.len();
            self.heap.push(entry(weight, 0));
            let heap = &self.heap;
            self.index
                .insert_unique(hash, i as u32, |&j| heap[j as usize].hash);
            self.sift_up(i);
            return;
        }
        // Full: the key takes the counter of the smallest count, and starts from it.
        self.evicted = true;
        let smallest = self.heap[0].hash;
        if let Ok(found) = self.index.find_entry(smallest, |&j| j == 0) {
            found.remove();
        }
        let floor = self.heap[0].count;
        self.heap[0] = entry(floor + weight, floor);
        let heap = &self.heap;
        self.index
            .insert_unique(hash, 0, |&j| heap[j as usize].hash);
        self.sift_down(0);
    }

    /// Points the index entry of the entry at `from` to `to`.
    fn moved(&mut self, hash: u64, from: u32, to: u32) {
        if let Some(i) = self.index.find_mut(hash, |&j| j == from) {
            *i = to;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let hash = self.heap[i].hash;
        self.moved(hash, i as u32, MOVING);
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            for child in [left, right] {
                if child < self.heap.len() && self.heap[child].count < self.heap[smallest].count {
                    smallest = child;
                }
            }
            if smallest == i {
                break;
            }
            self.heap.swap(i, smallest);
            let other = self.heap[i].hash;
            self.moved(other, smallest as u32, i as u32);
            i = smallest;
        }
        self.moved(hash, MOVING, i as u32);
    }

    fn sift_up(&mut self, mut i: usize) {
        let hash = self.heap[i].hash;
        self.moved(hash, i as u32, MOVING);
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].count <= self.heap[i].count {
                break;
            }
            self.heap.swap(i, parent);
            let other = self.heap[i].hash;
            self.moved(other, parent as u32, i as u32);
            i = parent;
        }
        self.moved(hash, MOVING, i as u32);
    }

    /// The bytes this summary holds, whatever it counts.
    #[cfg(test)]
    pub(super) fn footprint(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<CountedKey>()
            + self.index.allocation_size()
            + std::mem::size_of::<Self>()
    }
}
