//! ggml's compute devices, for [`crate::hwprobe`] to measure: enumerating them, a matrix ×
//! vector graph in a device's own memory, a device tensor to copy host bytes into, a device's
//! pinned host memory, and dropping a file's cached pages.
//!
//! Everything takes a [`Device`] whatever its kind, so the CPU (always present) runs exactly
//! the code a GPU runs. What to time and how lives in [`crate::hwprobe`].
use std::ffi::{c_char, CStr};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Once;

use hypura_llama_sys as sys;

use super::gguf_write::GgmlType;

/// What ggml says a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    /// A discrete GPU with its own memory.
    Gpu,
    /// An integrated GPU using host memory.
    IntegratedGpu,
    /// Works beside the CPU backend (BLAS, AMX) or wraps other devices.
    Other,
}

/// One ggml compute device. Devices are registered once per process and live
/// as long as it, so the handle stays valid.
#[derive(Debug, Clone)]
pub struct Device {
    raw: sys::ggml_backend_dev_t,
    /// ggml's name, e.g. `"CPU"`, `"CUDA0"`.
    pub name: String,
    /// e.g. `"NVIDIA H200"` or the CPU's model.
    pub description: String,
    pub kind: DeviceKind,
    /// Device memory in bytes (host RAM for the CPU), when enumerated.
    pub total_bytes: u64,
    /// Device memory free in bytes, when enumerated.
    pub free_bytes: u64,
}

/// Why a device probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum DeviceProbeError {
    #[error(
        "ggml found no CPU device: the llama.cpp build lacks its CPU backend (rebuild hypura)"
    )]
    NoCpu,
    #[error("device {device}: could not allocate {bytes} bytes of {what}: free memory on it or profile with less")]
    Alloc {
        device: String,
        what: &'static str,
        bytes: u64,
    },
    #[error("device {device}: {what}")]
    Failed { device: String, what: String },
}

static LOAD_MODULES: Once = Once::new();

/// Every ggml device of this process. Backends built as loadable modules
/// (`GGML_BACKEND_DL`) are loaded first, once, when no GPU is registered yet:
/// loading the same module twice would list its devices twice.
pub fn devices() -> Vec<Device> {
    super::backend::init();
    LOAD_MODULES.call_once(|| {
        if !enumerate().iter().any(|d| d.is_gpu()) {
            // SAFETY: no arguments; it only adds registrations to ggml's registry.
            unsafe { sys::ggml_backend_load_all() };
        }
    });
    enumerate()
}

fn enumerate() -> Vec<Device> {
    // SAFETY: the registry is initialised on first use and only grows.
    let count = unsafe { sys::ggml_backend_dev_count() };
    (0..count)
        // SAFETY: `i` < the device count.
        .map(|i| unsafe { sys::ggml_backend_dev_get(i) })
        .filter(|raw| !raw.is_null())
        .map(Device::from_raw)
        .collect()
}

/// The CPU device (present in every build).
pub fn cpu_device() -> Result<Device, DeviceProbeError> {
    devices()
        .into_iter()
        .find(|d| d.kind == DeviceKind::Cpu)
        .ok_or(DeviceProbeError::NoCpu)
}

/// A C string from ggml, or `""` when null.
fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the device,
    // which lives for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Device {
    fn from_raw(raw: sys::ggml_backend_dev_t) -> Device {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: `raw` is a registered device; the out-pointers are valid.
        let (name, description, ty) = unsafe {
            sys::ggml_backend_dev_memory(raw, &mut free, &mut total);
            (
                c_str(sys::ggml_backend_dev_name(raw)),
                c_str(sys::ggml_backend_dev_description(raw)),
                sys::ggml_backend_dev_type(raw),
            )
        };
        let kind = match ty {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            _ => DeviceKind::Other,
        };
        Device {
            raw,
            name,
            description,
            kind,
            total_bytes: total as u64,
            free_bytes: free as u64,
        }
    }

    /// A discrete or integrated GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu)
    }

    pub(crate) fn failed(&self, what: impl Into<String>) -> DeviceProbeError {
        DeviceProbeError::Failed {
            device: self.name.clone(),
            what: what.into(),
        }
    }

    fn alloc_failed(&self, what: &'static str, bytes: u64) -> DeviceProbeError {
        DeviceProbeError::Alloc {
            device: self.name.clone(),
            what,
            bytes,
        }
    }
}

