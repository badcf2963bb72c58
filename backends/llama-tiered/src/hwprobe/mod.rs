//! `hypura profile`: measures this machine once — CPU, RAM, GPUs, the disk
//! holding the models — and caches the [`HardwareProfile`] the planner reads.
//!
//! - this module: the profile, its cache, RAM and disk measurements;
//! - [`device`]: CPU and GPU measurements (a Q4_K matvec, host → device copies);
//! - [`host`]: this process's resident memory, and the fixed host overhead.
//!
//! Everything here is safe Rust, over the FFI wrappers of [`crate::llama::device`].
pub mod device;
pub mod host;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use hypura_gguf::paths;
use hypura_scheduler::profile::{
    CpuProfile, DiskProfile, DiskReadPoint, GpuProfile, HardwareProfile, RamProfile,
    PROFILE_VERSION,
};
use hypura_scheduler::size::format_bytes;
use serde::{Deserialize, Serialize};

use self::device::MatvecSpec;
use crate::llama::device::{self as devices, Device, DeviceProbeError};
use crate::rng::Rng;

/// Name of the cached profile inside the cache directory.
pub const CACHE_FILE_NAME: &str = "profile.json";

/// Block sizes of the disk read points, bytes.
pub const DISK_BLOCK_BYTES: [u64; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
/// Queue depths (reads in flight) of the disk read points.
pub const DISK_QUEUE_DEPTHS: [u32; 4] = [1, 4, 16, 32];

/// A model file at least this big is read as it is; otherwise a scratch file
/// is written (bytes). Smaller files would sit in the disk's own caches.
const MIN_SOURCE_FILE_BYTES: u64 = 256 << 20;
/// O_DIRECT needs buffers, offsets and lengths aligned to the logical block.
const DIRECT_ALIGN: usize = 4096;

/// How thoroughly to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    /// Everything at full size: buffers beyond the caches, seconds of I/O.
    #[default]
    Full,
    /// Same measurements at small sizes, for tests: numbers are rough.
    Quick,
}

/// Sizes and repetitions of each measurement.
#[derive(Debug, Clone, Copy)]
struct Amounts {
    matvec_weight_bytes: u64,
    matvec_runs: u32,
    copy_bytes: u64,
    copy_runs: u32,
    ram_bytes: u64,
    ram_passes: u32,
    scratch_bytes: u64,
    disk_point_bytes: u64,
    disk_point_time: Duration,
}

impl Effort {
    fn amounts(self) -> Amounts {
        match self {
            Effort::Full => Amounts {
                matvec_weight_bytes: 256 << 20,
                matvec_runs: 7,
                copy_bytes: 256 << 20,
                copy_runs: 5,
                ram_bytes: 1 << 30,
                ram_passes: 4,
                scratch_bytes: 1 << 30,
                disk_point_bytes: 256 << 20,
                disk_point_time: Duration::from_millis(500),
            },
            Effort::Quick => Amounts {
                matvec_weight_bytes: 16 << 20,
                matvec_runs: 3,
                copy_bytes: 16 << 20,
                copy_runs: 2,
                ram_bytes: 64 << 20,
                ram_passes: 2,
                scratch_bytes: 64 << 20,
                disk_point_bytes: 8 << 20,
                disk_point_time: Duration::from_millis(40),
            },
        }
    }
}

