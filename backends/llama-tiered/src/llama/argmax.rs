//! Greedy sampling inside the decode graph, in two stages.
//!
//! llama.cpp's own greedy backend sampler takes `ggml_argmax` of the whole
//! logits row: one thread block for the row, 128,256 logits for a Llama 3
//! vocabulary. On an H200 that kernel takes 55 µs of a 3.9 ms decode step
//! (`ncu`, Llama-8B shape), more than copying the logits to the host.
//! This sampler views the row as `rows` × `cols` (a factorisation of the
//! vocabulary size) and takes:
//! 1. the argmax of every row (one block per row, all in parallel),
//! 2. each row's maximum (`get_rows` at those columns),
//! 3. the argmax of those maxima: the row holding the largest logit,
//! 4. that row's winning column as a token id (`get_rows` from a table of
//!    token ids the sampler keeps beside the model, allocated once).
//!
//! The result is the position of a largest logit, as the one-stage argmax
//! gives. Where largest logits tie exactly, ggml's CPU argmax takes the last
//! of a row, so both give the last of them there; on CUDA either may win, in
//! both. (The host's argmax, llama.cpp's CPU greedy sampler, takes the first.)
use std::ffi::{c_char, c_void};
use std::ptr;

use hypura_llama_sys as sys;

/// A greedy sampler for [`sys::llama_set_sampler`] (inside a chain), or
/// `None` when the vocabulary has no factorisation it can use (llama.cpp's
/// greedy sampler then does the work).
pub(super) fn new_sampler(n_vocab: usize) -> Option<*mut sys::llama_sampler> {
    let cols = split(n_vocab)?;
    let state = Box::new(DeviceArgmax {
        n_vocab: n_vocab as i64,
        cols: cols as i64,
        ctx: ptr::null_mut(),
        buffer: ptr::null_mut(),
        ids: ptr::null_mut(),
    });
    // SAFETY: the interface is static; llama.cpp owns the sampler from here
    // and hands its context back to `free`.
    let sampler = unsafe {
        sys::llama_sampler_init(
            &IFACE.0 as *const sys::llama_sampler_i as *mut sys::llama_sampler_i,
            Box::into_raw(state) as *mut c_void,
        )
    };
    (!sampler.is_null()).then_some(sampler)
}

/// The row length: the divisor of `n_vocab` nearest its square root, within
/// a factor of 4 of it (so rows and columns both fill thread blocks).
fn split(n_vocab: usize) -> Option<usize> {
    if n_vocab < 1024 || n_vocab > i32::MAX as usize {
        return None;
    }
    let root = (n_vocab as f64).sqrt();
    let (lo, hi) = ((root / 4.0).ceil() as usize, (root * 4.0) as usize);
    (lo..=hi)
        .filter(|c| n_vocab.is_multiple_of(*c))
        .min_by(|a, b| {
            (*a as f64 - root)
                .abs()
                .total_cmp(&(*b as f64 - root).abs())
        })
}

struct DeviceArgmax {
    n_vocab: i64,
    cols: i64,
    /// The token-id table: `[1, cols, rows]` I32 holding `0..n_vocab`, in a
    /// buffer of the device that computes the logits (`backend_init`).
    ctx: *mut sys::ggml_context,
    buffer: *mut sys::ggml_backend_buffer,
    ids: *mut sys::ggml_tensor,
}

impl Drop for DeviceArgmax {
    fn drop(&mut self) {
        // SAFETY: both were created by `backend_init` and are freed once.
        unsafe {
            if !self.buffer.is_null() {
                sys::ggml_backend_buffer_free(self.buffer);
            }
            if !self.ctx.is_null() {
                sys::ggml_free(self.ctx);
            }
        }
    }
}

struct Iface(sys::llama_sampler_i);
// SAFETY: a table of function pointers, never written.
unsafe impl Sync for Iface {}

