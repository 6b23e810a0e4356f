//! Per pod: the prompt blocks recently sent there, least recently sent evicted first.
//!
//! Memory is the point of this layout: the seed's default of 16,384 blocks per pod, times pods,
//! times backends, lives in every worker (and later in shared data). A slot is the block's hash
//! and two `u32` links of the recency list (16 B); the index is an open-addressing table of `u32`
//! slot numbers sized 1.5× the bound (6 B per block), probed linearly from a multiply-shift home
//! and deleted by backward shift, so there are no tombstones and no per-entry allocation.
//! 22 B per remembered block in all; `heap_bytes` reports it and a test holds it to ≤ 24 B.

const NIL: u32 = u32::MAX;

/// Largest bound the seed allows for `maxBlocksPerEndpoint`.
pub const MAX_CAPACITY: usize = 262_144;

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: u64,
    /// Towards the most recently sent (or the next free slot, for a free slot).
    prev: u32,
    /// Towards the least recently sent.
    next: u32,
}

#[derive(Clone, Debug)]
pub struct BlockTable {
    slots: Vec<Slot>,
    index: Vec<u32>,
    /// Most recently sent.
    head: u32,
    /// Least recently sent: evicted first.
    tail: u32,
    /// Slots freed by [`BlockTable::remove`], chained through `next`.
    free: u32,
    len: usize,
    cap: usize,
    /// The bound in force, at most `cap`: lowered when the engine reports less cached than the
    /// table predicted (its cache is smaller than the configured bound), raised on good
    /// predictions. Memory stays reserved for `cap`.
    limit: usize,
}

impl BlockTable {
    /// A table remembering at most `capacity` blocks (clamped to 1..=[`MAX_CAPACITY`]).
    pub fn new(capacity: usize) -> Self {
        let cap = capacity.clamp(1, MAX_CAPACITY);
        BlockTable {
            slots: Vec::with_capacity(cap),
            index: vec![NIL; cap + cap / 2 + 1],
            head: NIL,
            tail: NIL,
            free: NIL,
            len: 0,
            cap,
            limit: cap,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sets the bound in force (clamped to 1..=capacity), evicting the least recently sent
    /// blocks beyond it.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.clamp(1, self.cap);
        while self.len > self.limit {
            let lru = self.tail;
            if lru == NIL {
                break;
            }
            let k = self.slots[lru as usize].key;
            self.remove(k);
        }
    }

    /// Forgets everything (a pod that failed may come back with an empty cache).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.index.iter_mut().for_each(|s| *s = NIL);
        self.head = NIL;
        self.tail = NIL;
        self.free = NIL;
        self.len = 0;
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes held, whatever the fill: slots are reserved for the bound up front.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.capacity() * std::mem::size_of::<u32>()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.find(key).is_some()
    }

    /// How many of `blocks` (a prompt's chain, first block first) are remembered from the start.
    pub fn matched_prefix(&self, blocks: &[u64]) -> usize {
        blocks.iter().take_while(|&&k| self.contains(k)).count()
    }

    /// Records a prompt sent to this pod. The last block is touched first and the first block
    /// last, so within a prompt the tail is evicted before the head, as engines evict (a prefix
    /// without its start is useless to them and to the match).
    pub fn record(&mut self, blocks: &[u64]) {
        for &k in blocks.iter().rev() {
            self.touch(k);
        }
    }

    /// Marks `key` most recently sent, inserting it (and evicting the least recently sent when
    /// full) if it was not remembered.
    pub fn touch(&mut self, key: u64) {
        if let Some((_, s)) = self.find(key) {
            self.unlink(s);
            self.push_front(s);
            return;
        }
        if self.len >= self.limit {
            let lru = self.tail;
            if lru == NIL {
                return;
            }
            let old = self.slots[lru as usize].key;
            self.remove(old);
        }
        let s = if self.free != NIL {
            let s = self.free;
            self.free = self.slots[s as usize].next;
            self.slots[s as usize].key = key;
            s
        } else {
            self.slots.push(Slot {
                key,
                prev: NIL,
                next: NIL,
            });
            (self.slots.len() - 1) as u32
        };
        self.push_front(s);
        self.index_insert(key, s);
        self.len += 1;
    }

    /// Forgets `key`; returns whether it was remembered.
    pub fn remove(&mut self, key: u64) -> bool {
        let Some((pos, s)) = self.find(key) else {
            return false;
        };
        self.unlink(s);
        self.index_delete(pos);
        self.slots[s as usize].next = self.free;
        self.free = s;
        self.len -= 1;
        true
    }