/// A ggml context holding tensor metadata (never tensor data).
struct MetaContext(NonNull<sys::ggml_context>);

impl MetaContext {
    fn new(tensors: usize, graph: bool) -> Result<MetaContext, String> {
        // SAFETY: pure size queries.
        let mut mem = unsafe { sys::ggml_tensor_overhead() } * tensors;
        if graph {
            // SAFETY: as above.
            mem += unsafe { sys::ggml_graph_overhead() };
        }
        let params = sys::ggml_init_params {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml allocates `mem` bytes itself; null on failure.
        NonNull::new(unsafe { sys::ggml_init(params) })
            .map(MetaContext)
            .ok_or_else(|| "ggml_init failed".to_string())
    }

    fn as_ptr(&self) -> *mut sys::ggml_context {
        self.0.as_ptr()
    }
}

impl Drop for MetaContext {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init, freed once.
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

/// A ggml backend buffer, freed on drop.
struct Buffer(NonNull<sys::ggml_backend_buffer>);

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by ggml, freed once; no tensor using it outlives
        // the struct that owns it (fields drop after their users).
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) }
    }
}

/// Allocates every tensor of `ctx` in one buffer of `dev`'s own buffer type.
fn alloc_on_device(
    dev: &Device,
    ctx: &MetaContext,
    what: &'static str,
    bytes: u64,
) -> Result<Buffer, DeviceProbeError> {
    // SAFETY: `dev.raw` is a registered device; `ctx` holds unallocated tensors.
    let buffer = unsafe {
        let buft = sys::ggml_backend_dev_buffer_type(dev.raw);
        sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), buft)
    };
    NonNull::new(buffer)
        .map(Buffer)
        .ok_or_else(|| dev.alloc_failed(what, bytes))
}

/// A backend (stream, thread pool) on one device, freed on drop.
pub struct DeviceBackend(NonNull<sys::ggml_backend>);

impl DeviceBackend {
    /// `threads`: for a CPU-kind device (others ignore it); 0 leaves ggml's default.
    pub fn init(dev: &Device, threads: u32) -> Result<DeviceBackend, DeviceProbeError> {
        // SAFETY: `dev.raw` is a registered device; null params are allowed.
        let raw = NonNull::new(unsafe { sys::ggml_backend_dev_init(dev.raw, std::ptr::null()) })
            .ok_or_else(|| dev.failed("could not initialise its backend"))?;
        let backend = DeviceBackend(raw);
        // The generic way llama.cpp sets threads: the registry may export
        // `ggml_backend_set_n_threads` (the CPU backend does).
        // SAFETY: looking up a symbol by a NUL-terminated name.
        let set_threads = unsafe {
            let reg = sys::ggml_backend_dev_backend_reg(dev.raw);
            sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_set_n_threads".as_ptr())
        };
        if !set_threads.is_null() && threads > 0 {
            // SAFETY: ggml documents this symbol's type as
            // `ggml_backend_set_n_threads_t`; a function pointer and a data
            // pointer have the same size on the platforms ggml supports.
            unsafe {
                let f: unsafe extern "C" fn(sys::ggml_backend_t, std::ffi::c_int) =
                    std::mem::transmute(set_threads);
                f(raw.as_ptr(), threads.min(i32::MAX as u32) as i32);
            }
        }
        Ok(backend)
    }
}

