//! How the worker reuses KV between requests ([`super::prompt_cache`]): which
//! free slot a request takes, what of its prompt is already computed there
//! or can be restored from RAM or NVMe, and saving a slot's conversation
//! before another takes its place.
use std::sync::Arc;
use std::time::Instant;

use super::prompt_cache::disk::DiskTier;
use super::prompt_cache::ram::{Entry, RamTier};
use super::prompt_cache::{common_prefix, CacheKey, Costs, Counters, PromptCacheConfig, Tier};
use super::worker::{Slot, Worker};
use crate::llama::{StateBuffer, StateBuffers};

/// Shorter shared prefixes do not count when choosing a slot: every prompt
/// of a chat template shares a few tokens, not worth a conversation's slot.
const MIN_PREFIX_TOKENS: usize = 16;
/// A slot's conversation is saved before it is overwritten only when at
/// least this many of its tokens would be lost.
const MIN_SAVE_TOKENS: usize = 32;

/// What an idle slot still holds: the tokens whose KV is in it.
#[derive(Default)]
pub(super) struct Kept {
    pub(super) tokens: Vec<i32>,
    /// The worker's clock when it was last used (`0`: never).
    last_used: u64,
}

/// The tiers below the slots and the speeds that decide between them.
pub(super) struct Tiers {
    ram: RamTier,
    disk: Option<DiskTier>,
    costs: Costs,
    clock: u64,
    /// Memory saves write into: an arena as large as the RAM tier's limit,
    /// made before requests run, holding the tier's entries and what their
    /// saves will need.
    buffers: StateBuffers,
    /// The arena's block: the largest state of one sequence.
    block_bytes: usize,
}

impl Tiers {
    /// The RAM tier and, when configured, the NVMe tier of `model_path`
    /// decoded with `n_ctx_per_seq` tokens a sequence. A folder that cannot
    /// be opened leaves the engine without an NVMe tier (logged).
    pub(super) fn new(
        config: &PromptCacheConfig,
        model_path: &std::path::Path,
        n_ctx_per_seq: u32,
    ) -> Tiers {
        let disk = config
            .disk_dir
            .as_ref()
            .filter(|_| config.disk_bytes > 0)
            .and_then(|dir| {
                // The KV layout: llama.cpp's default F16 K and V, one stream per sequence.
                let context = format!("kv f16/f16 n_ctx_per_seq {n_ctx_per_seq}");
                let opened = CacheKey::of(model_path, &context)
                    .and_then(|key| DiskTier::open(dir, key, config.disk_bytes));
                opened
                    .map_err(|e| tracing::warn!("prompt cache: no NVMe tier ({})", e.kind()))
                    .ok()
            });
        let mut costs = Costs::new(config.disk_read_bytes_per_second);
        if let Some(speed) = disk.as_ref().and_then(DiskTier::remembered_prefill) {
            costs.remembered_prefill(speed);
        }
        if let Some(speed) = disk.as_ref().and_then(DiskTier::remembered_read) {
            costs.remembered_disk_read(speed);
        }
        let block_bytes = largest_state(model_path, n_ctx_per_seq);
        let buffers = StateBuffers::for_this_machine();
        if config.ram_bytes > 0 {
            let started = Instant::now();
            buffers.reserve(config.ram_bytes, block_bytes);
            tracing::info!(
                "prompt cache: {} MiB of state memory made in {:.2} s (blocks of {} MiB)",
                buffers.reserved_bytes() >> 20,
                started.elapsed().as_secs_f64(),
                block_bytes >> 20,
            );
        }
        Tiers {
            ram: RamTier::new(config.ram_bytes),
            disk,
            costs,
            clock: 0,
            buffers,
            block_bytes,
        }
    }

    fn saves(&self) -> bool {
        self.ram.limit_bytes() > 0 || self.disk.is_some()
    }

    /// Keeps a saved state in RAM and writes it through to NVMe (a state
    /// larger than the RAM tier goes to NVMe alone).
    fn keep(&mut self, tokens: Vec<i32>, state: Arc<StateBuffer>) {
        if let Some(disk) = &self.disk {
            if state.memory_bytes() as u64 > self.ram.limit_bytes() {
                disk.write(tokens, state);
                return;
            }
            // Written unless a newer turn supersedes it in RAM first.
            disk.write_through(tokens.clone(), &state);
        }
        self.hold(tokens, state);
    }

