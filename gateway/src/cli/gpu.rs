//! The GPU budget in force when no flag sets one: what the GPUs have free,
//! less a margin per device (`serve`, `run` and `bench` resolve it here).
//!
//! Default: on each GPU, its free memory less [`GPU_MARGIN_BYTES`] (the CUDA
//! context, cuBLAS workspaces and allocator slack that llama.cpp does not
//! count), summed over the GPUs. `--gpu-budget 0` keeps everything on the
//! CPU; a build without a GPU backend, or one finding no device, has no GPU
//! budget at all.
use hypura_scheduler::size::format_bytes;
use llama_tiered::llama::GpuDevice;

/// GPU memory left free on each device by the default budget: the planner's
/// reserve, so that a default budget and a planned one agree.
pub const GPU_MARGIN_BYTES: u64 = hypura_scheduler::plan::GPU_RESERVE_BYTES;

/// Where a GPU budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--gpu-budget` or the configuration file.
    Given,
    /// Free memory less the margin.
    Default,
    /// No GPU found.
    NoGpu,
}

/// A resolved GPU budget with the devices it was resolved against.
#[derive(Debug, Clone)]
pub struct GpuBudget {
    /// `None` only when no GPU was found and none was asked for.
    pub bytes: Option<u64>,
    pub source: Source,
    pub devices: Vec<GpuDevice>,
}

impl GpuBudget {
    /// Resolves `given` (a flag or configured value) against the GPUs found now.
    pub fn resolve(given: Option<u64>) -> GpuBudget {
        Self::from_devices(given, llama_tiered::llama::gpu_devices())
    }

    /// [`GpuBudget::resolve`] against `devices` (testable without a GPU).
    pub fn from_devices(given: Option<u64>, devices: Vec<GpuDevice>) -> GpuBudget {
        let (bytes, source) = match given {
            Some(bytes) => (Some(bytes), Source::Given),
            None if devices.is_empty() => (None, Source::NoGpu),
            None => (Some(default_budget_bytes(&devices)), Source::Default),
        };
        GpuBudget {
            bytes,
            source,
            devices,
        }
    }

    /// One line for the start-up log: devices, their memory, the budget and why.
    pub fn describe(&self) -> String {
        let devices = self
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{} ({}) {} free of {}",
                    d.name,
                    d.description,
                    format_bytes(d.free_bytes),
                    format_bytes(d.total_bytes)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        match (self.source, self.bytes) {
            (Source::NoGpu, _) | (_, None) => "no GPU found: CPU only".to_string(),
            (Source::Given, Some(0)) if self.devices.is_empty() => {
                "GPU budget 0 (CPU only); no GPU found".to_string()
            }
            (Source::Given, Some(0)) => format!("GPU budget 0 (CPU only) beside {devices}"),
            (Source::Given, Some(_)) if self.devices.is_empty() => format!(
                "GPU budget {} given but no GPU found (a CPU-only build?): CPU only",
                self.size()
            ),
            (Source::Given, Some(_)) => format!("GPU budget {} on {devices}", self.size()),
            (Source::Default, Some(_)) => format!(
                "GPU budget {} (default: free memory less {} per device; \
                 --gpu-budget 0 for CPU only) on {devices}",
                self.size(),
                format_bytes(GPU_MARGIN_BYTES)
            ),
        }
    }

    fn size(&self) -> String {
        format_bytes(self.bytes.unwrap_or(0))
    }
}

/// The default budget over `devices`: each one's free memory less the margin.
pub fn default_budget_bytes(devices: &[GpuDevice]) -> u64 {
    devices
        .iter()
        .map(|d| d.free_bytes.saturating_sub(GPU_MARGIN_BYTES))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn device(index: usize, free_bytes: u64, total_bytes: u64) -> GpuDevice {
        GpuDevice {
            index,
            name: format!("CUDA{index}"),
            description: "NVIDIA H200".into(),
            free_bytes,
            total_bytes,
        }
    }

    #[test]
    fn the_default_is_free_memory_less_the_margin_per_device() {
        let devices = vec![
            device(0, 139 * GIB, 140 * GIB),
            device(1, 20 * GIB, 140 * GIB),
        ];
        let budget = GpuBudget::from_devices(None, devices);
        assert_eq!(budget.source, Source::Default);
        assert_eq!(budget.bytes, Some((139 - 1) * GIB + (20 - 1) * GIB));
    }

    #[test]
    fn a_device_with_less_free_than_the_margin_adds_nothing() {
        let budget = GpuBudget::from_devices(None, vec![device(0, GIB / 2, 8 * GIB)]);
        assert_eq!(budget.bytes, Some(0));
    }

    #[test]
    fn a_given_budget_wins_and_zero_is_cpu_only() {
        let given = GpuBudget::from_devices(Some(24 * GIB), vec![device(0, 139 * GIB, 140 * GIB)]);
        assert_eq!((given.bytes, given.source), (Some(24 * GIB), Source::Given));
        let zero = GpuBudget::from_devices(Some(0), vec![device(0, 139 * GIB, 140 * GIB)]);
        assert_eq!(zero.bytes, Some(0));
        assert!(
            zero.describe().starts_with("GPU budget 0 (CPU only)"),
            "{}",
            zero.describe()
        );
    }

    #[test]
    fn without_a_gpu_there_is_no_budget() {
        let budget = GpuBudget::from_devices(None, Vec::new());
        assert_eq!((budget.bytes, budget.source), (None, Source::NoGpu));
        assert_eq!(budget.describe(), "no GPU found: CPU only");
    }

    #[test]
    fn the_log_line_names_devices_and_the_margin() {
        let budget = GpuBudget::from_devices(None, vec![device(0, 139 * GIB, 140 * GIB)]);
        let line = budget.describe();
        assert!(
            line.starts_with("GPU budget 138.0 GiB (default: free memory less 1.0 GiB per device"),
            "{line}"
        );
        assert!(
            line.ends_with("on CUDA0 (NVIDIA H200) 139.0 GiB free of 140.0 GiB"),
            "{line}"
        );
    }
}
