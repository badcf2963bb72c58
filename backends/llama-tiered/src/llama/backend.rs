//! Process-wide llama.cpp initialisation and log routing.
use std::ffi::{c_char, c_void, CStr};
use std::sync::Once;

use hypura_llama_sys as sys;

static INIT: Once = Once::new();

/// Initialises llama.cpp once per process and routes its log lines to `tracing`
/// (target `llama.cpp`), so they obey `RUST_LOG` instead of flooding stderr.
pub fn init() {
    INIT.call_once(|| {
        // SAFETY: the callback is a plain function valid for the whole process;
        // the user-data pointer is unused.
        unsafe {
            sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

unsafe extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let text = text.trim_end();
    if text.is_empty() || text == "." {
        return;
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{text}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{text}"),
        sys::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "llama.cpp", "{text}"),
        _ => tracing::trace!(target: "llama.cpp", "{text}"),
    }
}

/// A GPU llama.cpp can place weights on: a ggml backend device of type GPU
/// (a discrete GPU with its own memory; integrated GPUs share host RAM and
/// are left to the RAM tier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// Position among the GPUs, in ggml's registry order (`CUDA0` is 0).
    pub index: usize,
    /// ggml's name, e.g. `CUDA0`.
    pub name: String,
    /// e.g. `NVIDIA H200`.
    pub description: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The GPUs of this llama.cpp build, in ggml's order. Empty in a CPU-only
/// build (the default) or when the GPU backend finds no device.
pub fn gpu_devices() -> Vec<GpuDevice> {
    gpu_handles()
        .into_iter()
        .enumerate()
        .map(|(index, dev)| {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: `dev` comes from ggml's registry and lives as long as the
            // process; the strings it returns are NUL-terminated and static.
            unsafe {
                sys::ggml_backend_dev_memory(dev, &mut free, &mut total);
                GpuDevice {
                    index,
                    name: c_string(sys::ggml_backend_dev_name(dev)),
                    description: c_string(sys::ggml_backend_dev_description(dev)),
                    free_bytes: free as u64,
                    total_bytes: total as u64,
                }
            }
        })
        .collect()
}

/// ggml's handles of the GPU devices, in the order of [`gpu_devices`].
pub(super) fn gpu_handles() -> Vec<sys::ggml_backend_dev_t> {
    init();
    // SAFETY: plain registry queries; indices stay below the count.
    unsafe {
        (0..sys::ggml_backend_dev_count())
            .map(|i| sys::ggml_backend_dev_get(i))
            .filter(|&dev| sys::ggml_backend_dev_type(dev) == sys::GGML_BACKEND_DEVICE_TYPE_GPU)
            .collect()
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
