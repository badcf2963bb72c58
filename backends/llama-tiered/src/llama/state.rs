//! One sequence's KV state out of a context and into another
//! (`llama_state_seq_*`): how the prompt cache saves a conversation before
//! its slot goes to another, and how a batch engine moves its sequences onto
//! a new placement of the same model between two decode steps.
//!
//! States are saved into [`StateBuffers`]: an arena of host memory made
//! before requests run, pinned for the GPU where there is one. A state is
//! often a gigabyte; writing it into fresh memory costs a page fault per
//! page, a GPU copies into pageable memory through a bounce buffer at a
//! fraction of the bus's speed (a save into a new `Vec` took ten times its
//! restore), and making pinned memory while the GPU works stalls that work.
use std::collections::BTreeMap;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use hypura_llama_sys as sys;

use super::context::Context;
use super::device::{devices, CudaHostRegister, Device, PinnedHostBytes};
use crate::error::EngineError;

impl Context {
    /// The bytes of sequence `seq`'s state ([`Context::seq_state`]).
    pub fn seq_state_bytes(&mut self, seq: i32) -> usize {
        // SAFETY: the context is alive; the size call only reads it.
        unsafe { sys::llama_state_seq_get_size(self.as_ptr(), seq) }
    }

    /// A copy of sequence `seq`'s KV cache (empty for an unused sequence),
    /// in memory from `buffers`.
    pub fn seq_state(
        &mut self,
        seq: i32,
        buffers: &StateBuffers,
    ) -> Result<StateBuffer, EngineError> {
        let size = self.seq_state_bytes(seq);
        let mut state = buffers.take(size)?;
        // SAFETY: `state` has room for `size` bytes (`take`), the size
        // llama.cpp asked for; it writes at most that many.
        let written =
            unsafe { sys::llama_state_seq_get_data(self.as_ptr(), state.as_mut_ptr(), size, seq) };
        if written != size {
            return Err(EngineError::Context(format!(
                "llama.cpp wrote {written} of the {size} bytes of sequence {seq}'s state"
            )));
        }
        state.len = size;
        Ok(state)
    }

    /// Replaces sequence `seq`'s KV cache with `state` from
    /// [`Context::seq_state`] of a context of the same model file.
    pub fn set_seq_state(&mut self, seq: i32, state: &[u8]) -> Result<(), EngineError> {
        self.clear_seq(seq, -1);
        if state.is_empty() {
            return Ok(());
        }
        // SAFETY: the context is alive; `state` is valid for `len` bytes and
        // only read. llama.cpp checks the layout and returns 0 on mismatch.
        let read = unsafe {
            sys::llama_state_seq_set_data(self.as_ptr(), state.as_ptr(), state.len(), seq)
        };
        if read == 0 {
            return Err(EngineError::Context(format!(
                "llama.cpp refused sequence {seq}'s state ({} bytes): not from the same model shape?",
                state.len()
            )));
        }
        Ok(())
    }
}

/// Host memory for sequence states: an arena made ahead of the saves
/// ([`StateBuffers::reserve`]), in blocks each large enough for the largest
/// state of one sequence, that saves take ranges of and give back when
/// dropped. Pinned for the GPU where there is one: a gigabyte of pinned
/// memory took 0.4–0.7 s to make on the H200 and stalled the GPU's other
/// work meanwhile, so none is made while requests run (vLLM's pinned swap
/// space, made at start, for the same reason). A state that finds no range
/// gets mapped pages of its own, freed with it. Cloning shares the pool.
#[derive(Clone, Default)]
pub struct StateBuffers(Arc<Pool>);

#[derive(Default)]
struct Pool {
    /// The GPU whose pinned host memory the arena is made of; `None`: mapped pages.
    pin: Option<Device>,
    arena: Mutex<Arena>,
    /// Buffers of memory made outside the arena (a state that found no range).
    made: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Arena {
    blocks: Vec<Block>,
}

/// One piece of the arena and the ranges of it no state holds.
struct Block {
    memory: Arc<BlockMemory>,
    /// Free ranges, offset → length; never two adjacent.
    free: BTreeMap<usize, usize>,
}

/// A block's memory; ranges of it are written through `base` by the one
/// [`StateBuffer`] holding each.
struct BlockMemory {
    base: NonNull<u8>,
    memory: Memory,
}

impl BlockMemory {
    fn new(mut memory: Memory) -> BlockMemory {
        let base = NonNull::new(memory.as_mut_ptr()).expect("host memory at address 0");
        BlockMemory { base, memory }
    }
}

impl Block {
    fn len(&self) -> usize {
        self.memory.memory.capacity()
    }

