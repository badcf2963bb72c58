//! The STREAM tier's FFI half: an address space mirroring the model file,
//! a ggml buffer type that places STREAM tensors in it at their file offsets,
//! the loader that fills only resident tensors, and the eval-callback hook.
//!
//! Invariant: every byte of the region is either untouched (reads as zero,
//! never used while so: the streamer pins what a node needs before it runs)
//! or equal to the file's byte at the same offset, but for the whole pages
//! inside a unit being loaded, which may hold another unit's bytes until
//! its read lands ([`StreamRegion::adopt`]; nothing reads a loading unit).
//! Reads therefore may spill over neighbouring bytes (page alignment for
//! O_DIRECT) without harm.
use std::collections::{BTreeSet, HashMap};
use std::ffi::{c_void, CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hypura_llama_sys as sys;
use hypura_llama_sys::buffer_type::{
    ggml_backend_buffer_init, BufferHandle, BufferInterface, BufferType, BufferTypeHandle,
    BufferTypeInterface,
};

/// Page size used for alignment and residency accounting.
pub const PAGE: u64 = 4096;

fn page_floor(x: u64) -> u64 {
    x & !(PAGE - 1)
}

fn page_ceil(x: u64) -> u64 {
    (x + PAGE - 1) & !(PAGE - 1)
}

/// Reserved, lazily backed memory with the layout of the model file:
/// file byte `o` lives at `base + o`.
pub struct StreamRegion {
    base: NonNull<u8>,
    len: usize,
    file_len: u64,
    /// Pages evictions gave up, for the next load (see
    /// [`StreamRegion::retire`]); `None` until [`StreamRegion::open_bank`].
    bank: Mutex<Option<Bank>>,
}

/// A mapping that holds an evicted unit's pages between its eviction and
/// the load that takes them: a stack of moved page runs (each run one
/// mapping of the kernel's, as `mremap` needs its source to be).
struct Bank {
    base: NonNull<u8>,
    cap: u64,
    /// `(offset in the bank, bytes)` of each run held, bottom first, each
    /// starting where the one below ends.
    runs: Vec<(u64, u64)>,
    /// Most runs held at once.
    max_runs: usize,
    /// Split points moves made in the bank's own mapping since it was last
    /// mapped whole: two a run moved in, one a run's top moved out
    /// ([`StreamRegion::drain_bank`] maps it whole again past `2 × max_runs`).
    pieces: usize,
    /// Region offsets where a move began or ended: the kernel's mappings of
    /// the region are split there and nowhere else (moved pages keep their
    /// old place's identity, so neighbours do not merge), one mapping more
    /// each.
    splits: BTreeSet<u64>,
    /// Most split points the region may take ([`MAPPING_RESERVE`]).
    most_splits: usize,
}

impl Bank {
    fn at(&self, offset: u64) -> *mut u8 {
        // SAFETY: callers keep `offset` within the bank's `cap`.
        unsafe { self.base.as_ptr().add(offset as usize) }
    }

    /// Bytes held: the runs fill the bank from its start.
    fn fill(&self) -> u64 {
        self.runs.last().map_or(0, |&(offset, len)| offset + len)
    }

    /// Whether a move of region pages `[a, b)` stays within the split
    /// points the process has room for.
    fn may_split(&self, a: u64, b: u64) -> bool {
        let new = [a, b].iter().filter(|p| !self.splits.contains(p)).count();
        self.splits.len() + new <= self.most_splits
    }

    fn split(&mut self, a: u64, b: u64) {
        self.splits.insert(a);
        self.splits.insert(b);
    }
}

/// Mappings left to everything else of a process that streams (CUDA's,
/// the allocator's arenas, threads' stacks, pinned buffers) when recycling
/// splits the stream region ([`StreamRegion::open_bank`]): a quarter of the
/// kernel's default `vm.max_map_count` (65,530). Past the process's limit
/// an `mmap` fails, and with it a CUDA allocation.
pub const MAPPING_RESERVE: u64 = 16_384;

/// Mappings this process may still make: `vm.max_map_count` less the
/// mappings it holds (`/proc/self/maps`); `None` where `/proc` cannot say.
pub fn mapping_room() -> Option<u64> {
    let max: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let held = maps.iter().filter(|&&c| c == b'\n').count() as u64;
    Some(max.saturating_sub(held))
}

/// The address a mapping's line of `/proc/self/maps` or `smaps` starts
/// at (`from-to perms ...`); `None` for smaps' other lines.
fn mapping_start(line: &str) -> Option<usize> {
    let (range, _) = line.split_once(' ')?;
    let (from, _) = range.split_once('-')?;
    usize::from_str_radix(from, 16).ok()
}

/// Split points recycling gives the region when it moves pages in and out
/// of every range of `ranges` (the units' file ranges): their whole pages'
/// distinct ends. Adjacent ranges share one where their boundary falls on
/// a page; the Qwen3-30B-A3B shape's expert slices do not start on pages,
/// so its 18,432 ranges make 36,864.
pub fn recycling_split_points(ranges: &[(u64, u64)]) -> usize {
    let mut points: Vec<u64> = ranges
        .iter()
        .map(|&(start, end)| (page_ceil(start), page_floor(end)))
        .filter(|(a, b)| b > a)
        .flat_map(|(a, b)| [a, b])
        .collect();
    points.sort_unstable();
    points.dedup();
    points.len()
}

/// A private anonymous mapping of `len` bytes, at `at` when given
/// (replacing what is mapped there).
fn map_anonymous(at: Option<NonNull<u8>>, len: u64) -> io::Result<NonNull<u8>> {
    let (hint, fixed) = match at {
        Some(p) => (p.as_ptr() as *mut c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: an anonymous private mapping; with MAP_FIXED only over a
    // bank's own mapping, whose pages no one uses once drained.
    let ptr = unsafe {
        libc::mmap(
            hint,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the mapping just made.
    unsafe { no_huge_pages(ptr, len as usize) };
    NonNull::new(ptr as *mut u8).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

/// Keeps transparent huge pages out of `[ptr, ptr + len)`. The stream
/// cache counts, releases and moves memory a 4 KiB page at a time: where
/// the kernel hands out huge pages unasked (`transparent_hugepage=always`,
/// the default of some distributions), a read into a few pages faults in a
/// whole 2 MiB one, and a release of part of it frees nothing until the
/// kernel splits it, so the cache would hold more than its budget says.
/// Best effort: a kernel without huge pages refuses, and has none to give.
///
/// # Safety
/// `[ptr, ptr + len)` is a mapping of this process.
unsafe fn no_huge_pages(ptr: *mut c_void, len: usize) {
    // SAFETY: as the caller guarantees; the advice changes no byte.
    unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
}

impl Drop for Bank {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `open_bank`, once; nothing
        // uses its pages once the bank goes.
        unsafe { libc::munmap(self.base.as_ptr() as *mut c_void, self.cap as usize) };
    }
}

/// Moves the pages of `[from, from + len)` to `[to, to + len)`, replacing
/// whatever is mapped there, and leaves `from` mapped and empty (reading as
/// zero: `MREMAP_DONTUNMAP`, Linux 5.7). No page is copied or zeroed: the
/// page tables move. Whether the kernel did it.
///
/// # Safety
/// Both ranges page aligned, inside private anonymous mappings of this
/// process, and not in use by anyone (no pinned page, no reader).
unsafe fn move_pages(from: *mut u8, to: *mut u8, len: usize) -> bool {
    // SAFETY: as the caller guarantees.
    let moved = unsafe {
        libc::mremap(
            from as *mut c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
            to as *mut c_void,
        )
    };
    moved == to as *mut c_void
}

// SAFETY: the region is plain memory; concurrent writers only ever store the
// file's own bytes (see the module invariant), and the pointer is never freed
// while a `StreamRegion` exists.
unsafe impl Send for StreamRegion {}
// SAFETY: as above.
unsafe impl Sync for StreamRegion {}

impl StreamRegion {
    /// Reserves address space for a file of `file_len` bytes; no memory is
    /// committed until pages are written.
    pub fn reserve(file_len: u64) -> io::Result<StreamRegion> {
        let len = page_ceil(file_len.max(1)) as usize;
        let guard = PAGE as usize;
        // One inaccessible page on each side keeps the kernel from merging
        // the region with a neighbouring mapping, so its `Rss` in smaps is
        // its own.
        // SAFETY: an anonymous private mapping with no fixed address; then
        // the inner part is made accessible.
        let base = unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len + 2 * guard,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if ptr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let inner = (ptr as *mut u8).add(guard);
            if libc::mprotect(
                inner as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            ) != 0
            {
                let err = io::Error::last_os_error();
                libc::munmap(ptr, len + 2 * guard);
                return Err(err);
            }
            no_huge_pages(inner as *mut c_void, len);
            inner
        };
        let base = NonNull::new(base).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(StreamRegion {
            base,
            len,
            file_len,
            bank: Mutex::new(None),
        })
    }

    /// Keeps up to `cap` bytes of evicted units' pages, in at most
    /// `max_runs` runs, for the loads that follow ([`StreamRegion::retire`],
    /// [`StreamRegion::adopt`]): an O_DIRECT read into pages already present
    /// skips faulting in and zeroing fresh ones, which slowed the H200
    /// machine's reads from 2.3–2.6 GB/s to 1.3–1.6
    /// (`scripts/bench/disk_read.py`: "reused" against "fresh"). Each move
    /// splits the kernel's mapping of the region where it begins and ends,
    /// and a process may hold only `vm.max_map_count` mappings: moves stop
    /// making new split points where the process would keep fewer than
    /// [`MAPPING_RESERVE`] for everything else (then evictions release as
    /// before). Returns how many split points moves may make; an error where
    /// the address space cannot be reserved or `/proc` cannot say.
    pub fn open_bank(&self, cap: u64, max_runs: usize) -> io::Result<usize> {
        let room = mapping_room()
            .ok_or_else(|| io::Error::other("/proc does not say how many mappings are free"))?;
        // The bank's own: the `2 × max_runs` pieces it may carry between
        // remaps, and three for each run one load moves in and out.
        let bank = 5 * max_runs as u64 + 1;
        let most = room.saturating_sub(MAPPING_RESERVE + bank) as usize;
        self.open_bank_with(cap, max_runs, most)?;
        Ok(most)
    }

    /// [`StreamRegion::open_bank`] with room for `most_splits` split points.
    fn open_bank_with(&self, cap: u64, max_runs: usize, most_splits: usize) -> io::Result<()> {
        let cap = page_ceil(cap.max(PAGE));
        let base = map_anonymous(None, cap)?;
        // A bank this one replaces is unmapped as it drops.
        *self.bank() = Some(Bank {
            base,
            cap,
            runs: Vec::new(),
            max_runs,
            pieces: 0,
            splits: BTreeSet::new(),
            most_splits,
        });
        Ok(())
    }

    /// The whole pages `[a, b)` inside file bytes `[start, end)` (empty
    /// when `b <= a`): the boundary pages, possibly shared with a
    /// neighbour, are not among them.
    fn whole_pages(&self, start: u64, end: u64) -> (u64, u64) {
        (page_ceil(start), page_floor(end).min(self.len as u64))
    }

    /// The bank's address range, for tests that count its mappings.
    #[cfg(test)]
    fn bank_range(&self) -> Option<(usize, usize)> {
        let bank = self.bank();
        let bank = bank.as_ref()?;
        let base = bank.base.as_ptr() as usize;
        Some((base, base + bank.cap as usize))
    }

    fn bank(&self) -> std::sync::MutexGuard<'_, Option<Bank>> {
        self.bank.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives up the whole pages inside `[start, end)` as [`release`] does,
    /// but keeps them, moved into the bank while it has room, for the next
    /// [`StreamRegion::adopt`]; the range reads as zero either way. The
    /// caller holds no pin on them.
    ///
    /// [`release`]: StreamRegion::release
    pub fn retire(&self, start: u64, end: u64) {
        let (a, b) = self.whole_pages(start, end);
        if b <= a {
            return;
        }
        let len = b - a;
        let mut bank = self.bank();
        let fits = |k: &&mut Bank| {
            k.fill() + len <= k.cap && k.runs.len() < k.max_runs && k.may_split(a, b)
        };
        if let Some(bank) = bank.as_mut().filter(fits) {
            let fill = bank.fill();
            // SAFETY: `[a, b)` is page aligned inside the region, unpinned;
            // `[fill, fill + len)` is free room in the bank.
            let from = unsafe { self.base.as_ptr().add(a as usize) };
            if unsafe { move_pages(from, bank.at(fill), len as usize) } {
                bank.runs.push((fill, len));
                bank.split(a, b);
                bank.pieces += 2;
                return;
            }
        }
        drop(bank);
        self.release(start, end);
    }

    /// Moves banked pages into the whole pages inside `[start, end)` (a
    /// unit being loaded, whose read will overwrite them), as many as the
    /// bank holds. Returns the file range now backed by moved pages (empty
    /// when none): present before its read lands, to be counted as such.
    pub fn adopt(&self, start: u64, end: u64) -> (u64, u64) {
        let (a, b) = self.whole_pages(start, end);
        let mut done = a;
        let mut bank = self.bank();
        let Some(bank) = bank.as_mut() else {
            return (a, a);
        };
        while done < b {
            let Some(&(offset, len)) = bank.runs.last() else {
                break;
            };
            let take = len.min(b - done);
            if !bank.may_split(done, done + take) {
                break;
            }
            // The run's top `take` bytes: within one mapping, as mremap needs.
            let from = offset + len - take;
            // SAFETY: `[done, done + take)` is page aligned inside the region
            // (the caller's loading unit); the bank run holds moved pages.
            let to = unsafe { self.base.as_ptr().add(done as usize) };
            if !unsafe { move_pages(bank.at(from), to, take as usize) } {
                break;
            }
            bank.split(done, done + take);
            bank.pieces += 1;
            if take == len {
                bank.runs.pop();
            } else {
                bank.runs.last_mut().expect("a run").1 -= take;
            }
            done += take;
        }
        (a, done)
    }

    /// Releases whatever pages the bank still holds (a load took fewer than
    /// its evictions gave up): the bank holds pages only between an
    /// eviction and the load it made room for. A bank moves have split into
    /// `2 × max_runs` pieces is mapped whole again.
    pub fn drain_bank(&self) {
        let mut slot = self.bank();
        let Some(bank) = slot.as_mut() else {
            return;
        };
        let fill = bank.fill();
        bank.runs.clear();
        if fill > 0 {
            // SAFETY: `[0, fill)` lies inside the bank; its pages are no one's.
            unsafe {
                libc::madvise(
                    bank.base.as_ptr() as *mut c_void,
                    fill as usize,
                    libc::MADV_DONTNEED,
                );
            }
        }
        if bank.pieces < 2 * bank.max_runs {
            return;
        }
        // Empty now: mapped whole again over itself, its pieces gone.
        bank.pieces = 0;
        if map_anonymous(Some(bank.base), bank.cap).is_err() {
            // A failed MAP_FIXED may have unmapped part of it, where another
            // mapping may come: never unmap or move pages there again
            // (recycling ends).
            std::mem::forget(slot.take());
            tracing::warn!(
                "the stream bank could not be mapped again: evicted pages are released from now on"
            );
        }
    }

    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole pages `[a, b)` of the region holding file bytes
    /// `[start, end)`; an error for a range outside the file.
    fn pages_of(&self, start: u64, end: u64) -> io::Result<(u64, u64)> {
        if start > end || end > self.file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {start}..{end} outside the file ({} bytes)",
                    self.file_len
                ),
            ));
        }
        Ok((page_floor(start), page_ceil(end).min(self.len as u64)))
    }

    /// Reads file bytes `[start, end)` into the region (rounded out to whole
    /// pages, as O_DIRECT needs). Returns the bytes the kernel delivered.
    /// A short read that leaves part of `[start, end)` unfilled is an error.
    pub fn read_from(&self, file: &File, start: u64, end: u64) -> io::Result<u64> {
        let (a, b) = self.pages_of(start, end)?;
        let mut done = a;
        while done < end {
            let want = (b - done) as usize;
            // SAFETY: `[done, b)` lies inside the mapping; pread writes raw
            // memory without creating Rust references (other threads may
            // read neighbouring bytes, which only ever get their own value).
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.base.as_ptr().add(done as usize) as *mut c_void,
                    want,
                    done as libc::off_t,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the model file ends at byte {done}, before {end}: was it truncated?"),
                ));
            }
            done += n as u64;
        }
        Ok(done - a)
    }

    /// Backs the pages holding file bytes `[start, end)` with memory before
    /// their read (`MADV_POPULATE_WRITE`, Linux 5.14): a page present
    /// already keeps its bytes; a new one is zero, which the module's
    /// invariant allows. Returns the bytes covered, counted as
    /// [`StreamRegion::read_from`] counts them. Faulting pages in during an
    /// O_DIRECT read is what slows it: on the H200's virtual disk, 1 MiB
    /// reads four at a time delivered 1.27–1.55 GB/s into fresh pages
    /// against 2.26–2.58 into pages present (`scripts/bench/disk_read.py`).
    pub fn populate(&self, start: u64, end: u64) -> io::Result<u64> {
        let (a, b) = self.pages_of(start, end)?;
        if b <= a {
            return Ok(0);
        }
        // SAFETY: `[a, b)` is page aligned and inside the mapping; populating
        // never changes a present page's bytes.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().add(a as usize) as *mut c_void,
                (b - a) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(b - a)
    }

    /// Gives back the memory of the whole pages inside `[start, end)`; the
    /// boundary pages, possibly shared with a neighbour, are kept.
    pub fn release(&self, start: u64, end: u64) {
        let (a, b) = self.whole_pages(start, end);
        if b <= a {
            return;
        }
        // SAFETY: `[a, b)` is page aligned and inside the mapping; the pages
        // belong to no slice in use (the caller holds no pin on them).
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(a as usize) as *mut c_void,
                (b - a) as usize,
                libc::MADV_DONTNEED,
            );
        }
    }

    /// Bytes of the region actually backed by memory now: the `Rss` of its
    /// mappings in `/proc/self/smaps` (one, or several once loads took
    /// moved pages). (`mincore` would also count pages only read, which map
    /// the shared zero page and cost no memory.)
    pub fn resident_bytes(&self) -> u64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let (lo, hi) = (
            self.base.as_ptr() as usize,
            self.base.as_ptr() as usize + self.len,
        );
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if let Some(from) = mapping_start(line) {
                inside = (lo..hi).contains(&from);
                continue;
            }
            if let Some(kb) = line.strip_prefix("Rss:").filter(|_| inside) {
                kib += kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
        kib * 1024
    }
}

