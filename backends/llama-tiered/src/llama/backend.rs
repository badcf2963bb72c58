//! Process-wide llama.cpp initialisation and log routing.
use std::cell::RefCell;
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

thread_local! {
    /// This thread's llama.cpp log lines, collected while [`capture_log`] runs.
    static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Runs `f` and returns, beside its result, every llama.cpp log line (any
/// level, whatever `RUST_LOG` lets through) that this thread emitted
/// meanwhile. llama.cpp logs from the thread that calls into it, so lines of
/// calls on other threads are never mixed in. An inner capture takes the
/// lines of its own span; the outer one goes on after it.
pub(crate) fn capture_log<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    /// Puts the outer capture back, also when `f` panics.
    struct Restore(Option<Vec<String>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CAPTURED.with(|c| *c.borrow_mut() = outer);
        }
    }
    init();
    let _restore = Restore(CAPTURED.with(|c| c.replace(Some(Vec::new()))));
    let result = f();
    let lines = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (result, lines)
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
    // `try_*`: never panic across the FFI boundary (thread teardown, re-entry).
    let _ = CAPTURED.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if let Some(lines) = c.as_mut() {
                lines.push(text.to_owned());
            }
        }
    });
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

/// Whether the memory of the ggml buffer type or device called `name` (as
/// llama.cpp's logs name them: `CPU`, `CUDA_Host`, `CUDA0`…) is host RAM.
/// Looked up among ggml's devices (each one's buffer type and host buffer
/// type); a name none of them has counts as host when it starts with `CPU` or
/// ends with `_Host`, else as GPU memory.
pub(crate) fn is_host_memory(name: &str) -> bool {
    init();
    // SAFETY: registry handles live as long as the process; indices stay
    // below the count; NULL buffer types are skipped; names are static strings.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            let buft = sys::ggml_backend_dev_buffer_type(dev);
            if c_string(sys::ggml_backend_dev_name(dev)) == name
                || (!buft.is_null() && c_string(sys::ggml_backend_buft_name(buft)) == name)
            {
                return buft.is_null() || sys::ggml_backend_buft_is_host(buft);
            }
            let host = sys::ggml_backend_dev_host_buffer_type(dev);
            if !host.is_null() && c_string(sys::ggml_backend_buft_name(host)) == name {
                return true;
            }
        }
    }
    name.starts_with("CPU") || name.ends_with("_Host")
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
