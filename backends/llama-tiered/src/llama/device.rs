//! The FFI half of `hypura profile`: ggml's compute devices, a Q4_K matrix ×
//! vector timed on any of them, and host → device copies.
//!
//! The matvec and the copies take a [`Device`] whatever its kind, so the CPU
//! (always present) runs exactly the code a GPU runs. The safe orchestration
//! (RAM, disk, caching) lives in [`crate::hwprobe`].
use std::ffi::{c_char, CStr};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Once;
use std::time::Instant;

use hypura_llama_sys as sys;

use super::gguf_write::{quantize_rows, GgmlType};
use crate::rng::Rng;

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

    fn failed(&self, what: impl Into<String>) -> DeviceProbeError {
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

/// How big and how often the Q4_K matvec is timed.
#[derive(Debug, Clone, Copy)]
pub struct MatvecSpec {
    /// The weight is at least this many bytes (make it exceed the last-level cache).
    pub min_weight_bytes: u64,
    /// Timed graph computations; the median is reported.
    pub runs: u32,
    /// Threads for a CPU-kind device (others ignore it).
    pub threads: u32,
}

/// Columns of the weight (elements per row): a Llama-8B hidden size.
const MATVEC_COLS: i64 = 4096;
/// Rows quantized once and repeated through the weight.
const MATVEC_TILE_ROWS: i64 = 256;

/// Rate at which `dev` consumes a Q4_K weight in `W × x` (x an F32 vector), in
/// GB/s (10^9 bytes): weight bytes ÷ median time of one product. The weight
/// lives in the device's own buffer type and holds valid Q4_K blocks
/// (quantized random floats, so no NaN or denormal slow paths).
pub fn q4k_matvec_gbps(dev: &Device, spec: &MatvecSpec) -> Result<f64, DeviceProbeError> {
    let row_bytes = GgmlType::Q4_K
        .row_bytes(MATVEC_COLS as usize)
        .ok_or_else(|| dev.failed("Q4_K row size unknown"))? as u64;
    let rows = spec
        .min_weight_bytes
        .div_ceil(row_bytes)
        .next_multiple_of(MATVEC_TILE_ROWS as u64)
        .max(MATVEC_TILE_ROWS as u64) as i64;
    // A GPU reads a few hundred MB in well under a millisecond: put several
    // products in one graph so launch and sync costs do not dominate.
    let reps: u32 = if dev.is_gpu() { 16 } else { 1 };
    let graph = MatvecGraph::new(dev, rows, reps as usize)?;
    graph.fill(dev)?;
    let backend = DeviceBackend::init(dev, spec.threads)?;

    graph.compute(dev, &backend)?; // warm-up: first-use allocations, kernel loads
    let mut secs = Vec::with_capacity(spec.runs.max(1) as usize);
    for _ in 0..spec.runs.max(1) {
        let start = Instant::now();
        graph.compute(dev, &backend)?;
        secs.push(start.elapsed().as_secs_f64() / f64::from(reps));
    }
    let weight_bytes = rows as u64 * row_bytes;
    Ok(weight_bytes as f64 / median(&mut secs) / 1e9)
}

/// Median of `v` (0 for an empty slice).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
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
struct DeviceBackend(NonNull<sys::ggml_backend>);

impl DeviceBackend {
    fn init(dev: &Device, threads: u32) -> Result<DeviceBackend, DeviceProbeError> {
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

/// `reps` products `W × x_i` of one Q4_K weight, all tensors in a device buffer.
struct MatvecGraph {
    // Held for the tensors' storage and metadata; field order is drop
    // order: the buffer before the context that describes it.
    _buffer: Buffer,
    _ctx: MetaContext,
    graph: NonNull<sys::ggml_cgraph>,
    weight: NonNull<sys::ggml_tensor>,
    inputs: Vec<NonNull<sys::ggml_tensor>>,
}

impl MatvecGraph {
    fn new(dev: &Device, rows: i64, reps: usize) -> Result<MatvecGraph, DeviceProbeError> {
        let ctx = MetaContext::new(1 + 2 * reps, true).map_err(|e| dev.failed(e))?;
        let c = ctx.as_ptr();
        // SAFETY: `c` is a live no-alloc context sized for these tensors
        // and one graph; ggml returns non-null or aborts.
        let (weight, inputs, graph) = unsafe {
            let w = sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_Q4_K, MATVEC_COLS, rows);
            let graph = sys::ggml_new_graph(c);
            let mut inputs = Vec::with_capacity(reps);
            for _ in 0..reps {
                let x = sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_F32, MATVEC_COLS, 1);
                let y = sys::ggml_mul_mat(c, w, x);
                if !sys::ggml_backend_dev_supports_op(dev.raw, y) {
                    return Err(dev.failed("cannot compute a Q4_K × F32 matrix-vector product"));
                }
                sys::ggml_build_forward_expand(graph, y);
                inputs.push(NonNull::new(x).ok_or_else(|| dev.failed("ggml_new_tensor failed"))?);
            }
            (NonNull::new(w), inputs, NonNull::new(graph))
        };
        let (Some(weight), Some(graph)) = (weight, graph) else {
            return Err(dev.failed("ggml_new_tensor failed"));
        };
        let bytes =
            rows as u64 * GgmlType::Q4_K.row_bytes(MATVEC_COLS as usize).unwrap_or(0) as u64;
        let buffer = alloc_on_device(dev, &ctx, "Q4_K weight", bytes)?;
        Ok(MatvecGraph {
            _buffer: buffer,
            _ctx: ctx,
            graph,
            weight,
            inputs,
        })
    }

    /// Writes valid Q4_K rows (a quantized random tile, repeated) and random inputs.
    fn fill(&self, dev: &Device) -> Result<(), DeviceProbeError> {
        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
        let tile_f32: Vec<f32> = (0..MATVEC_TILE_ROWS * MATVEC_COLS)
            .map(|_| rng.signed_unit())
            .collect();
        let tile = quantize_rows(GgmlType::Q4_K, &tile_f32, MATVEC_COLS as usize)
            .map_err(|e| dev.failed(format!("quantizing the Q4_K tile: {e}")))?;
        // SAFETY: the weight is allocated; reading its size.
        let weight_bytes = unsafe { sys::ggml_nbytes(self.weight.as_ptr()) };
        for offset in (0..weight_bytes).step_by(tile.len()) {
            let n = tile.len().min(weight_bytes - offset);
            // SAFETY: `[offset, offset + n)` lies inside the weight; `tile` holds ≥ n bytes.
            unsafe {
                sys::ggml_backend_tensor_set(self.weight.as_ptr(), tile.as_ptr().cast(), offset, n)
            };
        }
        for x in &self.inputs {
            let v: Vec<f32> = (0..MATVEC_COLS).map(|_| rng.signed_unit()).collect();
            // SAFETY: `x` is allocated with exactly `MATVEC_COLS` f32 values.
            unsafe { sys::ggml_backend_tensor_set(x.as_ptr(), v.as_ptr().cast(), 0, v.len() * 4) };
        }
        Ok(())
    }

    /// Computes the graph to completion (`ggml_backend_graph_compute` syncs).
    fn compute(&self, dev: &Device, backend: &DeviceBackend) -> Result<(), DeviceProbeError> {
        // SAFETY: every tensor of the graph is allocated in a buffer the
        // backend's device can use; the graph outlives the call.
        let status =
            unsafe { sys::ggml_backend_graph_compute(backend.0.as_ptr(), self.graph.as_ptr()) };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(dev.failed(format!("graph compute failed with status {status}")))
        }
    }
}