impl Drop for StreamRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `reserve` (with its guard pages), once.
        unsafe {
            let guard = PAGE as usize;
            libc::munmap(
                self.base.as_ptr().sub(guard) as *mut c_void,
                self.len + 2 * guard,
            );
        }
    }
}

/// hypura's STREAM buffer type. Must outlive every model loaded with it.
pub struct StreamBufferType {
    raw: Box<BufferType>,
    ctx: Box<BuftContext>,
}

struct BuftContext {
    name: CString,
    /// True while llama.cpp loads the model: the buffer type then claims not
    /// to be host memory, so the loader stages STREAM tensors through a
    /// temporary buffer handed to `set_tensor` (which ignores it) instead of
    /// reading into the region. Cleared once loaded, so the CPU backend can
    /// compute from the region directly.
    loading: std::sync::atomic::AtomicBool,
    region: Arc<StreamRegion>,
    /// Tensor name → offset of its data in the file.
    offsets: HashMap<String, u64>,
}

// SAFETY: the raw struct only holds pointers to the boxed context and static
// functions; nothing is mutated after construction.
unsafe impl Send for StreamBufferType {}
// SAFETY: as above.
unsafe impl Sync for StreamBufferType {}

static NEXT_BUFT_ID: AtomicU64 = AtomicU64::new(0);

