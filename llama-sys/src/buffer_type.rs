//! A `repr(C)` mirror of ggml's backend buffer-type and buffer interfaces
//! (`ggml/src/ggml-backend-impl.h`, `GGML_BACKEND_API_VERSION` 3), which
//! bindgen does not see because that header is internal. hypura implements
//! its own buffer type (the STREAM tier) through these.
//!
//! Layout is checked against the real CPU buffer type by the tests below:
//! if llama.cpp changes these structs, they fail before anything else can.
use std::os::raw::{c_char, c_int, c_void};

use llama_cpp_sys_2::{ggml_backend_buffer_usage, ggml_backend_dev_t, ggml_status, ggml_tensor};

/// The interface version these mirrors follow.
pub const GGML_BACKEND_API_VERSION: c_int = 3;

pub type BufferTypeHandle = *mut BufferType;
pub type BufferHandle = *mut Buffer;

/// `struct ggml_backend_buffer_type_i`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BufferTypeInterface {
    pub get_name: Option<unsafe extern "C" fn(BufferTypeHandle) -> *const c_char>,
    pub alloc_buffer: Option<unsafe extern "C" fn(BufferTypeHandle, usize) -> BufferHandle>,
    pub alloc_buffer_n: Option<
        unsafe extern "C" fn(BufferTypeHandle, *mut *mut ggml_tensor, c_int) -> BufferHandle,
    >,
    pub get_alignment: Option<unsafe extern "C" fn(BufferTypeHandle) -> usize>,
    pub get_max_size: Option<unsafe extern "C" fn(BufferTypeHandle) -> usize>,
    pub get_alloc_size: Option<unsafe extern "C" fn(BufferTypeHandle, *const ggml_tensor) -> usize>,
    pub get_alloc_size_n:
        Option<unsafe extern "C" fn(BufferTypeHandle, *mut *mut ggml_tensor, c_int) -> usize>,
    pub is_host: Option<unsafe extern "C" fn(BufferTypeHandle) -> bool>,
}

/// `struct ggml_backend_buffer_type`.
#[repr(C)]
pub struct BufferType {
    pub iface: BufferTypeInterface,
    pub device: ggml_backend_dev_t,
    pub context: *mut c_void,
}

/// `struct ggml_backend_buffer_i`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BufferInterface {
    pub free_buffer: Option<unsafe extern "C" fn(BufferHandle)>,
    pub get_base: Option<unsafe extern "C" fn(BufferHandle) -> *mut c_void>,
    pub init_tensor: Option<unsafe extern "C" fn(BufferHandle, *mut ggml_tensor) -> ggml_status>,
    pub memset_tensor:
        Option<unsafe extern "C" fn(BufferHandle, *mut ggml_tensor, u8, usize, usize)>,
    pub set_tensor:
        Option<unsafe extern "C" fn(BufferHandle, *mut ggml_tensor, *const c_void, usize, usize)>,
    pub get_tensor:
        Option<unsafe extern "C" fn(BufferHandle, *const ggml_tensor, *mut c_void, usize, usize)>,
    #[allow(clippy::type_complexity)]
    pub set_tensor_2d: Option<
        unsafe extern "C" fn(
            BufferHandle,
            *mut ggml_tensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    #[allow(clippy::type_complexity)]
    pub get_tensor_2d: Option<
        unsafe extern "C" fn(
            BufferHandle,
            *const ggml_tensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub cpy_tensor:
        Option<unsafe extern "C" fn(BufferHandle, *const ggml_tensor, *mut ggml_tensor) -> bool>,
    pub clear: Option<unsafe extern "C" fn(BufferHandle, u8)>,
    pub reset: Option<unsafe extern "C" fn(BufferHandle)>,
}

/// `struct ggml_backend_buffer`.
#[repr(C)]
pub struct Buffer {
    pub iface: BufferInterface,
    pub buft: BufferTypeHandle,
    pub context: *mut c_void,
    pub size: usize,
    pub usage: ggml_backend_buffer_usage,
}

extern "C" {
    /// Creates a buffer object of type `buft` with the given interface and context.
    pub fn ggml_backend_buffer_init(
        buft: BufferTypeHandle,
        iface: BufferInterface,
        context: *mut c_void,
        size: usize,
    ) -> BufferHandle;
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_cpp_sys_2 as sys;
    use std::ffi::CStr;

    #[test]
    fn api_version_matches_the_linked_ggml() {
        // SAFETY: the CPU backend registry is a static object; its first field is the API version.
        let version = unsafe { *(sys::ggml_backend_cpu_reg() as *const c_int) };
        assert_eq!(version, GGML_BACKEND_API_VERSION);
    }

    #[test]
    fn mirror_reads_the_real_cpu_buffer_type_and_buffer() {
        // SAFETY: the CPU buffer type is a static object laid out as `BufferType`
        // (the property under test); the buffer is freed at the end.
        unsafe {
            let raw = sys::ggml_backend_cpu_buffer_type();
            let buft = &*(raw as *const BufferType);
            let name = CStr::from_ptr(buft.iface.get_name.expect("get_name")(
                raw as BufferTypeHandle,
            ));
            assert_eq!(name, CStr::from_ptr(sys::ggml_backend_buft_name(raw)));
            assert!(buft.iface.is_host.expect("is_host")(
                raw as BufferTypeHandle
            ));
            assert_eq!(
                buft.iface.get_alignment.expect("get_alignment")(raw as BufferTypeHandle),
                sys::ggml_backend_buft_get_alignment(raw)
            );
            assert_eq!(buft.device, sys::ggml_backend_buft_get_device(raw));

            let buffer = sys::ggml_backend_buft_alloc_buffer(raw, 4096);
            let mirror = &*(buffer as *const Buffer);
            assert_eq!(mirror.size, sys::ggml_backend_buffer_get_size(buffer));
            assert_eq!(mirror.buft as *mut _, raw as *mut _);
            let base = mirror.iface.get_base.expect("get_base")(buffer as BufferHandle);
            assert_eq!(base, sys::ggml_backend_buffer_get_base(buffer));
            sys::ggml_backend_buffer_free(buffer);
        }
    }
}