    fn free_bytes(&self) -> usize {
        self.free.values().sum()
    }

    /// Gives `offset..offset + len` back, merged with its free neighbours.
    fn give_back(&mut self, mut offset: usize, mut len: usize) {
        if let Some((&before, &before_len)) = self.free.range(..offset).next_back() {
            if before + before_len == offset {
                self.free.remove(&before);
                offset = before;
                len += before_len;
            }
        }
        if let Some(after_len) = self.free.remove(&(offset + len)) {
            len += after_len;
        }
        self.free.insert(offset, len);
    }
}

impl Arena {
    fn bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.len() as u64).sum()
    }

    /// The index of the block of `memory`, while the arena holds it.
    fn block_of(&self, memory: &Arc<BlockMemory>) -> Option<usize> {
        self.blocks
            .iter()
            .position(|b| Arc::ptr_eq(&b.memory, memory))
    }

    /// The smallest free range of at least `len` bytes: (block index, offset).
    fn best_fit(&self, len: usize) -> Option<(usize, usize)> {
        self.blocks
            .iter()
            .enumerate()
            .flat_map(|(b, block)| block.free.iter().map(move |(&off, &n)| (n, b, off)))
            .filter(|&(n, _, _)| n >= len)
            .min()
            .map(|(_, b, off)| (b, off))
    }
}

impl StateBuffers {
    /// A pool whose arena is pinned for the first GPU when this process has
    /// one (copies from and to its KV run at the bus's speed), else mapped
    /// host pages. It holds no arena until [`StateBuffers::reserve`].
    pub fn for_this_machine() -> StateBuffers {
        let pin = devices().into_iter().find(Device::is_gpu);
        StateBuffers(Arc::new(Pool {
            pin,
            arena: Mutex::default(),
            made: Default::default(),
        }))
    }

    /// Makes the arena `bytes` large, in blocks of `block_bytes` (the
    /// largest state of one sequence) and one smaller block for the rest:
    /// new blocks are made now, on the caller's thread; blocks beyond it
    /// are let go, the emptiest first (a state still in one keeps its
    /// memory until it is dropped).
    pub fn reserve(&self, bytes: u64, block_bytes: usize) {
        let block_bytes = block_bytes.next_multiple_of(RANGE_ALIGN).max(RANGE_ALIGN);
        let mut arena = self.0.lock();
        while arena.bytes() > bytes {
            let emptiest = (0..arena.blocks.len())
                .max_by_key(|&i| arena.blocks[i].free_bytes())
                .expect("an arena with bytes has a block");
            arena.blocks.swap_remove(emptiest);
        }
        loop {
            let left = bytes - arena.bytes();
            let len = (left.min(block_bytes as u64) as usize) / RANGE_ALIGN * RANGE_ALIGN;
            if len < MIN_BLOCK.min(block_bytes) {
                return;
            }
            let Ok(memory) = self.0.alloc(len) else {
                tracing::warn!("prompt cache: could not make {len} bytes of state memory");
                return;
            };
            arena.blocks.push(Block {
                memory: Arc::new(BlockMemory::new(memory)),
                free: BTreeMap::from([(0, len)]),
            });
        }
    }

    /// Whether `state` holds a range of a block this arena has let go
    /// ([`StateBuffers::reserve`] to less): its whole block stays until it
    /// is dropped.
    pub fn orphaned(&self, state: &StateBuffer) -> bool {
        match &state.held {
            Held::Range { memory, .. } => self.0.lock().block_of(memory).is_none(),
            Held::Own(_) => false,
        }
    }

    /// Bytes of the arena.
    pub fn reserved_bytes(&self) -> u64 {
        self.0.lock().bytes()
    }

    /// Bytes of the arena no state holds.
    pub fn free_bytes(&self) -> u64 {
        let arena = self.0.lock();
        arena.blocks.iter().map(|b| b.free_bytes() as u64).sum()
    }