impl StreamBufferType {
    /// `offsets`: file offset of every tensor that may be placed in this buffer type.
    pub fn new(region: Arc<StreamRegion>, offsets: HashMap<String, u64>) -> StreamBufferType {
        // llama.cpp groups tensors by buffer-type name: each instance gets its own.
        let id = NEXT_BUFT_ID.fetch_add(1, Ordering::Relaxed);
        let name = CString::new(format!("HYPURA_STREAM_{id}")).expect("no NUL");
        let ctx = Box::new(BuftContext {
            name,
            loading: std::sync::atomic::AtomicBool::new(true),
            region,
            offsets,
        });
        // SAFETY: returns the CPU device (or NULL) from ggml's registry.
        let device = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        let raw = Box::new(BufferType {
            iface: BufferTypeInterface {
                get_name: Some(buft_get_name),
                alloc_buffer: Some(buft_alloc_buffer),
                alloc_buffer_n: Some(buft_alloc_buffer_n),
                get_alignment: Some(buft_get_alignment),
                get_max_size: None,
                get_alloc_size: None,
                get_alloc_size_n: None,
                is_host: Some(buft_is_host),
            },
            device: device as _,
            context: &*ctx as *const BuftContext as *mut c_void,
        });
        StreamBufferType { raw, ctx }
    }

