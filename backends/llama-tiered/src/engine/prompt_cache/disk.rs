//! The NVMe tier: saved sequence states in files under the cache directory,
//! one folder per model identity ([`super::CacheKey`]), so that a
//! conversation survives its runner's crash, the model's unload and a
//! server restart. Files are written by a thread of their own (the decode
//! thread never waits for a write) into a temporary name and renamed when
//! whole; the byte cap counts every model's folder together, oldest files
//! (by modification time, touched on each read) removed first.
//!
//! The folder also keeps the model's last measured prefill speed
//! (`prefill-speed`, tokens per second as text): after a restart the cost
//! model compares a restore with recomputing from the first request on,
//! instead of assuming a restore wins until a prompt was measured.
//!
//! A file: `MAGIC`, the 32-byte key, the token count (u32), the state's
//! length (u64), a CRC-32 of tokens and state, the tokens (i32 each), the
//! state; little-endian. A file whose header, length or checksum is wrong,
//! or whose key is another's, is never loaded: it is removed.
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::SystemTime;

use super::{common_prefix, CacheKey};
use crate::llama::{StateBuffer, StateBuffers};

const MAGIC: &[u8; 8] = b"HYPKV\0\0\x01";
const HEADER_BYTES: usize = 8 + 32 + 4 + 8 + 4;
/// Most tokens a file may claim (a context of 16M tokens): a corrupt count
/// never makes a huge allocation.
const MAX_TOKENS: u32 = 1 << 24;
/// Where a folder keeps its model's prefill speed.
const PREFILL_SPEED: &str = "prefill-speed";
/// The file of the disk read speed this tier measured (bytes per second).
const READ_SPEED: &str = "read-speed";
/// Writes waiting for the writer thread; more are dropped (the entry stays
/// in RAM, or is lost as an uncached prompt would be).
const WRITE_QUEUE: usize = 2;

/// A state to write: its tokens and its bytes.
type Pending = (Vec<i32>, Held);

/// How the writer holds a state. A state the RAM tier keeps is held
/// weakly: when RAM lets it go before it is written (a newer turn of the
/// conversation superseded it), the write is skipped and its memory goes
/// back to the pool at once, for the save that superseded it, instead of
/// waiting for a write nobody needs (and a new gigabyte of pinned memory
/// being asked for meanwhile).
enum Held {
    Strong(Arc<StateBuffer>),
    Weak(std::sync::Weak<StateBuffer>),
}

/// One file of this model's folder.
struct DiskEntry {
    tokens: Vec<i32>,
    path: PathBuf,
    state_bytes: u64,
}

/// What the decode thread and the writer share.
struct Index {
    entries: Vec<DiskEntry>,
}

impl Index {
    /// Whether a file holds `tokens` (or a longer conversation that starts
    /// with them).
    fn holds(&self, tokens: &[i32]) -> bool {
        self.entries.iter().any(|e| e.tokens.starts_with(tokens))
    }
}

pub(crate) struct DiskTier {
    key: CacheKey,
    index: Arc<Mutex<Index>>,
    writer: Option<SyncSender<Pending>>,
    thread: Option<JoinHandle<()>>,
    folder: Arc<Folder>,
}

/// Where files go and how many bytes all of them may take.
struct Folder {
    root: PathBuf,
    dir: PathBuf,
    limit_bytes: u64,
    /// The prefill speed (tokens per second) and the read speed (bytes per
    /// second) to keep, written by the writer thread after a state and
    /// when the tier closes.
    prefill: Remembered,
    read: Remembered,
}

/// A speed kept in a file of the folder (`f64` bits; 0: none measured).
struct Remembered {
    file: &'static str,
    bits: AtomicU64,
}

impl Remembered {
    fn open(dir: &Path, file: &'static str) -> Remembered {
        let speed = read_speed(&dir.join(file)).unwrap_or(0.0);
        Remembered {
            file,
            bits: AtomicU64::new(speed.to_bits()),
        }
    }

    fn get(&self) -> Option<f64> {
        let speed = f64::from_bits(self.bits.load(Ordering::Relaxed));
        (speed > 0.0).then_some(speed)
    }

    fn set(&self, speed: f64) {
        if speed.is_finite() && speed > 0.0 {
            self.bits.store(speed.to_bits(), Ordering::Relaxed);
        }
    }

