//! The GPU tier by rule: which resident tensors a [`GpuShare`] moves to the
//! GPU ([`assign`]), and the `n_gpu_layers` llama.cpp needs to put a
//! placement's GPU tensors there ([`gpu_layers`]).
//!
//! llama.cpp offloads the *last* `n_gpu_layers` layers, counting the output
//! layer as the last one (`-ngl 16` on a 32-layer model: the output layer and
//! layers 17–31): their weights, KV cache and compute go to the GPU;
//! `token_embd` always stays on the CPU. STREAM tensors never move to the GPU
//! (the STREAM buffer is host memory filled from the file).
//!
//! The planner uses [`assign`] when its caller fixes the share (`--gpu-layers
//! N`, or the server's full placement sized to the GPU budget); otherwise it
//! prices GPU prefixes of its own value-per-byte order.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::{PlanTensor, Tier};
use crate::roles::{classify, layer_index, TensorRole};

/// How much of a model the GPU takes, by rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuShare {
    /// No GPU.
    #[default]
    None,
    /// The resident tensors of the last `n` layers as llama.cpp's `-ngl n`
    /// counts them: the output layer first, then the last `n - 1` layers.
    Layers(u32),
    /// Resident tensors in order of use per byte (the output layer, then the
    /// attention, norms and routers of each layer from the last, then FFN
    /// tensors from the last layer, then each layer's experts as one unit from
    /// the last layer) while they fit in this many bytes.
    /// Leave room beside it for the KV cache and compute buffers.
    BudgetBytes(u64),
    /// The planner's own value-per-byte order ([`crate::plan`]: norms and
    /// routers, attention with its layer's KV cache and the output layer,
    /// dense FFN, then each layer's experts as one unit, streamed or not,
    /// each class from the last layer): its longest prefix whose bytes, KV
    /// cache included, fit in this many. A share the planner chose itself
    /// ([`crate::plan::Plan::gpu_prefix_bytes`]) fixed again under another
    /// stream cache: the server's streaming placement keeps its GPU tensors
    /// while its cache is resized. [`assign`], which knows neither the KV
    /// cache nor streamed experts, takes it as `BudgetBytes`.
    Prefix(u64),
}

/// Moves RAM tensors of `tiers` to the GPU as `share` says; STREAM tensors
/// stay STREAM. A layer's non-FFN tensors (attention, norms, router) always
/// move together, so the planner can price them as one unit.
pub fn assign(
    tensors: &[PlanTensor],
    n_layer: u32,
    tiers: &mut BTreeMap<String, Tier>,
    share: GpuShare,
) {
    match share {
        GpuShare::None | GpuShare::Layers(0) => {}
        GpuShare::Layers(n) => {
            let first_gpu_layer = (n_layer + 1).saturating_sub(n);
            for t in tensors {
                let on_gpu = match t.layer {
                    Some(il) => il >= first_gpu_layer,
                    None => !is_input(&t.name),
                };
                if on_gpu {
                    to_gpu(tiers, &t.name);
                }
            }
        }
        GpuShare::BudgetBytes(budget) | GpuShare::Prefix(budget) => {
            let mut used = 0u64;
            for unit in budget_order(tensors, n_layer) {
                let bytes: u64 = unit
                    .iter()
                    .filter(|t| tiers.get(&t.name) == Some(&Tier::Ram))
                    .map(|t| t.bytes)
                    .sum();
                if used + bytes > budget {
                    break;
                }
                used += bytes;
                for t in unit {
                    to_gpu(tiers, &t.name);
                }
            }
        }
    }
}

fn to_gpu(tiers: &mut BTreeMap<String, Tier>, name: &str) {
    if let Some(tier) = tiers.get_mut(name) {
        if *tier == Tier::Ram {
            *tier = Tier::Gpu;
        }
    }
}

/// The units [`GpuShare::BudgetBytes`] fills the GPU with, in order.
fn budget_order(tensors: &[PlanTensor], n_layer: u32) -> Vec<Vec<&PlanTensor>> {
    let mut units = Vec::new();
    let global: Vec<&PlanTensor> = tensors
        .iter()
        .filter(|t| t.layer.is_none() && !is_input(&t.name))
        .collect();
    units.push(global);
    let in_layer = |il: u32, ffn: bool| {
        tensors
            .iter()
            .filter(move |t| t.layer == Some(il) && is_ffn(&t.name) == ffn)
    };
    for il in (0..n_layer).rev() {
        units.push(in_layer(il, false).collect());
    }
    for il in (0..n_layer).rev() {
        units.extend(
            in_layer(il, true)
                .filter(|t| !is_experts(t))
                .map(|t| vec![t]),
        );
    }
    // A layer's experts as one unit: the planner prices them so.
    for il in (0..n_layer).rev() {
        units.push(in_layer(il, true).filter(|t| is_experts(t)).collect());
    }
    units
}

