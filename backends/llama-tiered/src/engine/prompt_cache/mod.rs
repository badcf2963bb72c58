//! The prompt cache: the KV of earlier prompts kept so a conversation's
//! next turn decodes only its new tokens.
//!
//! Three tiers, fastest first:
//! - **slots**: a finished request's KV stays in its sequence slot until the
//!   slot is needed; a new request takes the free slot sharing the longest
//!   prefix with its prompt (the worker, [`super::worker`]);
//! - **RAM** ([`ram`]): before a slot goes to another conversation its state
//!   is saved here, under a byte limit the memory budget sets;
//! - **NVMe** ([`disk`]): every state saved to RAM is also written (by a
//!   thread of its own) to a file under the cache directory, keyed by the
//!   model file and the context settings ([`CacheKey`]), so it outlives RAM
//!   eviction, the runner and the server.
//!
//! A lower tier is used only when [`Costs`] says restoring beats
//! recomputing: bytes ÷ measured restore speed against new tokens ÷
//! measured prefill speed.
pub(crate) mod disk;
pub(crate) mod ram;

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Tokens two sequences share from their start.
pub fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Where and how much the prompt cache may keep, beyond the decoding slots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PromptCacheConfig {
    /// Slots beyond `n_parallel` that only keep idle conversations' KV in
    /// the context (on the GPU when the KV is there): the fastest tier, at
    /// the price of their KV cache. A request takes any free slot; at most
    /// `n_parallel` decode at once ([`super::BatchConfig::n_slots`]).
    pub idle_slots: u32,
    /// Host RAM for saved sequence states, in bytes (`0`: no RAM tier).
    pub ram_bytes: u64,
    /// Folder of the NVMe tier (`None`: no NVMe tier).
    pub disk_dir: Option<PathBuf>,
    /// Bytes all files under `disk_dir` may take, every model's together.
    pub disk_bytes: u64,
    /// Measured sequential read speed of the disk holding `disk_dir`, in
    /// bytes per second (`0`: not measured; 1 GB/s is assumed until a read
    /// measures it).
    pub disk_read_bytes_per_second: u64,
}

