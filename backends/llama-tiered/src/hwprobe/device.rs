//! Device measurements for the profile: the rate at which a device consumes a Q4_K weight
//! in a matrix × vector product, and host → device copy rates. The CPU (always present)
//! runs exactly the code a GPU runs.
use std::time::Instant;

use crate::llama::device::{
    Device, DeviceBackend, DeviceBytes, DeviceProbeError, MatvecGraph, PinnedHostBytes,
};
use crate::llama::gguf_write::{quantize_rows, GgmlType};
use crate::rng::Rng;

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
const MATVEC_COLS: usize = 4096;
/// Rows quantized once and repeated through the weight.
const MATVEC_TILE_ROWS: usize = 256;

/// Rate at which `dev` consumes a Q4_K weight in `W × x` (x an F32 vector), in
/// GB/s (10^9 bytes): weight bytes ÷ median time of one product. The weight
/// lives in the device's own buffer type and holds valid Q4_K blocks
/// (quantized random floats, so no NaN or denormal slow paths).
pub fn q4k_matvec_gbps(dev: &Device, spec: &MatvecSpec) -> Result<f64, DeviceProbeError> {
    let row_bytes = GgmlType::Q4_K
        .row_bytes(MATVEC_COLS)
        .ok_or_else(|| dev.failed("Q4_K row size unknown"))? as u64;
    let rows = spec
        .min_weight_bytes
        .div_ceil(row_bytes)
        .next_multiple_of(MATVEC_TILE_ROWS as u64)
        .max(MATVEC_TILE_ROWS as u64) as usize;
    let reps = products_per_graph(dev);
    let graph = MatvecGraph::new(dev, GgmlType::Q4_K, MATVEC_COLS, rows, 1, reps as usize)?;
    let seconds = time_products(dev, &graph, spec, reps)?;
    let weight_bytes = rows as u64 * row_bytes;
    Ok(weight_bytes as f64 / seconds / 1e9)
}

/// Rows of the prompt probe's weight: a square Llama-8B projection.
const PROMPT_ROWS: usize = 4096;
/// Tokens of the prompt probe's batch: llama.cpp's default pass (`n_ubatch`).
const PROMPT_BATCH: usize = 512;

/// Rate at which `dev` computes a prompt pass's matrix product, in GFLOP/s
/// (10^9 multiply-adds × 2): a Q4_K weight of 4,096 × 4,096 times a batch
/// of 512 F32 columns, the median of `spec.runs` products. A matrix × vector
/// product reads each weight byte once and waits on memory; a batch reuses
/// it for every column and waits on arithmetic, which the matvec rate says
/// nothing about (on the 2-core development machine the matvec measured
/// 11 to 33 GB/s from one hour to the next while llama.cpp's pp512 moved
/// far less).
pub fn q4k_prompt_gflops(dev: &Device, spec: &MatvecSpec) -> Result<f64, DeviceProbeError> {
    let reps = products_per_graph(dev);
    let graph = MatvecGraph::new(
        dev,
        GgmlType::Q4_K,
        MATVEC_COLS,
        PROMPT_ROWS,
        PROMPT_BATCH,
        reps as usize,
    )?;
    let seconds = time_products(dev, &graph, spec, reps)?;
    let flop = 2.0 * (MATVEC_COLS * PROMPT_ROWS * PROMPT_BATCH) as f64;
    Ok(flop / seconds / 1e9)
}

/// Products a timed graph holds: a GPU computes one in well under a
/// millisecond, so several share a graph and its launch and sync costs.
fn products_per_graph(dev: &Device) -> u32 {
    if dev.is_gpu() {
        16
    } else {
        1
    }
}