static IFACE: Iface = Iface(sys::llama_sampler_i {
    name: Some(name),
    accept: None,
    apply: Some(apply),
    reset: None,
    clone: Some(clone),
    free: Some(free),
    backend_init: Some(backend_init),
    backend_accept: None,
    backend_apply: Some(backend_apply),
    backend_set_input: None,
    backend_reset: None,
    copy_state: None,
});

/// # Safety
/// `smpl` is a sampler made by [`new_sampler`].
unsafe fn state<'a>(smpl: *const sys::llama_sampler) -> &'a mut DeviceArgmax {
    &mut *((*smpl).ctx as *mut DeviceArgmax)
}

unsafe extern "C" fn name(_: *const sys::llama_sampler) -> *const c_char {
    c"greedy-two-stage".as_ptr()
}

/// On the host (a sampler chain run there): the first largest logit.
unsafe extern "C" fn apply(_: *mut sys::llama_sampler, cur_p: *mut sys::llama_token_data_array) {
    let cur = &mut *cur_p;
    if cur.data.is_null() || cur.size == 0 {
        return;
    }
    let data = std::slice::from_raw_parts(cur.data, cur.size);
    let mut best = 0;
    for (i, d) in data.iter().enumerate() {
        if d.logit > data[best].logit {
            best = i;
        }
    }
    cur.selected = best as i64;
}

unsafe extern "C" fn clone(smpl: *const sys::llama_sampler) -> *mut sys::llama_sampler {
    new_sampler(state(smpl).n_vocab as usize).unwrap_or(ptr::null_mut())
}

unsafe extern "C" fn free(smpl: *mut sys::llama_sampler) {
    drop(Box::from_raw((*smpl).ctx as *mut DeviceArgmax));
}

/// Allocates and fills the token-id table in `buft`, the buffer type of the
/// device computing the logits. Where it cannot, `backend_apply` takes the
/// one-stage argmax instead, as llama.cpp's greedy sampler does: either way
/// the sampler runs in the graph (llama.cpp attaches it whatever this returns).
unsafe extern "C" fn backend_init(
    smpl: *mut sys::llama_sampler,
    buft: sys::ggml_backend_buffer_type_t,
    _n_outputs_max_per_seq: u32,
) -> bool {
    let s = state(smpl);
    if !s.ids.is_null() {
        return true;
    }
    let ctx = sys::ggml_init(sys::ggml_init_params {
        mem_size: sys::ggml_tensor_overhead(),
        mem_buffer: ptr::null_mut(),
        no_alloc: true,
    });
    if ctx.is_null() {
        return true;
    }
    s.ctx = ctx;
    let ids = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_I32, 1, s.cols, s.n_vocab / s.cols);
    let buffer = sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if ids.is_null() || buffer.is_null() {
        return true;
    }
    s.buffer = buffer;
    let table: Vec<i32> = (0..s.n_vocab as i32).collect();
    sys::ggml_backend_tensor_set(
        ids,
        table.as_ptr() as *const c_void,
        0,
        table.len() * std::mem::size_of::<i32>(),
    );
    s.ids = ids;
    true
}

unsafe extern "C" fn backend_apply(
    smpl: *mut sys::llama_sampler,
    ctx: *mut sys::ggml_context,
    _gf: *mut sys::ggml_cgraph,
    data: *mut sys::llama_sampler_data,
) {
    let s = state(smpl);
    let data = &mut *data;
    let logits = data.logits;
    let n = sys::ggml_nelements(logits);
    if n != s.n_vocab || s.ids.is_null() {
        // Another row length (llama.cpp probes the ops with one of its own).
        data.sampled = sys::ggml_argmax(ctx, sys::ggml_reshape_1d(ctx, logits, n));
        return;
    }
    data.sampled = two_stage(ctx, logits, s.ids, s.cols);
}