/// Why profiling failed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "neither HYPURA_CACHE_DIR nor HOME is set: set HYPURA_CACHE_DIR to a writable directory"
    )]
    NoCacheDir,
    #[error("{path} is not a directory: pass --path with a directory on the volume that holds your models")]
    NotADirectory { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("measuring the disk under {path}: {source} (pass --path with a directory on a writable local volume with 1 GiB free)")]
    Disk {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Device(#[from] DeviceProbeError),
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ProfileError + 'a {
    move |source| ProfileError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The cache directory: `$HYPURA_CACHE_DIR`, else `~/.cache/hypura`.
pub fn default_cache_dir() -> Result<PathBuf, ProfileError> {
    paths::cache_dir().ok_or(ProfileError::NoCacheDir)
}

/// The directory whose volume is measured when none is given:
/// `$HYPURA_MODELS_DIR`, else `./models` if it exists, else `cache_dir`.
pub fn default_disk_path(cache_dir: &Path) -> PathBuf {
    if let Some(dir) = paths::models_dir_override() {
        return dir;
    }
    let models = PathBuf::from("models");
    if models.is_dir() {
        models
    } else {
        cache_dir.to_path_buf()
    }
}

/// A profile as stored in the cache file: the profile's own fields plus how
/// it was measured (absent in older files: full).
#[derive(Debug, Serialize, Deserialize)]
struct CachedProfile {
    #[serde(flatten)]
    profile: HardwareProfile,
    #[serde(default)]
    effort: Effort,
}

/// Why a cached profile cannot answer a request for `disk_path` at `effort`
/// (`None`: it can). A full profile answers a quick request, not the reverse.
pub fn stale_reason(
    cached: &HardwareProfile,
    cached_effort: Effort,
    disk_path: &Path,
    effort: Effort,
) -> Option<String> {
    if cached.version != PROFILE_VERSION {
        return Some(format!(
            "it has version {}, this hypura writes {PROFILE_VERSION}",
            cached.version
        ));
    }
    if cached.cpu.q4k_prompt_gflops <= 0.0 {
        return Some("it predates the CPU's prompt rate".into());
    }
    if Path::new(&cached.disk.path) != disk_path {
        return Some(format!(
            "it measured the disk at {}, not {}",
            cached.disk.path,
            disk_path.display()
        ));
    }
    if cached_effort == Effort::Quick && effort == Effort::Full {
        return Some("it was a quick measurement".into());
    }
    None
}

/// The cache file under `cache_dir`.
pub fn cache_file(cache_dir: &Path) -> PathBuf {
    cache_dir.join(CACHE_FILE_NAME)
}

/// The cached profile under `cache_dir`, when there is one that answers a
/// request for the disk at `disk_path` measured with `effort`.
pub fn cached(
    cache_dir: &Path,
    disk_path: &Path,
    effort: Effort,
) -> Result<Option<HardwareProfile>, ProfileError> {
    let disk_path = resolve_dir(disk_path)?;
    let Some(cached) = read_cache(&cache_file(cache_dir)) else {
        return Ok(None);
    };
    match stale_reason(&cached.profile, cached.effort, &disk_path, effort) {
        None => Ok(Some(cached.profile)),
        Some(why) => {
            tracing::info!("re-measuring: the cached profile is stale ({why})");
            Ok(None)
        }
    }
}

/// Measures this machine now (the disk at `disk_path`) and caches the profile
/// under `cache_dir`.
pub fn measure_and_cache(
    cache_dir: &Path,
    disk_path: &Path,
    effort: Effort,
) -> Result<HardwareProfile, ProfileError> {
    let profile = measure(disk_path, effort)?;
    write_cache(&cache_file(cache_dir), &profile, effort)?;
    Ok(profile)
}

/// `dir` made absolute and canonical; it must be an existing directory.
fn resolve_dir(dir: &Path) -> Result<PathBuf, ProfileError> {
    let resolved = dir
        .canonicalize()
        .map_err(io_error("cannot open the directory", dir))?;
    if resolved.is_dir() {
        Ok(resolved)
    } else {
        Err(ProfileError::NotADirectory { path: resolved })
    }
}

/// The cached profile, or `None` when the file is absent or unreadable (a
/// damaged cache is re-measured, with a warning).
fn read_cache(file: &Path) -> Option<CachedProfile> {
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(
                "cannot read the cached profile {}: {e}; re-measuring",
                file.display()
            );
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(cached) => Some(cached),
        Err(e) => {
            tracing::warn!(
                "the cached profile {} is damaged ({e}); re-measuring",
                file.display()
            );
            None
        }
    }
}

/// Writes the cache file atomically (a temporary file renamed over it).
fn write_cache(file: &Path, profile: &HardwareProfile, effort: Effort) -> Result<(), ProfileError> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_error("cannot create the cache directory", dir))?;
    let cached = CachedProfile {
        profile: profile.clone(),
        effort,
    };
    let json = serde_json::to_vec_pretty(&cached).map_err(|e| ProfileError::Io {
        what: "cannot serialize the profile for",
        path: file.to_path_buf(),
        source: io::Error::other(e),
    })?;
    let tmp = file.with_extension(format!("json.tmp{}", std::process::id()));
    std::fs::write(&tmp, json).map_err(io_error("cannot write the cached profile", &tmp))?;
    std::fs::rename(&tmp, file).map_err(io_error("cannot write the cached profile", file))
}

/// Queue depth for reads of `block_bytes` (the streamer's chunk size): the
/// smallest measured depth within 10% of the best rate at the largest
/// measured block no bigger than `block_bytes` (`None` when nothing fits).
/// More reads in flight than that only add threads.
pub fn suggested_read_queue_depth(disk: &DiskProfile, block_bytes: u64) -> Option<u32> {
    let block = disk
        .reads
        .iter()
        .map(|r| r.block_bytes)
        .filter(|&b| b <= block_bytes)
        .max()?;
    let points: Vec<&DiskReadPoint> = disk
        .reads
        .iter()
        .filter(|r| r.block_bytes == block)
        .collect();
    let best = points.iter().map(|r| r.gbps).fold(0.0, f64::max);
    points
        .iter()
        .filter(|r| best > 0.0 && r.gbps >= 0.9 * best)
        .map(|r| r.queue_depth)
        .min()
}