    /// Writes the speed into `dir` when it changed from `written` (its
    /// bits); the bits now on disk.
    fn keep(&self, dir: &Path, written: u64) -> u64 {
        let now = self.bits.load(Ordering::Relaxed);
        if now == written {
            return written;
        }
        let path = dir.join(self.file);
        let part = dir.join(format!("{}.part", self.file));
        let text = format!("{}\n", f64::from_bits(now));
        match fs::write(&part, text).and_then(|()| fs::rename(&part, &path)) {
            Ok(()) => now,
            Err(_) => {
                remove(&part);
                written
            }
        }
    }
}

impl DiskTier {
    /// Opens (creating) this key's folder under `root` and indexes the
    /// files in it; files that fail the checks are removed.
    pub(crate) fn open(root: &Path, key: CacheKey, limit_bytes: u64) -> std::io::Result<DiskTier> {
        let dir = root.join(key.hex());
        fs::create_dir_all(&dir)?;
        let mut entries = Vec::new();
        for item in fs::read_dir(&dir)? {
            let path = item?.path();
            if path.extension().is_some_and(|e| e == "kv") {
                match read_header(&path, &key) {
                    Some((tokens, state_bytes)) => entries.push(DiskEntry {
                        tokens,
                        path,
                        state_bytes,
                    }),
                    None => remove(&path),
                }
            } else if path.extension().is_some_and(|e| e == "part") {
                // A write cut short by a crash.
                remove(&path);
            }
        }
        let index = Arc::new(Mutex::new(Index { entries }));
        let folder = Arc::new(Folder {
            root: root.to_path_buf(),
            prefill: Remembered::open(&dir, PREFILL_SPEED),
            read: Remembered::open(&dir, READ_SPEED),
            dir,
            limit_bytes,
        });
        let (tx, rx) = sync_channel::<Pending>(WRITE_QUEUE);
        let thread = {
            let (index, folder) = (Arc::clone(&index), Arc::clone(&folder));
            let on_disk = [&folder.prefill, &folder.read].map(|r| r.bits.load(Ordering::Relaxed));
            std::thread::Builder::new()
                .name("hypura-kv-write".into())
                .spawn(move || {
                    let mut kept = on_disk;
                    for (tokens, held) in rx {
                        let state = match held {
                            Held::Strong(state) => Some(state),
                            Held::Weak(state) => state.upgrade(),
                        };
                        if let Some(state) = state {
                            folder.write(&index, &key, tokens, &state);
                        }
                        kept = folder.keep_speeds(kept);
                    }
                    folder.keep_speeds(kept);
                })?
        };
        Ok(DiskTier {
            key,
            index,
            writer: Some(tx),
            thread: Some(thread),
            folder,
        })
    }

    /// The prefill speed last measured for this model here, if any.
    pub(crate) fn remembered_prefill(&self) -> Option<f64> {
        self.folder.prefill.get()
    }

    /// Keeps `tokens_per_second` as this model's prefill speed (written
    /// with the next state, or when the tier closes).
    pub(crate) fn remember_prefill(&self, tokens_per_second: f64) {
        self.folder.prefill.set(tokens_per_second);
    }

    /// The speed this folder's state files were last read at, if any.
    pub(crate) fn remembered_read(&self) -> Option<f64> {
        self.folder.read.get()
    }

    /// Keeps `bytes_per_second` as the speed state files are read at.
    pub(crate) fn remember_read(&self, bytes_per_second: f64) {
        self.folder.read.set(bytes_per_second);
    }

