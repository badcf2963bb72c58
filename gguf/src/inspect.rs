//! What a model file holds, for `hypura inspect`: architecture, size, and bytes per tensor role.
//!
//! Built from the GGUF header and tensor table alone ([`GgufFile`]); no tensor data is read.

use std::collections::BTreeMap;
use std::fmt;

use hypura_scheduler::roles::{classify, TensorRole};
use hypura_scheduler::size::format_bytes;
use serde::Serialize;

use crate::reader::GgufFile;

/// A summary of one GGUF model. Serializes to the JSON of `hypura inspect --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReport {
    /// `general.architecture` (`unknown` when absent).
    pub architecture: String,
    /// `general.name`.
    pub name: Option<String>,
    /// Total number of weights: the sum of every tensor's element count.
    pub parameters: u64,
    /// Training context length in tokens (`{arch}.context_length`).
    pub context_length: Option<u64>,
    /// Hidden size (`{arch}.embedding_length`).
    pub embedding_length: Option<u64>,
    /// Number of transformer blocks (`{arch}.block_count`).
    pub layers: Option<u64>,
    /// Vocabulary size (length of `tokenizer.ggml.tokens`).
    pub vocab_size: Option<u64>,
    /// The quantization mix (`general.file_type`, named as llama.cpp names `llama_ftype`).
    pub file_type: Option<String>,
    /// Size of the whole file in bytes.
    pub file_bytes: u64,
    /// Bytes of tensor data, without alignment padding.
    pub tensor_bytes: u64,
    /// Number of tensors.
    pub tensors: u64,
    /// Mixture-of-experts shape; `None` for dense models.
    pub experts: Option<ExpertInfo>,
    /// Tensor bytes per role (every role of [`TensorRole::ALL`], zero included); the values
    /// sum to `tensor_bytes`.
    pub roles: BTreeMap<String, u64>,
}

/// Mixture-of-experts shape of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExpertInfo {
    /// Experts per MoE layer (`{arch}.expert_count`).
    pub count: u64,
    /// Experts each token is routed to (`{arch}.expert_used_count`), when the file says.
    pub used: Option<u64>,
}

impl ModelReport {
    pub fn from_gguf(file: &GgufFile) -> ModelReport {
        let mut roles: BTreeMap<String, u64> = TensorRole::ALL
            .iter()
            .map(|role| (role.as_str().to_string(), 0))
            .collect();
        for tensor in file.tensors() {
            *roles
                .entry(classify(&tensor.name).as_str().to_string())
                .or_default() += tensor.n_bytes;
        }
        let experts = file
            .arch_u64("expert_count")
            .filter(|&count| count > 0)
            .map(|count| ExpertInfo {
                count,
                used: file.arch_u64("expert_used_count"),
            });
        ModelReport {
            architecture: file.architecture().unwrap_or("unknown").to_string(),
            name: file.get_str("general.name").map(str::to_string),
            parameters: file.parameter_count(),
            context_length: file.arch_u64("context_length"),
            embedding_length: file.arch_u64("embedding_length"),
            layers: file.arch_u64("block_count"),
            vocab_size: file
                .get_array("tokenizer.ggml.tokens")
                .map(|t| t.len() as u64),
            file_type: file.get_u64("general.file_type").map(file_type_name),
            file_bytes: file.file_bytes(),
            tensor_bytes: file.tensor_bytes(),
            tensors: file.tensors().len() as u64,
            experts,
            roles,
        }
    }
}

/// The name llama.cpp gives a `general.file_type` value (`enum llama_ftype` in `llama.h`).
pub fn file_type_name(file_type: u64) -> String {
    let name = match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        other => return format!("unknown ({other})"),
    };
    name.to_string()
}

/// `1234567` → `1,234,567`.
fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let head = digits.len() % 3;
    let mut out = digits[..head].to_string();
    for group in digits.as_bytes()[head..].chunks(3) {
        if !out.is_empty() {
            out.push(',');
        }
        out.extend(group.iter().map(|&d| char::from(d)));
    }
    out
}

/// `134515008` → `134.5 M`.
fn format_count(n: u64) -> String {
    const UNITS: [(f64, &str); 4] = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")];
    UNITS
        .iter()
        .find(|(scale, _)| n as f64 >= *scale)
        .map_or_else(
            || n.to_string(),
            |(scale, unit)| format!("{:.1} {unit}", n as f64 / scale),
        )
}

