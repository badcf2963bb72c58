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
        let mut state = vec![0u8; size];
        // SAFETY: `state` holds `size` writable bytes, the size llama.cpp
        // asked for; it writes at most that many.
        let written =
            unsafe { sys::llama_state_seq_get_data(self.as_ptr(), state.as_mut_ptr(), size, seq) };
        if written != size {
            return Err(EngineError::Context(format!(
                "llama.cpp wrote {written} of the {size} bytes of sequence {seq}'s state"
            )));
        }
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