    /// The handle to give llama.cpp (`tensor_buft_overrides`).
    pub fn handle(&self) -> sys::ggml_backend_buffer_type_t {
        &*self.raw as *const BufferType as sys::ggml_backend_buffer_type_t
    }

    /// Ends the loading phase (see `BuftContext::loading`).
    pub(crate) fn finish_loading(&self) {
        self.ctx.loading.store(false, Ordering::SeqCst);
    }
}

unsafe fn buft_context<'a>(buft: BufferTypeHandle) -> &'a BuftContext {
    // SAFETY: `context` was set to the boxed BuftContext, alive with the buffer type.
    unsafe { &*((*buft).context as *const BuftContext) }
}

unsafe extern "C" fn buft_get_name(buft: BufferTypeHandle) -> *const std::os::raw::c_char {
    // SAFETY: called by ggml on our buffer type.
    unsafe { buft_context(buft) }.name.as_ptr()
}

unsafe extern "C" fn buft_alloc_buffer(_: BufferTypeHandle, _: usize) -> BufferHandle {
    // Only `alloc_buffer_n` can place tensors at their file offsets.
    tracing::error!("the STREAM buffer type cannot allocate an anonymous buffer");
    std::ptr::null_mut()
}

unsafe extern "C" fn buft_get_alignment(_: BufferTypeHandle) -> usize {
    32
}

