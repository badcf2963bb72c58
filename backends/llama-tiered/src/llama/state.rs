//! One sequence's KV state out of a context and into another
//! (`llama_state_seq_*`): how the prompt cache saves a conversation before
//! its slot goes to another, and how a batch engine moves its sequences onto
//! a new placement of the same model between two decode steps.
//!
//! States are saved into [`StateBuffers`]: host memory kept for reuse, pinned
//! for the GPU where there is one. A state is often a gigabyte; writing it
//! into fresh memory costs a page fault per page, and a GPU copies into
//! pageable memory through a bounce buffer at a fraction of the bus's speed,
//! so a save into a new `Vec` took ten times its restore.
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use hypura_llama_sys as sys;

use super::context::Context;
use super::device::{devices, Device, PinnedHostBytes};
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

/// A pool of host memory for sequence states. A [`StateBuffer`] returns its
/// memory here when dropped; the pool keeps up to [`StateBuffers::set_keep`]
/// bytes of it for later saves and frees the rest. Cloning shares the pool.
#[derive(Clone, Default)]
pub struct StateBuffers(Arc<Pool>);

#[derive(Default)]
struct Pool {
    /// The GPU whose pinned host memory states go into; `None`: mapped pages.
    pin: Option<Device>,
    free: Mutex<Free>,
    /// Buffers of new memory made so far (a save that found no kept one).
    made: std::sync::atomic::AtomicU64,
    /// A thread is making spare buffers ([`StateBuffers::make_spares`]).
    making: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Free {
    /// Oldest returned first.
    buffers: Vec<Memory>,
    bytes: u64,
    keep_bytes: u64,
}

impl StateBuffers {
    /// A pool whose memory is pinned for the first GPU when this process has
    /// one (copies from and to its KV run at the bus's speed), else mapped
    /// host pages. It keeps nothing until [`StateBuffers::set_keep`].
    pub fn for_this_machine() -> StateBuffers {
        let pin = devices().into_iter().find(Device::is_gpu);
        StateBuffers(Arc::new(Pool {
            pin,
            free: Mutex::default(),
            made: Default::default(),
            making: Default::default(),
        }))
    }

    /// Keeps at most `bytes` of returned memory for reuse (the room a
    /// memory budget gives the saves), freeing the oldest beyond it.
    pub fn set_keep(&self, bytes: u64) {
        let mut free = self.0.lock();
        free.keep_bytes = bytes;
        free.trim();
    }

    /// Bytes of memory held for reuse.
    pub fn kept_bytes(&self) -> u64 {
        self.0.lock().bytes
    }