impl Drop for DeviceBackend {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_dev_init, freed once.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// `reps` products `W × x_i` of one weight `W` (`cols` × `rows` of a quantized type) with F32
/// inputs `x_i` of `batch` columns of `cols` values (a matrix × vector product at a batch of
/// 1, a prompt pass's matrix product at a batch of its tokens), every tensor in one buffer of
/// the device.
pub struct MatvecGraph {
    // Held for the tensors' storage and metadata; field order is drop
    // order: the buffer before the context that describes it.
    _buffer: Buffer,
    _ctx: MetaContext,
    dev: Device,
    graph: NonNull<sys::ggml_cgraph>,
    weight: NonNull<sys::ggml_tensor>,
    inputs: Vec<NonNull<sys::ggml_tensor>>,
    cols: usize,
    batch: usize,
}

impl MatvecGraph {
    /// Fails when the device cannot compute the product or has no room for the weight.
    pub fn new(
        dev: &Device,
        weight_type: GgmlType,
        cols: usize,
        rows: usize,
        batch: usize,
        reps: usize,
    ) -> Result<MatvecGraph, DeviceProbeError> {
        let row_bytes = weight_type.row_bytes(cols).ok_or_else(|| {
            dev.failed(format!("{weight_type} rows of {cols} are not whole blocks"))
        })?;
        let (cols_i64, rows_i64, batch_i64) = (cols as i64, rows as i64, batch.max(1) as i64);
        let ctx = MetaContext::new(1 + 2 * reps, true).map_err(|e| dev.failed(e))?;
        let c = ctx.as_ptr();
        // SAFETY: `c` is a live no-alloc context sized for these tensors
        // and one graph; ggml returns non-null or aborts.
        let (weight, inputs, graph) = unsafe {
            let w = sys::ggml_new_tensor_2d(c, weight_type.raw(), cols_i64, rows_i64);
            let graph = sys::ggml_new_graph(c);
            let mut inputs = Vec::with_capacity(reps);
            for _ in 0..reps {
                let x = sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_F32, cols_i64, batch_i64);
                let y = sys::ggml_mul_mat(c, w, x);
                if !sys::ggml_backend_dev_supports_op(dev.raw, y) {
                    return Err(dev.failed(format!(
                        "cannot compute a {weight_type} × F32 matrix product"
                    )));
                }
                sys::ggml_build_forward_expand(graph, y);
                inputs.push(NonNull::new(x).ok_or_else(|| dev.failed("ggml_new_tensor failed"))?);
            }
            (NonNull::new(w), inputs, NonNull::new(graph))
        };
        let (Some(weight), Some(graph)) = (weight, graph) else {
            return Err(dev.failed("ggml_new_tensor failed"));
        };
        let bytes = rows as u64 * row_bytes as u64;
        let buffer = alloc_on_device(dev, &ctx, "weight", bytes)?;
        Ok(MatvecGraph {
            _buffer: buffer,
            _ctx: ctx,
            dev: dev.clone(),
            graph,
            weight,
            inputs,
            cols,
            batch: batch.max(1),
        })
    }

    /// Bytes of the weight.
    pub fn weight_bytes(&self) -> usize {
        // SAFETY: the weight is allocated; reading its size.
        unsafe { sys::ggml_nbytes(self.weight.as_ptr()) }
    }