    /// Keeps a state in RAM; what that evicts goes to NVMe.
    fn hold(&mut self, tokens: Vec<i32>, state: Arc<StateBuffer>) {
        let evicted = self.ram.insert(tokens, state);
        self.spill(evicted, &[]);
    }

    /// Entries that left RAM: those `superseding` (a newer turn of the
    /// same conversation) are dropped; the others go to NVMe unless a file
    /// already holds them (they were written through when saved, unless
    /// the writer was behind), their memory back to the pool once written.
    fn spill(&self, gone: Vec<Entry>, superseding: &[i32]) {
        let Some(disk) = &self.disk else {
            return;
        };
        for entry in gone {
            if !superseding.starts_with(&entry.tokens) && !disk.holds(&entry.tokens) {
                disk.write(entry.tokens, entry.state);
            }
        }
    }

    /// [`Tiers::spill`] for entries that left RAM to make room for a save
    /// of `size` bytes, once the arena has a range for it. The entries'
    /// bytes made room in the tier's limit, but a range must be whole: while
    /// none fits, an entry that left and that nothing else holds gives its
    /// memory back now, unwritten unless written through already, instead
    /// of waiting in the NVMe writer's queue; then the least recently used
    /// entries leave too. The save would otherwise take memory outside the
    /// arena, beyond the tier's charge, on the request's path.
    fn spill_for_save(&mut self, mut gone: Vec<Entry>, superseding: &[i32], size: usize) {
        while self.buffers.reserved_bytes() > 0 && !self.buffers.has_fit(size) {
            if let Some(i) = gone.iter().position(|e| Arc::strong_count(&e.state) == 1) {
                drop(gone.swap_remove(i));
            } else if let Some(oldest) = self.ram.evict_oldest() {
                gone.push(oldest);
            } else {
                break;
            }
        }
        self.spill(gone, superseding);
    }

    /// A new RAM limit: entries beyond it leave, and the arena follows it
    /// (blocks made or let go now: a budget move is rare, and making a
    /// block stalls this model's requests for its time, ~0.1 s a gigabyte
    /// on the H200). An entry left in a block let go would hold that whole
    /// block beyond the limit until it goes: it goes now.
    fn set_ram_limit(&mut self, bytes: u64) {
        let evicted = self.ram.set_limit(bytes);
        self.spill(evicted, &[]);
        self.buffers.reserve(bytes, self.block_bytes);
        let buffers = &self.buffers;
        let orphans = self.ram.remove_where(|e| buffers.orphaned(&e.state));
        self.spill(orphans, &[]);
    }

    fn publish(&self, counters: &Counters) {
        use std::sync::atomic::Ordering::Relaxed;
        counters.ram_bytes.store(self.ram.bytes(), Relaxed);
        counters.ram_entries.store(self.ram.len() as u64, Relaxed);
        counters.ram_limit.store(self.ram.limit_bytes(), Relaxed);
        let (files, bytes) = self.disk.as_ref().map_or((0, 0), DiskTier::usage);
        counters.disk_entries.store(files as u64, Relaxed);
        counters.disk_bytes.store(bytes, Relaxed);
    }
}

/// The largest state of one sequence of `n_ctx_per_seq` tokens of the
/// model at `path`: its F16 K and V rows, and for each cell llama.cpp's
/// position and sequence records (a few bytes), with a MiB for headers. A
/// GGUF whose attention shape cannot be read gets a gigabyte.
fn largest_state(path: &std::path::Path, n_ctx_per_seq: u32) -> usize {
    let per_token = hypura_gguf::GgufFile::open(path)
        .ok()
        .and_then(|file| crate::tiered::placement::plan_inputs(&file).ok())
        .map(|(_, facts)| facts.kv_bytes_per_token);
    match per_token {
        Some(bytes) => ((bytes + 16) * u64::from(n_ctx_per_seq) + (1 << 20)) as usize,
        None => 1 << 30,
    }
}

/// The slot a request takes.
pub(super) struct Choice {
    pub(super) seq: usize,
    /// The free slot whose KV it starts from (copied, its own left whole).
    pub(super) fork_from: Option<usize>,
}

impl Choice {
    fn take(seq: usize) -> Choice {
        Choice {
            seq,
            fork_from: None,
        }
    }
}