    /// How many buffers of new memory this pool has made (saves that found
    /// no kept buffer to reuse).
    pub fn made(&self) -> u64 {
        self.0.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes, on a thread of its own, up to [`SPARE_BUFFERS`] buffers of
    /// new memory for states a thirty-second larger than `size` (the next
    /// turns of the conversation just saved, or another as long), while the
    /// memory kept for reuse has room for them. A save that finds no kept
    /// memory makes it on the request's path: a gigabyte of pinned memory
    /// took 0.37 s on the H200 against an 18 ms copy into kept memory, and
    /// while the RAM tier fills (the first turns of eight users on four
    /// slots) every save did. Does nothing while an earlier call's thread
    /// still works.
    pub fn make_spares(&self, size: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0.making.swap(true, SeqCst) {
            return;
        }
        let pool = Arc::clone(&self.0);
        let spawned = std::thread::Builder::new()
            .name("hypura-state-spares".into())
            .spawn(move || {
                pool.make_spares(size + size / 32);
                pool.making.store(false, SeqCst);
            });
        if spawned.is_err() {
            self.0.making.store(false, SeqCst);
        }
    }

    /// Whether the thread of [`StateBuffers::make_spares`] is at work.
    pub fn making_spares(&self) -> bool {
        self.0.making.load(std::sync::atomic::Ordering::SeqCst)
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

    /// The most memory a state of `size` bytes takes once saved: what a
    /// cache must make room for before the save, so that keeping the state
    /// never evicts a second entry.
    pub fn room_for(size: usize) -> usize {
        new_capacity(size) + size / 16
    }

    /// Whether memory of `capacity` bytes would be reused for a state of
    /// `size` bytes ([`StateBuffers::take`]).
    pub fn fits(capacity: usize, size: usize) -> bool {
        capacity >= size && capacity <= StateBuffers::room_for(size)
    }

    /// Whether kept memory would take a state of `size` bytes without new
    /// memory being made.
    pub fn has_fit(&self, size: usize) -> bool {
        let free = self.0.lock();
        free.buffers
            .iter()
            .any(|m| StateBuffers::fits(m.capacity(), size))
    }

    /// A buffer with room for `size` bytes (its length 0): the smallest kept
    /// one that fits and is not more than [`StateBuffers::room_for`], else
    /// new memory with room for the state to grow by a thirty-second (a few
    /// turns of a long conversation; more would cost the RAM tier entries).
    fn take(&self, size: usize) -> Result<StateBuffer, EngineError> {
        let reused = {
            let mut free = self.0.lock();
            let best = (0..free.buffers.len())
                .filter(|&i| StateBuffers::fits(free.buffers[i].capacity(), size))
                .min_by_key(|&i| free.buffers[i].capacity());
            best.map(|i| {
                let m = free.buffers.remove(i);
                free.bytes -= m.capacity() as u64;
                m
            })
        };
        let memory = match reused {
            Some(m) => m,
            None => {
                self.0
                    .made
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.0.alloc(new_capacity(size))?
            }
        };
        Ok(StateBuffer {
            memory: Some(memory),
            len: 0,
            home: Arc::downgrade(&self.0),
        })
    }
}

// SAFETY: `pin` is a handle into ggml's device registry, which lives as long
// as the process; it is only used to allocate host buffers, which ggml allows
// from any thread. `free` is behind its mutex.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`StateBuffers::make_spares`]'s work: new memory for states of
    /// `size` bytes, one buffer at a time, while the kept memory has room
    /// for another and holds fewer than [`SPARE_BUFFERS`] that fit them.
    fn make_spares(&self, size: usize) {
        let capacity = new_capacity(size);
        loop {
            {
                let free = self.lock();
                let fitting = free
                    .buffers
                    .iter()
                    .filter(|m| StateBuffers::fits(m.capacity(), size))
                    .count();
                if fitting >= SPARE_BUFFERS || free.bytes + capacity as u64 > free.keep_bytes {
                    return;
                }
            }
            let Ok(memory) = self.alloc(capacity) else {
                return;
            };
            let mut free = self.lock();
            // The room may have gone meanwhile (a save was kept): then the
            // memory is freed here, never held beyond what may be kept.
            if free.bytes + capacity as u64 > free.keep_bytes {
                return;
            }
            free.bytes += capacity as u64;
            free.buffers.push(memory);
        }
    }

    fn alloc(&self, capacity: usize) -> Result<Memory, EngineError> {
        if let Some(dev) = &self.pin {
            match PinnedHostBytes::alloc(dev, capacity) {
                Ok(Some(pinned)) => return Ok(Memory::Pinned(pinned)),
                Ok(None) => {}
                Err(e) => tracing::debug!("state buffer: no pinned memory ({e}): mapped pages"),
            }
        }
        Mapped::new(capacity).map(Memory::Mapped)
    }
}

impl Free {
    fn trim(&mut self) {
        while self.bytes > self.keep_bytes && !self.buffers.is_empty() {
            let oldest = self.buffers.remove(0);
            self.bytes -= oldest.capacity() as u64;
        }
    }
}

/// One saved state: `len` bytes of memory from a [`StateBuffers`] pool,
/// which gets the memory back on drop.
pub struct StateBuffer {
    memory: Option<Memory>,
    len: usize,
    home: Weak<Pool>,
}

impl StateBuffer {
    /// The memory this state holds: its bytes and the room left to grow.
    pub fn memory_bytes(&self) -> usize {
        self.memory.as_ref().map_or(0, Memory::capacity)
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.memory
            .as_mut()
            .map_or(NonNull::dangling().as_ptr(), Memory::as_mut_ptr)
    }
}

impl Deref for StateBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.memory {
            // SAFETY: `len` ≤ the memory's capacity, and llama.cpp wrote
            // those bytes ([`Context::seq_state`] sets `len` after it did).
            Some(m) => unsafe { std::slice::from_raw_parts(m.as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl From<&[u8]> for StateBuffer {
    /// A copy of `bytes` outside any pool (tests, and states read from disk).
    fn from(bytes: &[u8]) -> StateBuffer {
        StateBuffer {
            memory: Some(Memory::Heap(bytes.to_vec().into_boxed_slice())),
            len: bytes.len(),
            home: Weak::new(),
        }
    }
}

impl Drop for StateBuffer {
    fn drop(&mut self) {
        let (Some(memory), Some(pool)) = (self.memory.take(), self.home.upgrade()) else {
            return;
        };
        if matches!(memory, Memory::Heap(_)) {
            return;
        }
        let mut free = pool.lock();
        free.bytes += memory.capacity() as u64;
        free.buffers.push(memory);
        free.trim();
    }
}

const HUGE_PAGE: usize = 2 << 20;

/// Most spare buffers [`StateBuffers::make_spares`] keeps ready: a save
/// takes one while the next is made.
pub const SPARE_BUFFERS: usize = 2;

/// The capacity of new memory for a state of `size` bytes.
fn new_capacity(size: usize) -> usize {
    (size + size / 32).next_multiple_of(HUGE_PAGE)
}

enum Memory {
    Pinned(PinnedHostBytes),
    Mapped(Mapped),
    Heap(Box<[u8]>),
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
            Memory::Mapped(m) => m.capacity,
            Memory::Heap(b) => b.len(),
        }
    }

    fn as_ptr(&self) -> *const u8 {
        match self {
            Memory::Pinned(p) => p.as_slice().as_ptr(),
            Memory::Mapped(m) => m.ptr.as_ptr(),
            Memory::Heap(b) => b.as_ptr(),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Memory::Pinned(p) => p.as_mut_slice().as_mut_ptr(),
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

    fn filled(pool: &StateBuffers, size: usize, byte: u8) -> StateBuffer {
        let mut b = pool.take(size).unwrap();
        // SAFETY (test): `take` gave room for `size` bytes.
        unsafe { std::ptr::write_bytes(b.as_mut_ptr(), byte, size) };
        b.len = size;
        b
    }

    #[test]
    fn dropped_buffers_are_reused_up_to_the_kept_bytes() {
        let pool = StateBuffers::default();
        pool.set_keep(64 << 20);
        let a = filled(&pool, 10 << 20, 1);
        assert_eq!(&a[..3], &[1, 1, 1]);
        let first = a.as_ptr();
        drop(a);
        assert!(pool.kept_bytes() >= 10 << 20);
        // A state that grew a little fits the same memory.
        let b = filled(&pool, (10 << 20) + 4096, 2);
        assert_eq!((b.as_ptr(), pool.kept_bytes()), (first, 0));
        assert_eq!(pool.made(), 1);
        assert!(b.iter().all(|&x| x == 2));
        assert!(b.memory_bytes() <= StateBuffers::room_for(b.len()));
        // A much smaller state does not take a buffer twice its size.
        drop(b);
        let small = filled(&pool, 1 << 20, 3);
        assert_ne!(small.as_ptr(), first);
        drop(small);
        // Keeping less frees the oldest first.
        pool.set_keep(2 << 20);
        assert!(pool.kept_bytes() <= 2 << 20);
        pool.set_keep(0);
        assert_eq!(pool.kept_bytes(), 0);
    }

    fn spares_made(pool: &StateBuffers) {
        let started = std::time::Instant::now();
        while pool.making_spares() {
            assert!(started.elapsed().as_secs() < 30, "spares never finished");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn spares_are_made_ahead_of_the_saves_within_the_kept_room() {
        let size = 8 << 20;
        let pool = StateBuffers::default();
        // Room for one spare only: one is made, and nothing past the room.
        pool.set_keep(new_capacity(size + size / 32) as u64 + (1 << 20));
        pool.make_spares(size);
        spares_made(&pool);
        assert_eq!(pool.kept_bytes(), new_capacity(size + size / 32) as u64);
        // Room for more: up to SPARE_BUFFERS, each one the next save reuses.
        pool.set_keep(1 << 30);
        pool.make_spares(size);
        spares_made(&pool);
        assert_eq!(
            pool.kept_bytes(),
            SPARE_BUFFERS as u64 * new_capacity(size + size / 32) as u64
        );
        let grown = filled(&pool, size + size / 40, 4);
        let same = filled(&pool, size, 5);
        assert_eq!(pool.made(), 0, "both saves found memory made ahead");
        assert_eq!(pool.kept_bytes(), 0);
        drop((grown, same));
        // Without room nothing is made.
        pool.set_keep(0);
        pool.make_spares(size);
        spares_made(&pool);
        assert_eq!(pool.kept_bytes(), 0);
    }

    #[test]
    fn a_buffer_outliving_its_pool_frees_its_memory() {
        let pool = StateBuffers::default();
        pool.set_keep(u64::MAX);
        let a = filled(&pool, 4096, 9);
        drop(pool);
        assert_eq!(a.len(), 4096);
        drop(a);
        let copy = StateBuffer::from(&[1u8, 2, 3][..]);
        assert_eq!(&copy[..], &[1, 2, 3]);
    }
}