    /// Writes `bytes` into the weight from byte `offset` on.
    pub fn set_weight(&self, offset: usize, bytes: &[u8]) -> Result<(), DeviceProbeError> {
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.weight_bytes())
        {
            return Err(self.dev.failed("write past the end of the weight"));
        }
        // SAFETY: `[offset, offset + len)` lies inside the allocated weight.
        unsafe {
            sys::ggml_backend_tensor_set(
                self.weight.as_ptr(),
                bytes.as_ptr().cast(),
                offset,
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Values of each input `x_i`: `cols × batch`.
    pub fn input_len(&self) -> usize {
        self.cols * self.batch
    }

    /// Number of inputs `x_i`.
    pub fn n_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Sets input `x_i` (`batch` columns of `cols` values, column after column).
    pub fn set_input(&self, i: usize, values: &[f32]) -> Result<(), DeviceProbeError> {
        let x = self
            .inputs
            .get(i)
            .ok_or_else(|| self.dev.failed("no such input"))?;
        if values.len() != self.input_len() {
            return Err(self
                .dev
                .failed("an input needs `cols` values per batch column"));
        }
        // SAFETY: `x` is allocated with exactly `cols × batch` f32 values.
        unsafe {
            sys::ggml_backend_tensor_set(x.as_ptr(), values.as_ptr().cast(), 0, values.len() * 4)
        };
        Ok(())
    }

    /// Computes the graph to completion (`ggml_backend_graph_compute` syncs).
    pub fn compute(&self, backend: &DeviceBackend) -> Result<(), DeviceProbeError> {
        // SAFETY: every tensor of the graph is allocated in a buffer the
        // backend's device can use; the graph outlives the call.
        let status =
            unsafe { sys::ggml_backend_graph_compute(backend.0.as_ptr(), self.graph.as_ptr()) };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(self
                .dev
                .failed(format!("graph compute failed with status {status}")))
        }
    }
}

/// `len` bytes in a device's own memory: the target of host → device copies.
pub struct DeviceBytes {
    _buffer: Buffer,
    _ctx: MetaContext,
    tensor: NonNull<sys::ggml_tensor>,
    len: usize,
}

impl DeviceBytes {
    pub fn alloc(dev: &Device, len: usize) -> Result<DeviceBytes, DeviceProbeError> {
        let ctx = MetaContext::new(1, false).map_err(|e| dev.failed(e))?;
        // SAFETY: a live no-alloc context with room for one tensor.
        let tensor =
            unsafe { sys::ggml_new_tensor_1d(ctx.as_ptr(), sys::GGML_TYPE_I8, len as i64) };
        let tensor = NonNull::new(tensor).ok_or_else(|| dev.failed("ggml_new_tensor failed"))?;
        let buffer = alloc_on_device(dev, &ctx, "copy target", len as u64)?;
        Ok(DeviceBytes {
            _buffer: buffer,
            _ctx: ctx,
            tensor,
            len,
        })
    }

    /// Copies `src` into the device memory (`ggml_backend_tensor_set`); returns once copied.
    ///
    /// # Panics
    /// When `src` is not exactly as long as this memory.
    pub fn copy_from(&self, src: &[u8]) {
        assert_eq!(src.len(), self.len, "a copy fills the whole device memory");
        // SAFETY: the tensor holds `len` bytes in an allocated buffer; `src`
        // holds `len` readable bytes. The call returns when copied.
        unsafe {
            sys::ggml_backend_tensor_set(self.tensor.as_ptr(), src.as_ptr().cast(), 0, self.len)
        }
    }
}

/// A device's pinned host memory (`ggml_backend_dev_host_buffer_type`), which copies to the
/// device fastest.
pub struct PinnedHostBytes {
    buffer: Buffer,
    len: usize,
}

impl PinnedHostBytes {
    /// `None` when the device has no pinned host memory of its own (the CPU).
    pub fn alloc(dev: &Device, len: usize) -> Result<Option<PinnedHostBytes>, DeviceProbeError> {
        // SAFETY: `dev.raw` is a registered device; null when it has no host buffer type.
        let host_buft = unsafe { sys::ggml_backend_dev_host_buffer_type(dev.raw) };
        if host_buft.is_null() {
            return Ok(None);
        }
        // SAFETY: a valid buffer type; null on failure.
        let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(host_buft, len) };
        let buffer = NonNull::new(raw)
            .map(Buffer)
            .ok_or_else(|| dev.alloc_failed("pinned host memory", len as u64))?;
        // SAFETY: a host buffer of at least `len` bytes, mapped in this process.
        if unsafe { sys::ggml_backend_buffer_get_base(buffer.0.as_ptr()) }.is_null() {
            return Err(dev.failed("pinned host buffer has no base address"));
        }
        // ggml falls back to pageable memory when the driver refuses to pin
        // (it says so only at debug level): copies to and from the GPU then
        // run at a fraction of the bus's speed, which is worth knowing.
        // SAFETY: a live buffer.
        if unsafe { sys::ggml_backend_buffer_get_type(buffer.0.as_ptr()) } != host_buft {
            tracing::warn!(
                "{}: {} MiB of host memory could not be pinned (pageable instead: copies to and from the GPU run slower)",
                dev.name,
                len >> 20
            );
        }
        Ok(Some(PinnedHostBytes { buffer, len }))
    }

