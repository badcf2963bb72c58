//! What each tensor of a model does, judged from its llama.cpp name alone.
//!
//! Names follow `LLM_TENSOR_NAMES` in llama.cpp's `src/llama-arch.cpp`: global tensors
//! (`token_embd.weight`, `output_norm.weight`, `output.weight`) and per-layer tensors
//! `blk.<layer>.<kind>.<weight|bias|...>`. The planner uses the role to decide where a tensor
//! goes: norms, attention and routers stay resident first, then FFN and expert weights by value
//! per byte.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The job of one tensor in the model graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// Token (and position / token-type) embedding tables.
    Embedding,
    /// Attention projections and the layer's other token mixers (SSM, RWKV time-mix, short
    /// convolutions), attention sinks, MLA low-rank factors.
    Attention,
    /// Every normalization weight or bias (`*_norm*`), whatever block it belongs to.
    Norm,
    /// MoE routing: the gate that scores experts, expert-selection biases.
    Router,
    /// Dense feed-forward weights (`ffn_gate`, `ffn_up`, `ffn_down`, ...).
    Ffn,
    /// Stacked routed-expert weights (`ffn_*_exps`), read per selected expert.
    Experts,
    /// Always-active shared experts of MoE layers (`ffn_*_shexp`).
    SharedExperts,
    /// The output (LM head) projection.
    Output,
    /// Anything else: RoPE factors, per-layer scales, vision or audio extras.
    Other,
}

impl TensorRole {
    /// Every role, in report order.
    pub const ALL: [TensorRole; 9] = [
        TensorRole::Embedding,
        TensorRole::Attention,
        TensorRole::Norm,
        TensorRole::Router,
        TensorRole::Ffn,
        TensorRole::Experts,
        TensorRole::SharedExperts,
        TensorRole::Output,
        TensorRole::Other,
    ];

    /// The snake_case name, the same as the serde form.
    pub const fn as_str(self) -> &'static str {
        match self {
            TensorRole::Embedding => "embedding",
            TensorRole::Attention => "attention",
            TensorRole::Norm => "norm",
            TensorRole::Router => "router",
            TensorRole::Ffn => "ffn",
            TensorRole::Experts => "experts",
            TensorRole::SharedExperts => "shared_experts",
            TensorRole::Output => "output",
            TensorRole::Other => "other",
        }
    }
}

