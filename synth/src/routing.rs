//! Routing profiles: synthetic MoEs whose expert choices have set statistics.
//!
//! A random router over a random model's hidden states routes by accident:
//! on the Qwen3-30B-A3B shape nearly the same experts every token (a 99%
//! expert-cache hit rate), on the Mixtral shape near uniform (issue 26).
//! Real routers are neither: per-layer popularity is skewed and consecutive
//! tokens share part of their experts. A profile sets both:
//!
//! - **popularity**: expert of rank r (a different random order per layer)
//!   is chosen with a probability ∝ r^−s (Zipf, exponent `zipf`), capped at
//!   one choice per token;
//! - **overlap**: the mean fraction of a generated token's experts that the
//!   previous token also chose, per layer.
//!
//! # How a random-weight model is made to route so
//!
//! The first [`CONTROL_DIMS`] dimensions of the residual stream are control
//! channels that no layer writes (the rows of `attn_output` and
//! `ffn_down_exps` for them are zero), so at every layer they hold the token
//! embedding's values: a constant in dim 0, a routing vector z (dims
//! [`Z_DIMS`]) and a next-token key y (dims [`Y_DIMS`]). Each router reads
//! only those: logit_e = b_e·c + ⟨u_e, z⟩, all divided by the same RMS
//! norm, so the ranking (the choice) does not depend on the rest of the
//! random model. The biases b_e are fitted at write time (on sampled z) so
//! each expert is chosen with its Zipf probability. `output` reads only y:
//! the next token of a normal token is its successor on a random tour of the
//! vocabulary (so greedy decoding never loops), and z follows that tour as
//! an AR(1) process, z' = ρz + √(1−ρ²)ε, with ρ fitted so that consecutive
//! generated tokens' expert sets overlap as set. z's marginal stays N(0, I),
//! so ρ leaves popularity alone. Prompt tokens (given text, not the tour)
//! get popularity but only the overlap popularity implies.
//!
//! Compute cost is unchanged: same shapes, same types; only values differ.
//!
//! # Sources of the targets
//!
//! Figures were taken where published; where not, the value is chosen and
//! said so. `hypura bench --routing` measures what a run actually did.
//!
//! - Mixtral (8 experts, top-2): Jiang et al. 2024, "Mixtral of Experts"
//!   (arXiv:2401.04088), section 5 "Routing analysis": expert assignment per
//!   layer is close to balanced across The Pile's domains (Figure 7, no
//!   per-expert figures in the text), and consecutive tokens are assigned
//!   the same experts more often than at random, most at layers 15 and 31
//!   (Table 5; its measure, repeated first or first-or-second choices, is not
//!   our overlap and is not converted here). Chosen: `zipf` 0.3 (shares
//!   18% down to 10% against 12.5% uniform), overlap 0.45 (uniform
//!   independent choices: 0.25).
//! - Qwen3-30B-A3B (128 experts, top-8): the gpu-container "Routing
//!   de-risk" measurement (llama-imatrix expert counts,
//!   <https://mcp-tool-shop-org.github.io/gpu-container/handbook/derisk/>):
//!   concentration (1 − normalised entropy) 0.111 on a diverse ~1k-token
//!   workload and 0.154 on a narrow ~8k-token one; 65/128 and 58/128 experts
//!   for 90% of the selections; the top expert 4.3% and 6.3%. A Zipf curve
//!   cannot match all three: `zipf` 0.8 matches the concentration (0.12),
//!   but its top expert takes 11% and 90% coverage needs 91 experts. Overlap
//!   is not published for Qwen3 in our sources; Liang et al. 2025, "Not All
//!   Models Suit Expert Offloading" (arXiv:2505.16056), find models with MoE
//!   on every layer and no shared expert (Qwen3-MoE's design) the most
//!   locally consistent of 20 measured. Chosen: overlap 0.35 (uniform
//!   independent choices: 0.0625).
//! - DeepSeek (V2/V3: shared experts, fine-grained routed experts): Liang et
//!   al. find shared experts lower local routing consistency; no preset has
//!   this shape, so no profile.
//! - `uniform`: every expert equally likely, tokens independent;
//!   `degenerate`: the same experts for every token (what the random router
//!   gave the Qwen3 shape); `random`: the random router, as before profiles.
use llama_tiered::rng::Rng;

/// Control channels at the start of the residual stream.
pub const CONTROL_DIMS: usize = 160;
/// The constant feature that carries the router biases.
const CONST_DIM: usize = 0;
/// The routing vector z.
pub const Z_DIMS: std::ops::Range<usize> = 32..96;
/// The next-token key y.
pub const Y_DIMS: std::ops::Range<usize> = 96..160;
const CONST_VALUE: f32 = 1.0;