/// Where a prompt's cached prefix comes from.
enum Source {
    Slot(usize),
    Ram(usize, usize),
    Disk(usize, usize),
}

impl Worker {
    /// The free slot for `prompt`: the one sharing the longest prefix with
    /// it, else the least recently used (an empty one first). When that
    /// slot's conversation goes on past the shared prefix and another free
    /// slot is empty or older, the prefix is copied there instead
    /// ([`Choice::fork_from`]), so a shared system prompt serves a new
    /// conversation without costing the one that holds it. `remaining`:
    /// the requests still to place this step, this one included (a fork
    /// leaves its source untouchable until the next decode).
    pub(super) fn choose_slot(
        &self,
        prompt: &[i32],
        use_cache: bool,
        free: &[usize],
        remaining: usize,
    ) -> Choice {
        let shared_with = |seq: usize| {
            let shared = common_prefix(&self.kept[seq].tokens, prompt);
            if use_cache && shared >= MIN_PREFIX_TOKENS {
                shared
            } else {
                0
            }
        };
        let score = |seq: usize| {
            (
                shared_with(seq),
                std::cmp::Reverse(self.kept[seq].last_used),
            )
        };
        let best = free
            .iter()
            .copied()
            .max_by_key(|&seq| score(seq))
            .unwrap_or(0);
        let shared = shared_with(best);
        let holder = &self.kept[best];
        let would_lose = holder.tokens.len().saturating_sub(shared);
        if shared == 0 || would_lose < MIN_SAVE_TOKENS || free.len() <= remaining {
            return Choice::take(best);
        }
        let victim = free
            .iter()
            .copied()
            .filter(|&seq| seq != best)
            .min_by_key(|&seq| (!self.kept[seq].tokens.is_empty(), self.kept[seq].last_used));
        // A copy costs a copy of one slot's KV and, on a GPU, llama.cpp's
        // new graph reservation after it (25–40 ms for an 8B on an H200):
        // worth it only when the holder would lose a tail worth saving (a
        // turn's reply re-tokenized a little differently is not). An older
        // conversation gives its slot up for it, a more recent one does not.
        let fork = victim.filter(|&seq| {
            let victim = &self.kept[seq];
            victim.tokens.is_empty() || victim.last_used < holder.last_used
        });
        match fork {
            Some(seq) => Choice {
                seq,
                fork_from: Some(best),
            },
            None => Choice::take(best),
        }
    }

    /// Makes slot `seq` hold the longest prefix of `prompt` it can get at a
    /// gain (its own KV, or a state restored from RAM or NVMe) and returns
    /// its length; at least the last prompt token is always left to decode.
    /// The slot's previous conversation is saved first when it would be lost.
    pub(super) fn prepare_slot(
        &mut self,
        choice: &Choice,
        prompt: &[i32],
        use_cache: bool,
    ) -> usize {
        let seq = choice.seq;
        let kept = std::mem::take(&mut self.kept[seq].tokens);
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters.prompt_cache;
        Counters::add(&counters.query_tokens, prompt.len() as u64);
        let limit = prompt.len().saturating_sub(1);
        if !use_cache {
            self.save(seq, &kept, 0);
            self.ctx.clear_seq(seq as i32, -1);
            return 0;
        }
        let from = choice.fork_from.map_or(&kept, |src| &self.kept[src].tokens);
        let in_slot = common_prefix(from, prompt).min(limit);
        let source = self.best_source(prompt, limit, in_slot);
        let (cached, tier) = match source {
            Source::Slot(n) => match choice.fork_from {
                Some(src) => {
                    self.save(seq, &kept, 0);
                    if n > 0 && self.ctx.copy_seq(src as i32, seq as i32) {
                        self.pending_copies.push((src, seq));
                        (self.keep_prefix(seq, n), Tier::Slot)
                    } else {
                        self.ctx.clear_seq(seq as i32, -1);
                        (0, Tier::Slot)
                    }
                }
                None => {
                    self.save(seq, &kept, n);
                    (self.keep_prefix(seq, n), Tier::Slot)
                }
            },
            Source::Ram(i, n) => {
                // Taken before the save: saving may drop or move entries.
                let state = Arc::clone(&self.tiers.ram.touch(i).state);
                self.save(seq, &kept, 0);
                (self.restore(seq, &state, n, Tier::Ram), Tier::Ram)
            }
            Source::Disk(i, n) => {
                self.save(seq, &kept, 0);
                let read = Instant::now();
                // The writer thread may have changed the index since the
                // lookup: the file read must still hold the prefix.
                let buffers = &self.tiers.buffers;
                let loaded = self.tiers.disk.as_ref().and_then(|d| d.read(i, buffers));
                let cached = match loaded.filter(|(t, _)| common_prefix(t, prompt) >= n) {
                    Some((tokens, state)) => {
                        let seconds = read.elapsed().as_secs_f64();
                        let costs = &mut self.tiers.costs;
                        costs.measured_restore(Tier::Disk, state.len() as u64, seconds);
                        if let Some(disk) = &self.tiers.disk {
                            disk.remember_read(costs.disk_read());
                        }
                        let cached = self.restore(seq, &state, n, Tier::Disk);
                        // Back in RAM: the next turn restores from there.
                        if cached > 0 && self.tiers.ram.limit_bytes() > 0 {
                            self.tiers.hold(tokens, Arc::new(state));
                        }
                        cached
                    }
                    None => {
                        self.ctx.clear_seq(seq as i32, -1);
                        0
                    }
                };
                (cached, Tier::Disk)
            }
        };
        if cached > 0 {
            Counters::add(&counters.hit_tokens, cached as u64);
            let counter = match tier {
                Tier::Slot => &counters.hits_slot,
                Tier::Ram => &counters.restores_ram,
                Tier::Disk => &counters.restores_disk,
            };
            Counters::add(counter, 1);
        }
        self.tiers.publish(counters);
        cached
    }

