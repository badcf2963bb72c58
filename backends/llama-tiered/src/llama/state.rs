//! One sequence's KV state out of a context and into another: how a batch
//! engine moves its sequences onto a new placement of the same model between
//! two decode steps (`llama_state_seq_*`).
use hypura_llama_sys as sys;

use super::context::Context;
use crate::error::EngineError;

impl Context {
    /// A copy of sequence `seq`'s KV cache (empty for an unused sequence).
    pub fn seq_state(&mut self, seq: i32) -> Result<Vec<u8>, EngineError> {
        // SAFETY: the context is alive; the size call only reads it.
        let size = unsafe { sys::llama_state_seq_get_size(self.as_ptr(), seq) };
        let mut state = Vec::with_capacity(size);
        huge_pages(state.spare_capacity_mut());
        // SAFETY: `state` has room for `size` bytes, the size llama.cpp
        // asked for; it writes at most that many.
        let written =
            unsafe { sys::llama_state_seq_get_data(self.as_ptr(), state.as_mut_ptr(), size, seq) };
        if written != size {
            return Err(EngineError::Context(format!(
                "llama.cpp wrote {written} of the {size} bytes of sequence {seq}'s state"
            )));
        }
        // SAFETY: llama.cpp initialized all `size` bytes.
        unsafe { state.set_len(size) };
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

/// Asks the kernel for transparent huge pages under a large, still untouched
/// buffer: a sequence's state is often a gigabyte, written once by a device
/// copy, and faulting it in 4 KiB pages costs more than the copy (a 2 MiB
/// page takes one fault for 512). Only whole 2 MiB pages inside the buffer
/// are advised; where THP is off this does nothing.
fn huge_pages(buffer: &mut [std::mem::MaybeUninit<u8>]) {
    const HUGE: usize = 2 << 20;
    let start = buffer.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE);
    let end = (start + buffer.len()) / HUGE * HUGE;
    if end > first {
        // SAFETY: the range lies inside `buffer`'s allocation; MADV_HUGEPAGE
        // changes how its pages are backed, never their contents.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}