/// llama.cpp's `n_gpu_layers` for a placement of the tensors `names`: the
/// longest run of last layers whose resident non-FFN tensors (attention,
/// norms, router) are all on the GPU, plus one for the output layer, which
/// llama.cpp then places on the GPU too (an override keeps it in RAM where
/// the placement says so). Zero when no layer qualifies and the output layer
/// is not on the GPU.
pub fn gpu_layers<'a>(
    names: impl IntoIterator<Item = &'a str>,
    tiers: &BTreeMap<String, Tier>,
    n_layer: u32,
) -> u32 {
    let mut layer_on_gpu = vec![true; n_layer as usize];
    let mut layer_seen = vec![false; n_layer as usize];
    let mut output_on_gpu = true;
    let mut output_seen = false;
    for name in names {
        let tier = tiers.get(name).copied();
        if tier == Some(Tier::Stream) {
            continue;
        }
        let on_gpu = tier == Some(Tier::Gpu);
        match layer_index(name) {
            Some(il) if (il as usize) < layer_on_gpu.len() && !is_ffn(name) => {
                layer_on_gpu[il as usize] &= on_gpu;
                layer_seen[il as usize] = true;
            }
            Some(_) => {}
            None if !is_input(name) => {
                output_on_gpu &= on_gpu;
                output_seen = true;
            }
            None => {}
        }
    }
    let suffix = layer_on_gpu
        .iter()
        .zip(&layer_seen)
        .rev()
        .take_while(|(&gpu, &seen)| gpu && seen)
        .count() as u32;
    if suffix > 0 || (output_seen && output_on_gpu) {
        suffix + 1
    } else {
        0
    }
}

fn is_experts(t: &PlanTensor) -> bool {
    t.role == TensorRole::Experts
}

/// The input layer, which llama.cpp keeps on the CPU.
pub fn is_input(name: &str) -> bool {
    classify(name) == TensorRole::Embedding
}