/// The streamer's default read queue depth: suggested by the cached profile
/// (`hypura profile`) when there is one, else
/// [`crate::tiered::streamer::DEFAULT_READ_QUEUE_DEPTH`].
pub fn default_read_queue_depth() -> u32 {
    use crate::tiered::streamer::{DEFAULT_READ_QUEUE_DEPTH, READ_CHUNK_BYTES};
    default_cache_dir()
        .ok()
        .and_then(|dir| read_cache(&cache_file(&dir)))
        .and_then(|c| suggested_read_queue_depth(&c.profile.disk, READ_CHUNK_BYTES))
        .unwrap_or(DEFAULT_READ_QUEUE_DEPTH)
}

/// This machine's name, CPU model and sizes (threads, RAM from `/proc/meminfo`, the GPUs ggml
/// sees) at conservative assumed speeds, in a few milliseconds: what the
/// planner uses until a measured profile exists
/// ([`HardwareProfile::estimated`]).
pub fn estimated() -> HardwareProfile {
    let threads = logical_cpus();
    let (ram_total, ram_available) = read_meminfo();
    let gpus = crate::llama::gpu_devices()
        .into_iter()
        .map(|d| GpuProfile::estimated(d.name, d.description, d.total_bytes, d.free_bytes))
        .collect();
    let mut profile =
        HardwareProfile::estimated(read_hostname(), threads, ram_total, ram_available, gpus);
    profile.cpu.model = read_cpu_model();
    profile
}

/// Whether `profile` was measured on this machine: the same host name, CPU
/// model, logical CPUs and RAM. What the streamer measured here (its read
/// rates) then applies to a plan made with it; a profile of another machine
/// (`--profile`, planning for the GPU machine on a laptop) gets none of it.
pub fn describes_this_machine(profile: &HardwareProfile) -> bool {
    profile.host == read_hostname()
        && profile.cpu.model == read_cpu_model()
        && profile.cpu.threads == logical_cpus()
        && profile.ram.total_bytes == read_meminfo().0
}

/// Logical CPUs this process may run on.
fn logical_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as u32
}

/// `(MemTotal, MemAvailable)` of this machine, bytes (zeros where
/// `/proc/meminfo` says nothing).
fn read_meminfo() -> (u64, u64) {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo(&text))
        .unwrap_or((0, 0))
}

/// Measures this machine now; `disk_path` must be an existing directory.
pub fn measure(disk_path: &Path, effort: Effort) -> Result<HardwareProfile, ProfileError> {
    let amounts = effort.amounts();
    let disk_path = resolve_dir(disk_path)?;
    // First, before anything else grows this process.
    let host_overhead = host::measure_overhead()?;
    let threads = logical_cpus();
    let matvec = MatvecSpec {
        min_weight_bytes: amounts.matvec_weight_bytes,
        runs: amounts.matvec_runs,
        threads,
    };
    let cpu_device = devices::cpu_device()?;
    let cpu = CpuProfile {
        model: read_cpu_model(),
        threads,
        q4k_matvec_gbps: device::q4k_matvec_gbps(&cpu_device, &matvec)?,
        q4k_prompt_gflops: device::q4k_prompt_gflops(&cpu_device, &matvec)?,
    };
    let gpus = devices::devices()
        .iter()
        .filter(|d| d.is_gpu())
        .map(|d| measure_gpu(d, &matvec, &amounts))
        .collect::<Result<Vec<_>, _>>()?;
    let ram = measure_ram(&amounts, threads as usize)?;
    let disk = measure_disk(&disk_path, &amounts)?;
    Ok(HardwareProfile {
        version: PROFILE_VERSION,
        measured_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        host: read_hostname(),
        cpu,
        ram,
        gpus,
        disk,
        host_overhead: Some(host_overhead),
    })
}