/// What a saved state must match to be loaded: the model file (its size,
/// modification time and first and last MiB), the context's KV layout and
/// this format. A state of another key is never loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// The key of `model_path` decoded with `context` (a description of the
    /// context settings that shape the KV: types, per-sequence length).
    pub fn of(model_path: &Path, context: &str) -> std::io::Result<CacheKey> {
        use sha2::{Digest, Sha256};
        let mut file = std::fs::File::open(model_path)?;
        let meta = file.metadata()?;
        let mut hasher = Sha256::new();
        hasher.update(b"hypura prompt cache 1\0");
        hasher.update(meta.len().to_le_bytes());
        let modified = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.update(modified.as_nanos().to_le_bytes());
        let mut chunk = vec![0u8; (1 << 20).min(meta.len() as usize)];
        file.read_exact(&mut chunk)?;
        hasher.update(&chunk);
        file.seek(SeekFrom::End(-(chunk.len() as i64)))?;
        file.read_exact(&mut chunk)?;
        hasher.update(&chunk);
        hasher.update(context.as_bytes());
        Ok(CacheKey(hasher.finalize().into()))
    }

    pub fn hex(&self) -> String {
        self.0[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Which tier a prompt's prefix came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    Slot,
    Ram,
    Disk,
}

/// Measured speeds, for deciding whether a restore beats recomputing.
#[derive(Debug, Clone)]
pub(crate) struct Costs {
    /// Prompt tokens per second, measured on decode steps that read prompts
    /// (`0` until measured: then a restore is assumed to win).
    prefill_tokens_per_second: f64,
    /// Whether a context's first prompt step was seen: it runs colder than
    /// any later one (kernels loaded, buffers grown, graphs made), so it
    /// is not a measurement.
    warmed_up: bool,
    ram_bytes_per_second: f64,
    disk_bytes_per_second: f64,
    /// Whether `disk_bytes_per_second` was timed on this tier's own reads
    /// (here or by an earlier run), not taken from the profile.
    disk_measured: bool,
}

/// Weight of a new measurement in the running averages.
const SMOOTHING: f64 = 0.3;

impl Costs {
    pub(crate) fn new(disk_read_bytes_per_second: u64) -> Costs {
        Costs {
            prefill_tokens_per_second: 0.0,
            warmed_up: false,
            // A memcpy into the KV buffers; corrected by the first restore.
            ram_bytes_per_second: 4e9,
            disk_bytes_per_second: if disk_read_bytes_per_second > 0 {
                disk_read_bytes_per_second as f64
            } else {
                1e9
            },
            disk_measured: false,
        }
    }

    /// Whether reading `bytes` from `tier` is faster than decoding `tokens`.
    pub(crate) fn restore_wins(&self, tier: Tier, bytes: u64, tokens: usize) -> bool {
        if tokens == 0 {
            return false;
        }
        if self.prefill_tokens_per_second <= 0.0 {
            return true;
        }
        let bytes = bytes as f64;
        let seconds = match tier {
            Tier::Slot => return true,
            Tier::Ram => bytes / self.ram_bytes_per_second,
            // Read into RAM, then loaded as a RAM restore is.
            Tier::Disk => bytes / self.disk_bytes_per_second + bytes / self.ram_bytes_per_second,
        };
        seconds < tokens as f64 / self.prefill_tokens_per_second
    }

    /// Starts from a prefill speed measured before (by an earlier run on
    /// this machine), taken as a sample: a faster measurement replaces it,
    /// a slower one (a short prompt, a busy step) is smoothed in.
    pub(crate) fn remembered_prefill(&mut self, tokens_per_second: f64) {
        self.prefill_tokens_per_second = tokens_per_second;
    }

    /// Starts from a read speed an earlier run timed on this tier's files.
    pub(crate) fn remembered_disk_read(&mut self, bytes_per_second: f64) {
        self.disk_bytes_per_second = bytes_per_second;
        self.disk_measured = true;
    }

    /// The speed state files are read at now, in bytes per second.
    pub(crate) fn disk_read(&self) -> f64 {
        self.disk_bytes_per_second
    }

    /// The prefill speed now, in tokens per second (`0`: not known).
    pub(crate) fn prefill(&self) -> f64 {
        self.prefill_tokens_per_second
    }

    pub(crate) fn measured_prefill(&mut self, tokens: usize, seconds: f64) {
        if tokens >= 16 && seconds > 0.0 && !std::mem::replace(&mut self.warmed_up, true) {
            return;
        }
        if tokens >= 16 && seconds > 0.0 {
            // A step's time also holds the other streams' decoding and any
            // stall: the machine's speed is what the fast steps show, so a
            // faster sample is taken at once and a slower one smoothed in.
            let sample = tokens as f64 / seconds;
            if sample > self.prefill_tokens_per_second {
                self.prefill_tokens_per_second = sample;
            } else {
                smooth(&mut self.prefill_tokens_per_second, sample);
            }
        }
    }

    pub(crate) fn measured_restore(&mut self, tier: Tier, bytes: u64, seconds: f64) {
        if bytes < (1 << 20) || seconds <= 0.0 {
            return;
        }
        let speed = bytes as f64 / seconds;
        match tier {
            Tier::Slot => {}
            Tier::Ram => smooth(&mut self.ram_bytes_per_second, speed),
            // The first read of the tier's own files replaces the
            // profile's figure (a raw device's, not this path's).
            Tier::Disk if !std::mem::replace(&mut self.disk_measured, true) => {
                self.disk_bytes_per_second = speed;
            }
            Tier::Disk => smooth(&mut self.disk_bytes_per_second, speed),
        }
    }
}

fn smooth(average: &mut f64, sample: f64) {
    *average = if *average > 0.0 {
        *average * (1.0 - SMOOTHING) + sample * SMOOTHING
    } else {
        sample
    };
}

/// The prompt cache's counters since the engine started (vLLM's
/// `prefix_cache_queries`/`prefix_cache_hits` meaning: tokens of prompts
/// looked up, and of those found).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) query_tokens: AtomicU64,
    pub(crate) hit_tokens: AtomicU64,
    pub(crate) hits_slot: AtomicU64,
    pub(crate) restores_ram: AtomicU64,
    pub(crate) restores_disk: AtomicU64,
    pub(crate) restore_micros: AtomicU64,
    pub(crate) saves: AtomicU64,
    pub(crate) save_micros: AtomicU64,
    /// Gauges, set by the worker.
    pub(crate) ram_bytes: AtomicU64,
    pub(crate) ram_entries: AtomicU64,
    pub(crate) disk_bytes: AtomicU64,
    pub(crate) disk_entries: AtomicU64,
    pub(crate) ram_limit: AtomicU64,
}

/// A snapshot of the prompt cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptCacheStatus {
    /// Prompt tokens looked up in the cache, and of those found in a tier.
    pub query_tokens_total: u64,
    pub hit_tokens_total: u64,
    /// Requests that started from their slot's own KV.
    pub slot_hits_total: u64,
    /// States restored from RAM and from NVMe, and the seconds they took.
    pub ram_restores_total: u64,
    pub disk_restores_total: u64,
    pub restore_micros_total: u64,
    /// States saved from a slot before it went to another conversation.
    pub saves_total: u64,
    /// Microseconds spent copying those states out of the slots.
    #[serde(default)]
    pub save_micros_total: u64,
    pub ram_bytes: u64,
    pub ram_limit_bytes: u64,
    pub ram_entries: u64,
    pub disk_bytes: u64,
    pub disk_entries: u64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> PromptCacheStatus {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PromptCacheStatus {
            query_tokens_total: get(&self.query_tokens),
            hit_tokens_total: get(&self.hit_tokens),
            slot_hits_total: get(&self.hits_slot),
            ram_restores_total: get(&self.restores_ram),
            disk_restores_total: get(&self.restores_disk),
            restore_micros_total: get(&self.restore_micros),
            saves_total: get(&self.saves),
            save_micros_total: get(&self.save_micros),
            ram_bytes: get(&self.ram_bytes),
            ram_limit_bytes: get(&self.ram_limit),
            ram_entries: get(&self.ram_entries),
            disk_bytes: get(&self.disk_bytes),
            disk_entries: get(&self.disk_entries),
        }
    }
}