    /// Remembered blocks, most recently sent first.
    pub fn iter_recent(&self) -> impl Iterator<Item = u64> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            let s = self.slots.get(at as usize)?;
            at = s.next;
            Some(s.key)
        })
        .take(self.len)
    }

    fn home(&self, key: u64) -> usize {
        ((key as u128 * self.index.len() as u128) >> 64) as usize
    }

    fn find(&self, key: u64) -> Option<(usize, u32)> {
        let n = self.index.len();
        let mut i = self.home(key);
        // The index is never full (1.5× the bound), so an empty entry ends every probe; the
        // step bound is a second guard.
        for _ in 0..n {
            let s = self.index[i];
            if s == NIL {
                return None;
            }
            if self.slots[s as usize].key == key {
                return Some((i, s));
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        None
    }

    fn index_insert(&mut self, key: u64, s: u32) {
        let n = self.index.len();
        let mut i = self.home(key);
        for _ in 0..n {
            if self.index[i] == NIL {
                self.index[i] = s;
                return;
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Backward-shift deletion: later entries of the probe run move up so no probe ever stops
    /// early at the hole.
    fn index_delete(&mut self, mut hole: usize) {
        let n = self.index.len();
        let mut j = hole;
        for _ in 0..n {
            j = if j + 1 == n { 0 } else { j + 1 };
            let s = self.index[j];
            if s == NIL {
                break;
            }
            let home = self.home(self.slots[s as usize].key);
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.index[hole] = s;
                hole = j;
            }
        }
        self.index[hole] = NIL;
    }

    fn unlink(&mut self, s: u32) {
        let Slot { prev, next, .. } = self.slots[s as usize];
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, s: u32) {
        let old = self.head;
        self.slots[s as usize].prev = NIL;
        self.slots[s as usize].next = old;
        if old != NIL {
            self.slots[old as usize].prev = s;
        } else {
            self.tail = s;
        }
        self.head = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pick::blocks::mix;

    #[test]
    fn at_most_24_bytes_per_block_and_400_kib_at_the_default() {
        let mut t = BlockTable::new(16_384);
        for i in 0..40_000u64 {
            t.touch(mix(i));
        }
        assert_eq!(t.len(), 16_384);
        assert!(t.heap_bytes() <= 24 * 16_384, "{} B", t.heap_bytes());
        assert!(t.heap_bytes() <= 400 * 1024);
        for cap in [1024, 5000, 16_385, MAX_CAPACITY] {
            let t = BlockTable::new(cap);
            assert!(
                t.heap_bytes() <= 24 * cap + 8,
                "{cap}: {} B",
                t.heap_bytes()
            );
        }
    }

    #[test]
    fn least_recently_sent_goes_first() {
        let mut t = BlockTable::new(3);
        t.touch(1);
        t.touch(2);
        t.touch(3);
        t.touch(1); // 1 is now the most recent
        t.touch(4); // evicts 2
        assert!(!t.contains(2));
        assert!(t.contains(1) && t.contains(3) && t.contains(4));
        assert_eq!(t.iter_recent().collect::<Vec<_>>(), vec![4, 1, 3]);
        t.set_limit(2);
        assert_eq!(t.iter_recent().collect::<Vec<_>>(), vec![4, 1]);
        t.touch(5);
        assert_eq!(t.iter_recent().collect::<Vec<_>>(), vec![5, 4]);
        t.set_limit(100);
        assert_eq!(t.limit(), 3);
        t.clear();
        assert!(t.is_empty() && !t.contains(5));
        t.touch(6);
        assert_eq!(t.iter_recent().collect::<Vec<_>>(), vec![6]);
    }

    #[test]
    fn a_prompt_loses_its_tail_before_its_head() {
        let mut t = BlockTable::new(4);
        t.record(&[10, 11, 12]);
        t.record(&[20, 21]); // evicts 12: the oldest prompt's last block
        assert_eq!(t.matched_prefix(&[10, 11, 12]), 2);
        assert_eq!(t.matched_prefix(&[20, 21, 22]), 2);
        assert_eq!(t.matched_prefix(&[11]), 1);
        assert_eq!(t.matched_prefix(&[99, 20]), 0);
    }

    #[test]
    fn agrees_with_a_model_under_churn_and_removal() {
        // A naive LRU (a Vec, most recent first) as the reference.
        let mut t = BlockTable::new(97);
        let mut model: Vec<u64> = Vec::new();
        let mut x = 12345u64;
        for step in 0..50_000 {
            x = mix(x);
            // Few distinct keys, and low bits equal, so probes collide and runs wrap.
            let key = (x % 300) << 40 | 7;
            if step % 5 == 0 {
                let had = model.iter().position(|&k| k == key);
                assert_eq!(t.remove(key), had.is_some());
                if let Some(p) = had {
                    model.remove(p);
                }
            } else {
                t.touch(key);
                if let Some(p) = model.iter().position(|&k| k == key) {
                    model.remove(p);
                } else if model.len() == 97 {
                    model.pop();
                }
                model.insert(0, key);
            }
            if step % 997 == 0 {
                assert_eq!(t.iter_recent().collect::<Vec<_>>(), model, "step {step}");
            }
        }
        assert_eq!(t.len(), model.len());
        for k in 0..300u64 {
            let key = k << 40 | 7;
            assert_eq!(t.contains(key), model.contains(&key));
        }
    }
}
