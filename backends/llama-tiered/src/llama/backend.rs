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
