//! How unevenly a model's router chooses its experts, as measured while it ran.
//!
//! A stream cache that keeps the experts most likely to be chosen (the
//! streamer evicts by chance of use) hits more often than the share of the
//! experts it holds when the router favours some experts. The planner reads a
//! model's measured popularity from the co-activation counts the streamer
//! saves (`coactivation/KEY.json` in the cache directory), so a model that has
//! run before is priced by its own routing; a model never run is priced as if
//! uniform.

/// Per-layer shares of a model's expert selections, each layer's in
/// descending order, summing to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertPopularity {
    layers: Vec<Vec<f64>>,
}

/// Selections a layer needs per expert, on average, before its shares are
/// trusted: fewer overstate the skew (a handful of tokens chooses few
/// experts). Drawn from the Qwen3 shape's measured shares, the popular
/// 0.642 of the experts took 0.960, 0.939, 0.930 and 0.925 of 4, 8, 16 and
/// 32 choices an expert, against 0.922 (session 29). 16 is 256 decoded
/// tokens for the Qwen3-30B-A3B shape (128 experts, top-8) and 64 for
/// Mixtral's (8, top-2).
pub const MIN_SELECTIONS_PER_EXPERT: u64 = 16;

impl ExpertPopularity {
    /// From `selections[layer][expert]`, the times each expert was chosen.
    /// Layers with fewer than [`MIN_SELECTIONS_PER_EXPERT`] selections per
    /// expert are left out; `None` when no layer is left.
    pub fn from_selections(selections: &[Vec<u64>]) -> Option<ExpertPopularity> {
        let layers: Vec<Vec<f64>> = selections
            .iter()
            .filter_map(|counts| {
                let total: u64 = counts.iter().sum();
                if counts.is_empty() || total < MIN_SELECTIONS_PER_EXPERT * counts.len() as u64 {
                    return None;
                }
                let mut shares: Vec<f64> =
                    counts.iter().map(|&c| c as f64 / total as f64).collect();
                shares.sort_by(|a, b| b.total_cmp(a));
                Some(shares)
            })
            .collect();
        (!layers.is_empty()).then_some(ExpertPopularity { layers })
    }

    /// The share of selections that go to the most popular `fraction` of
    /// each layer's experts (a fractional expert counted in part), averaged
    /// over the layers: what a cache holding the popular `fraction` of every
    /// layer would catch. At least `fraction` (uniform routing gives it).
    pub fn top_share(&self, fraction: f64) -> f64 {
        let fraction = fraction.clamp(0.0, 1.0);
        let sum: f64 = self
            .layers
            .iter()
            .map(|shares| {
                let k = fraction * shares.len() as f64;
                let whole = k.floor() as usize;
                let part = shares.get(whole).map_or(0.0, |s| (k - whole as f64) * s);
                shares.iter().take(whole).sum::<f64>() + part
            })
            .sum();
        (sum / self.layers.len() as f64).clamp(fraction, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_routing_catches_the_share_held() {
        let p = ExpertPopularity::from_selections(&[vec![100; 8], vec![100; 8]]).unwrap();
        for f in [0.0, 0.25, 0.5, 0.7, 1.0] {
            assert!((p.top_share(f) - f).abs() < 1e-12, "{f}");
        }
    }

    #[test]
    fn skewed_routing_catches_more_than_the_share_held() {
        // One layer: half of the selections to one expert of four.
        let p = ExpertPopularity::from_selections(&[vec![50, 200, 50, 100]]).unwrap();
        // The top quarter is the 200 (0.5 of 400); half an expert more, 0.5 × 0.25.
        assert!((p.top_share(0.25) - 0.5).abs() < 1e-12);
        assert!((p.top_share(0.375) - 0.625).abs() < 1e-12);
        assert!((p.top_share(1.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn layers_with_too_few_selections_are_left_out() {
        let few = vec![1, 0, 0, 0];
        let p = ExpertPopularity::from_selections(&[few.clone(), vec![100; 4]]).unwrap();
        assert!(
            (p.top_share(0.25) - 0.25).abs() < 1e-12,
            "the sparse layer is ignored"
        );
        assert_eq!(ExpertPopularity::from_selections(&[few]), None);
        assert_eq!(ExpertPopularity::from_selections(&[]), None);
    }
}