unsafe extern "C" fn buft_is_host(buft: BufferTypeHandle) -> bool {
    // SAFETY: called by ggml on our buffer type.
    !unsafe { buft_context(buft) }.loading.load(Ordering::SeqCst)
}

unsafe extern "C" fn buft_alloc_buffer_n(
    buft: BufferTypeHandle,
    tensors: *mut *mut sys::ggml_tensor,
    n_tensors: std::os::raw::c_int,
) -> BufferHandle {
    // SAFETY (whole function): ggml passes our buffer type and `n_tensors`
    // valid tensor pointers; the region outlives the buffer.
    unsafe {
        let ctx = buft_context(buft);
        let base = ctx.region.base();
        let buffer = ggml_backend_buffer_init(
            buft,
            BUFFER_IFACE,
            (ctx as *const BuftContext) as *mut c_void,
            ctx.region.len(),
        );
        if buffer.is_null() {
            return buffer;
        }
        for i in 0..n_tensors.max(0) as usize {
            let t = *tensors.add(i);
            let name = CStr::from_ptr((*t).name.as_ptr()).to_string_lossy();
            let Some(&offset) = ctx.offsets.get(name.as_ref()) else {
                tracing::error!(
                    "tensor {name} was placed on the STREAM tier but is not in the file"
                );
                sys::ggml_backend_buffer_free(buffer as sys::ggml_backend_buffer_t);
                return std::ptr::null_mut();
            };
            let status = sys::ggml_backend_tensor_alloc(
                buffer as sys::ggml_backend_buffer_t,
                t,
                base.add(offset as usize) as *mut c_void,
            );
            if status != sys::GGML_STATUS_SUCCESS {
                sys::ggml_backend_buffer_free(buffer as sys::ggml_backend_buffer_t);
                return std::ptr::null_mut();
            }
        }
        buffer
    }
}

const BUFFER_IFACE: BufferInterface = BufferInterface {
    free_buffer: None,
    get_base: Some(buffer_get_base),
    init_tensor: None,
    memset_tensor: Some(buffer_memset_tensor),
    set_tensor: Some(buffer_set_tensor),
    get_tensor: Some(buffer_get_tensor),
    set_tensor_2d: None,
    get_tensor_2d: None,
    cpy_tensor: None,
    clear: Some(buffer_clear),
    reset: None,
};

unsafe extern "C" fn buffer_get_base(buffer: BufferHandle) -> *mut c_void {
    // SAFETY: the buffer's context is our BuftContext.
    unsafe { (*((*buffer).context as *const BuftContext)).region.base() as *mut c_void }
}

unsafe extern "C" fn buffer_memset_tensor(
    _: BufferHandle,
    t: *mut sys::ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    // SAFETY: ggml checks `offset + size` against the tensor's size.
    unsafe { std::ptr::write_bytes(((*t).data as *mut u8).add(offset), value, size) }
}

unsafe extern "C" fn buffer_set_tensor(
    _: BufferHandle,
    _: *mut sys::ggml_tensor,
    _: *const c_void,
    _: usize,
    _: usize,
) {
    // The loader's staged copy of a STREAM tensor holds no file bytes (the
    // load file skipped them): the streamer fills the region itself.
}

unsafe extern "C" fn buffer_get_tensor(
    _: BufferHandle,
    t: *const sys::ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    // SAFETY: as above; the destination holds `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(((*t).data as *const u8).add(offset), data as *mut u8, size)
    }
}

unsafe extern "C" fn buffer_clear(_: BufferHandle, _: u8) {
    // Weights are never cleared; pages are managed by the streamer.
}

/// A graph node handed to an [`EvalHook`] once it has been computed.
pub struct Node {
    raw: *mut sys::ggml_tensor,
}

impl Node {
    /// `ne[1]`: rows of the node's matrix (for a router's choice, the
    /// ubatch's tokens). Known before the node is computed.
    pub fn n_rows(&self) -> usize {
        // SAFETY: `raw` is a graph node alive during the callback; its shape
        // is set when the graph is built.
        unsafe { (*self.raw).ne[1].max(0) as usize }
    }

    /// Rows of an I32 matrix `[ne0, ne1]` (e.g. the selected experts, one row per token).
    pub fn i32_rows(&self) -> Vec<Vec<i32>> {
        // SAFETY: `raw` is a computed node alive during the callback; each row
        // read stays inside the tensor (offset i*nb1, ne0*4 bytes).
        unsafe {
            let t = &*self.raw;
            if t.type_ != sys::GGML_TYPE_I32 {
                return Vec::new();
            }
            let (ne0, ne1) = (t.ne[0].max(0) as usize, t.ne[1].max(0) as usize);
            (0..ne1)
                .map(|i| {
                    let mut row = vec![0i32; ne0];
                    sys::ggml_backend_tensor_get(
                        self.raw,
                        row.as_mut_ptr() as *mut c_void,
                        i * t.nb[1],
                        ne0 * 4,
                    );
                    row
                })
                .collect()
        }
    }
}

/// Told about graph nodes while llama.cpp computes. `wants` is asked for
/// every node (not yet computed: only its shape may be read) and must be
/// cheap; `computed` runs on the decoding thread after a wanted node is
/// computed and before any later node runs.
pub trait EvalHook: Send + Sync {
    fn wants(&self, name: &[u8], node: &Node) -> bool;
    fn computed(&self, name: &[u8], node: &Node);
    /// True once the hook could not do its job (e.g. a read failed): the
    /// running decode is aborted rather than computed with missing weights.
    fn failed(&self) -> bool {
        false
    }
    /// The reason of the failure, clearing it.
    fn take_error(&self) -> Option<String> {
        None
    }
    /// A decode on the calling thread has ended (whether it succeeded or
    /// not): nothing it computed with is in use any more.
    fn decode_done(&self) {}
}