    /// Whether a file holds `tokens` (or a longer conversation that
    /// starts with them).
    pub(crate) fn holds(&self, tokens: &[i32]) -> bool {
        self.index().holds(tokens)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Files and their state bytes.
    pub(crate) fn usage(&self) -> (usize, u64) {
        let index = self.index();
        let bytes = index.entries.iter().map(|e| e.state_bytes).sum();
        (index.entries.len(), bytes)
    }

    /// The file sharing the longest prefix with `prompt`: its number, that
    /// length and its state's bytes.
    pub(crate) fn best(&self, prompt: &[i32]) -> Option<(usize, usize, u64)> {
        let index = self.index();
        index
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt), e.state_bytes))
            .filter(|&(_, n, _)| n > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
    }

    /// Reads file `i` whole: its tokens and state, once its checks pass.
    /// A file that fails them (or is gone) is forgotten and removed.
    /// The state goes into memory from `buffers` (pinned where there is a GPU).
    pub(crate) fn read(&self, i: usize, buffers: &StateBuffers) -> Option<(Vec<i32>, StateBuffer)> {
        let path = self.index().entries.get(i)?.path.clone();
        let read = read_file(&path, &self.key, buffers);
        if read.is_none() {
            tracing::warn!("prompt cache: dropped a damaged or stale file");
            remove(&path);
            self.index().entries.retain(|e| e.path != path);
        } else if let Ok(file) = File::options().write(true).open(&path) {
            // Least recently used goes first: a read counts as a use.
            let _ = file.set_modified(SystemTime::now());
        }
        read
    }

    /// Queues a write; false when the writer is behind (nothing written).
    pub(crate) fn write(&self, tokens: Vec<i32>, state: Arc<StateBuffer>) -> bool {
        self.queue(tokens, state.len(), Held::Strong(state))
    }

    /// Queues a write of a state the RAM tier holds: skipped when RAM has
    /// let it go before its turn comes ([`Held`]).
    pub(crate) fn write_through(&self, tokens: Vec<i32>, state: &Arc<StateBuffer>) -> bool {
        self.queue(tokens, state.len(), Held::Weak(Arc::downgrade(state)))
    }

    fn queue(&self, tokens: Vec<i32>, len: usize, held: Held) -> bool {
        if len as u64 > self.folder.limit_bytes {
            return false;
        }
        let Some(writer) = &self.writer else {
            return false;
        };
        match writer.try_send((tokens, held)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Writes now, on this thread (at shutdown, for what only a slot holds).
    pub(crate) fn write_now(&self, tokens: Vec<i32>, state: &[u8]) {
        if state.len() as u64 <= self.folder.limit_bytes {
            self.folder.write(&self.index, &self.key, tokens, state);
        }
    }
}

impl Drop for DiskTier {
    /// Waits for the queued writes.
    fn drop(&mut self) {
        drop(self.writer.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Folder {
    /// Writes the speeds that changed from `written` (their bits); the
    /// bits now on disk.
    fn keep_speeds(&self, written: [u64; 2]) -> [u64; 2] {
        [
            self.prefill.keep(&self.dir, written[0]),
            self.read.keep(&self.dir, written[1]),
        ]
    }

    /// Writes one file (temporary name, then renamed), indexes it in place
    /// of the files it supersedes, and keeps every folder under the cap.
    /// Failures (a full disk) are logged and the entry dropped.
    fn write(&self, index: &Mutex<Index>, key: &CacheKey, tokens: Vec<i32>, state: &[u8]) {
        if index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .holds(&tokens)
        {
            return;
        }
        let name = token_hash(&tokens);
        let path = self.dir.join(format!("{name}.kv"));
        let part = self.dir.join(format!("{name}.part"));
        if let Err(e) =
            write_file(&part, key, &tokens, state).and_then(|()| fs::rename(&part, &path))
        {
            tracing::warn!(
                "prompt cache: could not write a file ({}): entry dropped",
                e.kind()
            );
            remove(&part);
            return;
        }
        {
            let mut index = index.lock().unwrap_or_else(PoisonError::into_inner);
            let superseded: Vec<PathBuf> = index
                .entries
                .iter()
                .filter(|e| tokens.starts_with(&e.tokens) && e.path != path)
                .map(|e| e.path.clone())
                .collect();
            for p in &superseded {
                remove(p);
            }
            index
                .entries
                .retain(|e| !superseded.contains(&e.path) && e.path != path);
            index.entries.push(DiskEntry {
                tokens,
                path,
                state_bytes: state.len() as u64,
            });
        }
        self.enforce_cap(index);
    }

    /// Removes the oldest files of every model's folder until all of them
    /// fit the cap.
    fn enforce_cap(&self, index: &Mutex<Index>) {
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let Ok(folders) = fs::read_dir(&self.root) else {
            return;
        };
        for folder in folders.flatten() {
            let Ok(items) = fs::read_dir(folder.path()) else {
                continue;
            };
            for item in items.flatten() {
                let path = item.path();
                if path.extension().is_none_or(|e| e != "kv") {
                    continue;
                }
                if let Ok(meta) = item.metadata() {
                    let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    files.push((at, meta.len(), path));
                }
            }
        }
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        let mut removed = Vec::new();
        for (_, len, path) in files {
            if total <= self.limit_bytes {
                break;
            }
            remove(&path);
            total -= len;
            removed.push(path);
        }
        if !removed.is_empty() {
            let mut index = index.lock().unwrap_or_else(PoisonError::into_inner);
            index.entries.retain(|e| !removed.contains(&e.path));
        }
    }
}

/// A kept speed; `None` when absent or not a positive number.
fn read_speed(path: &Path) -> Option<f64> {
    let text = fs::read_to_string(path).ok()?;
    let speed: f64 = text.trim().parse().ok()?;
    (speed.is_finite() && speed > 0.0).then_some(speed)
}

fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}

/// A file name for a token sequence (a hash: equal sequences share a file).
fn token_hash(tokens: &[i32]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for t in tokens {
        hasher.update(t.to_le_bytes());
    }
    hasher.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn checksum(tokens: &[i32], state: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    for t in tokens {
        crc.update(&t.to_le_bytes());
    }
    crc.update(state);
    crc.finalize()
}

fn write_file(path: &Path, key: &CacheKey, tokens: &[i32], state: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, File::create(path)?);
    out.write_all(MAGIC)?;
    out.write_all(&key.0)?;
    out.write_all(&(tokens.len() as u32).to_le_bytes())?;
    out.write_all(&(state.len() as u64).to_le_bytes())?;
    out.write_all(&checksum(tokens, state).to_le_bytes())?;
    for t in tokens {
        out.write_all(&t.to_le_bytes())?;
    }
    out.write_all(state)?;
    out.into_inner().map_err(|e| e.into_error())?.sync_data()
}

/// The header's fields once they pass the checks: tokens, state length,
/// checksum.
fn parse_header(file: &mut File, key: &CacheKey) -> Option<(Vec<i32>, u64, u32)> {
    let mut header = [0u8; HEADER_BYTES];
    file.read_exact(&mut header).ok()?;
    if &header[..8] != MAGIC || header[8..40] != key.0 {
        return None;
    }
    let n_tokens = u32::from_le_bytes(header[40..44].try_into().ok()?);
    let state_bytes = u64::from_le_bytes(header[44..52].try_into().ok()?);
    let crc = u32::from_le_bytes(header[52..56].try_into().ok()?);
    if n_tokens == 0 || n_tokens > MAX_TOKENS {
        return None;
    }
    let expected = HEADER_BYTES as u64 + 4 * u64::from(n_tokens) + state_bytes;
    if file.metadata().ok()?.len() != expected {
        return None;
    }
    let mut raw = vec![0u8; 4 * n_tokens as usize];
    file.read_exact(&mut raw).ok()?;
    let tokens = raw
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some((tokens, state_bytes, crc))
}

fn read_header(path: &Path, key: &CacheKey) -> Option<(Vec<i32>, u64)> {
    let mut file = File::open(path).ok()?;
    parse_header(&mut file, key).map(|(tokens, bytes, _)| (tokens, bytes))
}

fn read_file(
    path: &Path,
    key: &CacheKey,
    buffers: &StateBuffers,
) -> Option<(Vec<i32>, StateBuffer)> {
    let mut file = File::open(path).ok()?;
    let (tokens, state_bytes, crc) = parse_header(&mut file, key)?;
    let len = usize::try_from(state_bytes).ok()?;
    let state = buffers.filled(len, |bytes| file.read_exact(bytes).is_ok())?;
    (checksum(&tokens, &state) == crc).then_some((tokens, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CacheKey {
        CacheKey([n; 32])
    }

    fn wait_for(tier: &DiskTier, files: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tier.usage().0 != files {
            assert!(std::time::Instant::now() < deadline, "{:?}", tier.usage());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_damaged_or_foreign_files_are_never_loaded() {
        let root = super::super::TestDir::new();
        {
            let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
            assert!(tier.write(vec![1, 2, 3], Arc::new(StateBuffer::from(&[9u8; 100][..]))));
            wait_for(&tier, 1);
        }
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        let (i, n, bytes) = tier.best(&[1, 2, 3, 4]).unwrap();
        assert_eq!((n, bytes), (3, 100));
        let (tokens, state) = tier.read(i, &StateBuffers::default()).unwrap();
        assert_eq!((tokens, &state[..]), (vec![1, 2, 3], &[9u8; 100][..]));

        // Another model's key sees nothing of it.
        let other = DiskTier::open(root.path(), key(2), 1 << 20).unwrap();
        assert!(other.best(&[1, 2, 3]).is_none());

        // A flipped byte in the state: refused and removed.
        let path = root.path().join(key(1).hex());
        let file = fs::read_dir(&path).unwrap().next().unwrap().unwrap().path();
        let mut bytes = fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&file, &bytes).unwrap();
        assert!(tier.read(i, &StateBuffers::default()).is_none());
        assert!(!file.exists());
        assert_eq!(tier.usage(), (0, 0));

        // A truncated file is removed when the folder is opened.
        fs::write(path.join("x.kv"), &bytes[..HEADER_BYTES + 2]).unwrap();
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        assert_eq!(tier.usage(), (0, 0));
        assert!(!path.join("x.kv").exists());
    }

    #[test]
    fn the_cap_removes_the_oldest_files_and_a_later_turn_replaces_its_prefix() {
        let root = super::super::TestDir::new();
        let cap = 3 * (HEADER_BYTES as u64 + 8 + 1000);
        let tier = DiskTier::open(root.path(), key(1), cap).unwrap();
        for t in 0..4 {
            tier.write_now(vec![t], &[0; 1000]);
        }
        assert_eq!(tier.usage(), (3, 3000));
        assert!(tier.best(&[0]).is_none(), "the oldest file went first");
        tier.write_now(vec![1, 5], &[0; 1000]);
        assert_eq!(tier.usage(), (3, 3000));
        assert_eq!(tier.best(&[1]).map(|b| b.1), Some(1));
        assert_eq!(tier.best(&[1, 5]).map(|b| b.1), Some(2));
        // Larger than the cap: not written.
        assert!(!tier.write(
            vec![7],
            Arc::new(StateBuffer::from(&vec![0u8; cap as usize + 1][..]))
        ));
    }

    #[test]
    fn the_prefill_speed_survives_a_reopen_and_a_bad_one_is_ignored() {
        let root = super::super::TestDir::new();
        {
            let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
            assert_eq!(tier.remembered_prefill(), None);
            tier.remember_prefill(8_700.5);
            assert_eq!(tier.remembered_prefill(), Some(8_700.5));
            tier.remember_prefill(f64::NAN);
            assert_eq!(tier.remembered_prefill(), Some(8_700.5));
        }
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        assert_eq!(tier.remembered_prefill(), Some(8_700.5));
        // Another model's folder keeps its own.
        let other = DiskTier::open(root.path(), key(2), 1 << 20).unwrap();
        assert_eq!(other.remembered_prefill(), None);
        let path = root.path().join(key(1).hex()).join(PREFILL_SPEED);
        fs::write(&path, "-3").unwrap();
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        assert_eq!(tier.remembered_prefill(), None);
    }

    #[test]
    fn the_read_speed_survives_a_reopen_beside_the_prefill_speed() {
        let root = super::super::TestDir::new();
        {
            let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
            assert_eq!(tier.remembered_read(), None);
            tier.remember_prefill(8_700.0);
            tier.remember_read(9.4e8);
            tier.remember_read(-1.0);
        }
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        assert_eq!(tier.remembered_read(), Some(9.4e8));
        assert_eq!(tier.remembered_prefill(), Some(8_700.0));
    }

    #[test]
    fn a_write_through_is_skipped_once_ram_has_let_the_state_go() {
        let root = super::super::TestDir::new();
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        // Superseded in RAM before the writer came to it: nothing holds it.
        // (Let go before it is queued: the writer cannot have taken it.)
        let gone = Arc::new(StateBuffer::from(&[1u8; 100][..]));
        let weak = Arc::downgrade(&gone);
        drop(gone);
        assert!(tier.queue(vec![1, 2], 100, Held::Weak(weak)));
        // Still held: written. The writer takes them in order, so once the
        // second is on disk the first was decided.
        let kept = Arc::new(StateBuffer::from(&[2u8; 100][..]));
        assert!(tier.write_through(vec![3, 4], &kept));
        wait_for(&tier, 1);
        assert!(tier.holds(&[3, 4]) && tier.holds(&[3]));
        assert!(!tier.holds(&[1, 2]));
    }

    #[test]
    fn a_failed_write_drops_the_entry_and_nothing_else() {
        let root = super::super::TestDir::new();
        let tier = DiskTier::open(root.path(), key(1), 1 << 20).unwrap();
        // The folder gone and a file in its place: every write fails.
        fs::remove_dir_all(root.path().join(key(1).hex())).unwrap();
        fs::write(root.path().join(key(1).hex()), b"not a folder").unwrap();
        tier.write_now(vec![1], &[0; 10]);
        assert_eq!(tier.usage(), (0, 0));
        assert!(tier.best(&[1]).is_none());
    }
}