impl fmt::Display for TensorRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The layer a tensor belongs to: `N` of a `blk.N.` prefix; `None` for global tensors.
pub fn layer_index(tensor_name: &str) -> Option<u32> {
    let rest = tensor_name.strip_prefix("blk.")?;
    let (digits, _) = rest.split_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The role of a tensor, from its name.
///
/// Order matters: norms are matched first (`attn_norm` is a norm, not attention;
/// `ffn_norm_exps` is a norm, not experts), then routers (`ffn_gate_inp` is not an FFN gate),
/// then experts and shared experts, then the plain blocks.
pub fn classify(tensor_name: &str) -> TensorRole {
    let stem = stem(tensor_name);
    if is_norm(stem) {
        TensorRole::Norm
    } else if is_router(stem) {
        TensorRole::Router
    } else if is_experts(stem) {
        TensorRole::Experts
    } else if stem.contains("_shexp") {
        TensorRole::SharedExperts
    } else if is_attention(stem) {
        TensorRole::Attention
    } else if is_ffn(stem) {
        TensorRole::Ffn
    } else if is_embedding(stem) {
        TensorRole::Embedding
    } else if is_output(stem) {
        TensorRole::Output
    } else {
        TensorRole::Other
    }
}

/// The name without its layer prefix (`blk.N.`, `enc.blk.N.`, `dec.blk.N.`) and without a
/// trailing parameter kind (`.weight`, `.bias`, `.scale`, ...).
fn stem(name: &str) -> &str {
    let mut rest = name;
    for prefix in ["enc.", "dec."] {
        if let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    if let Some(r) = rest.strip_prefix("blk.") {
        if let Some((digits, after)) = r.split_once('.') {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                rest = after;
            }
        }
    }
    const KINDS: [&str; 5] = [".weight", ".bias", ".scale", ".scales", ".shift"];
    KINDS
        .iter()
        .find_map(|kind| rest.strip_suffix(kind))
        .unwrap_or(rest)
}

fn is_norm(stem: &str) -> bool {
    // RWKV names its time-mix layer norm `time_mix_ln`.
    stem.contains("norm") || stem.ends_with("_ln")
}

fn is_router(stem: &str) -> bool {
    stem.starts_with("ffn_gate_inp")
        || stem.starts_with("exp_probs_b")
        || stem.starts_with("ffn_gate_tid2eid")
}

fn is_experts(stem: &str) -> bool {
    if stem.ends_with("_exps") || stem.ends_with("_chexps") {
        return true;
    }
    // Old per-expert layout: `ffn_gate.3`, `ffn_up.3`, `ffn_down.3` (one tensor per expert).
    match stem.split_once('.') {
        Some((kind, expert)) => {
            matches!(kind, "ffn_gate" | "ffn_up" | "ffn_down")
                && !expert.is_empty()
                && expert.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

fn is_attention(stem: &str) -> bool {
    const PREFIXES: [&str; 9] = [
        "attn_",
        "cross_attn_",
        "vis_attn_",
        "indexer.",
        "indexer_",
        "ssm_",
        "time_mix_",
        "shortconv.",
        "hc_attn_",
    ];
    PREFIXES.iter().any(|p| stem.starts_with(p))
}

fn is_ffn(stem: &str) -> bool {
    const PREFIXES: [&str; 5] = ["ffn_", "ffn.", "channel_mix_", "vis_", "hc_ffn_"];
    PREFIXES.iter().any(|p| stem.starts_with(p))
}

fn is_embedding(stem: &str) -> bool {
    matches!(
        stem,
        "token_embd"
            | "tok_embd"
            | "tok_embeddings"
            | "token_types"
            | "position_embd"
            | "per_layer_token_embd"
            | "nextn.embed_tokens"
    )
}

fn is_output(stem: &str) -> bool {
    matches!(stem, "output" | "cls.output" | "nextn.shared_head_head")
}

#[cfg(test)]
mod tests {
    use super::*;
    use TensorRole::*;

    fn check(cases: &[(&str, TensorRole)]) {
        for (name, role) in cases {
            assert_eq!(classify(name), *role, "{name}");
        }
    }

    #[test]
    fn llama_names() {
        check(&[
            ("token_embd.weight", Embedding),
            ("output_norm.weight", Norm),
            ("output.weight", Output),
            ("rope_freqs.weight", Other),
            ("blk.0.attn_norm.weight", Norm),
            ("blk.0.attn_q.weight", Attention),
            ("blk.0.attn_k.weight", Attention),
            ("blk.0.attn_v.weight", Attention),
            ("blk.0.attn_output.weight", Attention),
            ("blk.0.ffn_norm.weight", Norm),
            ("blk.0.ffn_gate.weight", Ffn),
            ("blk.0.ffn_up.weight", Ffn),
            ("blk.29.ffn_down.weight", Ffn),
        ]);
    }

    #[test]
    fn embedding_variants() {
        check(&[
            ("token_types.weight", Embedding),
            ("position_embd.weight", Embedding),
            ("tok_embd.weight", Embedding),
            ("per_layer_token_embd.weight", Embedding),
            ("token_embd_norm.weight", Norm),
            ("token_embd_norm.bias", Norm),
        ]);
    }

    #[test]
    fn mixtral_names() {
        check(&[
            ("blk.3.ffn_gate_inp.weight", Router),
            ("blk.3.ffn_gate_exps.weight", Experts),
            ("blk.3.ffn_up_exps.weight", Experts),
            ("blk.3.ffn_down_exps.weight", Experts),
            // The old layout with one tensor per expert.
            ("blk.3.ffn_gate.7.weight", Experts),
            ("blk.3.ffn_down.0.weight", Experts),
            ("blk.3.attn_qkv.weight", Attention),
        ]);
    }

    #[test]
    fn qwen3moe_shared_experts() {
        check(&[
            ("blk.0.attn_q_norm.weight", Norm),
            ("blk.0.attn_k_norm.weight", Norm),
            ("blk.0.ffn_gate_inp.weight", Router),
            ("blk.0.ffn_gate_inp_shexp.weight", Router),
            ("blk.0.ffn_gate_shexp.weight", SharedExperts),
            ("blk.0.ffn_up_shexp.weight", SharedExperts),
            ("blk.0.ffn_down_shexp.weight", SharedExperts),
            ("blk.0.ffn_gate_exps.weight", Experts),
        ]);
    }

    #[test]
    fn deepseek2_names() {
        check(&[
            ("blk.5.attn_q_a.weight", Attention),
            ("blk.5.attn_q_a_norm.weight", Norm),
            ("blk.5.attn_q_b.weight", Attention),
            ("blk.5.attn_kv_a_mqa.weight", Attention),
            ("blk.5.attn_kv_a_norm.weight", Norm),
            ("blk.5.attn_kv_b.weight", Attention),
            ("blk.5.attn_k_b.weight", Attention),
            ("blk.5.attn_v_b.weight", Attention),
            ("blk.5.exp_probs_b.bias", Router),
            ("blk.5.ffn_gate_inp.weight", Router),
            ("blk.5.ffn_down_shexp.weight", SharedExperts),
            ("blk.5.ffn_up_exps.weight", Experts),
            ("blk.5.indexer.attn_k.weight", Attention),
            ("blk.5.indexer.k_norm.weight", Norm),
            ("blk.61.nextn.enorm.weight", Norm),
            ("blk.61.nextn.embed_tokens.weight", Embedding),
            ("blk.61.nextn.shared_head_head.weight", Output),
        ]);
    }

    #[test]
    fn gemma3_post_norms() {
        check(&[
            ("blk.1.post_attention_norm.weight", Norm),
            ("blk.1.post_ffw_norm.weight", Norm),
            ("blk.1.pre_ffw_norm_2.weight", Norm),
            ("blk.1.layer_output_norm.weight", Norm),
            ("blk.1.attn_q_norm.weight", Norm),
            ("blk.1.ffn_gate.weight", Ffn),
        ]);
    }

    #[test]
    fn gpt_oss_and_fused_names() {
        check(&[
            ("blk.0.attn_sinks.weight", Attention),
            ("blk.0.attn_q.bias", Attention),
            ("blk.0.ffn_gate_inp.bias", Router),
            ("blk.0.ffn_gate_exps.bias", Experts),
            ("blk.0.ffn_gate_up_exps.weight", Experts),
            ("blk.0.ffn_down_exps.bias", Experts),
            ("blk.0.attn_qkv.weight", Attention),
        ]);
    }

    #[test]
    fn norms_win_over_everything() {
        check(&[
            ("blk.0.attn_norm.weight", Norm),
            ("blk.0.attn_norm_2.weight", Norm),
            ("blk.0.attn_sub_norm.weight", Norm),
            ("blk.0.attn_output_norm.weight", Norm),
            ("blk.0.ffn_norm_exps.weight", Norm),
            ("blk.0.ffn_routed_norm.weight", Norm),
            ("blk.0.time_mix_ln.weight", Norm),
            ("enc.blk.0.attn_norm.weight", Norm),
            ("dec.output_norm.weight", Norm),
        ]);
    }

    #[test]
    fn other_block_kinds() {
        check(&[
            ("blk.0.ssm_in.weight", Attention),
            ("blk.0.time_mix_key.weight", Attention),
            ("blk.0.channel_mix_key.weight", Ffn),
            ("enc.blk.2.attn_o.weight", Attention),
            ("dec.blk.2.cross_attn_k.weight", Attention),
            ("dec.blk.2.ffn_up.weight", Ffn),
            ("blk.0.layer_output_scale.weight", Other),
            ("rope_factors_long.weight", Other),
            ("blk.0.altup_router.weight", Other),
            ("", Other),
        ]);
    }

    #[test]
    fn layer_indices() {
        assert_eq!(layer_index("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_index("blk.61.ffn_up_exps.weight"), Some(61));
        assert_eq!(layer_index("token_embd.weight"), None);
        assert_eq!(layer_index("output.weight"), None);
        assert_eq!(layer_index("blk.x.attn_q.weight"), None);
        assert_eq!(layer_index("blk..attn_q.weight"), None);
        assert_eq!(layer_index("blk.99999999999.attn_q.weight"), None);
        assert_eq!(layer_index("blk.+1.attn_q.weight"), None);
        assert_eq!(layer_index("blk.7"), None);
    }

    #[test]
    fn names_and_serde_agree() {
        let all: Vec<&str> = TensorRole::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            all,
            [
                "embedding",
                "attention",
                "norm",
                "router",
                "ffn",
                "experts",
                "shared_experts",
                "output",
                "other"
            ]
        );
        for role in TensorRole::ALL {
            let json = serde_json::to_string(&role).expect("role serializes");
            assert_eq!(json, format!("\"{}\"", role.as_str()));
            let back: TensorRole = serde_json::from_str(&json).expect("role deserializes");
            assert_eq!(back, role);
            assert_eq!(role.to_string(), role.as_str());
        }
    }
}
