//! The RAM tier: sequence KV states (`llama_state_seq_get_data`) of
//! conversations whose slot went to another one, under a byte limit,
//! evicted least recently used first.
//!
//! An entry is a whole sequence's state, as llama.cpp exports it: its
//! layout (cells, then per layer K and a transposed V) is llama.cpp's own,
//! so entries are not split into token blocks that could be shared. What a
//! radix tree would save is kept another way: an entry whose tokens are a
//! prefix of a newer entry's is dropped when the newer one comes in (a
//! conversation's later turn supersedes its earlier ones), and a lookup
//! takes the entry with the longest common prefix, so one saved system
//! prompt serves every conversation that begins with it.
use std::sync::Arc;

use super::common_prefix;
use crate::llama::StateBuffer;

/// A saved sequence: the tokens whose KV it holds, and that KV.
pub(crate) struct Entry {
    pub(crate) tokens: Vec<i32>,
    pub(crate) state: Arc<StateBuffer>,
    last_used: u64,
}

/// Entries under a byte limit (their states' memory).
#[derive(Default)]
pub(crate) struct RamTier {
    entries: Vec<Entry>,
    bytes: u64,
    limit_bytes: u64,
    clock: u64,
}

impl RamTier {
    pub(crate) fn new(limit_bytes: u64) -> RamTier {
        RamTier {
            limit_bytes,
            ..Default::default()
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// The entry sharing the longest prefix with `prompt`, and that length
    /// (ties: the smaller state, cheaper to restore).
    pub(crate) fn best(&self, prompt: &[i32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .filter(|&(_, n)| n > 0)
            .max_by(|a, b| {
                let size = |i: usize| std::cmp::Reverse(self.entries[i].state.len());
                a.1.cmp(&b.1).then(size(a.0).cmp(&size(b.0)))
            })
    }

    /// The bytes of entry `i`'s state.
    pub(crate) fn state_bytes(&self, i: usize) -> u64 {
        self.entries[i].state.len() as u64
    }

    /// Whether an entry already holds `tokens` (or a longer conversation
    /// that begins with them): saving them again would add nothing.
    pub(crate) fn holds(&self, tokens: &[i32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.tokens.len() >= tokens.len() && e.tokens.starts_with(tokens))
    }

    /// Makes room for a state of `bytes` saved for `tokens` before it is
    /// made, so the memory of what leaves can hold it: the entries it will
    /// supersede go first, then the least recently used. Returns what left.
    pub(crate) fn make_room(&mut self, tokens: &[i32], bytes: u64) -> Vec<Entry> {
        let mut gone = self.remove_superseded(tokens);
        if bytes <= self.limit_bytes {
            gone.extend(self.evict_to(self.limit_bytes - bytes));
        }
        gone
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    /// Entry `i`, marked used now.
    pub(crate) fn touch(&mut self, i: usize) -> &Entry {
        self.clock += 1;
        self.entries[i].last_used = self.clock;
        &self.entries[i]
    }

    /// Keeps `state` for `tokens`; entries it supersedes (whose tokens are
    /// a prefix of `tokens`) go. Returns what had to leave to make room,
    /// least recently used first, for a lower tier; `state` itself when it
    /// is larger than the whole tier.
    pub(crate) fn insert(&mut self, tokens: Vec<i32>, state: Arc<StateBuffer>) -> Vec<Entry> {
        self.clock += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.len() >= tokens.len() && e.tokens.starts_with(&tokens))
        {
            // Already held, within a longer conversation.
            e.last_used = self.clock;
            return Vec::new();
        }
        let entry = Entry {
            tokens,
            state,
            last_used: self.clock,
        };
        if memory_bytes(&entry) > self.limit_bytes {
            return vec![entry];
        }
        drop(self.remove_superseded(&entry.tokens));
        self.bytes += memory_bytes(&entry);
        self.entries.push(entry);
        self.evict_to(self.limit_bytes)
    }

    /// Removes the entries whose tokens are a prefix of `tokens` (earlier
    /// turns of that conversation) and returns them.
    fn remove_superseded(&mut self, tokens: &[i32]) -> Vec<Entry> {
        self.remove_where(|e| tokens.starts_with(&e.tokens))
    }

    /// Removes the entries `gone` picks and returns them.
    pub(crate) fn remove_where(&mut self, mut gone: impl FnMut(&Entry) -> bool) -> Vec<Entry> {
        let mut removed = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            if gone(&self.entries[i]) {
                let entry = self.entries.swap_remove(i);
                self.bytes -= memory_bytes(&entry);
                removed.push(entry);
            } else {
                i += 1;
            }
        }
        removed
    }

    /// Evicts the least recently used entry.
    pub(crate) fn evict_oldest(&mut self) -> Option<Entry> {
        let oldest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        let gone = self.entries.swap_remove(oldest);
        self.bytes -= memory_bytes(&gone);
        Some(gone)
    }

    /// Sets the byte limit; returns the entries evicted to meet it.
    pub(crate) fn set_limit(&mut self, limit_bytes: u64) -> Vec<Entry> {
        self.limit_bytes = limit_bytes;
        self.evict_to(limit_bytes)
    }

    fn evict_to(&mut self, limit_bytes: u64) -> Vec<Entry> {
        let mut evicted = Vec::new();
        while self.bytes > limit_bytes {
            let Some(gone) = self.evict_oldest() else {
                break;
            };
            evicted.push(gone);
        }
        evicted
    }
}

/// What an entry takes of the tier: its state's memory (room to grow included).
fn memory_bytes(entry: &Entry) -> u64 {
    entry.state.memory_bytes() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(n: usize) -> Arc<StateBuffer> {
        Arc::new(StateBuffer::from(&vec![7u8; n][..]))
    }

    #[test]
    fn lookup_takes_the_longest_common_prefix() {
        let mut tier = RamTier::new(1000);
        tier.insert(vec![1, 2, 3, 4], state(10));
        tier.insert(vec![1, 2, 9], state(10));
        tier.insert(vec![5, 6], state(10));
        assert_eq!(tier.best(&[1, 2, 3, 4, 5]).map(|b| b.1), Some(4));
        let (i, n) = tier.best(&[1, 2, 9, 9]).unwrap();
        assert_eq!((tier.touch(i).tokens.as_slice(), n), (&[1, 2, 9][..], 3));
        assert_eq!(tier.best(&[8]), None);
    }

    #[test]
    fn a_later_turn_supersedes_the_earlier_and_is_not_stored_twice() {
        let mut tier = RamTier::new(1000);
        tier.insert(vec![1, 2], state(10));
        tier.insert(vec![1, 2, 3, 4], state(20));
        assert_eq!((tier.len(), tier.bytes()), (1, 20));
        // A prefix of what is held adds nothing.
        assert!(tier.insert(vec![1, 2, 3], state(15)).is_empty());
        assert_eq!((tier.len(), tier.bytes()), (1, 20));
    }

    #[test]
    fn room_is_made_from_superseded_entries_first_then_the_oldest() {
        let mut tier = RamTier::new(30);
        tier.insert(vec![1], state(10));
        tier.insert(vec![2], state(10));
        tier.insert(vec![3, 4], state(10));
        assert!(tier.holds(&[3]) && tier.holds(&[3, 4]) && !tier.holds(&[3, 4, 5]));
        // [3, 4] is superseded by [3, 4, 5]: its room is enough.
        let gone = tier.make_room(&[3, 4, 5], 10);
        assert_eq!(
            gone.iter().map(|e| e.tokens.clone()).collect::<Vec<_>>(),
            vec![vec![3, 4]]
        );
        assert_eq!(tier.bytes(), 20);
        // Twenty bytes more: the least recently used leaves too.
        let gone = tier.make_room(&[9], 20);
        assert_eq!(
            gone.iter().map(|e| e.tokens[0]).collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!(tier.bytes(), 10);
    }

    #[test]
    fn eviction_is_least_recently_used_and_keeps_the_limit() {
        let mut tier = RamTier::new(30);
        tier.insert(vec![1], state(10));
        tier.insert(vec![2], state(10));
        tier.insert(vec![3], state(10));
        let (i, _) = tier.best(&[1]).unwrap();
        tier.touch(i);
        let evicted = tier.insert(vec![4], state(10));
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].tokens, vec![2]);
        assert_eq!(tier.bytes(), 30);
        let evicted = tier.set_limit(15);
        let gone: Vec<_> = evicted.iter().map(|e| e.tokens[0]).collect();
        assert_eq!(gone, vec![3, 1]);
        assert_eq!((tier.len(), tier.bytes()), (1, 10));
        // Larger than the whole tier: handed straight down.
        assert_eq!(tier.insert(vec![9], state(16)).len(), 1);
        assert_eq!(tier.len(), 1);
    }
}