/// The graph of the two stages over `logits` (`rows × cols` elements) with
/// the token-id table `ids` (`[1, cols, rows]` I32): a `[1, 1]` I32 tensor.
///
/// # Safety
/// Valid tensors of `ctx`'s graph (or of buffers it may use).
unsafe fn two_stage(
    ctx: *mut sys::ggml_context,
    logits: *mut sys::ggml_tensor,
    ids: *mut sys::ggml_tensor,
    cols: i64,
) -> *mut sys::ggml_tensor {
    let rows = sys::ggml_nelements(logits) / cols;
    let by_row = sys::ggml_reshape_2d(ctx, logits, cols, rows);
    // [rows] I32: each row's winning column, as [1, rows] rows to pick.
    let col = sys::ggml_reshape_2d(ctx, sys::ggml_argmax(ctx, by_row), 1, rows);
    // [1, 1, rows]: each row's maximum, and its token id.
    let row_max = sys::ggml_get_rows(ctx, sys::ggml_reshape_3d(ctx, logits, 1, cols, rows), col);
    let row_token = sys::ggml_get_rows(ctx, ids, col);
    // [1] I32: the row holding the largest logit.
    let best_row = sys::ggml_argmax(ctx, sys::ggml_reshape_2d(ctx, row_max, rows, 1));
    // [1, 1] I32: its token id.
    sys::ggml_get_rows(ctx, sys::ggml_reshape_2d(ctx, row_token, 1, rows), best_row)
}

#[cfg(test)]
mod tests {
    use super::{split, sys, two_stage};

    /// The graph on ggml's CPU backend, over 12 rows of 8 logits: the token
    /// found is the largest logit's position, in the first, a middle or the
    /// last row and column, against rows whose own maxima are close.
    #[test]
    fn the_two_stages_find_the_largest_logit_wherever_it_is() {
        let (rows, cols) = (12i64, 8i64);
        let n = rows * cols;
        // SAFETY: one context, alive for the test; every tensor is
        // allocated in it with its data.
        unsafe {
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: 16 << 20,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: false,
            });
            assert!(!ctx.is_null());
            let logits = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, n);
            let ids = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_I32, 1, cols, rows);
            let id_data =
                std::slice::from_raw_parts_mut(sys::ggml_get_data(ids) as *mut i32, n as usize);
            for (i, v) in id_data.iter_mut().enumerate() {
                *v = i as i32;
            }
            let out = two_stage(ctx, logits, ids, cols);
            let gf = sys::ggml_new_graph(ctx);
            sys::ggml_build_forward_expand(gf, out);
            let values = std::slice::from_raw_parts_mut(sys::ggml_get_data_f32(logits), n as usize);
            for winner in [0usize, 7, 8, 45, 88, 95] {
                for (i, v) in values.iter_mut().enumerate() {
                    // Every row has a maximum just below the winner's.
                    *v = -(((i * 37) % 97) as f32) / 10.0;
                    if i % cols as usize == 3 {
                        *v = 4.9;
                    }
                }
                values[winner] = 5.0;
                sys::ggml_graph_compute_with_ctx(ctx, gf, 1);
                assert_eq!(sys::ggml_nelements(out), 1);
                assert_eq!(*(sys::ggml_get_data(out) as *const i32), winner as i32);
            }
            sys::ggml_free(ctx);
        }
    }

    #[test]
    fn vocabularies_split_into_rows_and_columns_near_the_square_root() {
        // Llama 3: 128,256 = 384 rows × 334.
        assert_eq!(split(128_256), Some(334));
        // SmolLM2: 49,152 = 256 rows × 192.
        assert_eq!(split(49_152), Some(192));
        assert_eq!(split(32_000), Some(160));
        // A prime has no split: llama.cpp's own greedy sampler is used.
        assert_eq!(split(32_003), None);
        assert_eq!(split(100), None);
        for v in [128_256usize, 49_152, 32_000, 151_936, 256_000] {
            let c = split(v).unwrap();
            assert_eq!(v % c, 0);
        }
    }
}