    fn base(&self) -> *mut u8 {
        // SAFETY: a live host buffer; its base was checked non-null at allocation.
        unsafe { sys::ggml_backend_buffer_get_base(self.buffer.0.as_ptr()) }.cast()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `base` points at `len` bytes owned by this buffer, mapped while it lives.
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.len) }
    }
}

/// Page-locks host memory in place for the GPU's driver, so that copies
/// from it run at the bus's pinned speed. The stream cache registers the
/// layers it keeps ([`crate::tiered::pinning`]); tests record the calls.
pub trait HostPinning: Send + Sync {
    /// Registers `len` bytes at `ptr` (page aligned, mapped); false when
    /// the driver refuses (the memory stays pageable).
    fn register(&self, ptr: *mut u8, len: usize) -> bool;
    /// Undoes the [`HostPinning::register`] made at `ptr`. The memory's
    /// pages must not be released before this returns: the driver keeps a
    /// registered page's frame, so a page released and read again while
    /// registered would leave the GPU copying its old bytes.
    fn unregister(&self, ptr: *mut u8);
}

/// The variable ggml-cuda reads before registering host memory
/// (`ggml_backend_register_host_buffer` does nothing without it).
pub const REGISTER_HOST_ENV: &str = "GGML_CUDA_REGISTER_HOST";

type RegisterFn = unsafe extern "C" fn(*mut std::ffi::c_void, usize) -> bool;
type UnregisterFn = unsafe extern "C" fn(*mut std::ffi::c_void);

/// [`HostPinning`] through the first ggml backend that exports
/// `ggml_backend_register_host_buffer` (CUDA: `cudaHostRegister`, read-only).
pub struct HostRegistrar {
    register: RegisterFn,
    unregister: UnregisterFn,
}

impl HostRegistrar {
    /// `None` without such a backend (no GPU build) or without
    /// [`REGISTER_HOST_ENV`] in the environment (set by `hypura` at start).
    pub fn find() -> Option<HostRegistrar> {
        std::env::var_os(REGISTER_HOST_ENV)?;
        // Loads the backends (modules included) once.
        devices();
        // SAFETY: reading ggml's backend registry, loaded above.
        let count = unsafe { sys::ggml_backend_reg_count() };
        (0..count).find_map(|i| {
            // SAFETY: `i` < the registry's count; symbols looked up by
            // NUL-terminated names; null when absent.
            let (register, unregister) = unsafe {
                let reg = sys::ggml_backend_reg_get(i);
                (
                    sys::ggml_backend_reg_get_proc_address(
                        reg,
                        c"ggml_backend_register_host_buffer".as_ptr(),
                    ),
                    sys::ggml_backend_reg_get_proc_address(
                        reg,
                        c"ggml_backend_unregister_host_buffer".as_ptr(),
                    ),
                )
            };
            if register.is_null() || unregister.is_null() {
                return None;
            }
            // SAFETY: ggml-cuda exports these names with these signatures
            // (`bool (void *, size_t)` and `void (void *)`); a function
            // pointer and a data pointer have the same size on the
            // platforms ggml supports.
            unsafe {
                Some(HostRegistrar {
                    register: std::mem::transmute::<*mut std::ffi::c_void, RegisterFn>(register),
                    unregister: std::mem::transmute::<*mut std::ffi::c_void, UnregisterFn>(
                        unregister,
                    ),
                })
            }
        })
    }
}

impl HostPinning for HostRegistrar {
    fn register(&self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: the caller passes mapped memory it keeps mapped until
        // `unregister` (the trait's contract).
        unsafe { (self.register)(ptr.cast(), len) }
    }

