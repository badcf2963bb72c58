//! What a model costs in memory when it streams, read from the GGUF header
//! alone: the numbers the multi-model budget charges for each residency.
use hypura_scheduler::roles::layer_index;

use super::placement::{is_streamed, Mode};
use hypura_gguf::GgufFile;

/// Memory of one model under its streaming mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFootprint {
    /// The mode that streams the most (experts for a MoE, else dense FFN).
    pub mode: Mode,
    /// Weights never streamed (attention, norms, embeddings, output...).
    pub resident_bytes: u64,
    /// Weights that may be streamed.
    pub stream_bytes: u64,
    /// What one layer may need at once (as
    /// [`super::Streamer::minimum_budget_bytes`] computes it): what one
    /// decoding context pins.
    pub layer_bytes: u64,
    /// The smallest stream cache: one layer for each context that can
    /// decode at once ([`DECODING_CONTEXTS`]), each pinning the layer it
    /// computes. Smaller, two contexts decoding together would take the
    /// cache over its budget (the streamer never waits for pins that the
    /// waiting thread's partner holds).
    pub minimum_cache_bytes: u64,
}

/// Contexts that decode one model at once in a server's engine: its
/// generation context (every slot in one batch, on one thread) and its
/// embedding context (on the caller's thread), as
/// [`crate::engine::BatchConfig::contexts`] lists them.
pub const DECODING_CONTEXTS: u64 = 2;

impl StreamFootprint {
    /// The footprint in a server's engine ([`DECODING_CONTEXTS`] contexts).
    pub fn of(file: &GgufFile) -> StreamFootprint {
        Self::with_contexts(file, DECODING_CONTEXTS)
    }

    /// The footprint when `contexts` contexts may decode at once.
    pub fn with_contexts(file: &GgufFile, contexts: u64) -> StreamFootprint {
        let moe = file
            .tensors()
            .iter()
            .any(|t| is_streamed(Mode::ExpertStreaming, &t.name));
        let mode = if moe {
            Mode::ExpertStreaming
        } else {
            Mode::DenseFfnStreaming
        };
        let mut per_layer: std::collections::BTreeMap<u32, u64> = Default::default();
        let (mut resident_bytes, mut stream_bytes) = (0, 0);
        for t in file.tensors() {
            match (is_streamed(mode, &t.name), layer_index(&t.name)) {
                (true, Some(layer)) => {
                    stream_bytes += t.n_bytes;
                    *per_layer.entry(layer).or_insert(0) += t.n_bytes;
                }
                _ => resident_bytes += t.n_bytes,
            }
        }
        let layer_bytes = per_layer.values().copied().max().unwrap_or(0);
        StreamFootprint {
            mode,
            resident_bytes,
            stream_bytes,
            layer_bytes,
            minimum_cache_bytes: (layer_bytes * contexts.max(1)).min(stream_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_models;

    #[test]
    fn smollm2_streams_its_ffn_and_keeps_the_rest() {
        let file = GgufFile::open(test_models::smollm2()).unwrap();
        let f = StreamFootprint::of(&file);
        assert_eq!(f.mode, Mode::DenseFfnStreaming);
        assert_eq!(f.resident_bytes + f.stream_bytes, file.tensor_bytes());
        // 30 layers of equal FFN: the smallest cache is one layer's per
        // context that decodes at once.
        assert_eq!(f.layer_bytes * 30, f.stream_bytes);
        assert_eq!(f.minimum_cache_bytes, f.layer_bytes * DECODING_CONTEXTS);
        let alone = StreamFootprint::with_contexts(&file, 1);
        assert_eq!(alone.minimum_cache_bytes, f.layer_bytes);
        // Never more than everything streamed.
        let many = StreamFootprint::with_contexts(&file, 100);
        assert_eq!(many.minimum_cache_bytes, f.stream_bytes);
    }
}
