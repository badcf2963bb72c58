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
    /// The smallest stream cache: what one layer may need at once
    /// (as [`super::Streamer::minimum_budget_bytes`] computes it).
    pub minimum_cache_bytes: u64,
}

impl StreamFootprint {
    pub fn of(file: &GgufFile) -> StreamFootprint {
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
        StreamFootprint {
            mode,
            resident_bytes,
            stream_bytes,
            minimum_cache_bytes: per_layer.values().copied().max().unwrap_or(0),
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
        // 30 layers of equal FFN: the smallest cache is one layer's.
        assert_eq!(f.minimum_cache_bytes * 30, f.stream_bytes);
    }
}