    /// How many buffers of memory outside the arena this pool has made
    /// (states that found no free range in it).
    pub fn made(&self) -> u64 {
        self.0.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A buffer of `len` bytes that `fill` wrote (`None` when it failed or
    /// no memory could be had).
    pub fn filled(&self, len: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> Option<StateBuffer> {
        let mut buffer = self.take(len).ok()?;
        // SAFETY: `take` gave room for `len` bytes of memory this buffer
        // owns alone; whatever they held is overwritten or ignored.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr(), len) };
        if !fill(bytes) {
            return None;
        }
        buffer.len = len;
        Some(buffer)
    }

    /// The memory a state of `size` bytes takes once saved, in the arena or
    /// out of it: what a cache must make room for before the save, so that
    /// keeping the state never evicts a second entry.
    pub fn room_for(size: usize) -> usize {
        capacity_for(size)
    }

    /// Whether the arena has a free range for a state of `size` bytes.
    pub fn has_fit(&self, size: usize) -> bool {
        self.0.lock().best_fit(capacity_for(size)).is_some()
    }

    /// A buffer with room for `size` bytes (its length 0): the smallest free
    /// range of the arena that holds it, else mapped pages of its own.
    fn take(&self, size: usize) -> Result<StateBuffer, EngineError> {
        let len = capacity_for(size);
        let range = {
            let mut arena = self.0.lock();
            arena.best_fit(len).map(|(b, offset)| {
                let block = &mut arena.blocks[b];
                let free = block.free.remove(&offset).expect("best_fit found it");
                if free > len {
                    block.free.insert(offset + len, free - len);
                }
                Held::Range {
                    memory: Arc::clone(&block.memory),
                    offset,
                    len,
                }
            })
        };
        let held = match range {
            Some(range) => range,
            None => {
                self.0
                    .made
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Held::Own(Memory::Mapped(Mapped::new(len)?))
            }
        };
        Ok(StateBuffer {
            held,
            len: 0,
            home: Arc::downgrade(&self.0),
        })
    }
}

// SAFETY: `pin` is a handle into ggml's device registry, which lives as long
// as the process; it is only used to allocate host buffers, which ggml allows
// from any thread. The arena is behind its mutex.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of the arena: on a GPU mapped pages touched by several
    /// threads and registered with the CUDA runtime (8 GiB in ~1 s), else
    /// a pinned allocation through ggml (~4 s for 8 GiB on the H200), else
    /// mapped pages.
    fn alloc(&self, capacity: usize) -> Result<Memory, EngineError> {
        if let Some(cuda) = self.pin.as_ref().and_then(|_| CudaHostRegister::find()) {
            let pages = Mapped::new(capacity)?;
            touch_pages(pages.ptr.as_ptr(), capacity);
            // SAFETY: the mapping lives in `Registered`, which unregisters
            // it before it is unmapped.
            if unsafe { cuda.register(pages.ptr.as_ptr(), capacity) } {
                return Ok(Memory::Registered(Registered { pages, cuda }));
            }
            tracing::debug!("state memory: the driver did not register {capacity} bytes");
        }
        if let Some(dev) = &self.pin {
            match PinnedHostBytes::alloc(dev, capacity) {
                Ok(Some(pinned)) => return Ok(Memory::Pinned(pinned)),
                Ok(None) => {}
                Err(e) => tracing::debug!("state memory: no pinned memory ({e}): mapped pages"),
            }
        }
        Mapped::new(capacity).map(Memory::Mapped)
    }
}

/// One saved state: `len` bytes of a range of the arena of a
/// [`StateBuffers`] pool, which gets the range back on drop, or of memory
/// of its own.
pub struct StateBuffer {
    held: Held,
    len: usize,
    home: Weak<Pool>,
}

enum Held {
    /// `len` bytes at `offset` of a block's memory, this buffer's alone.
    Range {
        memory: Arc<BlockMemory>,
        offset: usize,
        len: usize,
    },
    Own(Memory),
}

// SAFETY: a range is written only through the one buffer holding it; the
// block's other ranges are other buffers' and never overlap it.
unsafe impl Send for BlockMemory {}
// SAFETY: as above.
unsafe impl Sync for BlockMemory {}

impl StateBuffer {
    /// The memory this state holds: its bytes and the rounding past them.
    pub fn memory_bytes(&self) -> usize {
        match &self.held {
            Held::Range { len, .. } => *len,
            Held::Own(m) => m.capacity(),
        }
    }

    fn as_ptr(&self) -> *const u8 {
        match &self.held {
            // SAFETY: `offset + len` lies inside the block (`take`).
            Held::Range { memory, offset, .. } => unsafe { memory.base.as_ptr().add(*offset) },
            Held::Own(m) => m.as_ptr(),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.held {
            // SAFETY: as in `as_ptr`; the range is this buffer's alone.
            Held::Range { memory, offset, .. } => unsafe { memory.base.as_ptr().add(*offset) },
            Held::Own(m) => m.as_mut_ptr(),
        }
    }
}

impl Deref for StateBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` ≤ the memory's length, and those bytes were written
        // ([`Context::seq_state`] and `filled` set `len` after they were).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl From<&[u8]> for StateBuffer {
    /// A copy of `bytes` outside any pool (tests, and states read from disk).
    fn from(bytes: &[u8]) -> StateBuffer {
        StateBuffer {
            held: Held::Own(Memory::Heap(bytes.to_vec().into_boxed_slice())),
            len: bytes.len(),
            home: Weak::new(),
        }
    }
}

impl Drop for StateBuffer {
    fn drop(&mut self) {
        let Held::Range {
            ref memory,
            offset,
            len,
        } = self.held
        else {
            return;
        };
        let Some(pool) = self.home.upgrade() else {
            return;
        };
        let mut arena = pool.lock();
        // A block let go meanwhile frees its memory with its last range.
        if let Some(b) = arena.block_of(memory) {
            arena.blocks[b].give_back(offset, len);
        }
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// Ranges of the arena are whole multiples of this.
const RANGE_ALIGN: usize = HUGE_PAGE;

/// No block of the arena is made smaller (unless a state's largest is).
const MIN_BLOCK: usize = 64 << 20;

/// The memory a state of `size` bytes takes (a range, or its own pages).
fn capacity_for(size: usize) -> usize {
    size.max(1).next_multiple_of(RANGE_ALIGN)
}

enum Memory {
    Pinned(PinnedHostBytes),
    Registered(Registered),
    Mapped(Mapped),
    Heap(Box<[u8]>),
}

/// Mapped pages registered with the CUDA runtime, unregistered before they
/// are unmapped.
struct Registered {
    pages: Mapped,
    cuda: &'static CudaHostRegister,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: registered in `Pool::alloc`; still mapped (`pages` is
        // dropped after this).
        unsafe { self.cuda.unregister(self.pages.ptr.as_ptr()) };
    }
}

/// Faults in every page of `start..start + len` (a fresh mapping), on up
/// to eight threads: the kernel zeroes each page on its first write, and
/// one thread did ~2–3 GB/s of it.
fn touch_pages(start: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let chunk = len.div_ceil(threads).next_multiple_of(HUGE_PAGE);
    let base = start as usize;
    std::thread::scope(|scope| {
        for first in (0..len).step_by(chunk.max(PAGE)) {
            let end = (first + chunk).min(len);
            scope.spawn(move || {
                for offset in (first..end).step_by(PAGE) {
                    // SAFETY: inside the caller's fresh mapping; no one
                    // else reads or writes it yet.
                    unsafe { std::ptr::write_volatile((base + offset) as *mut u8, 0) };
                }
            });
        }
    });
}

// SAFETY: each variant owns its memory outright (no aliasing handle is kept
// elsewhere); ggml frees a host buffer from any thread.
unsafe impl Send for Memory {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for Memory {}

impl Memory {
    fn capacity(&self) -> usize {
        match self {
            Memory::Pinned(p) => p.as_slice().len(),
            Memory::Registered(r) => r.pages.capacity,
            Memory::Mapped(m) => m.capacity,
            Memory::Heap(b) => b.len(),
        }
    }

    fn as_ptr(&self) -> *const u8 {
        match self {
            Memory::Pinned(p) => p.as_slice().as_ptr(),
            Memory::Registered(r) => r.pages.ptr.as_ptr(),
            Memory::Mapped(m) => m.ptr.as_ptr(),
            Memory::Heap(b) => b.as_ptr(),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Memory::Pinned(p) => p.as_mut_slice().as_mut_ptr(),
            Memory::Registered(r) => r.pages.ptr.as_ptr(),
            Memory::Mapped(m) => m.ptr.as_ptr(),
            Memory::Heap(b) => b.as_mut_ptr(),
        }
    }
}

/// Anonymous private pages, advised huge (one fault per 2 MiB where
/// transparent huge pages are on in `madvise` mode).
struct Mapped {
    ptr: NonNull<u8>,
    capacity: usize,
}

impl Mapped {
    fn new(capacity: usize) -> Result<Mapped, EngineError> {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(EngineError::Context(format!(
                "could not map {capacity} bytes for a sequence's state: {}",
                std::io::Error::last_os_error()
            )));
        }
        huge_pages(raw.cast(), capacity);
        Ok(Mapped {
            ptr: NonNull::new(raw.cast()).expect("mmap returned null without failing"),
            capacity,
        })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) };
    }
}

/// Advises transparent huge pages for the whole 2 MiB pages inside
/// `start..start + len`; where THP is off this does nothing.
fn huge_pages(start: *mut u8, len: usize) {
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        // SAFETY: the range lies inside the caller's mapping; MADV_HUGEPAGE
        // changes how its pages are backed, never their contents.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn filled(pool: &StateBuffers, size: usize, byte: u8) -> StateBuffer {
        pool.filled(size, |b| {
            b.fill(byte);
            true
        })
        .unwrap()
    }

    #[test]
    fn ranges_of_the_arena_are_reused_and_merge_when_given_back() {
        let pool = StateBuffers::default();
        pool.reserve(64 << 20, 64 << 20);
        assert_eq!(
            (pool.reserved_bytes(), pool.free_bytes()),
            (64 << 20, 64 << 20)
        );
        let a = filled(&pool, 10 * MIB - 100, 1);
        let b = filled(&pool, 10 * MIB, 2);
        let c = filled(&pool, 20 * MIB, 3);
        assert_eq!(pool.made(), 0, "all three in the arena");
        assert_eq!(a.memory_bytes(), 10 * MIB);
        assert_eq!(pool.free_bytes(), 24 << 20);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(c.iter().all(|&x| x == 3), "ranges never overlap");
        let first = a.as_ptr();
        // a and b given back merge: a state as large as both takes their place.
        drop((a, b));
        let ab = filled(&pool, 20 * MIB, 4);
        assert_eq!((ab.as_ptr(), pool.made()), (first, 0));
        assert!(c.iter().all(|&x| x == 3));
        // No range fits: memory of its own, freed with it, the arena untouched.
        assert!(!pool.has_fit(30 * MIB));
        let own = filled(&pool, 30 * MIB, 5);
        assert_eq!((pool.made(), pool.free_bytes()), (1, 24 << 20));
        assert_eq!(StateBuffers::room_for(own.len()), own.memory_bytes());
        drop((own, ab, c));
        assert_eq!(pool.free_bytes(), 64 << 20, "every range back, merged");
        assert!(pool.has_fit(64 * MIB));
    }

    #[test]
    fn the_arena_is_made_in_blocks_and_let_go_emptiest_first() {
        let pool = StateBuffers::default();
        // Two blocks of 16 MiB; the 8 MiB left is under a block's size and
        // the smallest block made: not made.
        pool.reserve(40 << 20, 16 << 20);
        assert_eq!(pool.reserved_bytes(), 32 << 20);
        // A state fits one block, never two.
        assert!(pool.has_fit(16 * MIB) && !pool.has_fit(17 * MIB));
        let held = filled(&pool, 12 * MIB, 7);
        // Shrinking lets the empty block go first.
        pool.reserve(16 << 20, 16 << 20);
        assert_eq!(
            (pool.reserved_bytes(), pool.free_bytes()),
            (16 << 20, 4 << 20)
        );
        assert!(!pool.orphaned(&held));
        // The held state's block goes too; the state keeps its memory.
        pool.reserve(0, 16 << 20);
        assert_eq!(pool.reserved_bytes(), 0);
        assert!(pool.orphaned(&held));
        assert!(held.iter().all(|&x| x == 7));
        drop(held);
        assert_eq!(pool.free_bytes(), 0);
        // Growing again makes new blocks.
        pool.reserve(32 << 20, 16 << 20);
        assert_eq!(pool.free_bytes(), 32 << 20);
    }

    #[test]
    fn pages_touched_on_several_threads_are_all_there() {
        let len = 9 * MIB + 4096;
        let pages = Mapped::new(len).unwrap();
        // SAFETY (test): a fresh mapping of `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(pages.ptr.as_ptr(), len) };
        bytes[len - 1] = 1;
        touch_pages(pages.ptr.as_ptr(), len);
        // Touching writes a zero to the first byte of each page, nothing else.
        assert_eq!((bytes[0], bytes[len - 4096], bytes[len - 1]), (0, 0, 1));
    }

    #[test]
    fn a_buffer_outliving_its_pool_frees_its_memory() {
        let pool = StateBuffers::default();
        pool.reserve(16 << 20, 16 << 20);
        let a = filled(&pool, 4096, 9);
        drop(pool);
        assert_eq!(a.len(), 4096);
        assert!(a.iter().all(|&x| x == 9));
        drop(a);
        let copy = StateBuffer::from(&[1u8, 2, 3][..]);
        assert_eq!(&copy[..], &[1, 2, 3]);
    }
}
