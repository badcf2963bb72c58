//! Which tier each tensor lives on, and the streaming mode that follows.
use std::collections::BTreeMap;

use hypura_scheduler::plan::{self, ModelFacts, Plan, PlanRequest, PlanSettings, PlanTensor};
use hypura_scheduler::popularity::ExpertPopularity;
use hypura_scheduler::profile::HardwareProfile;
use hypura_scheduler::reads::MeasuredReads;
use serde::Serialize;

// The planner owns these; re-exported so engine code keeps its paths.
pub use hypura_scheduler::plan::{is_streamed, mode_tier, Mode, Tier};

use hypura_gguf::GgufFile;

/// The tier of every tensor of a model.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub mode: Mode,
    pub tiers: BTreeMap<String, Tier>,
}

impl Placement {
    /// The placement of `mode`: STREAM for the streamed role (experts, or
    /// dense FFN), RAM for everything else.
    pub fn for_mode(file: &GgufFile, mode: Mode) -> Result<Placement, String> {
        let tiers: BTreeMap<String, Tier> = file
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), mode_tier(mode, &t.name)))
            .collect();
        if mode != Mode::FullResident && !tiers.values().any(|&t| t == Tier::Stream) {
            return Err(match mode {
                Mode::ExpertStreaming => "expert-streaming needs a mixture-of-experts model; this one has no expert tensors".into(),
                _ => format!("{mode} found no dense FFN tensors in this model"),
            });
        }
        Ok(Placement { mode, tiers })
    }

    pub fn tier(&self, tensor: &str) -> Option<Tier> {
        self.tiers.get(tensor).copied()
    }

    /// Bytes per tier.
    pub fn tier_bytes(&self, file: &GgufFile) -> BTreeMap<Tier, u64> {
        let mut bytes = BTreeMap::new();
        for t in file.tensors() {
            if let Some(tier) = self.tier(&t.name) {
                *bytes.entry(tier).or_insert(0) += t.n_bytes;
            }
        }
        bytes
    }

    /// Anchored regexes matching exactly the STREAM tensors, for llama.cpp's
    /// `tensor_buft_overrides` (compiled per tensor × pattern: keep it to one).
    /// Where some layers' experts are resident (hybrid placement), the one
    /// pattern names the streamed layers.
    pub fn stream_patterns(&self) -> Vec<String> {
        match self.mode {
            Mode::FullResident => vec![],
            Mode::ExpertStreaming => {
                let layers = self.stream_layers();
                let all = self
                    .tiers
                    .keys()
                    .filter(|n| is_streamed(self.mode, n))
                    .all(|n| self.tier(n) == Some(Tier::Stream));
                let layers = if all {
                    "[0-9]+".to_string()
                } else {
                    format!("({})", super::gpu::layers_regex(&layers))
                };
                vec![format!(
                    r"^blk\.{layers}\.ffn_(gate|up|down|gate_up)_exps\.weight$"
                )]
            }
            Mode::DenseFfnStreaming => vec![r"^blk\.[0-9]+\.ffn_(gate|up|down)\.weight$".into()],
        }
    }

    /// The layers with a STREAM tensor, ascending.
    pub fn stream_layers(&self) -> Vec<u32> {
        plan::stream_layers(&self.tiers).into_iter().collect()
    }
}

impl Placement {
    /// The planner's placement, checked against what this engine can load:
    /// every tensor has a tier, and STREAM is the mode's streamed role (the
    /// streamer builds its units per mode): all of it, or in expert-streaming
    /// the experts of some layers, the others' staying resident.
    pub fn from_plan(file: &GgufFile, plan: &Plan) -> Result<Placement, String> {
        let mut tiers = BTreeMap::new();
        for t in file.tensors() {
            let tier = plan.tiers.get(&t.name).copied().ok_or_else(|| {
                format!(
                    "the plan has no tier for {}; plan again for this file",
                    t.name
                )
            })?;
            // Expert-streaming may keep some layers' experts resident (hybrid).
            let may_stay = plan.mode == Mode::ExpertStreaming && tier != Tier::Stream;
            if (tier == Tier::Stream) != is_streamed(plan.mode, &t.name) && !may_stay {
                return Err(format!(
                    "the plan puts {} on {tier}, but {} streams exactly its {} tensors",
                    t.name,
                    plan.mode,
                    if plan.mode == Mode::ExpertStreaming {
                        "expert"
                    } else {
                        "dense FFN"
                    }
                ));
            }
            tiers.insert(t.name.clone(), tier);
        }
        Ok(Placement {
            mode: plan.mode,
            tiers,
        })
    }
}