/// The `cb_eval` trampoline; `user_data` is a `*const Arc<dyn EvalHook>`.
pub(crate) unsafe extern "C" fn eval_trampoline(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user_data: *mut c_void,
) -> bool {
    // SAFETY: `user_data` points at the Arc boxed in the Context, alive for
    // every decode; `t` is a valid node during the call.
    unsafe {
        let hook = &*(user_data as *const Arc<dyn EvalHook>);
        let name = CStr::from_ptr((*t).name.as_ptr()).to_bytes();
        if ask {
            return hook.wants(name, &Node { raw: t });
        }
        hook.computed(name, &Node { raw: t });
    }
    // Returning false would only cut the current split short.
    true
}

/// Statistics of a tiered load.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadReport {
    /// Bytes read from the file at load (header and resident tensors).
    pub bytes_read: u64,
    /// Bytes llama.cpp asked for that lie in STREAM tensors, and were not read.
    pub stream_bytes_skipped: u64,
}

/// The file llama.cpp loads through: a `FILE*` (glibc `fopencookie`) whose
/// reads come from the model file, except reads of STREAM tensors' bytes,
/// which are answered without reading anything from disk (the caller's
/// staging buffer keeps whatever it held). llama.cpp's own loader thus runs
/// unchanged (same tensors, same buffer types as a normal load) while no
/// STREAM byte is read and no STREAM page is touched.
pub(crate) struct LoadFile {
    file: File,
    len: u64,
    pos: u64,
    /// Sorted, disjoint file ranges of STREAM tensors.
    skip: Vec<(u64, u64)>,
    /// Sorted offsets where tensors start: reads stop there, so glibc's
    /// read-ahead never fetches bytes of a tensor nobody asked for.
    boundaries: Vec<u64>,
    report: LoadReport,
    error: Option<io::Error>,
}

#[repr(C)]
struct CookieIoFunctions {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut std::os::raw::c_char, usize) -> isize>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const std::os::raw::c_char, usize) -> isize>,
    seek: Option<
        unsafe extern "C" fn(*mut c_void, *mut i64, std::os::raw::c_int) -> std::os::raw::c_int,
    >,
    close: Option<unsafe extern "C" fn(*mut c_void) -> std::os::raw::c_int>,
}

extern "C" {
    fn fopencookie(
        cookie: *mut c_void,
        mode: *const std::os::raw::c_char,
        funcs: CookieIoFunctions,
    ) -> *mut libc::FILE;
}

impl LoadFile {
    pub(crate) fn new(
        file: File,
        mut skip: Vec<(u64, u64)>,
        mut boundaries: Vec<u64>,
    ) -> io::Result<LoadFile> {
        let len = file.metadata()?.len();
        skip.sort_unstable();
        boundaries.sort_unstable();
        Ok(LoadFile {
            file,
            len,
            pos: 0,
            skip,
            boundaries,
            report: LoadReport::default(),
            error: None,
        })
    }

    /// Splits a read of `[start, end)` at STREAM range boundaries: returns
    /// how many bytes to serve first and whether they are skipped.
    fn next_piece(&self, start: u64, end: u64) -> (u64, bool) {
        let i = self.skip.partition_point(|&(_, e)| e <= start);
        match self.skip.get(i) {
            Some(&(a, b)) if a <= start => (end.min(b) - start, true),
            Some(&(a, _)) if a < end => (a - start, false),
            _ => (end - start, false),
        }
    }

    /// Opens the `FILE*`; `self` must stay in place until [`LoadFile::close`].
    pub(crate) fn open(&mut self) -> io::Result<*mut libc::FILE> {
        let funcs = CookieIoFunctions {
            read: Some(cookie_read),
            write: None,
            seek: Some(cookie_seek),
            close: None,
        };
        // SAFETY: `self` outlives the FILE (closed in `close` before `self` moves).
        unsafe {
            let fp = fopencookie(self as *mut LoadFile as *mut c_void, c"r".as_ptr(), funcs);
            if fp.is_null() {
                return Err(io::Error::last_os_error());
            }
            // glibc copies cookie reads through the stream buffer: make it big
            // enough that resident tensors load in large reads.
            libc::setvbuf(fp, std::ptr::null_mut(), libc::_IOFBF, 1 << 20);
            Ok(fp)
        }
    }

    pub(crate) fn close(&mut self, fp: *mut libc::FILE) -> (LoadReport, Option<io::Error>) {
        // SAFETY: `fp` came from `open` and is closed once.
        unsafe { libc::fclose(fp) };
        (self.report, self.error.take())
    }
}

unsafe extern "C" fn cookie_read(
    cookie: *mut c_void,
    buf: *mut std::os::raw::c_char,
    size: usize,
) -> isize {
    use std::os::unix::fs::FileExt;
    // SAFETY: the cookie is the LoadFile given to fopencookie; `buf` holds `size` bytes.
    let this = unsafe { &mut *(cookie as *mut LoadFile) };
    let start = this.pos;
    let n = (size as u64).min(this.len.saturating_sub(start));
    if n == 0 {
        return 0;
    }
    // glibc accepts short reads: serve one piece (skipped or read) per call.
    let (mut n, skipped) = this.next_piece(start, start + n);
    if skipped {
        this.pos += n;
        this.report.stream_bytes_skipped += n;
        return n as isize;
    }
    let next = this.boundaries.partition_point(|&b| b <= start);
    if let Some(&boundary) = this.boundaries.get(next) {
        n = n.min(boundary - start);
    }
    // SAFETY: as above; the slice covers only the caller's buffer.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n as usize) };
    match this.file.read_at(dst, start) {
        Ok(read) => {
            this.pos += read as u64;
            this.report.bytes_read += read as u64;
            read as isize
        }
        Err(e) => {
            this.error = Some(e);
            -1
        }
    }
}