    /// The source with the longest usable prefix, where reading it beats
    /// recomputing what it adds over the slot's own.
    fn best_source(&self, prompt: &[i32], limit: usize, in_slot: usize) -> Source {
        let mut best = Source::Slot(in_slot);
        let mut best_n = in_slot;
        if let Some((i, n)) = self.tiers.ram.best(prompt) {
            let n = n.min(limit);
            let bytes = self.tiers.ram.state_bytes(i);
            if n > best_n && self.tiers.costs.restore_wins(Tier::Ram, bytes, n - in_slot) {
                best = Source::Ram(i, n);
                best_n = n;
            }
        }
        if let Some((i, n, bytes)) = self.tiers.disk.as_ref().and_then(|d| d.best(prompt)) {
            let n = n.min(limit);
            if n > best_n
                && self
                    .tiers
                    .costs
                    .restore_wins(Tier::Disk, bytes, n - in_slot)
            {
                best = Source::Disk(i, n);
            }
        }
        best
    }

    /// Keeps the first `n` tokens of slot `seq`'s KV; what it kept.
    fn keep_prefix(&mut self, seq: usize, n: usize) -> usize {
        if n == 0 {
            self.ctx.clear_seq(seq as i32, -1);
            return 0;
        }
        if self.ctx.trim_seq(seq as i32, n as i32) {
            n
        } else {
            0
        }
    }

    /// Loads `state` into slot `seq` and keeps its first `n` tokens.
    fn restore(&mut self, seq: usize, state: &[u8], n: usize, tier: Tier) -> usize {
        let started = Instant::now();
        if let Err(e) = self.ctx.set_seq_state(seq as i32, state) {
            tracing::warn!("prompt cache: a saved state did not load ({e}): recomputing");
            self.ctx.clear_seq(seq as i32, -1);
            return 0;
        }
        let cached = self.keep_prefix(seq, n);
        let seconds = started.elapsed().as_secs_f64();
        if tier == Tier::Ram {
            self.tiers
                .costs
                .measured_restore(tier, state.len() as u64, seconds);
        }
        let micros = &self.shared.counters.prompt_cache.restore_micros;
        Counters::add(micros, started.elapsed().as_micros() as u64);
        cached
    }