/// The planner's placement of `file` on `profile` with `settings`: the one
/// planner ([`hypura_scheduler::plan::plan`]) fed from the GGUF's header.
/// Every placement `run`, `bench`, `serve` and `inspect --plan` use comes
/// from here.
pub fn plan_file(
    file: &GgufFile,
    profile: &HardwareProfile,
    settings: PlanSettings,
) -> Result<Plan, crate::error::EngineError> {
    let invalid = crate::error::EngineError::InvalidArgument;
    let (tensors, facts) =
        plan_inputs(file).map_err(|e| invalid(format!("{}: {e}", file.path().display())))?;
    let popularity = measured_popularity(file, &facts);
    let reads = measured_reads(file, profile);
    let request = PlanRequest {
        tensors: &tensors,
        facts,
        profile,
        settings,
        popularity: popularity.as_ref(),
        reads: reads.as_ref(),
    };
    Ok(plan::plan(&request)?)
}

/// The rates the model's streamer read its file at on this machine, as it
/// saved them in the default cache directory ([`super::reads`]); `None`
/// for a model never streamed here, or a plan for another machine's
/// profile.
fn measured_reads(file: &GgufFile, profile: &HardwareProfile) -> Option<MeasuredReads> {
    if !crate::hwprobe::describes_this_machine(profile) {
        return None;
    }
    super::reads::load(&super::reads::path(file.path(), file.data_offset(), None).ok()?)
}

/// The expert popularity an MoE's earlier runs measured: the co-activation
/// counts its streamer saved in the default cache directory, where it keeps
/// them ([`super::coact`]); `None` for a dense model, one never streamed, or
/// too few tokens seen ([`ExpertPopularity::from_selections`]).
fn measured_popularity(file: &GgufFile, facts: &ModelFacts) -> Option<ExpertPopularity> {
    if facts.n_expert == 0 {
        return None;
    }
    let path = super::coact::stats_path(file.path(), file.data_offset(), None).ok()?;
    let counts = super::coact::Coactivation::load(&path, facts.n_layer, facts.n_expert)?;
    ExpertPopularity::from_selections(&counts.selections(facts.n_expert_used))
}

/// What the planner needs from a GGUF: its tensors and model facts, from the
/// metadata alone (no tensor data is read).
pub fn plan_inputs(file: &GgufFile) -> Result<(Vec<PlanTensor>, ModelFacts), String> {
    let tensors = file
        .tensors()
        .iter()
        .map(|t| PlanTensor::new(t.name.clone(), t.n_bytes))
        .collect();
    let key = |suffix: &str| file.arch_u64(suffix).and_then(|v| u32::try_from(v).ok());
    let n_layer = key("block_count").ok_or("the GGUF has no {arch}.block_count")?;
    let n_embd = key("embedding_length").ok_or("the GGUF has no {arch}.embedding_length")?;
    let n_head = key("attention.head_count").unwrap_or(1).max(1);
    // Per-layer arrays (some architectures) fall back to the query head count.
    let n_head_kv = key("attention.head_count_kv").unwrap_or(n_head);
    let head_dim = n_embd / n_head;
    let key_length = key("attention.key_length").unwrap_or(head_dim);
    let value_length = key("attention.value_length").unwrap_or(head_dim);
    let n_vocab = key("vocab_size")
        .or_else(|| {
            file.get_array("tokenizer.ggml.tokens")
                .and_then(|a| u32::try_from(a.len()).ok())
        })
        .unwrap_or(0);
    let facts = ModelFacts {
        n_layer,
        n_expert: key("expert_count").unwrap_or(0),
        n_expert_used: key("expert_used_count").unwrap_or(0),
        n_embd,
        n_vocab,
        kv_bytes_per_token: ModelFacts::f16_kv_bytes_per_token(
            n_layer,
            n_head_kv,
            key_length,
            value_length,
        ),
    };
    Ok((tensors, facts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_inputs_read_smollm2s_attention_shape() {
        let file = GgufFile::open(crate::test_models::smollm2()).unwrap();
        let (tensors, facts) = plan_inputs(&file).unwrap();
        assert_eq!(tensors.len(), file.tensors().len());
        assert_eq!(facts.n_layer, 30);
        // 30 layers × 3 KV heads × (64 + 64) × 2 bytes.
        assert_eq!(facts.kv_bytes_per_token, 30 * 3 * 128 * 2);
    }
}