/// Fills `graph` and times it: the median seconds of one of its `reps`
/// products over `spec.runs` computations, after one warm-up.
fn time_products(
    dev: &Device,
    graph: &MatvecGraph,
    spec: &MatvecSpec,
    reps: u32,
) -> Result<f64, DeviceProbeError> {
    fill(dev, graph)?;
    let backend = DeviceBackend::init(dev, spec.threads)?;
    graph.compute(&backend)?; // warm-up: first-use allocations, kernel loads
    let mut secs = Vec::with_capacity(spec.runs.max(1) as usize);
    for _ in 0..spec.runs.max(1) {
        let start = Instant::now();
        graph.compute(&backend)?;
        secs.push(start.elapsed().as_secs_f64() / f64::from(reps));
    }
    Ok(median(&mut secs))
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

/// Writes valid Q4_K rows (a quantized random tile, repeated) and random inputs.
fn fill(dev: &Device, graph: &MatvecGraph) -> Result<(), DeviceProbeError> {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let tile_f32: Vec<f32> = (0..MATVEC_TILE_ROWS * MATVEC_COLS)
        .map(|_| rng.signed_unit())
        .collect();
    let tile = quantize_rows(GgmlType::Q4_K, &tile_f32, MATVEC_COLS)
        .map_err(|e| dev.failed(format!("quantizing the Q4_K tile: {e}")))?;
    let weight_bytes = graph.weight_bytes();
    for offset in (0..weight_bytes).step_by(tile.len()) {
        let n = tile.len().min(weight_bytes - offset);
        graph.set_weight(offset, &tile[..n])?;
    }
    for i in 0..graph.n_inputs() {
        let v: Vec<f32> = (0..graph.input_len()).map(|_| rng.signed_unit()).collect();
        graph.set_input(i, &v)?;
    }
    Ok(())
}

/// Host → device copy rates, GB/s (10^9 bytes).
#[derive(Debug, Clone, Copy)]
pub struct HostCopyRates {
    /// From the device's pinned host buffer type; `None` when the device has none.
    pub pinned_gbps: Option<f64>,
    /// From ordinary heap memory.
    pub pageable_gbps: f64,
}

/// Times copies of `bytes` into `dev`'s memory, from pinned host memory
/// (`ggml_backend_dev_host_buffer_type`) and from a plain `Vec`; each the median of
/// `runs` copies after one warm-up.
pub fn host_to_device_gbps(
    dev: &Device,
    bytes: u64,
    runs: u32,
) -> Result<HostCopyRates, DeviceProbeError> {
    let len = bytes as usize;
    let target = DeviceBytes::alloc(dev, len)?;

    let mut pageable = vec![0u8; len];
    fill_pattern(&mut pageable);
    let pageable_gbps = time_copies(&target, &pageable, runs);
    drop(pageable);

    let pinned_gbps = match PinnedHostBytes::alloc(dev, len)? {
        None => None,
        Some(mut pinned) => {
            fill_pattern(pinned.as_mut_slice());
            Some(time_copies(&target, pinned.as_slice(), runs))
        }
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

fn time_copies(target: &DeviceBytes, src: &[u8], runs: u32) -> f64 {
    target.copy_from(src);
    let mut secs: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            target.copy_from(src);
            start.elapsed().as_secs_f64()
        })
        .collect();
    src.len() as f64 / median(&mut secs) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::device::cpu_device;

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
    fn a_prompt_batch_reuses_each_weight_byte_for_many_columns() {
        let cpu = cpu_device().unwrap();
        let spec = MatvecSpec {
            min_weight_bytes: 8 << 20,
            runs: 2,
            threads: 1,
        };
        let gflops = q4k_prompt_gflops(&cpu, &spec).unwrap();
        assert!(gflops.is_finite() && gflops > 0.0, "{gflops}");
        // A matvec does two flops per parameter it reads (4.5 bits each).
        // The batch's 512 columns take about as long a flop (the CPU's
        // kernels are arithmetic-bound either way once the weight is in
        // cache): a product that skipped its columns would report ~512×.
        let matvec_gflops = q4k_matvec_gbps(&cpu, &spec).unwrap() * 2.0 * 8.0 / 4.5;
        assert!(
            gflops > 0.5 * matvec_gflops && gflops < 50.0 * matvec_gflops,
            "{gflops} against {matvec_gflops}"
        );
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