    /// Saves slot `seq`'s conversation (`kept`, its KV tokens) into the
    /// lower tiers when keeping only `keep` of its tokens would lose enough.
    fn save(&mut self, seq: usize, kept: &[i32], keep: usize) {
        if !self.tiers.saves() || kept.len().saturating_sub(keep) < MIN_SAVE_TOKENS {
            return;
        }
        if self.tiers.ram.holds(kept) {
            return;
        }
        let started = Instant::now();
        // Room first: what leaves RAM gives its memory to this save (a new
        // gigabyte of pinned memory costs more than the copy into it). The
        // room is the memory the state will be charged (its buffer's
        // capacity), so keeping it evicts nothing more.
        let bytes = self.ctx.seq_state_bytes(seq as i32);
        let room = StateBuffers::room_for(bytes) as u64;
        let gone = self.tiers.ram.make_room(kept, room);
        self.tiers.spill_for_save(gone, kept, bytes);
        let made = self.tiers.buffers.made();
        match self.ctx.seq_state(seq as i32, &self.tiers.buffers) {
            Ok(state) if !state.is_empty() => {
                tracing::debug!(
                    "prompt cache: saved {} tokens ({} MiB{}) in {:.1} ms; {} entries, {} MiB in RAM",
                    kept.len(),
                    state.len() >> 20,
                    if self.tiers.buffers.made() > made { ", new memory" } else { "" },
                    started.elapsed().as_secs_f64() * 1e3,
                    self.tiers.ram.len(),
                    self.tiers.ram.bytes() >> 20,
                );
                let counters = &self.shared.counters.prompt_cache;
                Counters::add(&counters.saves, 1);
                Counters::add(&counters.save_micros, started.elapsed().as_micros() as u64);
                self.tiers.keep(kept.to_vec(), Arc::new(state));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("prompt cache: could not save a sequence: {e}"),
        }
    }

    /// What slot `seq` holds once `slot` leaves it: its KV tokens when its
    /// request allowed caching, else nothing (and its KV is cleared).
    pub(super) fn keep_after(&mut self, seq: usize, slot: &Slot, kv_valid: bool) {
        self.tiers.clock += 1;
        if kv_valid && slot.cache_prompt {
            self.kept[seq] = Kept {
                tokens: slot.kv_tokens(),
                last_used: self.tiers.clock,
            };
        } else {
            self.ctx.clear_seq(seq as i32, -1);
            self.kept[seq] = Kept::default();
        }
    }

    /// A decode step read `tokens` prompt tokens in `seconds`.
    pub(super) fn measured_prefill(&mut self, tokens: usize, seconds: f64) {
        self.tiers.costs.measured_prefill(tokens, seconds);
        if let Some(disk) = &self.tiers.disk {
            disk.remember_prefill(self.tiers.costs.prefill());
        }
    }

    /// Applies a new RAM limit (the memory budget moved).
    pub(super) fn set_ram_limit(&mut self, bytes: u64) {
        self.tiers.set_ram_limit(bytes);
        self.tiers.publish(&self.shared.counters.prompt_cache);
    }

    /// At shutdown: what only the slots hold goes to NVMe, so a restarted
    /// server finds it.
    pub(super) fn flush(&mut self) {
        let Some(disk) = self.tiers.disk.as_ref() else {
            return;
        };
        for seq in 0..self.kept.len() {
            if self.kept[seq].tokens.len() < MIN_SAVE_TOKENS {
                continue;
            }
            if let Ok(state) = self.ctx.seq_state(seq as i32, &self.tiers.buffers) {
                disk.write_now(self.kept[seq].tokens.clone(), &state);
            }
        }
        // Entries a busy writer skipped (one already written is not written again).
        for entry in self.tiers.ram.entries() {
            disk.write_now(entry.tokens.clone(), &entry.state);
        }
        self.tiers.publish(&self.shared.counters.prompt_cache);
    }

    /// Whether slot `seq` holds a finished conversation's KV.
    pub(super) fn holds_kept(&self, seq: usize) -> bool {
        !self.kept[seq].tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::prompt_cache::disk::DiskTier;

    fn tiers(ram_bytes: u64, block_bytes: usize, dir: &std::path::Path) -> Tiers {
        let disk = DiskTier::open(dir, CacheKey([7; 32]), 1 << 30).unwrap();
        let buffers = StateBuffers::for_this_machine();
        buffers.reserve(ram_bytes, block_bytes);
        Tiers {
            ram: RamTier::new(ram_bytes),
            disk: Some(disk),
            costs: Costs::new(1 << 30),
            clock: 0,
            buffers,
            block_bytes,
        }
    }

    fn state(tiers: &Tiers, fill: u8, len: usize) -> Arc<StateBuffer> {
        let filled = tiers.buffers.filled(len, |b| {
            b.fill(fill);
            true
        });
        Arc::new(filled.unwrap())
    }

    /// What `Worker::save` does around the copy out of the context.
    fn save(tiers: &mut Tiers, tokens: &[i32], fill: u8, len: usize) {
        let room = StateBuffers::room_for(len) as u64;
        let gone = tiers.ram.make_room(tokens, room);
        tiers.spill_for_save(gone, tokens, len);
        let saved = state(tiers, fill, len);
        tiers.hold(tokens.to_vec(), saved);
    }

    /// Whether the tier holds conversation `i` whole (touching it), its
    /// state's bytes all `fill`.
    fn holds(tiers: &mut Tiers, i: i32, fill: u8) -> bool {
        match tiers.ram.best(&[i; 64]) {
            Some((e, 64)) => tiers.ram.touch(e).state.iter().all(|&b| b == fill),
            _ => false,
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("hypura-reuse-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// A save that evicts an entry the NVMe writer has not written reuses
    /// that entry's memory at once: without it the writer holds it while it
    /// writes, and the save takes memory outside the arena.
    #[test]
    fn a_save_reuses_the_memory_of_what_it_evicts_before_the_writer_gets_it() {
        let dir = temp_dir("evicts");
        let len = 4 << 20;
        let room = StateBuffers::room_for(len);
        let mut tiers = tiers(room as u64, room, &dir);
        save(&mut tiers, &[1; 64], 1, len);
        save(&mut tiers, &[2; 64], 2, len);
        assert_eq!(tiers.buffers.made(), 0, "no memory outside the arena");
        assert_eq!(tiers.ram.len(), 1);
        assert!(holds(&mut tiers, 2, 2));
        drop(tiers);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The bytes a save's room frees need not be one range: the save then
    /// evicts the least recently used entries until one is, and never takes
    /// memory beyond the arena, which stays the tier's limit.
    #[test]
    fn a_save_finding_no_whole_range_evicts_until_one_is_free() {
        let dir = temp_dir("ranges");
        let mib = 1 << 20;
        // One block of 12 MiB: 4 MiB at 0, 2 MiB at 4, 4 MiB at 6, 2 free at 10.
        let mut tiers = tiers(12 << 20, 12 << 20, &dir);
        for (i, len) in [(1, 4 * mib), (2, 2 * mib), (3, 4 * mib)] {
            save(&mut tiers, &[i; 64], i as u8, len);
        }
        assert_eq!(tiers.buffers.free_bytes(), 2 << 20);
        // The 2 MiB one is the least recently used, then the first.
        for i in [2, 1, 3] {
            assert!(holds(&mut tiers, i, i as u8));
        }
        // A save of 4 MiB: the limit makes it evict the 2 MiB entry, which
        // leaves 4 MiB free in two pieces; the first entry goes too.
        save(&mut tiers, &[4; 64], 4, 4 * mib);
        assert_eq!(tiers.buffers.made(), 0, "no memory outside the arena");
        assert_eq!(tiers.buffers.reserved_bytes(), 12 << 20);
        assert!(tiers.ram.best(&[1; 64]).is_none() && tiers.ram.best(&[2; 64]).is_none());
        assert!(holds(&mut tiers, 3, 3) && holds(&mut tiers, 4, 4));
        drop(tiers);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A smaller limit lets blocks of the arena go; an entry in one of them
    /// leaves the tier with it, so no block is held past the limit.
    #[test]
    fn a_smaller_limit_lets_blocks_go_with_their_entries() {
        let dir = temp_dir("shrink");
        let block = 16 << 20;
        let mut tiers = tiers(2 * block as u64, block, &dir);
        // Two states of 12 MiB: one a block.
        save(&mut tiers, &[1; 64], 1, 12 << 20);
        save(&mut tiers, &[2; 64], 2, 12 << 20);
        assert_eq!(tiers.buffers.free_bytes(), 8 << 20);
        tiers.set_ram_limit(block as u64);
        assert_eq!(tiers.buffers.reserved_bytes(), block as u64);
        // The least recently used left for the limit; the block let go
        // held it or the other, which left with it: one entry at most,
        // and only in the block that stays.
        assert!(tiers.ram.len() <= 1);
        for e in tiers.ram.entries() {
            assert!(!tiers.buffers.orphaned(&e.state));
        }
        assert_eq!(tiers.buffers.made(), 0);
        drop(tiers);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