unsafe extern "C" fn cookie_seek(
    cookie: *mut c_void,
    offset: *mut i64,
    whence: std::os::raw::c_int,
) -> std::os::raw::c_int {
    // SAFETY: the cookie is the LoadFile given to fopencookie; `offset` is valid.
    let (this, offset) = unsafe { (&mut *(cookie as *mut LoadFile), &mut *offset) };
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => this.pos as i64,
        libc::SEEK_END => this.len as i64,
        _ => return -1,
    };
    let target = base + *offset;
    if target < 0 {
        return -1;
    }
    this.pos = target as u64;
    *offset = target;
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A file of `pages` pages, page `i` filled with byte `i + 1`.
    fn paged_file(pages: u64) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "hypura-stream-region-{}-{pages}",
            std::process::id()
        ));
        let mut f = File::create(&path).unwrap();
        for i in 0..pages {
            f.write_all(&vec![(i + 1) as u8; PAGE as usize]).unwrap();
        }
        (path.clone(), File::open(&path).unwrap())
    }

    fn byte(region: &StreamRegion, offset: u64) -> u8 {
        // SAFETY: `offset` lies inside the region; plain memory.
        unsafe { *region.base().add(offset as usize) }
    }

    /// Whether every mapping starting in `[lo, hi)` has `flag` among its
    /// `VmFlags` in `/proc/self/smaps`, and there is at least one.
    fn mappings_have_flag(lo: usize, hi: usize, flag: &str) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut seen = 0;
        for line in smaps.lines() {
            if let Some(from) = mapping_start(line) {
                inside = (lo..hi).contains(&from);
            } else if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                if !flags.split_whitespace().any(|f| f == flag) {
                    return false;
                }
                seen += 1;
            }
        }
        seen > 0
    }

    #[test]
    fn the_region_and_its_bank_never_take_huge_pages() {
        // `nh`: MADV_NOHUGEPAGE, kept by the pieces moves split off.
        let (path, file) = paged_file(16);
        let region = StreamRegion::reserve(16 * PAGE).unwrap();
        region.open_bank(16 * PAGE, 4).unwrap();
        region.read_from(&file, 0, 8 * PAGE).unwrap();
        region.retire(0, 4 * PAGE);
        region.adopt(8 * PAGE, 12 * PAGE);
        let lo = region.base() as usize;
        assert!(mappings_have_flag(lo, lo + region.len(), "nh"));
        let (bank_lo, bank_hi) = region.bank_range().unwrap();
        assert!(mappings_have_flag(bank_lo, bank_hi, "nh"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn an_evicted_units_pages_back_the_next_load_and_the_rest_are_released() {
        let (path, file) = paged_file(64);
        let region = StreamRegion::reserve(64 * PAGE).unwrap();
        region.open_bank(16 * PAGE, 4).unwrap();
        // Unit Y: pages 2..10 (its first and last page shared with neighbours).
        let (y0, y1) = (2 * PAGE - 100, 10 * PAGE + 100);
        region.read_from(&file, y0, y1).unwrap();
        let resident = region.resident_bytes();
        assert_eq!(resident, 10 * PAGE, "pages 1..=10 read");
        region.retire(y0, y1);
        // Y's whole pages read as zero again; its boundary pages stay.
        assert_eq!(byte(&region, 5 * PAGE), 0);
        assert_eq!(byte(&region, 2 * PAGE - 1), 2);
        // The pages moved, not freed: the region holds only the boundary ones.
        assert_eq!(region.resident_bytes(), 2 * PAGE);
        // Unit X: pages 40..52, twelve whole pages; the bank has eight.
        let (x0, x1) = (40 * PAGE, 52 * PAGE);
        let (m0, m1) = region.adopt(x0, x1);
        assert_eq!((m0, m1), (40 * PAGE, 48 * PAGE));
        // Present before any read: they hold Y's old bytes until it lands.
        assert_eq!(region.resident_bytes(), 10 * PAGE);
        assert_ne!(byte(&region, 40 * PAGE), 0);
        region.read_from(&file, x0, x1).unwrap();
        for p in 40..52 {
            assert_eq!(byte(&region, p * PAGE), (p + 1) as u8, "page {p}");
        }
        // Nothing left to adopt; a drained bank holds nothing.
        assert_eq!(region.adopt(60 * PAGE, 62 * PAGE), (60 * PAGE, 60 * PAGE));
        region.retire(x0, x1);
        region.drain_bank();
        assert_eq!(region.adopt(60 * PAGE, 62 * PAGE), (60 * PAGE, 60 * PAGE));
        assert_eq!(region.resident_bytes(), 2 * PAGE);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_full_bank_or_none_releases_as_before() {
        let (path, file) = paged_file(32);
        let region = StreamRegion::reserve(32 * PAGE).unwrap();
        region.read_from(&file, 0, 8 * PAGE).unwrap();
        // No bank: retiring releases.
        region.retire(0, 4 * PAGE);
        assert_eq!(region.resident_bytes(), 4 * PAGE);
        assert_eq!(region.adopt(16 * PAGE, 20 * PAGE), (16 * PAGE, 16 * PAGE));
        // A bank of two pages: four do not fit, and are released.
        region.open_bank(2 * PAGE, 4).unwrap();
        region.retire(4 * PAGE, 8 * PAGE);
        assert_eq!(region.resident_bytes(), 0);
        assert_eq!(region.adopt(16 * PAGE, 20 * PAGE), (16 * PAGE, 16 * PAGE));
        std::fs::remove_file(path).unwrap();
    }

    /// The kernel's mappings of this process that begin inside `[lo, hi)`.
    fn mappings_within(lo: usize, hi: usize) -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(mapping_start)
            .filter(|from| (lo..hi).contains(from))
            .count()
    }

    #[test]
    fn moves_stop_at_the_split_points_the_process_has_room_for() {
        let (path, file) = paged_file(33);
        let region = StreamRegion::reserve(33 * PAGE).unwrap();
        // Room for two split points: one range's ends.
        region.open_bank_with(8 * PAGE, 4, 2).unwrap();
        region.read_from(&file, 0, 12 * PAGE).unwrap();
        region.retire(0, 4 * PAGE);
        assert_eq!(region.resident_bytes(), 8 * PAGE, "moved to the bank");
        // Moving 8..12 would split the region at two new points: released.
        region.retire(8 * PAGE, 12 * PAGE);
        assert_eq!(region.resident_bytes(), 4 * PAGE);
        // Into new points, refused; back into the same range's, taken.
        assert_eq!(region.adopt(16 * PAGE, 20 * PAGE), (16 * PAGE, 16 * PAGE));
        assert_eq!(region.adopt(0, 4 * PAGE), (0, 4 * PAGE));
        assert_eq!(region.resident_bytes(), 8 * PAGE);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_load_takes_a_runs_top_pages_and_the_bank_stays_in_few_pieces() {
        let (path, file) = paged_file(130);
        let region = StreamRegion::reserve(130 * PAGE).unwrap();
        region.open_bank_with(128 * PAGE, 2, usize::MAX).unwrap();
        let (b0, b1) = region.bank_range().unwrap();
        for i in 0..120u64 {
            // A run of 1 to 60 pages moved in, its top part moved out: the
            // bank's mapping is split at offsets that vary (here the kernel
            // merges the pieces back; `drain_bank` maps it whole again
            // where a kernel does not).
            let len = 1 + (i * 37) % 60;
            region.read_from(&file, 0, len * PAGE).unwrap();
            region.retire(0, len * PAGE);
            let take = 1 + (i * 13) % len;
            let to = 64 * PAGE;
            assert_eq!(region.adopt(to, to + take * PAGE), (to, to + take * PAGE));
            assert_eq!(byte(&region, to), (len - take + 1) as u8);
            region.drain_bank();
            region.release(to, to + take * PAGE);
            let bank = mappings_within(b0, b1);
            assert!(bank <= 5 * 2 + 1, "{bank} bank mappings after {i}");
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn recycling_splits_the_region_only_at_its_ranges_ends() {
        // A layer's three expert tensors of 3, 2 and 5 pages an expert,
        // each holding its 8 experts end to end, over 4 layers, with a
        // page of other tensors between layers: a unit is (layer, expert)
        // with one range per tensor.
        let (experts, layers, sizes) = (8u64, 4u64, [3u64, 2, 5]);
        let layer_pages = 1 + experts * sizes.iter().sum::<u64>();
        let pages = layers * layer_pages;
        let (path, file) = paged_file(pages);
        let region = StreamRegion::reserve(pages * PAGE).unwrap();
        let unit = |u: u64| -> Vec<(u64, u64)> {
            let (layer, expert) = (u / experts, u % experts);
            let mut start = layer * layer_pages + 1;
            sizes
                .iter()
                .map(|&n| {
                    let a = start + expert * n;
                    start += experts * n;
                    (a * PAGE, (a + n) * PAGE)
                })
                .collect()
        };
        let all: Vec<(u64, u64)> = (0..layers * experts).flat_map(unit).collect();
        let points = recycling_split_points(&all);
        // A layer's tensors end to end: a point per range and one more.
        assert_eq!(points as u64, layers * (sizes.len() as u64 * experts + 1));
        region.open_bank_with(20 * PAGE, 6, points).unwrap();
        let (lo, hi) = (
            region.base() as usize,
            region.base() as usize + region.len(),
        );
        let before = mappings_within(lo, hi);
        // Twelve of 32 units resident; each load evicts one, chosen by an
        // LCG, the streamer's way: its ranges retired last first, the new
        // unit's adopted first to last.
        let mut resident: Vec<u64> = (0..12).collect();
        let mut seed = 7u64;
        let (mut loads, mut whole) = (0, 0);
        for _ in 0..400 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let next = (seed >> 33) % (layers * experts);
            if resident.contains(&next) {
                continue;
            }
            let victim = resident.remove((seed >> 40) as usize % resident.len());
            for (a, b) in unit(victim).into_iter().rev() {
                region.retire(a, b);
            }
            let ranges = unit(next);
            let adopted: Vec<(u64, u64)> =
                ranges.iter().map(|&(a, b)| region.adopt(a, b)).collect();
            region.drain_bank();
            loads += 1;
            whole += (adopted == ranges) as u32;
            for &(a, b) in &ranges {
                region.read_from(&file, a, b).unwrap();
                assert_eq!(byte(&region, a), (a / PAGE + 1) as u8);
                assert_eq!(byte(&region, b - 1), (b / PAGE) as u8);
            }
            resident.push(next);
        }
        // Every load took a whole unit of pages, each range its own.
        assert!(loads > 100, "{loads}");
        assert_eq!(whole, loads);
        // The region's mappings: one more than its split points at most.
        let after = mappings_within(lo, hi);
        assert!(after > before, "moves split the region");
        assert!(
            after <= points + 1,
            "{after} mappings for {points} split points"
        );
        // The bank's own, mapped whole again as moves split it.
        let (b0, b1) = region.bank_range().unwrap();
        let bank = mappings_within(b0, b1);
        assert!((1..=5 * 6 + 1).contains(&bank), "{bank} bank mappings");
        std::fs::remove_file(path).unwrap();
    }
}