fn measure_gpu(
    dev: &Device,
    matvec: &MatvecSpec,
    amounts: &Amounts,
) -> Result<GpuProfile, ProfileError> {
    let q4k_matvec_gbps = device::q4k_matvec_gbps(dev, matvec)?;
    let copies = device::host_to_device_gbps(dev, amounts.copy_bytes, amounts.copy_runs)?;
    let pinned = copies.pinned_gbps.unwrap_or_else(|| {
        tracing::warn!(
            "{} has no pinned host buffer type: reporting pageable copies as pinned",
            dev.name
        );
        copies.pageable_gbps
    });
    Ok(GpuProfile {
        name: dev.name.clone(),
        description: dev.description.clone(),
        total_bytes: dev.total_bytes,
        free_bytes: dev.free_bytes,
        q4k_matvec_gbps,
        host_to_device_pinned_gbps: pinned,
        host_to_device_pageable_gbps: copies.pageable_gbps,
    })
}

/// The CPU's model from `/proc/cpuinfo` (`"unknown"` when it says none).
fn read_cpu_model() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    parse_cpu_model(&text).unwrap_or_else(|| "unknown".into())
}

/// The first `model name` (x86), else `Model` or `Hardware` (Arm boards).
fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Model", "Hardware"].iter().find_map(|key| {
        cpuinfo.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_string())
        })
    })
}

fn read_hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// `(MemTotal, MemAvailable)` in bytes from the text of `/proc/meminfo`.
pub fn parse_meminfo(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

fn measure_ram(amounts: &Amounts, threads: usize) -> Result<RamProfile, ProfileError> {
    let path = Path::new("/proc/meminfo");
    let text = std::fs::read_to_string(path).map_err(io_error("cannot read", path))?;
    let (total_bytes, available_bytes) = parse_meminfo(&text).ok_or_else(|| ProfileError::Io {
        what: "no MemTotal/MemAvailable in",
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidData),
    })?;
    Ok(RamProfile {
        total_bytes,
        available_bytes,
        read_gbps: ram_read_gbps(amounts.ram_bytes, amounts.ram_passes, threads),
    })
}

/// Sequential read bandwidth of a `bytes` buffer by `threads` threads, each
/// summing its share; the best of `passes`, GB/s.
fn ram_read_gbps(bytes: u64, passes: u32, threads: usize) -> f64 {
    let words = (bytes / 8) as usize;
    let threads = threads.max(1);
    let share = words.div_ceil(threads).max(1);
    let mut buffer = vec![0u64; words];
    // A fresh allocation maps the shared zero page: write every word first
    // so the reads below hit real memory.
    std::thread::scope(|s| {
        for (i, chunk) in buffer.chunks_mut(share).enumerate() {
            s.spawn(move || {
                for (j, w) in chunk.iter_mut().enumerate() {
                    *w = (i * share + j) as u64 ^ 0x5555_5555;
                }
            });
        }
    });
    let mut best = 0.0f64;
    for _ in 0..passes.max(1) {
        let start = Instant::now();
        let sum = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(share)
                .map(|chunk| s.spawn(move || sum_words(chunk)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(bytes as f64 / secs / 1e9);
    }
    best
}

/// Wrapping sum with independent lanes, so the loop is bound by memory, not
/// by one dependency chain.
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (lane, w) in lanes.iter_mut().zip(c) {
            *lane = lane.wrapping_add(*w);
        }
    }
    lanes
        .iter()
        .chain(chunks.remainder())
        .fold(0, |a, &b| a.wrapping_add(b))
}

/// A scratch file deleted when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            tracing::warn!("cannot remove the scratch file {}: {e}", self.0.display());
        }
    }
}

/// Measures reads on the volume holding `dir` (see the module's disk rules).
fn measure_disk(dir: &Path, amounts: &Amounts) -> Result<DiskProfile, ProfileError> {
    let disk_error = |source| ProfileError::Disk {
        path: dir.to_path_buf(),
        source,
    };
    let mut scratch = None;
    let source = match largest_gguf(dir).map_err(disk_error)? {
        Some((path, len)) if len >= MIN_SOURCE_FILE_BYTES => path,
        _ => {
            let path = dir.join(format!(".hypura-profile-scratch-{}", std::process::id()));
            let guard = Scratch(path.clone());
            write_scratch(&path, amounts.scratch_bytes).map_err(disk_error)?;
            scratch = Some(guard);
            path
        }
    };
    let (file, o_direct) = open_for_reads(&source).map_err(disk_error)?;
    let file_len = file.metadata().map_err(disk_error)?.len();
    let mut reads = Vec::new();
    for (i, &block_bytes) in DISK_BLOCK_BYTES.iter().enumerate() {
        for (j, &queue_depth) in DISK_QUEUE_DEPTHS.iter().enumerate() {
            let seed = (i * DISK_QUEUE_DEPTHS.len() + j) as u64;
            let point = ReadPoint {
                block_bytes,
                queue_depth,
                max_bytes: amounts.disk_point_bytes,
                max_time: amounts.disk_point_time,
            };
            let gbps = point.measure(&file, file_len, seed).map_err(disk_error)?;
            reads.push(DiskReadPoint {
                block_bytes,
                queue_depth,
                gbps,
            });
        }
    }
    drop(file);
    drop(scratch);
    Ok(DiskProfile {
        path: dir.display().to_string(),
        o_direct,
        reads,
    })
}