    fn unregister(&self, ptr: *mut u8) {
        // SAFETY: `ptr` was registered by `register`.
        unsafe { (self.unregister)(ptr.cast()) }
    }
}

/// Drops `file`'s cached pages (`POSIX_FADV_DONTNEED`), so that buffered reads
/// after a buffered write go to the disk. Pages must be written back first
/// (`File::sync_all`).
pub fn evict_from_page_cache(file: &File) -> io::Result<()> {
    // SAFETY: a valid open descriptor; the call only advises the kernel.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

type CudaRegisterFn = unsafe extern "C" fn(*mut std::ffi::c_void, usize, u32) -> i32;
type CudaUnregisterFn = unsafe extern "C" fn(*mut std::ffi::c_void) -> i32;

/// The CUDA runtime's `cudaHostRegister` with the GPU allowed to write
/// (ggml's [`HostRegistrar`] registers read-only, fit for weights, not for
/// KV copied out of the GPU), found among the libraries this process has
/// loaded: libcudart comes with ggml-cuda when it is linked in; ggml's
/// backends loaded as modules keep it to themselves, and then there is none.
/// Page-locking memory this way ran at ~17 GB/s on the H200, against
/// ~2 GB/s for a pinned allocation (`cudaMallocHost`) of the same size.
pub struct CudaHostRegister {
    register: CudaRegisterFn,
    unregister: CudaUnregisterFn,
}

/// `cudaHostRegisterPortable`: pinned for every CUDA context of the process.
const CUDA_HOST_REGISTER_PORTABLE: u32 = 1;

impl CudaHostRegister {
    /// The process's `cudaHostRegister`, looked up once; `None` without a GPU.
    pub fn find() -> Option<&'static CudaHostRegister> {
        static FOUND: std::sync::OnceLock<Option<CudaHostRegister>> = std::sync::OnceLock::new();
        FOUND
            .get_or_init(|| {
                devices().into_iter().find(Device::is_gpu)?;
                // SAFETY: looking up NUL-terminated names among the loaded
                // libraries; null when absent.
                let (register, unregister) = unsafe {
                    (
                        libc::dlsym(libc::RTLD_DEFAULT, c"cudaHostRegister".as_ptr()),
                        libc::dlsym(libc::RTLD_DEFAULT, c"cudaHostUnregister".as_ptr()),
                    )
                };
                if register.is_null() || unregister.is_null() {
                    return None;
                }
                // SAFETY: the CUDA runtime's signatures: `cudaError_t
                // (void *, size_t, unsigned int)` and `cudaError_t (void *)`,
                // `cudaError_t` a C enum (an int).
                unsafe {
                    Some(CudaHostRegister {
                        register: std::mem::transmute::<*mut std::ffi::c_void, CudaRegisterFn>(
                            register,
                        ),
                        unregister: std::mem::transmute::<*mut std::ffi::c_void, CudaUnregisterFn>(
                            unregister,
                        ),
                    })
                }
            })
            .as_ref()
    }

    /// Page-locks `len` bytes at `ptr` for every GPU, writable by them;
    /// false when the driver refuses.
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped, and stays mapped until [`Self::unregister`].
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: the caller's contract.
        unsafe { (self.register)(ptr.cast(), len, CUDA_HOST_REGISTER_PORTABLE) == 0 }
    }

    /// Undoes [`Self::register`] at `ptr`.
    ///
    /// # Safety
    /// `ptr` was registered by [`Self::register`] and is still mapped.
    pub unsafe fn unregister(&self, ptr: *mut u8) {
        // SAFETY: the caller's contract.
        unsafe { (self.unregister)(ptr.cast()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_device_is_enumerated() {
        let cpu = cpu_device().expect("a CPU device");
        assert_eq!(cpu.kind, DeviceKind::Cpu);
        assert!(!cpu.name.is_empty());
        assert!(!cpu.is_gpu());
    }
}