/// FFN, expert or shared-expert weights: the part of a layer llama.cpp's
/// `--n-cpu-moe` style overrides keep apart from its attention.
pub fn is_ffn(name: &str) -> bool {
    matches!(
        classify(name),
        TensorRole::Ffn | TensorRole::Experts | TensorRole::SharedExperts
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{mode_tier, Mode};

    /// A 4-layer llama-shaped model (1 KiB attention tensors, 4 KiB FFN),
    /// or a MoE one with 8 KiB expert stacks and a router.
    fn model(moe: bool) -> Vec<PlanTensor> {
        let mut t = vec![
            PlanTensor::new("token_embd.weight", 8192),
            PlanTensor::new("output_norm.weight", 64),
            PlanTensor::new("output.weight", 8192),
        ];
        for l in 0..4 {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            t.push(PlanTensor::new(n("attn_norm"), 64));
            for a in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                t.push(PlanTensor::new(n(a), 1024));
            }
            t.push(PlanTensor::new(n("ffn_norm"), 64));
            if moe {
                t.push(PlanTensor::new(n("ffn_gate_inp"), 128));
                for m in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                    t.push(PlanTensor::new(n(m), 8192));
                }
            } else {
                for m in ["ffn_gate", "ffn_up", "ffn_down"] {
                    t.push(PlanTensor::new(n(m), 4096));
                }
            }
        }
        t
    }

    fn placed(tensors: &[PlanTensor], mode: Mode, share: GpuShare) -> BTreeMap<String, Tier> {
        let mut tiers = tensors
            .iter()
            .map(|t| (t.name.clone(), mode_tier(mode, &t.name)))
            .collect();
        assign(tensors, 4, &mut tiers, share);
        tiers
    }

    fn ngl(tensors: &[PlanTensor], tiers: &BTreeMap<String, Tier>) -> u32 {
        gpu_layers(tensors.iter().map(|t| t.name.as_str()), tiers, 4)
    }

    fn gpu_bytes(tensors: &[PlanTensor], tiers: &BTreeMap<String, Tier>) -> u64 {
        tensors
            .iter()
            .filter(|t| tiers[&t.name] == Tier::Gpu)
            .map(|t| t.bytes)
            .sum()
    }

    /// Bytes of everything but FFN / expert weights and the token embeddings.
    fn non_ffn_bytes(tensors: &[PlanTensor]) -> u64 {
        tensors
            .iter()
            .filter(|t| !is_ffn(&t.name) && !is_input(&t.name))
            .map(|t| t.bytes)
            .sum()
    }

    #[test]
    fn whole_layers_are_llama_cpps_ngl() {
        // As llama.cpp's `-ngl 3`: the output layer and the last two layers.
        let tensors = model(false);
        let tiers = placed(&tensors, Mode::FullResident, GpuShare::Layers(3));
        for t in &tensors {
            let gpu = t.name.starts_with("blk.2.")
                || t.name.starts_with("blk.3.")
                || t.name.starts_with("output");
            let expected = if gpu { Tier::Gpu } else { Tier::Ram };
            assert_eq!(tiers[&t.name], expected, "{}", t.name);
        }
        assert_eq!(ngl(&tensors, &tiers), 3);
    }

    #[test]
    fn more_layers_than_the_model_takes_the_output_layer_but_not_the_embeddings() {
        let tensors = model(false);
        let tiers = placed(&tensors, Mode::FullResident, GpuShare::Layers(99));
        assert_eq!(tiers["token_embd.weight"], Tier::Ram);
        assert_eq!(tiers["output.weight"], Tier::Gpu);
        assert_eq!(tiers["output_norm.weight"], Tier::Gpu);
        assert_eq!(ngl(&tensors, &tiers), 5);
    }

    #[test]
    fn a_budget_for_all_but_the_ffn_keeps_the_ffn_in_ram_like_n_cpu_moe() {
        for moe in [false, true] {
            let tensors = model(moe);
            let budget = non_ffn_bytes(&tensors);
            let tiers = placed(&tensors, Mode::FullResident, GpuShare::BudgetBytes(budget));
            for t in &tensors {
                let on_gpu = !is_ffn(&t.name) && !is_input(&t.name);
                let expected = if on_gpu { Tier::Gpu } else { Tier::Ram };
                assert_eq!(tiers[&t.name], expected, "{}", t.name);
            }
            assert_eq!(ngl(&tensors, &tiers), 5, "every layer and the output");
            assert_eq!(gpu_bytes(&tensors, &tiers), budget);
        }
    }

    #[test]
    fn a_budget_short_of_a_layer_stops_at_whole_units() {
        let tensors = model(false);
        // The output layer and the last layer's attention and norms, not one byte more.
        let output = 8192 + 64;
        let last: u64 = tensors
            .iter()
            .filter(|t| t.name.starts_with("blk.3.") && !is_ffn(&t.name))
            .map(|t| t.bytes)
            .sum();
        let tiers = placed(
            &tensors,
            Mode::FullResident,
            GpuShare::BudgetBytes(output + last + last / 2),
        );
        assert_eq!(gpu_bytes(&tensors, &tiers), output + last);
        // llama.cpp's `-ngl 2`: the output layer and the last layer.
        assert_eq!(ngl(&tensors, &tiers), 2);
        assert_eq!(tiers["blk.3.ffn_up.weight"], Tier::Ram);
    }

    #[test]
    fn a_budget_fills_ffn_from_the_last_layer_after_all_attention() {
        let tensors = model(false);
        let budget = non_ffn_bytes(&tensors) + 3 * 4096;
        let tiers = placed(&tensors, Mode::FullResident, GpuShare::BudgetBytes(budget));
        for m in ["ffn_gate", "ffn_up", "ffn_down"] {
            assert_eq!(tiers[&format!("blk.3.{m}.weight")], Tier::Gpu);
            assert_eq!(tiers[&format!("blk.2.{m}.weight")], Tier::Ram);
        }
    }

    #[test]
    fn an_output_layer_in_ram_beside_gpu_layers_still_counts_the_layers() {
        let tensors = model(false);
        let mut tiers = placed(&tensors, Mode::FullResident, GpuShare::Layers(3));
        for name in ["output.weight", "output_norm.weight"] {
            tiers.insert(name.to_string(), Tier::Ram);
        }
        assert_eq!(ngl(&tensors, &tiers), 3);
    }

    #[test]
    fn streamed_tensors_never_move_to_the_gpu() {
        let tensors = model(true);
        let tiers = placed(&tensors, Mode::ExpertStreaming, GpuShare::Layers(99));
        for t in &tensors {
            let expected = match t.role {
                TensorRole::Experts => Tier::Stream,
                TensorRole::Embedding => Tier::Ram,
                _ => Tier::Gpu,
            };
            assert_eq!(tiers[&t.name], expected, "{}", t.name);
        }
        assert_eq!(ngl(&tensors, &tiers), 5);
        // A budget counts only the RAM bytes it moves.
        let budget = non_ffn_bytes(&tensors);
        let tiers = placed(
            &tensors,
            Mode::ExpertStreaming,
            GpuShare::BudgetBytes(budget),
        );
        assert_eq!(gpu_bytes(&tensors, &tiers), budget);
    }

    #[test]
    fn no_gpu_share_means_no_gpu_layers() {
        let tensors = model(false);
        for share in [
            GpuShare::None,
            GpuShare::Layers(0),
            GpuShare::BudgetBytes(10),
        ] {
            let tiers = placed(&tensors, Mode::FullResident, share);
            assert_eq!(gpu_bytes(&tensors, &tiers), 0, "{share:?}");
            assert_eq!(ngl(&tensors, &tiers), 0, "{share:?}");
        }
    }
}
