//! This process's own memory: its resident set now and at its peak (from
//! `/proc/self/status`), and the fixed host overhead of a hypura process
//! ([`measure_overhead`]), which `hypura profile` reports and the RAM
//! budget does not cover.
use hypura_scheduler::profile::HostOverhead;

use crate::llama::device::DeviceProbeError;
use crate::llama::device::{self as devices, DeviceBackend, MatvecGraph, PinnedHostBytes};
use crate::llama::gguf_write::GgmlType;

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`…), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&status, field).map(|kb| kb * 1024)
}

fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// This process's resident set now (`VmRSS`); `None` where `/proc` has no
/// such field (not Linux).
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS")
}

/// This process's resident set now, from `/proc/self/statm` (the same
/// figure as `VmRSS`, several times cheaper to read: for checks made while
/// decoding).
pub fn statm_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The most this process has had resident at once so far (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM")
}

/// Size of the pinned host memory that makes a GPU set up its host side.
const PINNED_PROBE_BYTES: usize = 1 << 20;
/// The small product each device computes once (a 4096 × 64 Q4_K weight,
/// 144 KiB): its compute kernels are loaded, its threads started.
const PROBE_COLS: usize = 4096;
const PROBE_ROWS: usize = 64;

/// The host overhead of this process, read at three points: now (the
/// executable and its libraries), after llama.cpp's backends are
/// initialised, and after every device has a backend that has computed a
/// small Q4_K product (with all of this machine's threads on the CPU) and
/// (GPUs) 1 MiB of pinned host memory: the GPU runtime's context and
/// kernels, the CPU backend's threads. Meant for a fresh process (`hypura
/// profile`): where llama.cpp was initialised before, the first two
/// readings are taken after it (they then say the same as the third, or
/// more than a fresh process). Zeros where `/proc/self/status` is missing.
pub fn measure_overhead() -> Result<HostOverhead, DeviceProbeError> {
    let process_bytes = rss_bytes().unwrap_or(0);
    let all = devices::devices();
    let after_backends_bytes = rss_bytes().unwrap_or(0).max(process_bytes);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let mut held = Vec::new();
    for dev in &all {
        let backend = DeviceBackend::init(dev, threads)?;
        let graph = MatvecGraph::new(dev, GgmlType::Q4_K, PROBE_COLS, PROBE_ROWS, 1, 1)?;
        // Zero scales: a valid weight whose product is zero.
        graph.set_weight(0, &vec![0; graph.weight_bytes()])?;
        graph.set_input(0, &[0.0; PROBE_COLS])?;
        graph.compute(&backend)?;
        let pinned = PinnedHostBytes::alloc(dev, PINNED_PROBE_BYTES)?;
        held.push((graph, backend, pinned));
    }
    let after_devices_bytes = rss_bytes().unwrap_or(0).max(after_backends_bytes);
    drop(held);
    Ok(HostOverhead {
        process_bytes,
        after_backends_bytes,
        after_devices_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes() {
        let status = "Name:\thypura\nVmHWM:\t  463264 kB\nVmRSS:\t  12744 kB\n";
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(12744));
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(463264));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
        assert!(rss_bytes().unwrap() > 0);
        assert!(peak_rss_bytes().unwrap() >= rss_bytes().unwrap());
        let (statm, status) = (statm_rss_bytes().unwrap(), rss_bytes().unwrap());
        assert!(statm.abs_diff(status) < 16 << 20, "{statm} vs {status}");
    }

    #[test]
    fn the_overhead_grows_from_the_process_to_its_devices() {
        let o = measure_overhead().unwrap();
        assert!(o.process_bytes > 0, "{o:?}");
        assert!(o.process_bytes <= o.after_backends_bytes, "{o:?}");
        assert!(o.after_backends_bytes <= o.after_devices_bytes, "{o:?}");
    }
}
