//! How a MoE's routers spread a token's choices over the experts, as the
//! planner assumes it: what an expert cache of a given size hits.
//!
//! The planner cannot watch a model route before it places it, so it takes
//! a prior by architecture from published measurements: per-layer expert
//! popularity following a Zipf curve (the `r`-th most chosen expert of a
//! layer is chosen ∝ `r^−s`), the same curves `hypura-synth --routing`
//! writes its benchmark routers with (`synth/src/routing.rs` gives the
//! sources). An architecture without one is taken as uniform, which errs
//! low: any skew makes a cache of the most used experts hit more. A file
//! `hypura-synth` wrote names the routing its routers were made with
//! (`hypura.synth.routing`), which then stands instead.
use serde::{Deserialize, Serialize};

/// The routing prior of a model's architecture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingPrior {
    /// Every expert alike.
    #[default]
    Uniform,
    /// Mixtral: near-balanced experts per layer (Jiang et al. 2024, §5):
    /// Zipf 0.3, 8 experts from 18% down to 10% of a layer's choices.
    Mixtral,
    /// Qwen2/Qwen3-MoE: concentration (1 − normalised entropy) 0.111–0.154
    /// measured on Qwen3-30B-A3B with llama-imatrix: Zipf 0.8.
    QwenMoe,
}

impl RoutingPrior {
    /// The prior of a GGUF's `general.architecture` (llama.cpp's names); a
    /// `llama` file with experts is Mixtral's layout.
    pub fn of_architecture(arch: &str, n_expert: u32) -> Self {
        match arch {
            _ if n_expert == 0 => Self::Uniform,
            "qwen2moe" | "qwen3moe" => Self::QwenMoe,
            "llama" | "mixtral" => Self::Mixtral,
            _ => Self::Uniform,
        }
    }

    /// The prior of a file: the routing a synthetic file names (`synthetic`,
    /// its `hypura.synth.routing`), else its architecture's. A synthetic
    /// router without a set popularity (`random`, `degenerate`) is taken as
    /// uniform.
    pub fn of_file(arch: &str, n_expert: u32, synthetic: Option<&str>) -> Self {
        match synthetic {
            _ if n_expert == 0 => Self::Uniform,
            Some("mixtral") => Self::Mixtral,
            Some("qwen3") => Self::QwenMoe,
            Some(_) => Self::Uniform,
            None => Self::of_architecture(arch, n_expert),
        }
    }

    /// The Zipf exponent of per-layer popularity (0: uniform).
    pub fn zipf(self) -> f64 {
        match self {
            Self::Uniform => 0.0,
            Self::Mixtral => 0.3,
            Self::QwenMoe => 0.8,
        }
    }

    /// The share of a layer's choices that land on its `cached` most
    /// chosen experts of `n_expert` (fractional `cached` counts that share
    /// of the next expert): the hit rate of a cache that keeps the most
    /// used experts, as the streamer's frequency-ordered cache does.
    pub fn cached_share(self, cached: f64, n_expert: u32) -> f64 {
        if n_expert == 0 {
            return 1.0;
        }
        let s = self.zipf();
        let weight = |r: u32| f64::from(r).powf(-s);
        let total: f64 = (1..=n_expert).map(weight).sum();
        let cached = cached.clamp(0.0, f64::from(n_expert));
        let whole = cached.floor() as u32;
        let mut share: f64 = (1..=whole).map(weight).sum();
        if whole < n_expert {
            share += (cached - f64::from(whole)) * weight(whole + 1);
        }
        (share / total).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skewed_prior_hits_more_than_the_cached_share_and_uniform_hits_exactly_it() {
        for cached in [0.0, 13.0, 64.5, 100.0, 128.0] {
            let uniform = RoutingPrior::Uniform.cached_share(cached, 128);
            assert!(
                (uniform - cached / 128.0).abs() < 1e-12,
                "{cached}: {uniform}"
            );
        }
        // Qwen3's curve: 81 of 128 experts (63%) take 86% of the choices.
        let qwen = RoutingPrior::QwenMoe.cached_share(81.0, 128);
        assert!((0.85..0.87).contains(&qwen), "{qwen}");
        // Mixtral's, near balanced: 5.5 of 8 take 75%.
        let mixtral = RoutingPrior::Mixtral.cached_share(5.5, 8);
        assert!((0.74..0.76).contains(&mixtral), "{mixtral}");
        assert_eq!(RoutingPrior::Mixtral.cached_share(8.0, 8), 1.0);
        assert_eq!(RoutingPrior::Mixtral.cached_share(0.0, 8), 0.0);
    }

    #[test]
    fn the_prior_follows_the_architecture() {
        assert_eq!(
            RoutingPrior::of_architecture("qwen3moe", 128),
            RoutingPrior::QwenMoe
        );
        assert_eq!(
            RoutingPrior::of_architecture("llama", 8),
            RoutingPrior::Mixtral
        );
        assert_eq!(
            RoutingPrior::of_architecture("llama", 0),
            RoutingPrior::Uniform
        );
        assert_eq!(
            RoutingPrior::of_architecture("deepseek2", 64),
            RoutingPrior::Uniform
        );
        // A synthetic file's own routing stands instead.
        let of = RoutingPrior::of_file;
        assert_eq!(of("qwen3moe", 128, Some("uniform")), RoutingPrior::Uniform);
        assert_eq!(of("qwen3moe", 128, Some("mixtral")), RoutingPrior::Mixtral);
        assert_eq!(of("llama", 8, Some("qwen3")), RoutingPrior::QwenMoe);
        assert_eq!(of("llama", 8, None), RoutingPrior::Mixtral);
    }
}