/// A folder removed when dropped, for tests.
#[cfg(test)]
pub(crate) struct TestDir(PathBuf);

#[cfg(test)]
impl TestDir {
    pub(crate) fn new() -> TestDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("hypura-kv-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TestDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }

    #[test]
    fn the_cost_model_recomputes_when_the_disk_is_slower_than_prefill() {
        let mut costs = Costs::new(1_000_000_000);
        // Nothing measured yet: restore.
        assert!(costs.restore_wins(Tier::Disk, 1 << 30, 10));
        // A context's first prompt step runs cold (here at a tenth of the
        // speed): it is not taken as the speed.
        costs.measured_prefill(900, 1.0);
        let per_token = 128 << 10;
        assert!(costs.restore_wins(Tier::Disk, 7000 * per_token, 7000));
        // A GPU reading 9,000 prompt tokens/s; an 8B's KV is 128 KiB a token.
        // A step slowed by other streams before it does not hide that speed.
        costs.measured_prefill(3000, 1.0);
        costs.measured_prefill(9000, 1.0);
        assert!(!costs.restore_wins(Tier::Disk, 7000 * per_token, 7000));
        assert!(costs.restore_wins(Tier::Ram, 7000 * per_token, 7000));

        // A speed kept from an earlier run decides before any measurement;
        // a short warm-up prompt's slower speed does not replace it.
        let mut restarted = Costs::new(1_000_000_000);
        restarted.remembered_prefill(9000.0);
        assert!(!restarted.restore_wins(Tier::Disk, 7000 * per_token, 7000));
        restarted.measured_prefill(900, 1.0);
        restarted.measured_prefill(900, 1.0);
        assert!(!restarted.restore_wins(Tier::Disk, 7000 * per_token, 7000));
        assert!((restarted.prefill() - (0.7 * 9000.0 + 0.3 * 900.0)).abs() < 1e-6);

        // Two CPU cores at 150 tokens/s: the disk wins.
        let mut cpu = Costs::new(1_500_000_000);
        cpu.measured_prefill(300, 2.0);
        cpu.measured_prefill(300, 2.0);
        assert!(cpu.restore_wins(Tier::Disk, 2800 * (23 << 10), 2800));
        assert!(!cpu.restore_wins(Tier::Disk, 1 << 30, 0));
    }

    #[test]
    fn the_first_timed_disk_read_replaces_the_profiles_figure() {
        // The H200 of 2026-12-03: the profile said 1.82 GB/s for one
        // stream, a state file read at 0.94 GB/s, and prefill ran at
        // 8,700 tokens/s: 7,060 tokens (0.94 GB) recompute in 0.81 s.
        let (bytes, tokens) = (940_000_000, 7060);
        let mut costs = Costs::new(1_820_000_000);
        costs.remembered_prefill(8700.0);
        assert!(costs.restore_wins(Tier::Disk, bytes, tokens));
        costs.measured_restore(Tier::Disk, bytes, 1.0);
        assert_eq!(costs.disk_read(), 940_000_000.0);
        assert!(!costs.restore_wins(Tier::Disk, bytes, tokens));
        // Later reads are smoothed in.
        costs.measured_restore(Tier::Disk, bytes, 0.5);
        assert!((costs.disk_read() - (0.7 * 0.94e9 + 0.3 * 1.88e9)).abs() < 1.0);
        // A speed kept by an earlier run counts as timed: the next read
        // is smoothed in, not taken whole.
        let mut restarted = Costs::new(1_820_000_000);
        restarted.remembered_disk_read(0.94e9);
        restarted.remembered_prefill(8700.0);
        assert!(!restarted.restore_wins(Tier::Disk, bytes, tokens));
        restarted.measured_restore(Tier::Disk, bytes, 0.5);
        assert!((restarted.disk_read() - (0.7 * 0.94e9 + 0.3 * 1.88e9)).abs() < 1.0);
    }

    #[test]
    fn the_key_changes_with_the_file_and_the_context() {
        let dir = TestDir::new();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, vec![1u8; 3 << 20]).unwrap();
        let a = CacheKey::of(&path, "ctx 512").unwrap();
        assert_eq!(a, CacheKey::of(&path, "ctx 512").unwrap());
        assert_ne!(a, CacheKey::of(&path, "ctx 1024").unwrap());
        let mut bytes = vec![1u8; 3 << 20];
        bytes[10] = 2;
        std::fs::write(&path, bytes).unwrap();
        assert_ne!(a, CacheKey::of(&path, "ctx 512").unwrap());
    }
}