/// Host → device copy rates, GB/s (10^9 bytes).
#[derive(Debug, Clone, Copy)]
pub struct HostCopyRates {
    /// From the device's pinned host buffer type; `None` when the device has none.
    pub pinned_gbps: Option<f64>,
    /// From ordinary heap memory.
    pub pageable_gbps: f64,
}

/// Times `ggml_backend_tensor_set` of `bytes` into a tensor in `dev`'s memory,
/// from pinned host memory (`ggml_backend_dev_host_buffer_type`) and from a
/// plain `Vec`; each the median of `runs` copies after one warm-up.
pub fn host_to_device_gbps(
    dev: &Device,
    bytes: u64,
    runs: u32,
) -> Result<HostCopyRates, DeviceProbeError> {
    let ctx = MetaContext::new(1, false).map_err(|e| dev.failed(e))?;
    // SAFETY: a live no-alloc context with room for one tensor.
    let target = unsafe { sys::ggml_new_tensor_1d(ctx.as_ptr(), sys::GGML_TYPE_I8, bytes as i64) };
    let target = NonNull::new(target).ok_or_else(|| dev.failed("ggml_new_tensor failed"))?;
    let _buffer = alloc_on_device(dev, &ctx, "copy target", bytes)?;
    let len = bytes as usize;

    let mut pageable = vec![0u8; len];
    fill_pattern(&mut pageable);
    let pageable_gbps = time_copies(target, pageable.as_ptr(), len, runs);
    drop(pageable);

    // SAFETY: `dev.raw` is a registered device; null when it has no host buffer type.
    let host_buft = unsafe { sys::ggml_backend_dev_host_buffer_type(dev.raw) };
    let pinned_gbps = if host_buft.is_null() {
        None
    } else {
        // SAFETY: a valid buffer type; null on failure.
        let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(host_buft, len) };
        let pinned = NonNull::new(raw)
            .map(Buffer)
            .ok_or_else(|| dev.alloc_failed("pinned host memory", bytes))?;
        // SAFETY: a host buffer of at least `len` bytes, mapped in this process.
        let base = unsafe { sys::ggml_backend_buffer_get_base(pinned.0.as_ptr()) }.cast::<u8>();
        if base.is_null() {
            return Err(dev.failed("pinned host buffer has no base address"));
        }
        // SAFETY: `base` points at `len` writable bytes owned by `pinned`,
        // which no one else references.
        fill_pattern(unsafe { std::slice::from_raw_parts_mut(base, len) });
        Some(time_copies(target, base, len, runs))
    };
    Ok(HostCopyRates {
        pinned_gbps,
        pageable_gbps,
    })
}