/// Which routing a synthetic MoE gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// A random router over the random model's hidden states (no control).
    Random,
    Uniform,
    Degenerate,
    Mixtral,
    Qwen3,
}

impl Routing {
    pub const NAMES: [&'static str; 5] = ["mixtral", "qwen3", "uniform", "degenerate", "random"];

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "random" => Self::Random,
            "uniform" => Self::Uniform,
            "degenerate" => Self::Degenerate,
            "mixtral" => Self::Mixtral,
            "qwen3" => Self::Qwen3,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Uniform => "uniform",
            Self::Degenerate => "degenerate",
            Self::Mixtral => "mixtral",
            Self::Qwen3 => "qwen3",
        }
    }

    /// The targets, `None` for [`Routing::Random`] (nothing is set).
    pub fn profile(self) -> Option<RoutingProfile> {
        let (zipf, overlap) = match self {
            Self::Random => return None,
            Self::Uniform => (0.0, None),
            Self::Degenerate => (0.0, Some(1.0)),
            Self::Mixtral => (0.3, Some(0.45)),
            Self::Qwen3 => (0.8, Some(0.35)),
        };
        Some(RoutingProfile {
            routing: self,
            zipf,
            overlap,
        })
    }
}

/// The statistics a profile sets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoutingProfile {
    pub routing: Routing,
    /// Zipf exponent of per-layer expert popularity (0: uniform).
    pub zipf: f64,
    /// Target overlap of consecutive generated tokens' experts; `None`:
    /// independent tokens (what popularity alone gives).
    pub overlap: Option<f64>,
}

impl RoutingProfile {
    /// The probability that a token chooses the expert of each popularity
    /// rank (descending; they sum to `n_used`, none above 1).
    pub fn choice_probabilities(&self, n_expert: usize, n_used: usize) -> Vec<f64> {
        if self.routing == Routing::Degenerate {
            return (0..n_expert)
                .map(|r| if r < n_used { 1.0 } else { 0.0 })
                .collect();
        }
        let w: Vec<f64> = (1..=n_expert)
            .map(|r| (r as f64).powf(-self.zipf))
            .collect();
        // Water-filling: ranks that would exceed 1 are capped, the rest rescaled.
        let mut p = vec![0.0; n_expert];
        let mut capped = 0;
        loop {
            let rest: f64 = w[capped..].iter().sum();
            let scale = (n_used - capped) as f64 / rest;
            if capped < n_used && w[capped] * scale > 1.0 {
                p[capped] = 1.0;
                capped += 1;
                continue;
            }
            for r in capped..n_expert {
                p[r] = w[r] * scale;
            }
            return p;
        }
    }

    /// Each rank's share of all selections (`choice_probabilities / n_used`).
    pub fn shares(&self, n_expert: usize, n_used: usize) -> Vec<f64> {
        self.choice_probabilities(n_expert, n_used)
            .into_iter()
            .map(|p| p / n_used as f64)
            .collect()
    }

    /// 1 − H(shares)/ln(n_expert) of [`Self::shares`].
    pub fn concentration(&self, n_expert: usize, n_used: usize) -> f64 {
        let h: f64 = self
            .shares(n_expert, n_used)
            .iter()
            .filter(|&&s| s > 0.0)
            .map(|s| -s * s.ln())
            .sum();
        1.0 - h / (n_expert as f64).ln()
    }
}

/// What the writer puts in the control channels and routers.
pub(crate) struct RoutingPlan {
    /// Per token: the first [`CONTROL_DIMS`] values of its embedding row.
    pub token_controls: Vec<[f32; CONTROL_DIMS]>,
    /// Per token: the y whose owner's successor it is (`output` row), or
    /// `None` for tokens never predicted (specials).
    pub output_keys: Vec<Option<u32>>,
    /// Per layer: `n_expert` router rows over the control dims.
    pub routers: Vec<Vec<[f32; CONTROL_DIMS]>>,
    /// The fitted AR(1) coefficient, and the overlap it gave in simulation.
    pub rho: f64,
    pub simulated_overlap: f64,
}

/// Samples for fitting biases and ρ.
const FIT_SAMPLES: usize = 2048;
const FIT_ITERATIONS: usize = 80;

fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    rng.fill_normal(&mut v, 0.0, 1.0);
    v
}