/// The biggest `*.gguf` directly inside `dir` whose bytes are on the disk,
/// with its length. A sparse file (`hypura-synth --sparse`, a download
/// preallocated with a hole) reads its holes as zeros without touching the
/// disk: a profile read from one put the disk at 43–790 GB/s.
fn largest_gguf(dir: &Path) -> io::Result<Option<(PathBuf, u64)>> {
    let mut best: Option<(PathBuf, u64)> = None;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        let meta = entry.metadata()?;
        if is_gguf
            && meta.is_file()
            && is_allocated(&meta)
            && best.as_ref().is_none_or(|(_, len)| meta.len() > *len)
        {
            best = Some((path, meta.len()));
        }
    }
    Ok(best)
}

/// Whether at least 15/16 of the file's length is allocated on the disk
/// (`st_blocks` counts 512-byte units).
fn is_allocated(meta: &std::fs::Metadata) -> bool {
    let on_disk = meta.blocks().saturating_mul(512);
    on_disk >= meta.len() - meta.len() / 16
}

/// A zeroed, `DIRECT_ALIGN`-aligned window of `len` bytes inside `storage`.
fn aligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    *storage = vec![0u8; len + DIRECT_ALIGN];
    let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
    &mut storage[start..start + len]
}

fn is_direct_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// Writes `len` bytes of non-repeating data with O_DIRECT (buffered, then
/// evicted from the page cache, where the file system refuses it), so that
/// the reads after it come from the disk.
fn write_scratch(path: &Path, len: u64) -> io::Result<()> {
    let open = |flags| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(flags)
            .open(path)
    };
    let (mut file, direct) = match open(libc::O_DIRECT) {
        Ok(f) => (f, true),
        Err(e) if is_direct_refused(&e) => (open(0)?, false),
        Err(e) => return Err(e),
    };
    const CHUNK: usize = 4 << 20;
    let mut storage = Vec::new();
    let buf = aligned(&mut storage, CHUNK);
    let mut rng = Rng::new(0x243f_6a88_85a3_08d3);
    for w in buf.chunks_exact_mut(8) {
        w.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let mut written = 0u64;
    while written < len {
        // Vary every page so no layer below can deduplicate the chunks.
        for page in buf.chunks_exact_mut(DIRECT_ALIGN) {
            page[..8].copy_from_slice(&written.to_le_bytes());
        }
        let n = CHUNK.min((len - written) as usize);
        file.write_all(&buf[..n])?;
        written += n as u64;
    }
    file.sync_all()?;
    if !direct {
        devices::evict_from_page_cache(&file)?;
    }
    Ok(())
}

/// Opens `path` read-only with O_DIRECT, else buffered (then `false`, with a
/// warning: buffered reads may come from the page cache).
fn open_for_reads(path: &Path) -> io::Result<(File, bool)> {
    let open = |flags| OpenOptions::new().read(true).custom_flags(flags).open(path);
    let refused = match open(libc::O_DIRECT) {
        Ok(file) => {
            // Some file systems accept the flag and refuse the reads.
            let mut storage = Vec::new();
            match file.read_at(aligned(&mut storage, DIRECT_ALIGN), 0) {
                Ok(_) => return Ok((file, true)),
                Err(e) if is_direct_refused(&e) => e,
                Err(e) => return Err(e),
            }
        }
        Err(e) if is_direct_refused(&e) => e,
        Err(e) => return Err(e),
    };
    tracing::warn!(
        "{} refused O_DIRECT ({refused}): measuring buffered reads, which the page cache may inflate",
        path.display()
    );
    let file = open(0)?;
    devices::evict_from_page_cache(&file)?;
    Ok((file, false))
}

/// One point of the disk table: reads of `block_bytes` at random
/// block-aligned offsets with `queue_depth` of them in flight (one thread
/// each), until `max_bytes` are issued or `max_time` has passed.
struct ReadPoint {
    block_bytes: u64,
    queue_depth: u32,
    max_bytes: u64,
    max_time: Duration,
}

