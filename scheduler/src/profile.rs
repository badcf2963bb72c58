//! The hardware profile: what `hypura profile` measures once and caches, and
//! what the planner's cost model reads. Plain data; measuring lives in the
//! engine (`llama_tiered::hwprobe`), which needs FFI and the file system.
use serde::{Deserialize, Serialize};

/// Bump when a field changes meaning: older cached profiles are re-measured.
pub const PROFILE_VERSION: u32 = 1;

/// One machine, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub version: u32,
    /// RFC 3339, UTC.
    pub measured_at: String,
    pub host: String,
    pub cpu: CpuProfile,
    pub ram: RamProfile,
    /// Empty on a machine without a GPU backend.
    pub gpus: Vec<GpuProfile>,
    pub disk: DiskProfile,
    /// Host memory a hypura process holds before it loads any model
    /// (absent in profiles measured before it was: [`HostOverhead::assumed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_overhead: Option<HostOverhead>,
}

/// Resident memory (RSS) of a fresh `hypura` process at three points of its
/// start: the fixed overhead that the RAM budget does not cover. A process
/// running a model under `--ram-budget B` peaks at most at `B +
/// after_devices_bytes`: the budget covers everything the model brings
/// (weights, stream cache, KV cache, llama.cpp's compute and output buffers,
/// the model's metadata), this covers the executable, its libraries and the
/// GPU runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostOverhead {
    /// Before llama.cpp is initialised: the executable and its libraries.
    pub process_bytes: u64,
    /// After llama.cpp's backends are initialised (GPU libraries loaded).
    pub after_backends_bytes: u64,
    /// After each device has a backend, a buffer and (GPUs) pinned host
    /// memory: the GPU runtime's context. The stated overhead.
    pub after_devices_bytes: u64,
}

impl HostOverhead {
    /// What a profile without a measurement assumes: 64 MiB (measured on
    /// a CPU-only build, 2026-12: about 13 MiB; the GPU runtime adds more).
    pub const fn assumed() -> HostOverhead {
        HostOverhead {
            process_bytes: assumed::HOST_OVERHEAD_BYTES,
            after_backends_bytes: assumed::HOST_OVERHEAD_BYTES,
            after_devices_bytes: assumed::HOST_OVERHEAD_BYTES,
        }
    }