/// Top-`k` indices of `logits` (unordered).
fn top_k(logits: &[f32], k: usize, idx: &mut Vec<usize>) {
    idx.clear();
    idx.extend(0..logits.len());
    if k < logits.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
    }
}

/// Biases making each expert chosen with `target[e]` probability, for
/// token terms `terms` (`FIT_SAMPLES` rows of `n_expert`).
fn fit_biases(terms: &[f32], n_expert: usize, k: usize, target: &[f64]) -> Vec<f32> {
    let m = terms.len() / n_expert;
    let mut b: Vec<f32> = target.iter().map(|&q| q.max(1e-6).ln() as f32).collect();
    let (mut logits, mut idx) = (vec![0f32; n_expert], Vec::new());
    for it in 0..FIT_ITERATIONS {
        let mut counts = vec![0u32; n_expert];
        for row in terms.chunks_exact(n_expert) {
            for e in 0..n_expert {
                logits[e] = row[e] + b[e];
            }
            top_k(&logits, k, &mut idx);
            for &e in &idx {
                counts[e] += 1;
            }
        }
        let step = if it < FIT_ITERATIONS / 2 { 1.0 } else { 0.5 };
        for e in 0..n_expert {
            let f = (f64::from(counts[e]) + 0.5) / (m as f64 + 1.0);
            let q = target[e].max(0.5 / m as f64);
            b[e] += (step * (q.ln() - f.ln())) as f32;
        }
    }
    b
}

/// Mean overlap of consecutive tokens when token terms follow an AR(1)
/// chain of coefficient `rho` over the i.i.d. rows `terms`.
fn chain_overlap(terms: &[f32], n_expert: usize, k: usize, bias: &[f32], rho: f64) -> f64 {
    let (rho, fresh) = (rho as f32, (1.0 - rho * rho).max(0.0).sqrt() as f32);
    let mut state = terms[..n_expert].to_vec();
    let (mut logits, mut idx, mut prev) = (vec![0f32; n_expert], Vec::new(), Vec::new());
    let (mut sum, mut pairs) = (0.0, 0usize);
    for (i, row) in terms.chunks_exact(n_expert).enumerate() {
        if i > 0 {
            for e in 0..n_expert {
                state[e] = rho * state[e] + fresh * row[e];
            }
        }
        for e in 0..n_expert {
            logits[e] = state[e] + bias[e];
        }
        top_k(&logits, k, &mut idx);
        if i > 0 {
            sum += idx.iter().filter(|e| prev.contains(*e)).count() as f64 / k as f64;
            pairs += 1;
        }
        std::mem::swap(&mut prev, &mut idx);
    }
    sum / pairs.max(1) as f64
}