impl ReadPoint {
    /// Bytes read ÷ wall time, GB/s.
    fn measure(&self, file: &File, file_len: u64, seed: u64) -> io::Result<f64> {
        let slots = file_len / self.block_bytes;
        if slots == 0 {
            return Err(io::Error::other(format!(
                "the file read is {file_len} bytes, smaller than one {} block",
                format_bytes(self.block_bytes)
            )));
        }
        let depth = self.queue_depth.max(1) as usize;
        // At least two rounds of the whole queue, so depth really is depth.
        let max_reads = (self.max_bytes / self.block_bytes).max(2 * depth as u64);
        let claimed = AtomicU64::new(0);
        let done_bytes = AtomicU64::new(0);
        let ready = Barrier::new(depth + 1);
        let (start, results) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..depth)
                .map(|t| {
                    let (claimed, done_bytes, ready) = (&claimed, &done_bytes, &ready);
                    let mut rng = Rng::new(seed.wrapping_mul(1000).wrapping_add(t as u64));
                    s.spawn(move || -> io::Result<()> {
                        let mut storage = Vec::new();
                        let buf = aligned(&mut storage, self.block_bytes as usize);
                        buf.fill(1); // back the pages before the clock starts
                        ready.wait();
                        let deadline = Instant::now() + self.max_time;
                        while Instant::now() < deadline
                            && claimed.fetch_add(1, Ordering::Relaxed) < max_reads
                        {
                            let offset = rng.next_u64() % slots * self.block_bytes;
                            file.read_exact_at(buf, offset)?;
                            done_bytes.fetch_add(self.block_bytes, Ordering::Relaxed);
                        }
                        Ok(())
                    })
                })
                .collect();
            ready.wait();
            let start = Instant::now();
            let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (start, results)
        });
        let secs = start.elapsed().as_secs_f64();
        for r in results {
            r.map_err(|_| io::Error::other("a disk reader thread panicked"))??;
        }
        Ok(done_bytes.load(Ordering::Relaxed) as f64 / secs / 1e9)
    }
}

/// A [`HardwareProfile`] as a readable table.
pub struct ProfileTable<'a>(pub &'a HardwareProfile);

impl fmt::Display for ProfileTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        let mut row = |label: &str, value: String| writeln!(f, "{label:<10}{value}");
        row("host", p.host.clone())?;
        row(
            "measured",
            format!("{} (profile version {})", p.measured_at, p.version),
        )?;
        let prompt = match p.cpu.q4k_prompt_gflops {
            r if r > 0.0 => format!(", prompt matmul {r:.0} GFLOP/s"),
            _ => String::new(),
        };
        row(
            "CPU",
            format!(
                "{}, {} threads, Q4_K matvec {:.1} GB/s{prompt}",
                p.cpu.model, p.cpu.threads, p.cpu.q4k_matvec_gbps
            ),
        )?;
        row(
            "RAM",
            format!(
                "{} total, {} available, read {:.1} GB/s",
                format_bytes(p.ram.total_bytes),
                format_bytes(p.ram.available_bytes),
                p.ram.read_gbps
            ),
        )?;
        if p.gpus.is_empty() {
            row("GPU", "none".into())?;
        }
        for (i, g) in p.gpus.iter().enumerate() {
            row(
                &format!("GPU {i}"),
                format!(
                    "{} ({}): {} total, {} free",
                    g.name,
                    g.description,
                    format_bytes(g.total_bytes),
                    format_bytes(g.free_bytes)
                ),
            )?;
            row(
                "",
                format!(
                    "Q4_K matvec {:.1} GB/s, host→device pinned {:.1} GB/s, pageable {:.1} GB/s",
                    g.q4k_matvec_gbps, g.host_to_device_pinned_gbps, g.host_to_device_pageable_gbps
                ),
            )?;
        }
        let mode = if p.disk.o_direct {
            "O_DIRECT"
        } else {
            "buffered: O_DIRECT refused"
        };
        let overhead = match p.host_overhead {
            Some(o) => format!(
                "{} resident before any model (the process {}, llama.cpp's backends {}): \
                 a run peaks at most this above its RAM budget",
                format_bytes(o.after_devices_bytes),
                format_bytes(o.process_bytes),
                format_bytes(o.after_backends_bytes)
            ),
            None => format!(
                "not measured (profile from an older hypura): {} assumed",
                format_bytes(p.host_overhead().bytes())
            ),
        };
        row("overhead", overhead)?;
        row("disk", format!("{} ({mode})", p.disk.path))?;
        write_disk_grid(f, &p.disk)
    }
}

