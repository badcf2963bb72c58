//! Which tier each tensor lives on, and the streaming mode that follows.
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use hypura_scheduler::roles::{classify, TensorRole};
use serde::Serialize;

use crate::gguf::GgufFile;

/// Where a tensor's bytes live while the model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Gpu,
    Ram,
    /// Left in the file; read on demand into the STREAM region.
    Stream,
}

/// How a model's weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every tensor resident; no I/O after load.
    FullResident,
    /// MoE: expert tensors streamed per selected expert through a RAM cache.
    ExpertStreaming,
    /// Dense: FFN weights streamed layer by layer through a pool of slots.
    DenseFfnStreaming,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::FullResident => "full-resident",
            Mode::ExpertStreaming => "expert-streaming",
            Mode::DenseFfnStreaming => "dense-ffn-streaming",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full-resident" => Ok(Mode::FullResident),
            "expert-streaming" => Ok(Mode::ExpertStreaming),
            "dense-ffn-streaming" => Ok(Mode::DenseFfnStreaming),
            other => Err(format!(
                "unknown mode '{other}': use full-resident, expert-streaming or dense-ffn-streaming"
            )),
        }
    }
}

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
            .map(|t| {
                let tier = if is_streamed(mode, &t.name) {
                    Tier::Stream
                } else {
                    Tier::Ram
                };
                (t.name.clone(), tier)
            })
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
    pub fn stream_patterns(&self) -> Vec<String> {
        match self.mode {
            Mode::FullResident => vec![],
            Mode::ExpertStreaming => {
                vec![r"^blk\.[0-9]+\.ffn_(gate|up|down|gate_up)_exps\.weight$".into()]
            }
            Mode::DenseFfnStreaming => vec![r"^blk\.[0-9]+\.ffn_(gate|up|down)\.weight$".into()],
        }
    }
}

/// Whether `mode` streams tensor `name`: exactly the names matched by
/// [`Placement::stream_patterns`] (stacked expert tensors, or dense FFN
/// matrices of a layer), so llama.cpp and hypura agree on the STREAM set.
pub fn is_streamed(mode: Mode, name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let Some(tensor) = rest[digits..]
        .strip_prefix('.')
        .and_then(|r| r.strip_suffix(".weight"))
    else {
        return false;
    };
    let role = classify(name);
    match mode {
        Mode::FullResident => false,
        Mode::ExpertStreaming => {
            role == TensorRole::Experts
                && matches!(
                    tensor,
                    "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" | "ffn_gate_up_exps"
                )
        }
        Mode::DenseFfnStreaming => {
            role == TensorRole::Ffn && matches!(tensor, "ffn_gate" | "ffn_up" | "ffn_down")
        }
    }
}

impl PartialOrd for Tier {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tier {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (*self as u8).cmp(&(*other as u8))
    }
}