    /// The overhead a run's peak may exceed its RAM budget by.
    pub fn bytes(&self) -> u64 {
        self.after_devices_bytes
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuProfile {
    /// e.g. `"Intel(R) Xeon(R) Platinum 8480+"`.
    pub model: String,
    /// Logical CPUs this process may run on.
    pub threads: u32,
    /// Rate at which the CPU backend consumes quantized (Q4_K) weights in a
    /// matrix × vector product with all `threads`, GB/s: a decode step's
    /// ceiling for weights held in RAM (often below `RamProfile::read_gbps`).
    pub q4k_matvec_gbps: f64,
    /// Rate of a prompt pass's matrix product on the CPU with all `threads`
    /// (a Q4_K weight times a batch of 512 columns), GFLOP/s; 0: not
    /// measured (profiles before it), and the cost model derives one from
    /// the matvec rate.
    #[serde(default)]
    pub q4k_prompt_gflops: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RamProfile {
    pub total_bytes: u64,
    pub available_bytes: u64,
    /// Multi-threaded sequential read bandwidth, GB/s (10^9 bytes).
    pub read_gbps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProfile {
    /// ggml device name, e.g. `"CUDA0"`.
    pub name: String,
    /// Device description, e.g. `"NVIDIA H200"`.
    pub description: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Rate at which this device consumes Q4_K weights in a matrix × vector
    /// product, GB/s (its effective memory bandwidth for decode).
    pub q4k_matvec_gbps: f64,
    /// Host → device copy from pinned host memory, GB/s.
    pub host_to_device_pinned_gbps: f64,
    /// Host → device copy from ordinary (pageable) host memory, GB/s.
    pub host_to_device_pageable_gbps: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskProfile {
    /// The directory whose volume was measured (where the models live).
    pub path: String,
    /// False when the file system refused O_DIRECT and buffered reads were measured.
    pub o_direct: bool,
    /// One point per (block size, queue depth) measured.
    pub reads: Vec<DiskReadPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskReadPoint {
    pub block_bytes: u64,
    pub queue_depth: u32,
    pub gbps: f64,
}

impl DiskProfile {
    /// Best measured read bandwidth, GB/s (0 when nothing was measured).
    pub fn best_gbps(&self) -> f64 {
        self.reads.iter().map(|p| p.gbps).fold(0.0, f64::max)
    }

    /// The slowest bandwidth measured at `queue_depth` (any block size;
    /// the best overall when none was measured there): a figure to plan
    /// with until a path's own reads are timed, where a choice made on the
    /// fast figure of a disk whose figures scatter costs more than the
    /// read saves.
    pub fn slowest_gbps_at(&self, queue_depth: u32) -> f64 {
        let slowest = self
            .reads
            .iter()
            .filter(|p| p.queue_depth == queue_depth && p.gbps > 0.0)
            .map(|p| p.gbps)
            .fold(f64::INFINITY, f64::min);
        if slowest.is_finite() {
            slowest
        } else {
            self.best_gbps()
        }
    }

    /// Bandwidth for reads of about `block_bytes` at up to `queue_depth`
    /// in flight: the best point with a block no larger and a depth no
    /// deeper (falls back to the best overall when none is).
    pub fn gbps_for(&self, block_bytes: u64, queue_depth: u32) -> f64 {
        let fitting = self
            .reads
            .iter()
            .filter(|p| p.block_bytes <= block_bytes.max(1) && p.queue_depth <= queue_depth.max(1))
            .map(|p| p.gbps)
            .fold(0.0, f64::max);
        if fitting > 0.0 {
            fitting
        } else {
            self.best_gbps()
        }
    }
}

/// What [`HardwareProfile::estimated`] writes in `measured_at`: nothing was measured.
pub const NOT_MEASURED: &str = "not measured";

/// Speeds assumed before anything is measured, low for their kind (a
/// plan made with them errs towards predicting too little, never towards
/// placing more than fits: sizes are always this machine's own).
pub mod assumed {
    pub const CPU_Q4K_MATVEC_GBPS: f64 = 10.0;
    pub const RAM_READ_GBPS: f64 = 10.0;
    pub const GPU_Q4K_MATVEC_GBPS: f64 = 200.0;
    pub const HOST_TO_DEVICE_PINNED_GBPS: f64 = 10.0;
    pub const HOST_TO_DEVICE_PAGEABLE_GBPS: f64 = 5.0;
    pub const DISK_READ_GBPS: f64 = 0.5;
    /// See [`super::HostOverhead::assumed`].
    pub const HOST_OVERHEAD_BYTES: u64 = 64 << 20;
}

impl GpuProfile {
    /// A GPU of known memory at [`assumed`] speeds.
    pub fn estimated(name: String, description: String, total_bytes: u64, free_bytes: u64) -> Self {
        GpuProfile {
            name,
            description,
            total_bytes,
            free_bytes,
            q4k_matvec_gbps: assumed::GPU_Q4K_MATVEC_GBPS,
            host_to_device_pinned_gbps: assumed::HOST_TO_DEVICE_PINNED_GBPS,
            host_to_device_pageable_gbps: assumed::HOST_TO_DEVICE_PAGEABLE_GBPS,
        }
    }
}

impl HardwareProfile {
    /// This machine's sizes (threads, RAM, GPUs) with [`assumed`] speeds:
    /// what a server plans with until `hypura profile` has measured it.
    pub fn estimated(
        host: String,
        threads: u32,
        ram_total_bytes: u64,
        ram_available_bytes: u64,
        gpus: Vec<GpuProfile>,
    ) -> HardwareProfile {
        HardwareProfile {
            version: PROFILE_VERSION,
            measured_at: NOT_MEASURED.into(),
            host,
            cpu: CpuProfile {
                model: "unknown".into(),
                threads,
                q4k_matvec_gbps: assumed::CPU_Q4K_MATVEC_GBPS,
                q4k_prompt_gflops: 0.0,
            },
            ram: RamProfile {
                total_bytes: ram_total_bytes,
                available_bytes: ram_available_bytes,
                read_gbps: assumed::RAM_READ_GBPS,
            },
            gpus,
            disk: DiskProfile {
                path: String::new(),
                o_direct: true,
                reads: vec![DiskReadPoint {
                    block_bytes: 1 << 20,
                    queue_depth: 4,
                    gbps: assumed::DISK_READ_GBPS,
                }],
            },
            host_overhead: None,
        }
    }

    /// Whether this profile was measured (not [`HardwareProfile::estimated`]).
    pub fn is_measured(&self) -> bool {
        self.measured_at != NOT_MEASURED
    }

    /// The host overhead measured, else [`HostOverhead::assumed`].
    pub fn host_overhead(&self) -> HostOverhead {
        self.host_overhead.unwrap_or(HostOverhead::assumed())
    }

    /// Total GPU memory over all GPUs.
    pub fn gpu_total_bytes(&self) -> u64 {
        self.gpus.iter().map(|g| g.total_bytes).sum()
    }
}

/// Profiles for tests, here and in the crates above (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod fixtures {
    use super::{DiskProfile, DiskReadPoint};

    /// A disk read at QD1 and QD32 with 64 KiB and 16 MiB blocks: 0.3, 1.0, 1.2 and 1.3 GB/s.
    pub fn disk() -> DiskProfile {
        DiskProfile {
            path: "/models".into(),
            o_direct: true,
            reads: vec![
                DiskReadPoint {
                    block_bytes: 64 << 10,
                    queue_depth: 1,
                    gbps: 0.3,
                },
                DiskReadPoint {
                    block_bytes: 64 << 10,
                    queue_depth: 32,
                    gbps: 1.0,
                },
                DiskReadPoint {
                    block_bytes: 16 << 20,
                    queue_depth: 1,
                    gbps: 1.2,
                },
                DiskReadPoint {
                    block_bytes: 16 << 20,
                    queue_depth: 32,
                    gbps: 1.3,
                },
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::disk;

    #[test]
    fn disk_bandwidth_is_looked_up_by_block_and_depth() {
        let d = disk();
        assert_eq!(d.best_gbps(), 1.3);
        assert_eq!(d.gbps_for(64 << 10, 1), 0.3);
        assert_eq!(d.gbps_for(1 << 20, 8), 0.3);
        assert_eq!(d.gbps_for(1 << 20, 32), 1.0);
        assert_eq!(d.gbps_for(32 << 20, 4), 1.2);
        // Smaller than anything measured: the best there is.
        assert_eq!(d.gbps_for(4096, 1), 1.3);
    }

    #[test]
    fn the_slowest_read_at_a_depth_is_the_floor_of_that_depth() {
        let d = disk();
        // Single stream: 0.3 (64 KiB) and 1.2 (16 MiB) were measured.
        assert_eq!(d.slowest_gbps_at(1), 0.3);
        assert_eq!(d.slowest_gbps_at(32), 1.0);
        // Nothing at that depth: the best there is.
        assert_eq!(d.slowest_gbps_at(7), 1.3);
    }
}