/// Read GB/s by block size (rows) × queue depth (columns); `-` where unmeasured.
fn write_disk_grid(f: &mut fmt::Formatter<'_>, disk: &DiskProfile) -> fmt::Result {
    let mut blocks: Vec<u64> = disk.reads.iter().map(|r| r.block_bytes).collect();
    let mut depths: Vec<u32> = disk.reads.iter().map(|r| r.queue_depth).collect();
    blocks.sort_unstable();
    blocks.dedup();
    depths.sort_unstable();
    depths.dedup();
    write!(f, "  {:<10}", "GB/s")?;
    for d in &depths {
        write!(f, "{:>8}", format!("QD{d}"))?;
    }
    writeln!(f)?;
    for b in &blocks {
        write!(f, "  {:<10}", format_bytes(*b))?;
        for d in &depths {
            let point = disk
                .reads
                .iter()
                .find(|r| r.block_bytes == *b && r.queue_depth == *d);
            match point {
                Some(r) => write!(f, "{:>8.2}", r.gbps)?,
                None => write!(f, "{:>8}", "-")?,
            }
        }
        writeln!(f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypura_scheduler::profile::HostOverhead;

    fn profile() -> HardwareProfile {
        HardwareProfile {
            version: PROFILE_VERSION,
            measured_at: "2026-01-02T03:04:05.678Z".into(),
            host: "box".into(),
            cpu: CpuProfile {
                model: "Test CPU".into(),
                threads: 16,
                q4k_matvec_gbps: 41.25,
                q4k_prompt_gflops: 900.0,
            },
            ram: RamProfile {
                total_bytes: 128 << 30,
                available_bytes: 100 << 30,
                read_gbps: 80.0,
            },
            gpus: vec![],
            disk: hypura_scheduler::profile::fixtures::disk(),
            host_overhead: Some(HostOverhead {
                process_bytes: 8 << 20,
                after_backends_bytes: 9 << 20,
                after_devices_bytes: 12 << 20,
            }),
        }
    }

    #[test]
    fn a_matching_profile_is_fresh() {
        let p = profile();
        let path = Path::new("/models");
        assert_eq!(stale_reason(&p, Effort::Full, path, Effort::Full), None);
        // A full profile answers a quick request too.
        assert_eq!(stale_reason(&p, Effort::Full, path, Effort::Quick), None);
        assert_eq!(stale_reason(&p, Effort::Quick, path, Effort::Quick), None);
    }

    #[test]
    fn another_version_path_or_a_quick_profile_is_stale() {
        let p = profile();
        let path = Path::new("/models");
        let old = HardwareProfile {
            version: PROFILE_VERSION + 1,
            ..p.clone()
        };
        let why = stale_reason(&old, Effort::Full, path, Effort::Full).unwrap();
        assert!(why.contains("version"), "{why}");
        let why = stale_reason(&p, Effort::Full, Path::new("/elsewhere"), Effort::Full).unwrap();
        assert!(why.contains("/elsewhere"), "{why}");
        let why = stale_reason(&p, Effort::Quick, path, Effort::Full).unwrap();
        assert!(why.contains("quick"), "{why}");
        // Measured before the CPU's prompt rate was: measured again.
        let mut before = p.clone();
        before.cpu.q4k_prompt_gflops = 0.0;
        let why = stale_reason(&before, Effort::Full, path, Effort::Full).unwrap();
        assert!(why.contains("prompt rate"), "{why}");
    }

    #[test]
    fn cache_round_trips_and_defaults_to_full() {
        let dir = std::env::temp_dir().join(format!("hypura-hwprobe-{}", std::process::id()));
        let file = dir.join(CACHE_FILE_NAME);
        write_cache(&file, &profile(), Effort::Quick).unwrap();
        let cached = read_cache(&file).unwrap();
        assert_eq!(cached.profile, profile());
        assert_eq!(cached.effort, Effort::Quick);
        // The file is a plain HardwareProfile to other readers.
        let plain: HardwareProfile =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(plain, profile());
        // A file without `effort` (written by hand, or older) is a full one.
        std::fs::write(&file, serde_json::to_vec(&profile()).unwrap()).unwrap();
        assert_eq!(read_cache(&file).unwrap().effort, Effort::Full);
        std::fs::write(&file, b"{ not json").unwrap();
        assert!(read_cache(&file).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn table_shows_every_part() {
        let text = ProfileTable(&profile()).to_string();
        let expected = "\
host      box
measured  2026-01-02T03:04:05.678Z (profile version 1)
CPU       Test CPU, 16 threads, Q4_K matvec 41.2 GB/s, prompt matmul 900 GFLOP/s
RAM       128.0 GiB total, 100.0 GiB available, read 80.0 GB/s
GPU       none
overhead  12.0 MiB resident before any model (the process 8.0 MiB, llama.cpp's backends 9.0 MiB): a run peaks at most this above its RAM budget
disk      /models (O_DIRECT)
  GB/s           QD1    QD32
  64.0 KiB      0.30    1.00
  16.0 MiB      1.20    1.30
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_profile_without_the_host_overhead_still_loads() {
        // Written before the overhead was measured: no `host_overhead` key.
        let mut value = serde_json::to_value(profile()).unwrap();
        value.as_object_mut().unwrap().remove("host_overhead");
        let old: HardwareProfile = serde_json::from_value(value).unwrap();
        assert_eq!(old.host_overhead, None);
        assert_eq!(old.host_overhead(), HostOverhead::assumed());
        let text = ProfileTable(&old).to_string();
        assert!(text.contains("overhead  not measured"), "{text}");
    }

    #[test]
    fn table_lists_gpus() {
        let mut p = profile();
        p.gpus.push(GpuProfile {
            name: "CUDA0".into(),
            description: "NVIDIA H200".into(),
            total_bytes: 140 << 30,
            free_bytes: 139 << 30,
            q4k_matvec_gbps: 4000.0,
            host_to_device_pinned_gbps: 55.0,
            host_to_device_pageable_gbps: 15.0,
        });
        let text = ProfileTable(&p).to_string();
        assert!(
            text.contains(
                "GPU 0     CUDA0 (NVIDIA H200): 140.0 GiB total, 139.0 GiB free\n          \
             Q4_K matvec 4000.0 GB/s, host→device pinned 55.0 GB/s, pageable 15.0 GB/s\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn read_queue_depth_is_the_least_that_gets_near_the_best() {
        let point = |block_bytes, queue_depth, gbps| DiskReadPoint {
            block_bytes,
            queue_depth,
            gbps,
        };
        let disk = DiskProfile {
            path: "/models".into(),
            o_direct: true,
            reads: vec![
                point(64 << 10, 1, 0.2),
                point(64 << 10, 32, 1.0),
                point(1 << 20, 1, 0.5),
                point(1 << 20, 4, 1.25),
                point(1 << 20, 16, 1.3),
                point(1 << 20, 32, 1.2),
            ],
        };
        assert_eq!(suggested_read_queue_depth(&disk, 1 << 20), Some(4));
        // Larger blocks than measured: the largest measured one decides.
        assert_eq!(suggested_read_queue_depth(&disk, 16 << 20), Some(4));
        assert_eq!(suggested_read_queue_depth(&disk, 256 << 10), Some(32));
        assert_eq!(suggested_read_queue_depth(&disk, 4096), None);
    }

    #[test]
    fn meminfo_and_cpuinfo_are_parsed() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            Some((24_576_000 * 1024, 20_000_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9554\n";
        assert_eq!(parse_cpu_model(cpuinfo).as_deref(), Some("AMD EPYC 9554"));
        assert_eq!(
            parse_cpu_model("Hardware\t: BCM2835\n").as_deref(),
            Some("BCM2835")
        );
        assert_eq!(parse_cpu_model("processor: 0\n"), None);
    }

    #[test]
    fn lane_sum_matches_a_plain_sum() {
        let words: Vec<u64> = (0..1003).map(|i| i * 7 + u64::MAX / 3).collect();
        let plain = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        assert_eq!(sum_words(&words), plain);
    }

    #[test]
    fn the_disk_is_read_from_the_largest_model_whose_bytes_are_on_it() {
        let dir = std::env::temp_dir().join(format!("hypura-hwprobe-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = dir.join("small.gguf");
        write_scratch(&written, 1 << 20).unwrap();
        // Bigger, but a hole: its reads would never reach the disk.
        let sparse = dir.join("sparse.gguf");
        File::create(&sparse).unwrap().set_len(64 << 20).unwrap();
        let chosen = largest_gguf(&dir).unwrap();
        assert_eq!(chosen, Some((written.clone(), 1 << 20)));
        std::fs::remove_file(&written).unwrap();
        assert_eq!(largest_gguf(&dir).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disk_points_read_a_scratch_file() {
        let dir = std::env::temp_dir().join(format!("hypura-hwprobe-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scratch");
        write_scratch(&path, 4 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        let (file, _) = open_for_reads(&path).unwrap();
        let point = ReadPoint {
            block_bytes: 1 << 20,
            queue_depth: 4,
            max_bytes: 4 << 20,
            max_time: Duration::from_secs(5),
        };
        let gbps = point.measure(&file, 4 << 20, 7).unwrap();
        assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
        let too_big = ReadPoint {
            block_bytes: 8 << 20,
            ..point
        };
        assert!(too_big.measure(&file, 4 << 20, 7).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