fn optional(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

impl fmt::Display for ModelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut row = |label: &str, value: String| writeln!(f, "{label:<16}{value}");
        row("architecture", self.architecture.clone())?;
        row("name", self.name.clone().unwrap_or_else(|| "-".into()))?;
        row(
            "parameters",
            format!(
                "{} ({})",
                format_count(self.parameters),
                group_digits(self.parameters)
            ),
        )?;
        row(
            "file type",
            self.file_type.clone().unwrap_or_else(|| "-".into()),
        )?;
        row("context length", optional(self.context_length))?;
        row("layers", optional(self.layers))?;
        row("embedding", optional(self.embedding_length))?;
        row("vocabulary", optional(self.vocab_size))?;
        row(
            "experts",
            match self.experts {
                None => "none (dense)".to_string(),
                Some(ExpertInfo {
                    count,
                    used: Some(used),
                }) => format!("{count} ({used} used per token)"),
                Some(ExpertInfo { count, used: None }) => count.to_string(),
            },
        )?;
        row(
            "file size",
            format!(
                "{} ({} bytes)",
                format_bytes(self.file_bytes),
                group_digits(self.file_bytes)
            ),
        )?;
        row(
            "tensor data",
            format!(
                "{} ({} bytes) in {} tensors",
                format_bytes(self.tensor_bytes),
                group_digits(self.tensor_bytes),
                self.tensors
            ),
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<16}{:>12}  {:>17}  {:>6}",
            "role", "size", "bytes", "share"
        )?;
        for role in TensorRole::ALL {
            let bytes = self.roles.get(role.as_str()).copied().unwrap_or(0);
            let share = if self.tensor_bytes == 0 {
                0.0
            } else {
                100.0 * bytes as f64 / self.tensor_bytes as f64
            };
            writeln!(
                f,
                "{:<16}{:>12}  {:>17}  {share:>5.1}%",
                role.as_str(),
                format_bytes(bytes),
                group_digits(bytes)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{s, t, Model, V};

    #[test]
    fn smollm2_report() {
        // Expected values were read independently with the `gguf` Python package (0.19.0).
        let file = GgufFile::open(crate::testing::smollm2()).expect("model opens");
        let report = ModelReport::from_gguf(&file);
        assert_eq!(report.architecture, "llama");
        assert_eq!(
            report.name.as_deref(),
            Some("Smollm2 135M 8k Lc100K Mix1 Ep2")
        );
        assert_eq!(report.parameters, 134_515_008);
        assert_eq!(report.context_length, Some(8192));
        assert_eq!(report.embedding_length, Some(576));
        assert_eq!(report.layers, Some(30));
        assert_eq!(report.vocab_size, Some(49_152));
        assert_eq!(report.file_type.as_deref(), Some("Q4_1"));
        assert_eq!(report.file_bytes, 98_362_432);
        assert_eq!(report.tensor_bytes, 96_576_768);
        assert_eq!(report.tensors, 272);
        assert_eq!(report.experts, None);

        let sum_of_tensors: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
        assert_eq!(report.tensor_bytes, sum_of_tensors);
        assert_eq!(report.roles.values().sum::<u64>(), report.tensor_bytes);
        let expected: BTreeMap<String, u64> = [
            ("embedding", 30_081_024),
            ("attention", 16_588_800),
            ("norm", 140_544),
            ("router", 0),
            ("ffn", 49_766_400),
            ("experts", 0),
            ("shared_experts", 0),
            ("output", 0), // SmolLM2 ties the output projection to token_embd
            ("other", 0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(report.roles, expected);
    }

    #[test]
    fn smollm2_table_and_json() {
        let file = GgufFile::open(crate::testing::smollm2()).expect("model opens");
        let report = ModelReport::from_gguf(&file);

        let table = report.to_string();
        assert!(
            table.contains("parameters      134.5 M (134,515,008)"),
            "{table}"
        );
        assert!(
            table.contains("file size       93.8 MiB (98,362,432 bytes)"),
            "{table}"
        );
        assert!(
            table.contains("tensor data     92.1 MiB (96,576,768 bytes) in 272 tensors"),
            "{table}"
        );
        assert!(table.contains("file type       Q4_1"), "{table}");
        assert!(table.contains("experts         none (dense)"), "{table}");
        let ffn_row = table
            .lines()
            .find(|l| l.starts_with("ffn "))
            .expect("ffn row");
        assert!(
            ffn_row.contains("47.5 MiB")
                && ffn_row.contains("49,766,400")
                && ffn_row.contains("51.5%"),
            "{ffn_row}"
        );

        let json = serde_json::to_value(&report).expect("serializes");
        for key in [
            "architecture",
            "parameters",
            "context_length",
            "file_bytes",
            "tensor_bytes",
            "experts",
            "roles",
        ] {
            assert!(json.get(key).is_some(), "missing {key} in {json}");
        }
        assert_eq!(json["architecture"], "llama");
        assert_eq!(json["parameters"], 134_515_008u64);
        assert_eq!(json["context_length"], 8192);
        assert_eq!(json["file_bytes"], 98_362_432u64);
        assert_eq!(json["tensor_bytes"], 96_576_768u64);
        assert!(json["experts"].is_null());
        assert_eq!(json["roles"]["ffn"], 49_766_400u64);
        assert_eq!(json["roles"]["shared_experts"], 0);
        assert_eq!(
            json["roles"].as_object().map(|r| r.len()),
            Some(TensorRole::ALL.len())
        );
    }

    fn moe_model() -> Model {
        let mut model = Model::valid()
            .set("llama.expert_count", V::U32(4))
            .set("llama.expert_used_count", V::U32(2));
        let dense_ffn = [
            "blk.0.ffn_gate.weight",
            "blk.0.ffn_down.weight",
            "blk.0.ffn_up.weight",
        ];
        model
            .tensors
            .retain(|t| !dense_ffn.contains(&t.name.as_str()));
        model.tensors.extend([
            t("blk.0.ffn_gate_inp.weight", &[32, 4], 0),
            t("blk.0.ffn_gate_exps.weight", &[32, 8, 4], 2),
            t("blk.0.ffn_up_exps.weight", &[32, 8, 4], 2),
            t("blk.0.ffn_down_exps.weight", &[32, 8, 4], 2),
            t("blk.0.ffn_up_shexp.weight", &[32, 8], 2),
            t("output.weight", &[32, 4], 0),
        ]);
        model
    }

    #[test]
    fn moe_report_counts_experts_and_roles() {
        let file = moe_model().open().expect("opens");
        let report = ModelReport::from_gguf(&file);
        assert_eq!(
            report.experts,
            Some(ExpertInfo {
                count: 4,
                used: Some(2)
            })
        );
        let q4_0 = |elements: u64| elements / 32 * 18;
        assert_eq!(report.roles["experts"], 3 * q4_0(32 * 8 * 4));
        assert_eq!(report.roles["shared_experts"], q4_0(32 * 8));
        assert_eq!(report.roles["router"], 32 * 4 * 4);
        assert_eq!(report.roles["output"], 32 * 4 * 4);
        assert_eq!(report.roles["embedding"], q4_0(32 * 4));
        assert_eq!(report.roles["norm"], 3 * 32 * 4); // attn, ffn and output norms
        assert_eq!(report.roles.values().sum::<u64>(), report.tensor_bytes);
        assert_eq!(report.parameters, file.parameter_count());
        assert!(report
            .to_string()
            .contains("experts         4 (2 used per token)"));
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["experts"], serde_json::json!({"count": 4, "used": 2}));
    }

    #[test]
    fn zero_experts_means_dense() {
        let file = Model::valid()
            .set("llama.expert_count", V::U32(0))
            .open()
            .expect("opens");
        assert_eq!(ModelReport::from_gguf(&file).experts, None);
    }

    #[test]
    fn missing_fields_are_none() {
        let file = Model::valid()
            .remove("general.name")
            .remove("llama.context_length")
            .set("general.file_type", V::U32(999))
            .set("general.architecture", s("gemma3"))
            .open()
            .expect("opens");
        let report = ModelReport::from_gguf(&file);
        assert_eq!(report.architecture, "gemma3");
        assert_eq!(report.name, None);
        assert_eq!(report.context_length, None);
        assert_eq!(report.layers, None); // the key is llama.block_count, not gemma3's
        assert_eq!(report.file_type.as_deref(), Some("unknown (999)"));
        let json = serde_json::to_value(&report).expect("serializes");
        assert!(json["context_length"].is_null());
    }

    #[test]
    fn number_formatting() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(98_362_432), "98,362,432");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1500), "1.5 K");
        assert_eq!(format_count(8_030_261_248), "8.0 B");
        assert_eq!(file_type_name(15), "Q4_K_M");
        assert_eq!(file_type_name(0), "F32");
    }
}