/// Builds the control values of `profile` for a vocabulary whose normal
/// tokens are `normal` (the others are specials), `n_layer` layers of
/// `n_expert` experts choosing `k`.
pub(crate) fn plan(
    profile: &RoutingProfile,
    normal: &[bool],
    n_layer: usize,
    n_expert: usize,
    k: usize,
    seed: u64,
) -> RoutingPlan {
    let mut rng = Rng::new(seed ^ 0x5EED_0F20_77E5);
    let dz = Z_DIMS.len();
    let probs = profile.choice_probabilities(n_expert, k);
    // Routers: per layer a popularity order, token directions u_e and biases.
    let samples = normal_rows(&mut rng, FIT_SAMPLES, dz);
    let mut routers = Vec::with_capacity(n_layer);
    let mut layer0 = None;
    for _ in 0..n_layer {
        let mut order: Vec<usize> = (0..n_expert).collect();
        for i in (1..n_expert).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut target = vec![0.0; n_expert];
        for (rank, &e) in order.iter().enumerate() {
            target[e] = probs[rank];
        }
        // u_e ~ N(0, I/dz): token terms ⟨u_e, z⟩ ~ N(0, 1).
        let scale = 1.0 / (dz as f32).sqrt();
        let u: Vec<Vec<f32>> = (0..n_expert)
            .map(|_| normals(&mut rng, dz).iter().map(|x| x * scale).collect())
            .collect();
        let (bias, terms) = if profile.routing == Routing::Degenerate {
            // Chosen experts far ahead: the token terms never reorder them.
            let b = target
                .iter()
                .map(|&t| if t > 0.0 { 1e3 } else { 0.0 })
                .collect();
            (b, Vec::new())
        } else {
            let mut terms = Vec::with_capacity(FIT_SAMPLES * n_expert);
            for z in samples.chunks_exact(dz) {
                terms.extend(u.iter().map(|ue| dot(ue, z)));
            }
            (fit_biases(&terms, n_expert, k, &target), terms)
        };
        if layer0.is_none() {
            layer0 = Some((terms, bias.clone()));
        }
        let rows = (0..n_expert)
            .map(|e| {
                let mut row = [0f32; CONTROL_DIMS];
                row[CONST_DIM] = bias[e] / CONST_VALUE;
                row[Z_DIMS].copy_from_slice(&u[e]);
                row
            })
            .collect();
        routers.push(rows);
    }
    // ρ: bisection on layer 0's simulated overlap (monotone in ρ).
    let (mut rho, mut simulated) = (0.0, 0.0);
    if let Some((terms, bias)) = layer0.filter(|(t, _)| !t.is_empty()) {
        simulated = chain_overlap(&terms, n_expert, k, &bias, 0.0);
        if let Some(want) = profile.overlap.filter(|&w| w > simulated) {
            let (mut lo, mut hi) = (0.0, 0.999);
            for _ in 0..14 {
                let mid = 0.5 * (lo + hi);
                if chain_overlap(&terms, n_expert, k, &bias, mid) < want {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            rho = 0.5 * (lo + hi);
            simulated = chain_overlap(&terms, n_expert, k, &bias, rho);
        }
    } else if profile.routing == Routing::Degenerate {
        simulated = 1.0;
    }
    // Token controls: z along a random tour of the normal tokens, y i.i.d.
    let n_vocab = normal.len();
    let mut tour: Vec<u32> = (0..n_vocab as u32)
        .filter(|&t| normal[t as usize])
        .collect();
    for i in (1..tour.len()).rev() {
        tour.swap(i, rng.below(i + 1));
    }
    let mut token_controls = vec![[0f32; CONTROL_DIMS]; n_vocab];
    for row in token_controls.iter_mut() {
        row[CONST_DIM] = CONST_VALUE;
        rng.fill_normal(&mut row[Z_DIMS], 0.0, 1.0);
        rng.fill_normal(&mut row[Y_DIMS], 0.0, 1.0);
    }
    let fresh = (1.0 - rho * rho).sqrt() as f32;
    for w in tour.windows(2) {
        let prev: Vec<f32> = token_controls[w[0] as usize][Z_DIMS].to_vec();
        let next = &mut token_controls[w[1] as usize][Z_DIMS];
        for (n, p) in next.iter_mut().zip(prev) {
            *n = rho as f32 * p + fresh * *n;
        }
    }
    let mut output_keys = vec![None; n_vocab];
    if let (Some(&first), Some(&last)) = (tour.first(), tour.last()) {
        output_keys[first as usize] = Some(last);
        for w in tour.windows(2) {
            output_keys[w[1] as usize] = Some(w[0]);
        }
    }
    RoutingPlan {
        token_controls,
        output_keys,
        routers,
        rho,
        simulated_overlap: simulated,
    }
}

fn normal_rows(rng: &mut Rng, rows: usize, dims: usize) -> Vec<f32> {
    normals(rng, rows * dims)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_probabilities_sum_to_k_and_cap_at_one() {
        for routing in [
            Routing::Mixtral,
            Routing::Qwen3,
            Routing::Uniform,
            Routing::Degenerate,
        ] {
            let p = routing.profile().unwrap();
            for (e, k) in [(8, 2), (128, 8), (16, 4), (4, 3)] {
                let q = p.choice_probabilities(e, k);
                assert!(
                    (q.iter().sum::<f64>() - k as f64).abs() < 1e-9,
                    "{routing:?} {q:?}"
                );
                assert!(q.iter().all(|&x| (0.0..=1.0 + 1e-12).contains(&x)));
                assert!(q.windows(2).all(|w| w[0] >= w[1] - 1e-12));
            }
        }
        let uniform = Routing::Uniform.profile().unwrap();
        assert!(uniform.concentration(128, 8).abs() < 1e-12);
        let qwen3 = Routing::Qwen3.profile().unwrap().concentration(128, 8);
        assert!((0.11..0.13).contains(&qwen3), "{qwen3}");
    }

    #[test]
    fn fitted_plan_simulates_the_target_overlap() {
        let normal = vec![true; 2000];
        for (routing, e, k) in [(Routing::Mixtral, 8, 2), (Routing::Qwen3, 32, 4)] {
            let p = routing.profile().unwrap();
            let plan = plan(&p, &normal, 2, e, k, 1);
            let want = p.overlap.unwrap();
            assert!(
                (plan.simulated_overlap - want).abs() < 0.03,
                "{routing:?}: rho {} gave {}",
                plan.rho,
                plan.simulated_overlap
            );
        }
    }
}
