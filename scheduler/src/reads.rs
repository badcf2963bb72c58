//! How fast a model's streamer read its file on this machine, as measured
//! while it ran.
//!
//! The profile's disk probe and the streamer do not see the same disk. On
//! the virtual disks of the GPU machines and the development machine, the
//! streamer inside a decode read faster than any probe outside one: the
//! H100 machine's decodes and prompt passes 16–54% above the probe run
//! seconds before (session 29), the development machine's Mixtral decode
//! 2.5–2.9 GB/s where the profile, fio and the streamer's own reader timed
//! alone measured 0.8–1.6 at any block size, depth or destination (session
//! 30; `/proc/diskstats` confirmed the bytes), which put the planner's
//! decode 50% slow. A streamer therefore saves what it measured (`reads/KEY.json`
//! in the cache directory, beside the co-activation counts), and the
//! planner prices a model that has streamed by its own reads (the rate, and
//! a layer request's wait beyond it); a model never streamed here is priced
//! by the profile.
//!
//! A model's first prompt pass (cold: begun before the stream cache's
//! first eviction) reads slower than later ones, which neither the decode's
//! rate nor the probe's says (session 31: on an H100 machine, Qwen3's first
//! passes 1.70–1.78 GB/s against 2.34–2.50 for later ones in the same
//! minutes and 1.85 for its decode; Mixtral's 1.44–1.79 against 1.84–2.20;
//! on the development machine 0.24 against 1.79–1.91). Cold and warm
//! passes are saved and priced apart.
use serde::{Deserialize, Serialize};

/// Bytes a phase must have read before its rate is trusted: a few
/// thousand of the streamer's 1 MiB reads, seconds of reading.
pub const MIN_MEASURED_READ_BYTES: f64 = 1e9;

/// The weight of earlier runs' totals against a new run's when they are
/// combined ([`MeasuredReads::after`]): the disk drifts (a virtual disk by a
/// third within minutes), so recent runs count most.
pub const EARLIER_RUNS_WEIGHT: f64 = 0.5;

/// Bytes read and the seconds reading them took; and the layers that asked
/// for units, with the seconds they waited for them (reads included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadTotals {
    pub bytes: f64,
    pub seconds: f64,
    #[serde(default)]
    pub layer_requests: f64,
    #[serde(default)]
    pub stall_seconds: f64,
}

impl ReadTotals {
    /// The rate, GB/s, once [`MIN_MEASURED_READ_BYTES`] were read.
    pub fn gbps(&self) -> Option<f64> {
        (self.bytes >= MIN_MEASURED_READ_BYTES && self.seconds > 0.0)
            .then(|| self.bytes / self.seconds / 1e9)
    }

    /// A layer request's wait beyond its reads at [`ReadTotals::gbps`]
    /// (bookkeeping, evictions, a unit another thread is reading), seconds;
    /// with the rate it makes the measured waits add up. Trusted with the rate.
    pub fn request_seconds(&self) -> Option<f64> {
        self.gbps()?;
        (self.layer_requests > 0.0)
            .then(|| ((self.stall_seconds - self.seconds) / self.layer_requests).max(0.0))
    }

    fn after(self, run: ReadTotals) -> ReadTotals {
        let mix = |earlier: f64, new: f64| earlier * EARLIER_RUNS_WEIGHT + new;
        ReadTotals {
            bytes: mix(self.bytes, run.bytes),
            seconds: mix(self.seconds, run.seconds),
            layer_requests: mix(self.layer_requests, run.layer_requests),
            stall_seconds: mix(self.stall_seconds, run.stall_seconds),
        }
    }
}

/// A model's streamed reads on this machine, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredReads {
    /// A decode's reads: each token's misses, and what prefetch read for it.
    pub decode: ReadTotals,
    /// Warm prompt passes' reads (every pass but cold ones): whole layers
    /// in file order, read ahead.
    pub prompt: ReadTotals,
    /// Cold prompt passes' reads: passes begun before the cache's first
    /// eviction (a model's first pass).
    #[serde(default)]
    pub cold_prompt: ReadTotals,
}

impl MeasuredReads {
    /// These totals (earlier runs') combined with one more run's, the
    /// earlier weighed by [`EARLIER_RUNS_WEIGHT`].
    pub fn after(self, run: MeasuredReads) -> MeasuredReads {
        MeasuredReads {
            decode: self.decode.after(run.decode),
            prompt: self.prompt.after(run.prompt),
            cold_prompt: self.cold_prompt.after(run.cold_prompt),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(gb: f64, seconds: f64) -> ReadTotals {
        ReadTotals {
            bytes: gb * 1e9,
            seconds,
            ..Default::default()
        }
    }

    #[test]
    fn a_requests_wait_beyond_its_reads_makes_the_waits_add_up() {
        let decode = ReadTotals {
            layer_requests: 400.0,
            stall_seconds: 2.2,
            ..totals(4.0, 2.0)
        };
        // 2.2 s of waits: 2 s of reads at 2 GB/s, and 0.5 ms a request.
        assert!((decode.request_seconds().unwrap() - 0.5e-3).abs() < 1e-12);
        // Reads overlapped by a prefetch can outlast the waits: never below 0.
        let overlapped = ReadTotals {
            stall_seconds: 1.5,
            ..decode
        };
        assert_eq!(overlapped.request_seconds(), Some(0.0));
        // Untrusted with its rate, or without requests.
        assert_eq!(
            ReadTotals {
                bytes: 1e8,
                ..decode
            }
            .request_seconds(),
            None
        );
        assert_eq!(totals(4.0, 2.0).request_seconds(), None);
    }

    #[test]
    fn a_rate_is_trusted_from_a_gigabyte_read() {
        assert_eq!(totals(0.9, 0.3).gbps(), None);
        assert_eq!(totals(3.0, 1.5).gbps(), Some(2.0));
        assert_eq!(totals(3.0, 0.0).gbps(), None);
    }

    #[test]
    fn a_new_run_outweighs_the_earlier_ones() {
        let earlier = MeasuredReads {
            decode: totals(8.0, 8.0),
            prompt: totals(2.0, 1.0),
            cold_prompt: totals(3.0, 2.0),
        };
        let run = MeasuredReads {
            decode: totals(4.0, 1.0),
            cold_prompt: totals(1.5, 0.5),
            ..Default::default()
        };
        let both = earlier.after(run);
        // (4 + 4) GB in (4 + 1) s: the new run's 4 GB/s pulls the earlier 1 to 1.6.
        assert_eq!(both.decode, totals(8.0, 5.0));
        assert_eq!(both.decode.gbps(), Some(1.6));
        // A phase the run did not read keeps the earlier rate.
        assert_eq!(both.prompt.gbps(), Some(2.0));
        // Each phase by its own totals: (1.5 + 1.5) GB in (1 + 0.5) s.
        assert_eq!(both.cold_prompt.gbps(), Some(2.0));
    }

    #[test]
    fn a_file_saved_before_the_cold_phase_reads_as_none_measured() {
        let old = r#"{"decode":{"bytes":4e9,"seconds":2.0},"prompt":{"bytes":2e9,"seconds":1.0}}"#;
        let reads: MeasuredReads = serde_json::from_str(old).unwrap();
        assert_eq!(reads.prompt.gbps(), Some(2.0));
        assert_eq!(reads.cold_prompt, ReadTotals::default());
        assert_eq!(reads.cold_prompt.gbps(), None);
    }
}