/// Non-zero bytes, written so every page is really backed.
fn fill_pattern(buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8) ^ 0x5a;
    }
}

fn time_copies(target: NonNull<sys::ggml_tensor>, src: *const u8, len: usize, runs: u32) -> f64 {
    let copy = || {
        // SAFETY: `target` holds `len` bytes in an allocated buffer; `src`
        // points at `len` readable bytes. The call returns when copied.
        unsafe { sys::ggml_backend_tensor_set(target.as_ptr(), src.cast(), 0, len) }
    };
    copy();
    let mut secs: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            copy();
            start.elapsed().as_secs_f64()
        })
        .collect();
    len as f64 / median(&mut secs) / 1e9
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

    #[test]
    fn the_matvec_runs_on_the_cpu_device() {
        let cpu = cpu_device().unwrap();
        let spec = MatvecSpec {
            min_weight_bytes: 8 << 20,
            runs: 2,
            threads: 1,
        };
        let gbps = q4k_matvec_gbps(&cpu, &spec).unwrap();
        assert!(gbps.is_finite() && gbps > 0.0, "{gbps}");
    }

    #[test]
    fn host_copies_run_on_the_cpu_device() {
        let cpu = cpu_device().unwrap();
        let rates = host_to_device_gbps(&cpu, 4 << 20, 2).unwrap();
        assert!(rates.pageable_gbps.is_finite() && rates.pageable_gbps > 0.0);
        // The CPU backend has no separate pinned host buffer type.
        assert_eq!(rates.pinned_gbps, None);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
