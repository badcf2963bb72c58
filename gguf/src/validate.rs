//! [`GgufFile::validate`]: what llama.cpp would otherwise fail on later, much of it by
//! aborting the whole process in a `GGML_ASSERT` (or dividing by zero, or throwing where
//! nothing catches).
//!
//! Every check is one [`Rule`] of [`RULES`], which names the llama.cpp code it mirrors in the
//! vendored sources (`llama-cpp-sys-2`'s `llama.cpp/`). The rules run in table order and the
//! first one broken is the error: [`GgufError::BadValue`] for a hyperparameter, else the
//! error kind of the part at fault (tensor layout, architecture, tokenizer).
//!
//! Hyperparameters are checked for every architecture where llama.cpp's common loader
//! (`llama_model_base::load_hparams`) reads them, and in full (required keys, tensor shapes)
//! for [`CHECKED_ARCHITECTURES`], the families hypura runs and tests.
use std::borrow::Cow;
use std::collections::HashSet;

use crate::reader::*;

/// `LLAMA_MAX_LAYERS` (`llama-hparams.h`).
pub const LLAMA_MAX_LAYERS: u32 = 512;
/// `LLAMA_MAX_EXPERTS` (`llama-hparams.h`).
pub const LLAMA_MAX_EXPERTS: u32 = 1024;

/// `GGML_TYPE_F32`: the only type of a vector (norm, bias) ggml applies.
const GGML_TYPE_F32: u32 = 0;

/// The `ggml_type`s ggml can multiply as weights: those with a `vec_dot` in
/// `ggml-cpu.c`'s `type_traits_cpu` (not q8_1 and q8_K, which are activation
/// types, nor the integer types and f64).
pub const MATMUL_TYPES: &[u32] = &[
    0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 29, 30, 34, 35, 39,
    40, 41, 42,
];

/// Architectures whose hyperparameters and tensor shapes are checked in full: required keys
/// present, head counts, feed-forward widths and the shapes of the embedding, output and
/// per-layer attention and FFN tensors. (Mixtral and other llama-layout MoEs are `llama`.)
pub const CHECKED_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma", "gemma2", "gemma3", "phi3",
    "mistral3",
];

/// Graphs that assert `n_embd_head_v == n_embd_head_k == n_rot` (`models/<arch>.cpp`).
const HEAD_IS_ROPE: &[&str] = &[
    "llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "mistral3",
];
/// Graphs that assert `n_embd_head_v == n_embd_head_k` only.
const HEAD_K_IS_V: &[&str] = &["phi2", "phi3"];
/// Whose Q projection is `n_embd` wide rather than `n_embd_head_k * n_head`.
const Q_IS_EMBD: &[&str] = &["qwen2", "qwen2moe", "phi3"];
/// Whose loader throws without experts (`models/qwen2moe.cpp`, `models/qwen3moe.cpp`).
const NEED_EXPERTS: &[&str] = &["qwen2moe", "qwen3moe"];

/// One check of [`GgufFile::validate`].
pub struct Rule {
    /// Short name, in [`GgufError::BadValue`] and the tests.
    pub name: &'static str,
    /// The llama.cpp code this rule mirrors: `file: the assert, throw or crash`.
    pub mirrors: &'static str,
    check: fn(&GgufFile) -> Result<(), Refusal>,
}

/// Every check, in the order [`GgufFile::validate`] runs them. Tensor data inside the file
/// comes last: the header alone (a truncated download, the fuzz corpus) passes every other rule.
pub const RULES: &[Rule] = &[
    // ---- tensor layout ----------------------------------------------------------------------
    Rule {
        name: "tensor-alignment",
        mirrors: "ggml/src/gguf.cpp gguf_init_from_file_impl: tensor offsets are multiples of \
                  general.alignment, else the file is refused",
        check: |f| f.check_alignment().map_err(Refusal::from),
    },
    Rule {
        name: "tensor-packing",
        mirrors: "ggml/src/gguf.cpp: \"tensor '%s' has offset %\" PRIu64 \", expected %zu\"",
        check: |f| f.check_packing().map_err(Refusal::from),
    },
    Rule {
        name: "tensor-types",
        mirrors: "ggml/src/ggml-cpu/ops.cpp binary ops (the ggml_mul of a norm, the ggml_add of \
                  a bias): GGML_ABORT(\"%s: unsupported types\") unless the vector is F32 \
                  (convert_hf_to_gguf.py and llama-quantize keep 1-D tensors and *_norm.weight \
                  F32); ggml-cpu.c type_traits_cpu: a matrix of a type without vec_dot (q8_1, \
                  q8_K, the integer types, f64) crashes ggml_mul_mat",
        check: |f| f.check_tensor_types().map_err(Refusal::from),
    },
    // ---- architecture -----------------------------------------------------------------------
    Rule {
        name: "architecture",
        mirrors: "src/llama-model.cpp: \"unknown model architecture: '%s'\"",
        check: |f| f.validate_architecture().map_err(Refusal::from),
    },
    // ---- tokenizer --------------------------------------------------------------------------
    Rule {
        name: "tokenizer-model",
        mirrors: "src/llama-vocab.cpp: \"unknown tokenizer: '%s'\"; and for \"none\"/\"no_vocab\" \
                  GGML_ASSERT(type != LLAMA_VOCAB_TYPE_NONE) on the first tokenize",
        check: |f| f.tokenizer_model().map(|_| ()).map_err(Refusal::from),
    },
    Rule {
        name: "tokenizer-tokens",
        mirrors: "src/llama-vocab.cpp: \"cannot find tokenizer vocab in model file\", \
                  \"invalid gguf type for tokenizer.ggml.tokens\"",
        check: |f| f.vocab_tokens().map(|_| ()).map_err(Refusal::from),
    },
    Rule {
        name: "tokenizer-per-token-arrays",
        mirrors: "src/llama-vocab.cpp: \"Index out of array bounds for scores\" / \"toktypes\", \
                  \"invalid gguf type for tokenizer.ggml.scores\" / \"token_type\"",
        check: |f| f.check_per_token_arrays().map_err(Refusal::from),
    },
    Rule {
        name: "tokenizer-unique-tokens",
        mirrors: "src/llama-vocab.cpp: GGML_ASSERT(id_to_token.size() == token_to_id.size())",
        check: |f| f.check_unique_tokens().map_err(Refusal::from),
    },
    Rule {
        name: "special-token-ids",
        mirrors:
            "src/llama-vocab.cpp: ml.get_key(LLM_KV_TOKENIZER_*_ID, uint32_t) throws \"key %s \
                  has wrong type\" (llama-model-loader.cpp); BOS/EOS outside the vocabulary \
                  are dropped (\"bad special token\")",
        check: |f| f.check_special_token_ids().map_err(Refusal::from),
    },
    Rule {
        name: "add-bos-eos",
        mirrors: "src/llama-vocab.cpp append_bos/append_eos: \
                  GGML_ASSERT(vocab.token_bos() != LLAMA_TOKEN_NULL) (and token_eos)",
        check: |f| f.check_add_bos_eos().map_err(Refusal::from),
    },
    Rule {
        name: "wpm-byte-tokens",
        mirrors: "src/llama-vocab.cpp token_to_byte: case LLAMA_VOCAB_TYPE_WPM: \
                  GGML_ABORT(\"fatal error\"), reached at load (the token-to-piece cache) for \
                  every token typed BYTE in a BERT vocabulary",
        check: |f| f.check_wpm_byte_tokens().map_err(Refusal::from),
    },
    Rule {
        name: "spm-byte-tokens",
        mirrors: "src/llama-vocab.cpp byte_to_token: throw \"Byte token for <0x..> is not set\" \
                  while tokenizing, where nothing catches it (std::terminate)",
        check: |f| f.check_byte_tokens().map_err(Refusal::from),
    },
    Rule {
        name: "bpe-merges",
        mirrors: "src/llama-vocab.cpp: \"cannot find tokenizer merges in model file\", \
                  \"invalid gguf type for tokenizer.ggml.merges\"",
        check: |f| f.check_merges().map_err(Refusal::from),
    },
    // ---- hyperparameters --------------------------------------------------------------------
    Rule {
        name: "context-length",
        mirrors: "src/llama-model.cpp load_hparams: ml.get_key(LLM_KV_CONTEXT_LENGTH, \
                  hparams.n_ctx_train) (required); llama-context.cpp: \"n_ctx and \
                  model->hparams.n_ctx_train cannot both be zero\"",
        check: |f| hparams(f, check_context_length),
    },
    Rule {
        name: "embedding-length",
        mirrors: "src/llama-model.cpp load_hparams: ml.get_key(LLM_KV_EMBEDDING_LENGTH, \
                  hparams.n_embd) (required); n_embd / n_head sizes every head",
        check: |f| hparams(f, check_embedding_length),
    },
    Rule {
        name: "block-count",
        mirrors: "src/llama-model.cpp load_hparams: \
                  GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)",
        check: |f| hparams(f, |hp| hp.n_layer().map(|_| ())),
    },
    Rule {
        name: "hparam-types",
        mirrors: "src/llama-model-loader.cpp get_key: \"key %s has wrong type %s but expected \
                  type %s\"; get_key_or_arr: \"key %s has wrong array length\", get_arr: \"%s \
                  has wrong array element type %s\"",
        check: |f| hparams(f, check_types),
    },
    Rule {
        name: "nextn-layers",
        mirrors: "src/llama-model.cpp load_hparams: \
                  GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all)",
        check: |f| hparams(f, check_nextn),
    },
    Rule {
        name: "expert-count",
        mirrors:
            "src/llama-model.cpp load_hparams: GGML_ASSERT(hparams.n_expert <= LLAMA_MAX_EXPERTS)",
        check: |f| hparams(f, check_expert_count),
    },
    Rule {
        name: "expert-used-count",
        mirrors: "src/llama-model.cpp load_hparams: GGML_ASSERT(n_expert_used_max <= \
                  hparams.n_expert); GGML_ASSERT(n_expert_used_max > 0) with experts, \
                  GGML_ASSERT(n_expert_used_max == 0) without; a layer routing to 0 experts \
                  (per-layer expert_used_count) crashes the MoE graph (SIGSEGV, found by \
                  gateway/tests/safety/mutated.rs)",
        check: |f| hparams(f, check_expert_used),
    },
    Rule {
        name: "expert-groups",
        mirrors: "src/llama-model.cpp load_hparams: GGML_ASSERT(hparams.n_expert_groups < \
                  hparams.n_expert), n_expert % n_expert_groups == 0, 0 < n_group_used < \
                  n_expert_groups; GGML_ASSERT(hparams.n_expert_groups == 0) without experts",
        check: |f| hparams(f, check_expert_groups),
    },
    Rule {
        name: "moe-needs-experts",
        mirrors: "src/models/qwen2moe.cpp, qwen3moe.cpp: \"n_expert must be > 0\", \
                  \"n_expert_used must be > 0\"",
        check: |f| hparams(f, check_moe_needs_experts),
    },
    Rule {
        name: "head-count",
        mirrors: "src/models/gemma2.cpp, gemma3.cpp: hparams.n_embd / hparams.n_head(0) \
                  (integer division: SIGFPE at n_head 0); load_hparams sizes heads as \
                  n_embd / n_head()",
        check: |f| hparams(f, check_head_count),
    },
    Rule {
        name: "head-count-kv",
        mirrors: "ggml/src/ggml.c ggml_mul_mat: GGML_ASSERT(ggml_can_mul_mat(a, b)) on K·Q in \
                  llama-graph.cpp build_attn_mha (Q heads broadcast over n_head_kv)",
        check: |f| hparams(f, check_head_count_kv),
    },
    Rule {
        name: "head-dimensions",
        mirrors: "src/models/llama.cpp (qwen2, qwen3, qwen2moe, qwen3moe, mistral3, phi3) graph: \
                  GGML_ASSERT(n_embd_head == hparams.n_embd_head_k())",
        check: |f| hparams(f, check_head_dims),
    },
    Rule {
        name: "rope-dimensions",
        mirrors: "ggml/src/ggml-cpu/ops.cpp rope: GGML_ASSERT(n_dims <= ne0), \
                  GGML_ASSERT(n_dims % 2 == 0); src/models/llama.cpp graph: \
                  GGML_ASSERT(n_embd_head == n_rot); llama-model.cpp: \"invalid n_rot\"",
        check: |f| hparams(f, check_rope_dims),
    },
    Rule {
        name: "norm-epsilon",
        mirrors: "ggml/src/ggml-cpu/ops.cpp norm/rms_norm: GGML_ASSERT(eps >= 0.0f) (NaN fails \
                  it); src/models/<arch>.cpp: ml.get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS) \
                  (required)",
        check: |f| hparams(f, check_norm_eps),
    },
    Rule {
        name: "rope-freq-base",
        mirrors: "src/llama-model.cpp load_hparams: ml.get_key(LLM_KV_ROPE_FREQ_BASE) is not \
                  checked; ggml's rope raises it to a power, so NaN or <= 0 makes every logit NaN",
        check: |f| hparams(f, check_rope_freq_base),
    },
    Rule {
        name: "rope-scaling",
        mirrors: "src/llama-model.cpp load_hparams: GGML_ASSERT(hparams.rope_scaling_type_train \
                  != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED); rope_freq_scale = 1/factor",
        check: |f| hparams(f, check_rope_scaling),
    },
    Rule {
        name: "feed-forward-length",
        mirrors: "src/models/<arch>.cpp load_arch_tensors: ffn tensors {n_embd, n_ff}; \
                  src/llama-model-loader.cpp: \"tensor '%s' has wrong shape\"",
        check: |f| hparams(f, check_ffn_length),
    },
    Rule {
        name: "vocab-tensor-shapes",
        mirrors: "src/models/<arch>.cpp: create_tensor(TOKEN_EMBD / OUTPUT, {n_embd, n_vocab}); \
                  src/llama-model-loader.cpp: \"tensor '%s' has wrong shape\"",
        check: |f| hparams(f, check_vocab_shapes),
    },
    Rule {
        name: "layer-tensor-shapes",
        mirrors: "src/models/<arch>.cpp load_arch_tensors: create_tensor_qkv, ATTN_OUT, FFN_*, \
                  FFN_GATE_INP {n_embd, n_expert}, FFN_*_EXPS {.., n_expert}; \
                  src/llama-model-loader.cpp: \"tensor '%s' has wrong shape\", \
                  \"missing tensor '%s'\", \"wrong number of tensors\"",
        check: |f| hparams(f, check_layer_shapes),
    },
    // ---- last, so that the metadata of a truncated download is checked too ------------------
    Rule {
        name: "tensor-data-in-file",
        mirrors: "src/llama-model-loader.h: \"tensor '%s' data is not within the file bounds, \
                  model is corrupted or incomplete\"",
        check: |f| f.check_data_in_file().map_err(Refusal::from),
    },
];

/// Why a rule refused the file.
enum Refusal {
    /// An error of its own kind (tensor layout, architecture, tokenizer).
    File(GgufError),
    /// A bad hyperparameter: becomes [`GgufError::BadValue`] with the rule's name.
    Value { key: String, detail: String },
}

impl From<GgufError> for Refusal {
    fn from(e: GgufError) -> Self {
        Refusal::File(e)
    }
}

fn refuse<T>(key: impl Into<String>, detail: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::Value {
        key: key.into(),
        detail: detail.into(),
    })
}

impl GgufFile {
    /// Checks that llama.cpp can load this file, build its tokenizer and run it without
    /// aborting: every rule of [`RULES`], in order.
    pub fn validate(&self) -> Result<(), GgufError> {
        match self.broken_rule() {
            None => Ok(()),
            Some((_, e)) => Err(e),
        }
    }

    /// The first rule of [`RULES`] this file breaks, with the error [`GgufFile::validate`]
    /// returns for it.
    pub fn broken_rule(&self) -> Option<(&'static Rule, GgufError)> {
        RULES.iter().find_map(|rule| match (rule.check)(self) {
            Ok(()) => None,
            Err(Refusal::File(e)) => Some((rule, e)),
            Err(Refusal::Value { key, detail }) => Some((
                rule,
                GgufError::BadValue {
                    path: self.path.clone(),
                    rule: rule.name,
                    key,
                    detail,
                },
            )),
        })
    }

    // ---- tensor layout ----------------------------------------------------------------------

    /// Vectors (1-D tensors: norms, biases, scales) and `*norm.weight` must be F32, as
    /// ggml's element-wise ops need and llama.cpp's converter and quantizer write them;
    /// matrices must be of a type ggml can multiply ([`MATMUL_TYPES`]).
    fn check_tensor_types(&self) -> Result<(), GgufError> {
        for tensor in &self.tensors {
            let name = ggml_type(tensor.ggml_type).map_or("unknown", |t| t.name);
            let vector = tensor.dims.len() <= 1 || tensor.name.ends_with("norm.weight");
            if vector && tensor.ggml_type != GGML_TYPE_F32 {
                return Err(self.bad_tensor(
                    tensor,
                    format!(
                        "it is a vector (norm, bias or scale) of ggml type {} ({name}), and \
                         llama.cpp only applies F32 vectors (it aborts otherwise); convert the \
                         model again keeping 1-D tensors and norms F32",
                        tensor.ggml_type
                    ),
                ));
            }
            if !vector && !MATMUL_TYPES.contains(&tensor.ggml_type) {
                return Err(self.bad_tensor(
                    tensor,
                    format!(
                        "it is a weight matrix of ggml type {} ({name}), which ggml cannot \
                         multiply (no vec_dot for it); use F32, F16, BF16 or a weight \
                         quantization such as Q8_0 or Q4_K",
                        tensor.ggml_type
                    ),
                ));
            }
        }
        Ok(())
    }

    fn bad_tensor(&self, tensor: &TensorInfo, detail: String) -> GgufError {
        GgufError::BadTensor {
            path: self.path.clone(),
            tensor: tensor.name.clone(),
            detail,
        }
    }

    fn check_alignment(&self) -> Result<(), GgufError> {
        for (tensor, &offset) in self.tensors.iter().zip(&self.relative_offsets) {
            if offset % self.alignment != 0 {
                return Err(self.bad_tensor(
                    tensor,
                    format!(
                        "its data offset {offset} is not a multiple of the file's alignment {}",
                        self.alignment
                    ),
                ));
            }
        }
        Ok(())
    }

    /// ggml requires tensor i to start exactly where tensor i-1 ends, padded to the
    /// alignment: no gaps, no overlaps, no reordering.
    fn check_packing(&self) -> Result<(), GgufError> {
        let mut expected: u64 = 0;
        let mut previous: Option<&TensorInfo> = None;
        for (tensor, &offset) in self.tensors.iter().zip(&self.relative_offsets) {
            if offset < expected {
                let other =
                    previous.map_or(String::new(), |p| format!(" with tensor '{}'", p.name));
                return Err(self.bad_tensor(
                    tensor,
                    format!(
                        "its data at offset {offset} overlaps{other}, which ends at {expected}"
                    ),
                ));
            }
            if offset > expected {
                return Err(self.bad_tensor(
                    tensor,
                    format!(
                        "its data starts at offset {offset} but ggml expects {expected}: \
                         tensor data must be packed in the order of the tensor table"
                    ),
                ));
            }
            expected = tensor
                .n_bytes
                .checked_next_multiple_of(self.alignment)
                .and_then(|padded| offset.checked_add(padded))
                .ok_or_else(|| self.bad_tensor(tensor, "its size overflows 64 bits".into()))?;
            previous = Some(tensor);
        }
        Ok(())
    }

    /// Every tensor's bytes inside the file; a cut file is reported with its real size, the
    /// size its tensors need (the end of the furthest one) and the first tensor it cuts.
    fn check_data_in_file(&self) -> Result<(), GgufError> {
        if self.tensors.is_empty() {
            return Ok(());
        }
        // None: past 2^64.
        let needed = self
            .tensors
            .iter()
            .try_fold(self.data_offset, |most, t| Some(most.max(t.end_in_file()?)));
        let truncated = |first_cut: String| {
            let needs = match needed {
                Some(n) => format!(
                    "its tensors need {n} bytes ({} missing)",
                    n.saturating_sub(self.file_bytes)
                ),
                None => "its tensors need more than 2^64 bytes".to_string(),
            };
            GgufError::Truncated {
                path: self.path.clone(),
                detail: format!(
                    "the file has {} bytes but {needs}: {first_cut}",
                    self.file_bytes
                ),
            }
        };
        if self.data_offset > self.file_bytes {
            return Err(truncated(format!(
                "tensor data should start at byte {}",
                self.data_offset
            )));
        }
        for tensor in &self.tensors {
            let start = tensor.offset_in_file;
            match tensor.end_in_file() {
                Some(end) if end <= self.file_bytes => {}
                end => {
                    return Err(truncated(format!(
                        "the first tensor cut is {}, bytes {start}..{}",
                        tensor.name,
                        end.map_or_else(|| "(beyond 2^64)".to_string(), |e| e.to_string()),
                    )))
                }
            }
        }
        Ok(())
    }

    // ---- architecture -----------------------------------------------------------------------

    fn validate_architecture(&self) -> Result<(), GgufError> {
        const KEY: &str = "general.architecture";
        let architecture = match self.get(KEY) {
            None => return Err(self.bad_metadata(KEY, "the key is missing".into())),
            Some(value) => value.as_str().ok_or_else(|| {
                self.bad_metadata(
                    KEY,
                    format!("must be a UTF-8 string, found {}", value.type_name()),
                )
            })?,
        };
        if is_supported_architecture(architecture) {
            Ok(())
        } else {
            Err(GgufError::UnsupportedArchitecture {
                path: self.path.clone(),
                architecture: architecture.to_string(),
            })
        }
    }

    fn bad_metadata(&self, key: &str, detail: String) -> GgufError {
        GgufError::BadMetadata {
            path: self.path.clone(),
            key: key.to_string(),
            detail,
        }
    }

    // ---- tokenizer --------------------------------------------------------------------------

    fn bad_tokenizer(&self, detail: String) -> GgufError {
        GgufError::BadTokenizer {
            path: self.path.clone(),
            detail,
        }
    }

    /// `tokenizer.ggml.model`: one llama.cpp builds a tokenizer for.
    fn tokenizer_model(&self) -> Result<&str, GgufError> {
        let model = match self.get("tokenizer.ggml.model") {
            None => return Err(self.bad_tokenizer("tokenizer.ggml.model is missing".into())),
            Some(value) => value.as_str().ok_or_else(|| {
                self.bad_tokenizer(format!(
                    "tokenizer.ggml.model must be a string, found {}",
                    value.type_name()
                ))
            })?,
        };
        // The tokenizer models llama_vocab::impl::load knows; it throws on any other.
        const KNOWN: &[&str] = &[
            "llama",
            "bert",
            "gpt2",
            "hybriddna",
            "whitespace",
            "t5",
            "rwkv",
            "test",
            "plamo2",
            "gemma4",
        ];
        if model == "no_vocab" || model == "none" {
            return Err(self.bad_tokenizer(format!(
                "tokenizer.ggml.model is '{model}': the model has no vocabulary, and llama.cpp \
                 aborts on the first text it tokenizes"
            )));
        }
        if !KNOWN.contains(&model) {
            return Err(self.bad_tokenizer(format!("unknown tokenizer model '{model}'")));
        }
        Ok(model)
    }

    fn vocab_tokens(&self) -> Result<&[GgufString], GgufError> {
        const KEY: &str = "tokenizer.ggml.tokens";
        let tokens = match self.get(KEY) {
            None => return Err(self.bad_tokenizer(format!("{KEY} is missing"))),
            Some(value) => value
                .as_array()
                .and_then(GgufArray::as_strings)
                .ok_or_else(|| {
                    self.bad_tokenizer(format!(
                        "{KEY} must be an array of strings, found {}",
                        value.type_name()
                    ))
                })?,
        };
        if tokens.is_empty() {
            return Err(self.bad_tokenizer(format!("{KEY} is empty")));
        }
        // Token ids are int32_t.
        if tokens.len() > i32::MAX as usize {
            return Err(self.bad_tokenizer(format!("{KEY} has more than 2^31 tokens")));
        }
        Ok(tokens)
    }

    fn n_vocab(&self) -> Result<u64, GgufError> {
        self.vocab_tokens().map(|t| t.len() as u64)
    }

    fn check_per_token_arrays(&self) -> Result<(), GgufError> {
        let n_vocab = self.n_vocab()?;
        self.check_parallel_array("tokenizer.ggml.scores", n_vocab, &["f32", "i32"])?;
        self.check_parallel_array("tokenizer.ggml.token_type", n_vocab, &["i32"])
    }

    /// An optional per-token array (`scores`, `token_type`) must match the vocabulary.
    fn check_parallel_array(
        &self,
        key: &str,
        n_vocab: u64,
        types: &[&str],
    ) -> Result<(), GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(());
        };
        let array = value
            .as_array()
            .filter(|a| types.contains(&a.element_type_name()))
            .ok_or_else(|| {
                let wanted: Vec<String> = types.iter().map(|t| format!("arr[{t}]")).collect();
                self.bad_tokenizer(format!(
                    "{key} must be {}, found {}",
                    wanted.join(" or "),
                    value.type_name()
                ))
            })?;
        if array.len() as u64 != n_vocab {
            return Err(self.bad_tokenizer(format!(
                "{key} has {} entries but the vocabulary has {n_vocab} tokens",
                array.len()
            )));
        }
        Ok(())
    }

    /// Every `tokenizer.ggml.*_token_id` (bos, eos, eot, unknown, padding, ...) must be a u32,
    /// the type llama.cpp reads. BOS and EOS must lie in the vocabulary: llama.cpp drops an id
    /// outside it, and a model without its EOS never stops. Any other id outside is only warned
    /// about: llama.cpp then disables that token, and real models ship such ids (e.g. a padding
    /// id equal to the vocabulary size).
    fn check_special_token_ids(&self) -> Result<(), GgufError> {
        let n_vocab = self.n_vocab()?;
        let special = self
            .metadata()
            .filter(|(key, _)| key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id"));
        for (key, value) in special {
            let GgufValue::U32(id) = *value else {
                return Err(self.bad_tokenizer(format!(
                    "{key} must be a u32 token id (llama.cpp reads it as one), found {}",
                    value.type_name()
                )));
            };
            if u64::from(id) < n_vocab {
                continue;
            }
            if key == "tokenizer.ggml.bos_token_id" || key == "tokenizer.ggml.eos_token_id" {
                return Err(self.bad_tokenizer(format!(
                    "{key} is {id}, outside the vocabulary of {n_vocab} tokens"
                )));
            }
            tracing::warn!(
                "{}: {key} is {id}, outside the vocabulary of {n_vocab} tokens; llama.cpp will ignore it",
                self.path.display()
            );
        }
        Ok(())
    }

    /// When the tokenizer adds BOS (or EOS) to every prompt, that token must exist: the file's
    /// id, else the tokenizer type's default (`llama_vocab::impl::load`), inside the vocabulary.
    fn check_add_bos_eos(&self) -> Result<(), GgufError> {
        let model = self.tokenizer_model()?;
        let n_vocab = self.n_vocab()?;
        // (default id, added by default) per tokenizer type, from llama_vocab::impl::load. A
        // BPE pre-tokenizer may turn add_bos on (llama3 and others), so BPE counts as adding.
        let (bos_default, add_bos_default, eos_default, add_eos_default) = match model {
            "llama" => (Some(1), true, Some(2), false),
            "bert" => (Some(101), true, None, false),
            "gpt2" | "hybriddna" | "whitespace" => (Some(11), true, Some(11), false),
            "t5" => (None, false, Some(1), true),
            "plamo2" => (Some(1), false, Some(2), false),
            _ => (None, false, None, false),
        };
        for (what, default, add_default) in [
            ("bos", bos_default, add_bos_default),
            ("eos", eos_default, add_eos_default),
        ] {
            let add_key = format!("tokenizer.ggml.add_{what}_token");
            let adds = self.get_bool(&add_key).unwrap_or(add_default);
            if !adds {
                continue;
            }
            let id_key = format!("tokenizer.ggml.{what}_token_id");
            let id = self
                .get(&id_key)
                .and_then(GgufValue::as_u64)
                .filter(|&id| id < n_vocab)
                .or(default.filter(|&id| id < n_vocab));
            if id.is_none() {
                return Err(self.bad_tokenizer(format!(
                    "the tokenizer adds {} to every prompt ({add_key}) but the model has no \
                     {what} token inside its vocabulary of {n_vocab} ({id_key})",
                    what.to_uppercase()
                )));
            }
        }
        Ok(())
    }

    /// llama.cpp aborts the process (GGML_ASSERT) when two tokens have the same text (an empty
    /// token becomes `[EMPTY_<id>]`).
    fn check_unique_tokens(&self) -> Result<(), GgufError> {
        self.unique_token_texts(self.vocab_tokens()?).map(|_| ())
    }

    fn unique_token_texts<'a>(
        &self,
        tokens: &'a [GgufString],
    ) -> Result<HashSet<Cow<'a, [u8]>>, GgufError> {
        let mut texts = HashSet::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            let text: Cow<'a, [u8]> = if token.as_bytes().is_empty() {
                Cow::Owned(format!("[EMPTY_{id}]").into_bytes())
            } else {
                Cow::Borrowed(token.as_bytes())
            };
            if !texts.insert(text) {
                return Err(self.bad_tokenizer(format!(
                    "token {id} ({token:?}) appears twice in tokenizer.ggml.tokens"
                )));
            }
        }
        Ok(texts)
    }

    /// The SPM tokenizer falls back to byte tokens for any text it cannot cover, looking up
    /// `<0xXX>` (upper-case hex) or else the one-byte string itself; a byte with neither makes
    /// `llama_vocab::byte_to_token` throw while tokenizing, which aborts the process.
    fn check_byte_tokens(&self) -> Result<(), GgufError> {
        if self.tokenizer_model()? != "llama" {
            return Ok(());
        }
        let texts = self.unique_token_texts(self.vocab_tokens()?)?;
        let missing: Vec<String> = (0..=255u8)
            .filter(|&b| {
                let hex = format!("<0x{b:02X}>");
                !texts.contains(hex.as_bytes()) && !texts.contains([b].as_slice())
            })
            .map(|b| format!("<0x{b:02X}>"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let shown = missing
            .iter()
            .take(4)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        Err(self.bad_tokenizer(format!(
            "the SentencePiece (llama) vocabulary lacks {} of the 256 byte tokens ({shown}{}), \
             which llama.cpp needs for byte fallback",
            missing.len(),
            if missing.len() > 4 { ", ..." } else { "" }
        )))
    }

    /// A BERT (WPM) vocabulary has no byte tokens: llama.cpp aborts on any token typed BYTE
    /// (`LLAMA_TOKEN_TYPE_BYTE`, 6) when it caches the tokens' texts.
    fn check_wpm_byte_tokens(&self) -> Result<(), GgufError> {
        const BYTE: i32 = 6;
        if self.tokenizer_model()? != "bert" {
            return Ok(());
        }
        let Some(GgufArray::I32(types)) = self.get_array("tokenizer.ggml.token_type") else {
            return Ok(());
        };
        match types.iter().position(|&t| t == BYTE) {
            Some(id) => Err(self.bad_tokenizer(format!(
                "token {id} of the BERT (WPM) vocabulary is typed BYTE (6), which llama.cpp \
                 aborts on"
            ))),
            None => Ok(()),
        }
    }

    fn check_merges(&self) -> Result<(), GgufError> {
        const KEY: &str = "tokenizer.ggml.merges";
        let model = self.tokenizer_model()?;
        let needs_merges = match model {
            "gpt2" | "hybriddna" | "whitespace" => {
                // Kimi-K2's pre-tokenizer is the one BPE vocabulary without merges.
                self.get_str("tokenizer.ggml.pre") != Some("kimi-k2")
            }
            "gemma4" => true,
            _ => false,
        };
        if !needs_merges {
            return Ok(());
        }
        match self.get(KEY) {
            None => Err(self.bad_tokenizer(format!(
                "the '{model}' BPE tokenizer needs {KEY}, which is missing"
            ))),
            Some(value) if value.as_array().and_then(GgufArray::as_strings).is_some() => Ok(()),
            Some(value) => Err(self.bad_tokenizer(format!(
                "{KEY} must be an array of strings, found {}",
                value.type_name()
            ))),
        }
    }
}

// ---- hyperparameters ------------------------------------------------------------------------

/// The file's hyperparameters as llama.cpp reads them (`{arch}.*` keys, strict types).
struct Hparams<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

/// Runs `check` on the file's hyperparameters; nothing to check without an architecture
/// (the `architecture` rule refuses that first).
fn hparams(file: &GgufFile, check: fn(&Hparams<'_>) -> Result<(), Refusal>) -> Result<(), Refusal> {
    match file.architecture() {
        Some(arch) => check(&Hparams { file, arch }),
        None => Ok(()),
    }
}

impl Hparams<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn checked(&self) -> bool {
        CHECKED_ARCHITECTURES.contains(&self.arch)
    }

    fn is(&self, archs: &[&str]) -> bool {
        archs.contains(&self.arch)
    }

    /// `{arch}.{suffix}` as the u32 llama.cpp's `get_key<uint32_t>` demands.
    fn u32(&self, suffix: &str) -> Result<Option<u32>, Refusal> {
        let key = self.key(suffix);
        match self.file.get(&key) {
            None => Ok(None),
            Some(GgufValue::U32(v)) => Ok(Some(*v)),
            Some(other) => refuse(
                key,
                format!(
                    "must be a u32 (llama.cpp reads it as one), found {}",
                    other.type_name()
                ),
            ),
        }
    }

    fn required_u32(&self, suffix: &str) -> Result<u32, Refusal> {
        self.u32(suffix)?
            .map_or_else(|| refuse(self.key(suffix), "the key is missing"), Ok)
    }

    /// `{arch}.{suffix}` as the f32 llama.cpp's `get_key<float>` demands.
    fn f32(&self, suffix: &str) -> Result<Option<f32>, Refusal> {
        let key = self.key(suffix);
        match self.file.get(&key) {
            None => Ok(None),
            Some(GgufValue::F32(v)) => Ok(Some(*v)),
            Some(other) => refuse(
                key,
                format!(
                    "must be an f32 (llama.cpp reads it as one), found {}",
                    other.type_name()
                ),
            ),
        }
    }

    fn str(&self, suffix: &str) -> Result<Option<&str>, Refusal> {
        let key = self.key(suffix);
        match self.file.get(&key) {
            None => Ok(None),
            Some(value) => match value.as_str() {
                Some(text) => Ok(Some(text)),
                None => refuse(
                    key,
                    format!("must be a UTF-8 string, found {}", value.type_name()),
                ),
            },
        }
    }

    /// `block_count`: 1 to [`LLAMA_MAX_LAYERS`].
    fn n_layer(&self) -> Result<u32, Refusal> {
        let n = self.required_u32("block_count")?;
        if n == 0 || n > LLAMA_MAX_LAYERS {
            return refuse(
                self.key("block_count"),
                format!("is {n}; llama.cpp needs 1 to {LLAMA_MAX_LAYERS} layers"),
            );
        }
        Ok(n)
    }

    /// A per-layer value (`get_key_or_arr`): one u32 for every layer, or an array of
    /// u32/i32/bool with one entry per layer. `None` when absent.
    fn per_layer(&self, suffix: &str) -> Result<Option<Vec<u32>>, Refusal> {
        let key = self.key(suffix);
        let n_layer = self.n_layer()? as usize;
        let values: Vec<u32> = match self.file.get(&key) {
            None => return Ok(None),
            Some(GgufValue::U32(v)) => vec![*v; n_layer],
            Some(GgufValue::Array(array)) => {
                let values: Vec<u32> = match array {
                    GgufArray::U32(a) => a.clone(),
                    GgufArray::I32(a) => a.iter().map(|&v| v as u32).collect(),
                    GgufArray::Bool(a) => a.iter().map(|&v| u32::from(v)).collect(),
                    other => {
                        return refuse(
                            key,
                            format!(
                                "must be a u32 or an array of u32, i32 or bool, found arr[{}]",
                                other.element_type_name()
                            ),
                        )
                    }
                };
                if values.len() != n_layer {
                    return refuse(
                        key,
                        format!(
                            "has {} entries but the model has {n_layer} layers",
                            values.len()
                        ),
                    );
                }
                values
            }
            Some(other) => {
                return refuse(
                    key,
                    format!(
                        "must be a u32 or an array of one per layer, found {}",
                        other.type_name()
                    ),
                )
            }
        };
        Ok(Some(values))
    }

    fn n_embd(&self) -> Result<u32, Refusal> {
        self.required_u32("embedding_length")
    }

    fn n_expert(&self) -> Result<u32, Refusal> {
        Ok(self.u32("expert_count")?.unwrap_or(0))
    }

    /// `attention.head_count` per layer (0 when absent: a model without attention).
    fn n_head(&self) -> Result<Vec<u32>, Refusal> {
        let n_layer = self.n_layer()? as usize;
        Ok(self
            .per_layer("attention.head_count")?
            .unwrap_or_else(|| vec![0; n_layer]))
    }

    /// `attention.head_count_kv` per layer, defaulting to `head_count`.
    fn n_head_kv(&self) -> Result<Vec<u32>, Refusal> {
        match self.per_layer("attention.head_count_kv")? {
            Some(v) => Ok(v),
            None => self.n_head(),
        }
    }

    /// (`n_embd_head_k`, `n_embd_head_v`): `attention.key_length`/`value_length`, else
    /// `n_embd / n_head(0)`, as load_hparams computes them; (0, 0) without heads.
    fn head_dims(&self) -> Result<(u32, u32), Refusal> {
        let n_head = self.n_head()?[0];
        if n_head == 0 {
            return Ok((0, 0));
        }
        let default = self.n_embd()? / n_head;
        Ok((
            self.u32("attention.key_length")?.unwrap_or(default),
            self.u32("attention.value_length")?.unwrap_or(default),
        ))
    }

    /// `rope.dimension_count`, else the K head size.
    fn n_rot(&self) -> Result<u32, Refusal> {
        let (head_k, _) = self.head_dims()?;
        Ok(self.u32("rope.dimension_count")?.unwrap_or(head_k))
    }

    /// `expert_used_count` per layer (0s when absent).
    fn expert_used(&self) -> Result<Vec<u32>, Refusal> {
        let n_layer = self.n_layer()? as usize;
        Ok(self
            .per_layer("expert_used_count")?
            .unwrap_or_else(|| vec![0; n_layer]))
    }
}

fn check_context_length(hp: &Hparams<'_>) -> Result<(), Refusal> {
    match hp.required_u32("context_length")? {
        0 => refuse(
            hp.key("context_length"),
            "is 0; the model needs a training context length",
        ),
        _ => Ok(()),
    }
}

fn check_embedding_length(hp: &Hparams<'_>) -> Result<(), Refusal> {
    match hp.n_embd()? {
        0 => refuse(hp.key("embedding_length"), "is 0"),
        _ => Ok(()),
    }
}

/// Reads every hyperparameter the other rules (and llama.cpp's common loader) use, refusing
/// any of the wrong type or length.
fn check_types(hp: &Hparams<'_>) -> Result<(), Refusal> {
    for key in [
        "nextn_predict_layers",
        "expert_count",
        "expert_group_count",
        "expert_group_used_count",
        "attention.key_length",
        "attention.value_length",
        "attention.key_length_swa",
        "attention.value_length_swa",
        "rope.dimension_count",
        "rope.dimension_count_swa",
        "rope.scaling.original_context_length",
        "vocab_size",
    ] {
        hp.u32(key)?;
    }
    for key in [
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "expert_used_count",
        "expert_feed_forward_length",
    ] {
        hp.per_layer(key)?;
    }
    for key in [
        "attention.layer_norm_rms_epsilon",
        "attention.layer_norm_epsilon",
        "rope.freq_base",
        "rope.freq_base_swa",
        "rope.scaling.factor",
        "rope.scale_linear",
        "rope.scaling.attn_factor",
    ] {
        hp.f32(key)?;
    }
    hp.str("rope.scaling.type")?;
    // Keys outside `{arch}.` that llama.cpp reads with a fixed type.
    let typed = |key: &str, wanted: &str, ok: fn(&GgufValue) -> bool| match hp.file.get(key) {
        Some(value) if !ok(value) => refuse(
            key,
            format!(
                "must be a {wanted} (llama.cpp reads it as one), found {}",
                value.type_name()
            ),
        ),
        _ => Ok(()),
    };
    typed("general.file_type", "u32", |v| {
        matches!(v, GgufValue::U32(_))
    })?;
    for key in [
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_sep_token",
        "tokenizer.ggml.add_space_prefix",
    ] {
        typed(key, "bool", |v| matches!(v, GgufValue::Bool(_)))?;
    }
    Ok(())
}

fn check_nextn(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let n_layer = hp.n_layer()?;
    match hp.u32("nextn_predict_layers")? {
        Some(n) if n > n_layer => refuse(
            hp.key("nextn_predict_layers"),
            format!("is {n}, more than the model's {n_layer} layers"),
        ),
        _ => Ok(()),
    }
}

fn check_expert_count(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let n_expert = hp.n_expert()?;
    if n_expert > LLAMA_MAX_EXPERTS {
        return refuse(
            hp.key("expert_count"),
            format!("is {n_expert}; llama.cpp allows at most {LLAMA_MAX_EXPERTS} experts"),
        );
    }
    Ok(())
}

fn check_expert_used(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let n_expert = hp.n_expert()?;
    let per_layer = hp.expert_used()?;
    let used = per_layer.iter().copied().max().unwrap_or(0);
    let key = hp.key("expert_used_count");
    if n_expert > 0 && used > 0 {
        if let Some(il) = per_layer.iter().position(|&n| n == 0) {
            return refuse(
                key,
                format!("is 0 for layer {il}: every layer of a mixture of experts routes to at least one"),
            );
        }
    }
    if n_expert == 0 && used > 0 {
        return refuse(
            key,
            format!(
                "is {used} but the model has no experts ({} is absent or 0)",
                hp.key("expert_count")
            ),
        );
    }
    if n_expert > 0 && used == 0 {
        return refuse(
            key,
            format!("is absent or 0, but the model has {n_expert} experts: each token needs at least one"),
        );
    }
    if used > n_expert {
        return refuse(key, format!("is {used}, more than the {n_expert} experts"));
    }
    Ok(())
}

fn check_expert_groups(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let n_expert = hp.n_expert()?;
    let groups = hp.u32("expert_group_count")?.unwrap_or(0);
    let used = hp.u32("expert_group_used_count")?.unwrap_or(0);
    let key = hp.key("expert_group_count");
    if n_expert == 0 {
        if groups != 0 {
            return refuse(key, format!("is {groups} but the model has no experts"));
        }
        return Ok(());
    }
    if groups >= n_expert {
        return refuse(
            key,
            format!("is {groups}; it must be below the {n_expert} experts"),
        );
    }
    if groups > 1 {
        if n_expert % groups != 0 {
            return refuse(
                key,
                format!("is {groups}, which does not divide the {n_expert} experts"),
            );
        }
        if used == 0 || used >= groups {
            return refuse(
                hp.key("expert_group_used_count"),
                format!(
                    "is {used}; with {groups} expert groups it must be 1 to {}",
                    groups - 1
                ),
            );
        }
    }
    Ok(())
}

fn check_moe_needs_experts(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if hp.is(NEED_EXPERTS) && hp.n_expert()? == 0 {
        return refuse(
            hp.key("expert_count"),
            format!(
                "is absent or 0, but a {} model is a mixture of experts",
                hp.arch
            ),
        );
    }
    Ok(())
}

fn check_head_count(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if !hp.checked() {
        return Ok(());
    }
    let key = hp.key("attention.head_count");
    if hp.per_layer("attention.head_count")?.is_none() {
        return refuse(key, "the key is missing");
    }
    let n_head = hp.n_head()?;
    if let Some(il) = n_head.iter().position(|&n| n == 0) {
        return refuse(
            key,
            format!("is 0 for layer {il}; every layer needs attention heads"),
        );
    }
    let n_embd = hp.n_embd()?;
    if hp.u32("attention.key_length")?.is_none() && n_embd % n_head[0] != 0 {
        return refuse(
            key,
            format!(
                "is {}, which does not divide {} ({n_embd}) into equal heads",
                n_head[0],
                hp.key("embedding_length")
            ),
        );
    }
    Ok(())
}

fn check_head_count_kv(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let n_head = hp.n_head()?;
    let n_head_kv = hp.n_head_kv()?;
    let key = hp.key("attention.head_count_kv");
    for (il, (&q, &kv)) in n_head.iter().zip(&n_head_kv).enumerate() {
        if q == 0 {
            continue; // a layer without attention (recurrent models)
        }
        if kv == 0 && hp.checked() {
            return refuse(
                key,
                format!("is 0 for layer {il}, which has {q} query heads"),
            );
        }
        if kv != 0 && q % kv != 0 {
            return refuse(
                key,
                format!("is {kv} for layer {il}, which does not divide its {q} query heads"),
            );
        }
    }
    Ok(())
}

fn check_head_dims(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if hp.n_head()?[0] == 0 {
        return Ok(());
    }
    let (k, v) = hp.head_dims()?;
    if hp.checked() && (k == 0 || v == 0) {
        return refuse(
            hp.key(if k == 0 {
                "attention.key_length"
            } else {
                "attention.value_length"
            }),
            "the attention head size is 0",
        );
    }
    if (hp.is(HEAD_IS_ROPE) || hp.is(HEAD_K_IS_V)) && k != v {
        return refuse(
            hp.key("attention.value_length"),
            format!(
                "is {v} but the key length is {k}; llama.cpp's {} graph needs them equal",
                hp.arch
            ),
        );
    }
    Ok(())
}

fn check_rope_dims(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if hp.n_head()?[0] == 0 {
        return Ok(());
    }
    let (head_k, _) = hp.head_dims()?;
    let n_rot = hp.n_rot()?;
    let key = hp.key("rope.dimension_count");
    if n_rot % 2 != 0 {
        return refuse(key, format!("is {n_rot}; rotary dimensions come in pairs"));
    }
    if n_rot > head_k {
        return refuse(key, format!("is {n_rot}, more than the head size {head_k}"));
    }
    if hp.is(HEAD_IS_ROPE) && n_rot != head_k {
        return refuse(
            key,
            format!(
                "is {n_rot} but the head size is {head_k}; llama.cpp's {} graph needs them equal",
                hp.arch
            ),
        );
    }
    Ok(())
}

fn check_norm_eps(hp: &Hparams<'_>) -> Result<(), Refusal> {
    let rms = hp.f32("attention.layer_norm_rms_epsilon")?;
    let plain = hp.f32("attention.layer_norm_epsilon")?;
    if hp.checked() && rms.is_none() {
        return refuse(
            hp.key("attention.layer_norm_rms_epsilon"),
            "the key is missing",
        );
    }
    for (suffix, eps) in [
        ("attention.layer_norm_rms_epsilon", rms),
        ("attention.layer_norm_epsilon", plain),
    ] {
        if let Some(eps) = eps {
            if !eps.is_finite() || eps < 0.0 {
                return refuse(
                    hp.key(suffix),
                    format!("is {eps}; a norm epsilon must be finite and >= 0"),
                );
            }
        }
    }
    Ok(())
}

fn check_rope_freq_base(hp: &Hparams<'_>) -> Result<(), Refusal> {
    for suffix in ["rope.freq_base", "rope.freq_base_swa"] {
        if let Some(base) = hp.f32(suffix)? {
            if !base.is_finite() || base <= 0.0 {
                return refuse(
                    hp.key(suffix),
                    format!("is {base}; the RoPE base frequency must be finite and > 0"),
                );
            }
        }
    }
    Ok(())
}

fn check_rope_scaling(hp: &Hparams<'_>) -> Result<(), Refusal> {
    // LLAMA_ROPE_SCALING_TYPES (llama-model.cpp).
    const TYPES: &[&str] = &["none", "linear", "yarn", "longrope"];
    if let Some(kind) = hp.str("rope.scaling.type")? {
        if !TYPES.contains(&kind) {
            return refuse(
                hp.key("rope.scaling.type"),
                format!("is '{kind}'; llama.cpp knows {}", TYPES.join(", ")),
            );
        }
    }
    for suffix in ["rope.scaling.factor", "rope.scale_linear"] {
        if let Some(factor) = hp.f32(suffix)? {
            if !factor.is_finite() || factor < 0.0 {
                return refuse(
                    hp.key(suffix),
                    format!("is {factor}; a RoPE scaling factor must be finite and >= 0"),
                );
            }
        }
    }
    if let Some(factor) = hp.f32("rope.scaling.attn_factor")? {
        if !factor.is_finite() {
            return refuse(
                hp.key("rope.scaling.attn_factor"),
                format!("is {factor}; it must be finite"),
            );
        }
    }
    Ok(())
}

fn check_ffn_length(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if !hp.checked() {
        return Ok(());
    }
    let key = hp.key("feed_forward_length");
    let dense = hp.n_expert()? == 0;
    match hp.per_layer("feed_forward_length")? {
        None if dense => return refuse(key, "the key is missing"),
        Some(ff) if dense => {
            if let Some(il) = ff.iter().position(|&n| n == 0) {
                return refuse(key, format!("is 0 for layer {il}"));
            }
        }
        _ => {}
    }
    if let Some(ff) = hp.per_layer("expert_feed_forward_length")? {
        if let Some(il) = ff.iter().position(|&n| n == 0) {
            return refuse(
                hp.key("expert_feed_forward_length"),
                format!("is 0 for layer {il}"),
            );
        }
    }
    Ok(())
}

/// `{name}` must have exactly the dimensions `dims` when the file has it.
fn check_shape(hp: &Hparams<'_>, name: &str, dims: &[u64], why: &str) -> Result<(), Refusal> {
    let Some(tensor) = hp.file.tensor(name) else {
        return Ok(());
    };
    if tensor.dims != dims {
        return Err(Refusal::File(GgufError::BadTensor {
            path: hp.file.path.clone(),
            tensor: name.to_string(),
            detail: format!(
                "its shape is {:?} but the hyperparameters make it {dims:?} ({why}); \
                 llama.cpp refuses it",
                tensor.dims
            ),
        }));
    }
    Ok(())
}

fn check_vocab_shapes(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if !hp.checked() {
        return Ok(());
    }
    let n_embd = u64::from(hp.n_embd()?);
    let n_vocab = hp.file.n_vocab()?;
    let why = format!(
        "{} × the {n_vocab} tokens of tokenizer.ggml.tokens",
        hp.key("embedding_length")
    );
    if hp.file.tensor("token_embd.weight").is_none() {
        return Err(Refusal::File(GgufError::BadTensor {
            path: hp.file.path.clone(),
            tensor: "token_embd.weight".into(),
            detail: "the tensor is missing".into(),
        }));
    }
    check_shape(hp, "token_embd.weight", &[n_embd, n_vocab], &why)?;
    check_shape(hp, "output.weight", &[n_embd, n_vocab], &why)
}

fn check_layer_shapes(hp: &Hparams<'_>) -> Result<(), Refusal> {
    if !hp.checked() {
        return Ok(());
    }
    let n_embd = u64::from(hp.n_embd()?);
    let n_head = hp.n_head()?;
    let n_head_kv = hp.n_head_kv()?;
    let (head_k, head_v) = hp.head_dims()?;
    let (head_k, head_v) = (u64::from(head_k), u64::from(head_v));
    let n_expert = u64::from(hp.n_expert()?);
    let ff = hp.per_layer("feed_forward_length")?;
    let n_layer = hp.n_layer()? as usize;
    // Layers without tensors, or tensors of layers the model does not have.
    for tensor in &hp.file.tensors {
        let layer = tensor
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(il) = layer.filter(|&il| il >= n_layer) {
            return Err(Refusal::File(GgufError::BadTensor {
                path: hp.file.path.clone(),
                tensor: tensor.name.clone(),
                detail: format!(
                    "it belongs to layer {il} but {} is {n_layer}",
                    hp.key("block_count")
                ),
            }));
        }
    }
    for il in 0..n_layer {
        let norm = format!("blk.{il}.attn_norm.weight");
        if hp.file.tensor(&norm).is_none() {
            return Err(Refusal::File(GgufError::BadTensor {
                path: hp.file.path.clone(),
                tensor: norm,
                detail: format!(
                    "the tensor is missing: {} says the model has {n_layer} layers",
                    hp.key("block_count")
                ),
            }));
        }
    }
    for il in 0..n_layer {
        let q = u64::from(n_head[il]);
        let kv = u64::from(n_head_kv[il]);
        let name = |t: &str| format!("blk.{il}.{t}.weight");
        let q_width = if hp.is(Q_IS_EMBD) { n_embd } else { head_k * q };
        check_shape(hp, &name("attn_norm"), &[n_embd], "embedding_length")?;
        check_shape(hp, &name("attn_q"), &[n_embd, q_width], "heads × head size")?;
        check_shape(
            hp,
            &name("attn_k"),
            &[n_embd, head_k * kv],
            "KV heads × key length",
        )?;
        check_shape(
            hp,
            &name("attn_v"),
            &[n_embd, head_v * kv],
            "KV heads × value length",
        )?;
        check_shape(
            hp,
            &name("attn_output"),
            &[q_width, n_embd],
            "heads × head size",
        )?;
        if n_expert == 0 {
            if let Some(ff) = &ff {
                let ff = u64::from(ff[il]);
                check_shape(hp, &name("ffn_gate"), &[n_embd, ff], "feed_forward_length")?;
                check_shape(hp, &name("ffn_down"), &[ff, n_embd], "feed_forward_length")?;
            }
        } else {
            check_shape(
                hp,
                &name("ffn_gate_inp"),
                &[n_embd, n_expert],
                "expert_count",
            )?;
            for t in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                if let Some(tensor) = hp.file.tensor(&name(t)) {
                    if tensor.dims.len() != 3 || tensor.dims[2] != n_expert {
                        return Err(Refusal::File(GgufError::BadTensor {
                            path: hp.file.path.clone(),
                            tensor: name(t),
                            detail: format!(
                                "its shape is {:?} but it should hold {n_expert} experts \
                                 ({}) in its third dimension",
                                tensor.dims,
                                hp.key("expert_count")
                            ),
                        }));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    /// The first rule `bytes` break, and the message.
    fn broken(bytes: &[u8]) -> Option<(&'static str, String)> {
        let file = GgufFile::from_bytes("model.gguf", bytes).expect("the header parses");
        file.broken_rule()
            .map(|(rule, e)| (rule.name, e.to_string()))
    }

    fn assert_breaks(rule: &str, bytes: Vec<u8>, needle: &str) {
        match broken(&bytes) {
            Some((name, message)) => {
                assert_eq!(name, rule, "{message}");
                assert!(message.contains(needle), "{message:?} lacks {needle:?}");
            }
            None => panic!("the model breaks no rule; expected {rule}"),
        }
    }

    fn valid() -> Model {
        Model::valid()
    }

    /// The valid model under another architecture (its `llama.*` keys renamed).
    fn as_arch(arch: &str, mut model: Model) -> Model {
        for (key, _) in &mut model.kv {
            if let Some(rest) = key.strip_prefix("llama.") {
                *key = format!("{arch}.{rest}");
            }
        }
        model.set("general.architecture", s(arch))
    }

    /// The valid model with tensor `name` stored as ggml type `ggml_type`, its
    /// data resized to match (as a mutating tool would write it).
    fn retyped(name: &str, ggml_type: u32) -> Vec<u8> {
        let mut model = valid();
        model.tensor_mut(name).ggml_type = ggml_type;
        model.bytes()
    }

    #[test]
    fn every_matmul_type_is_a_known_type() {
        for id in MATMUL_TYPES {
            assert!(ggml_type(*id).is_some(), "{id}");
        }
    }

    #[test]
    fn valid_types_pass_for_matrices_and_vectors() {
        for ggml_type in [0, 1, 2, 8, 30, 39] {
            let mut model = valid();
            model.tensor_mut("blk.0.ffn_up.weight").ggml_type = ggml_type;
            assert_eq!(broken(&model.bytes()), None, "type {ggml_type}");
        }
    }

    fn spm_without_bytes() -> Model {
        let tokens = ["<unk>", "<s>", "</s>", "a", "b"]
            .map(String::from)
            .to_vec();
        valid()
            .set("tokenizer.ggml.model", s("llama"))
            .vocab(tokens)
    }

    #[test]
    fn valid_models_break_no_rule() {
        for model in [
            valid(),
            Model::moe(),
            as_arch("qwen3", valid()),
            as_arch("qwen3moe", Model::moe()),
        ] {
            assert_eq!(broken(&model.bytes()), None);
        }
        let smollm2 = GgufFile::open(smollm2()).expect("opens");
        assert!(smollm2.broken_rule().is_none());
    }

    #[test]
    fn rule_names_are_unique_and_cite_llama_cpp() {
        let names: HashSet<_> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), RULES.len());
        for rule in RULES {
            assert!(
                rule.mirrors.starts_with("src/") || rule.mirrors.starts_with("ggml/"),
                "{}: {}",
                rule.name,
                rule.mirrors
            );
        }
    }

    /// One test per way of breaking a rule: `test_name: "rule" => bytes, "message part";`.
    /// `every_rule_has_a_test` checks the list covers [`RULES`].
    macro_rules! breaks {
        ($($test:ident: $rule:literal => $bytes:expr, $needle:literal;)*) => {
            $(
                #[test]
                fn $test() {
                    assert_breaks($rule, $bytes, $needle);
                }
            )*
            const TESTED: &[&str] = &[$($rule),*];
        };
    }

    #[test]
    fn every_rule_has_a_test() {
        for rule in RULES {
            assert!(
                TESTED.contains(&rule.name),
                "no test breaks rule {}",
                rule.name
            );
        }
    }

    breaks! {
        misaligned_tensor: "tensor-alignment" => {
            let mut m = valid();
            m.tensors[1].offset = Some(100);
            m.bytes()
        }, "not a multiple of the file's alignment 32";
        f16_output_norm: "tensor-types" => retyped("output_norm.weight", 1),
            "it is a vector (norm, bias or scale) of ggml type 1 (f16)";
        q4_0_output_norm: "tensor-types" => retyped("output_norm.weight", 2), "type 2 (q4_0)";
        q8_0_output_norm: "tensor-types" => retyped("output_norm.weight", 8), "type 8 (q8_0)";
        bf16_output_norm: "tensor-types" => retyped("output_norm.weight", 30), "type 30 (bf16)";
        mxfp4_output_norm: "tensor-types" => retyped("output_norm.weight", 39), "type 39 (mxfp4)";
        nvfp4_output_norm: "tensor-types" => {
            // NVFP4 blocks are 64 wide: a 64-wide norm, as a real model's would be.
            let mut model = valid();
            let norm = model.tensor_mut("output_norm.weight");
            (norm.dims, norm.ggml_type) = (vec![64], 40);
            model.bytes()
        }, "type 40 (nvfp4)";
        f16_layer_norm: "tensor-types" => retyped("blk.0.attn_norm.weight", 1), "only applies F32 vectors";
        i32_matrix: "tensor-types" => retyped("blk.0.attn_q.weight", 26),
            "weight matrix of ggml type 26 (i32), which ggml cannot multiply";
        q8_1_matrix: "tensor-types" => retyped("blk.0.ffn_up.weight", 9), "type 9 (q8_1)";
        gap_between_tensors: "tensor-packing" => {
            let mut m = valid();
            m.tensors[2].offset = Some(512);
            m.bytes()
        }, "ggml expects 224";
        truncated_data: "tensor-data-in-file" => {
            let bytes = valid().bytes();
            bytes[..bytes.len() - 10].to_vec()
        }, "is truncated";
        unknown_architecture: "architecture" =>
            valid().set("general.architecture", s("nope")).bytes(), "'nope'";
        vocab_none: "tokenizer-model" =>
            valid().set("tokenizer.ggml.model", s("none")).bytes(), "has no vocabulary";
        vocab_unknown: "tokenizer-model" =>
            valid().set("tokenizer.ggml.model", s("klingon")).bytes(), "unknown tokenizer model";
        tokens_missing: "tokenizer-tokens" =>
            valid().remove("tokenizer.ggml.tokens").bytes(), "tokenizer.ggml.tokens is missing";
        token_types_short: "tokenizer-per-token-arrays" =>
            valid().set("tokenizer.ggml.token_type", V::I32Arr(vec![1, 1])).bytes(),
            "token_type has 2 entries but the vocabulary has 4 tokens";
        scores_long: "tokenizer-per-token-arrays" =>
            valid().set("tokenizer.ggml.scores", V::F32Arr(vec![0.0; 5])).bytes(),
            "scores has 5 entries";
        duplicate_token: "tokenizer-unique-tokens" =>
            valid().set("tokenizer.ggml.tokens", strs(["a", "b", "a", "c"])).bytes(),
            "token 2 (\"a\") appears twice";
        eos_outside_vocab: "special-token-ids" =>
            valid().set("tokenizer.ggml.eos_token_id", V::U32(4)).bytes(),
            "eos_token_id is 4, outside the vocabulary of 4 tokens";
        special_id_not_u32: "special-token-ids" =>
            valid().set("tokenizer.ggml.unknown_token_id", V::I32(0)).bytes(),
            "must be a u32 token id";
        bos_added_but_missing: "add-bos-eos" =>
            valid()
                .set("tokenizer.ggml.add_bos_token", V::Bool(true))
                .remove("tokenizer.ggml.bos_token_id")
                .bytes(),
            "adds BOS to every prompt";
        spm_lacks_byte_tokens: "spm-byte-tokens" =>
            spm_without_bytes().bytes(), "lacks 254 of the 256 byte tokens";
        bpe_lacks_merges: "bpe-merges" =>
            valid().remove("tokenizer.ggml.merges").bytes(), "needs tokenizer.ggml.merges";
        context_length_zero: "context-length" =>
            valid().set("llama.context_length", V::U32(0)).bytes(), "'llama.context_length' is 0";
        context_length_missing: "context-length" =>
            valid().remove("llama.context_length").bytes(), "the key is missing";
        embedding_length_zero: "embedding-length" =>
            valid().set("llama.embedding_length", V::U32(0)).bytes(), "is 0";
        block_count_zero: "block-count" =>
            valid().set("llama.block_count", V::U32(0)).bytes(), "is 0; llama.cpp needs 1 to 512";
        block_count_above_max: "block-count" =>
            valid().set("llama.block_count", V::U32(513)).bytes(), "is 513";
        block_count_u64: "block-count" =>
            valid().set("llama.block_count", V::U64(1)).bytes(), "must be a u32";
        head_count_u64: "hparam-types" =>
            valid().set("llama.attention.head_count", V::U64(4)).bytes(), "found u64";
        head_count_array_too_long: "hparam-types" =>
            valid().set("llama.attention.head_count", V::U32Arr(vec![4, 4])).bytes(),
            "has 2 entries but the model has 1 layers";
        add_bos_not_bool: "hparam-types" =>
            valid().set("tokenizer.ggml.add_bos_token", V::U32(1)).bytes(), "must be a bool";
        file_type_u64: "hparam-types" =>
            valid().set("general.file_type", V::U64(1)).bytes(), "must be a u32";
        eps_f64: "hparam-types" =>
            valid().set("llama.attention.layer_norm_rms_epsilon", V::U32(1)).bytes(),
            "must be an f32";
        nextn_above_layers: "nextn-layers" =>
            valid().set("llama.nextn_predict_layers", V::U32(2)).bytes(),
            "more than the model's 1 layers";
        too_many_experts: "expert-count" =>
            Model::moe().set("llama.expert_count", V::U32(1025)).bytes(), "at most 1024 experts";
        more_used_than_experts: "expert-used-count" =>
            Model::moe().set("llama.expert_used_count", V::U32(5)).bytes(), "more than the 4 experts";
        a_layer_with_no_expert_used: "expert-used-count" =>
            Model::moe().set("llama.block_count", V::U32(2))
                .set("llama.expert_used_count", V::U32Arr(vec![2, 0])).bytes(),
            "is 0 for layer 1";
        bert_with_byte_tokens: "wpm-byte-tokens" =>
            valid().set("tokenizer.ggml.model", s("bert"))
                .set("tokenizer.ggml.token_type", V::I32Arr(vec![1, 6, 1, 3])).bytes(),
            "token 1 of the BERT (WPM) vocabulary is typed BYTE";
        experts_none_used: "expert-used-count" =>
            Model::moe().set("llama.expert_used_count", V::U32(0)).bytes(), "needs at least one";
        used_without_experts: "expert-used-count" =>
            valid().set("llama.expert_used_count", V::U32(2)).bytes(), "has no experts";
        groups_not_below_experts: "expert-groups" =>
            Model::moe().set("llama.expert_group_count", V::U32(4)).bytes(), "below the 4 experts";
        groups_without_group_used: "expert-groups" =>
            Model::moe().set("llama.expert_group_count", V::U32(2)).bytes(),
            "with 2 expert groups it must be 1 to 1";
        qwen3moe_without_experts: "moe-needs-experts" =>
            as_arch("qwen3moe", valid()).bytes(), "a qwen3moe model is a mixture of experts";
        head_count_zero: "head-count" =>
            valid().set("llama.attention.head_count", V::U32(0)).bytes(), "is 0 for layer 0";
        head_count_missing: "head-count" =>
            valid().remove("llama.attention.head_count").bytes(), "the key is missing";
        gemma2_head_count_zero: "head-count" =>
            as_arch("gemma2", valid()).set("gemma2.attention.head_count", V::U32(0)).bytes(),
            "is 0 for layer 0";
        head_count_kv_not_divisor: "head-count-kv" =>
            valid().set("llama.attention.head_count_kv", V::U32(3)).bytes(),
            "does not divide its 4 query heads";
        head_count_kv_zero: "head-count-kv" =>
            valid().set("llama.attention.head_count_kv", V::U32(0)).bytes(), "is 0 for layer 0";
        key_and_value_lengths_differ: "head-dimensions" =>
            valid().set("llama.attention.value_length", V::U32(16)).bytes(),
            "is 16 but the key length is 8";
        rope_dims_odd: "rope-dimensions" =>
            as_arch("gemma", valid()).set("gemma.rope.dimension_count", V::U32(7)).bytes(),
            "come in pairs";
        rope_dims_above_head: "rope-dimensions" =>
            as_arch("gemma", valid()).set("gemma.rope.dimension_count", V::U32(16)).bytes(),
            "more than the head size 8";
        rope_dims_not_head_for_llama: "rope-dimensions" =>
            valid().set("llama.rope.dimension_count", V::U32(4)).bytes(),
            "llama.cpp's llama graph needs them equal";
        eps_nan: "norm-epsilon" =>
            valid().set("llama.attention.layer_norm_rms_epsilon", V::F32(f32::NAN)).bytes(),
            "is NaN";
        eps_negative: "norm-epsilon" =>
            valid().set("llama.attention.layer_norm_rms_epsilon", V::F32(-1e-5)).bytes(),
            "must be finite and >= 0";
        eps_missing: "norm-epsilon" =>
            valid().remove("llama.attention.layer_norm_rms_epsilon").bytes(), "the key is missing";
        plain_eps_infinite: "norm-epsilon" =>
            valid().set("llama.attention.layer_norm_epsilon", V::F32(f32::INFINITY)).bytes(),
            "is inf";
        freq_base_zero: "rope-freq-base" =>
            valid().set("llama.rope.freq_base", V::F32(0.0)).bytes(), "must be finite and > 0";
        freq_base_nan: "rope-freq-base" =>
            valid().set("llama.rope.freq_base", V::F32(f32::NAN)).bytes(), "is NaN";
        rope_scaling_unknown: "rope-scaling" =>
            valid().set("llama.rope.scaling.type", s("bogus")).bytes(), "is 'bogus'";
        rope_scaling_factor_negative: "rope-scaling" =>
            valid().set("llama.rope.scaling.factor", V::F32(-2.0)).bytes(), "finite and >= 0";
        ffn_zero: "feed-forward-length" =>
            valid().set("llama.feed_forward_length", V::U32(0)).bytes(), "is 0 for layer 0";
        ffn_missing: "feed-forward-length" =>
            valid().remove("llama.feed_forward_length").bytes(), "the key is missing";
        embedding_vocab_mismatch: "vocab-tensor-shapes" => {
            let mut m = valid();
            m.tensor_mut("token_embd.weight").dims = vec![32, 8];
            m.bytes()
        }, "the hyperparameters make it [32, 4]";
        output_vocab_mismatch: "vocab-tensor-shapes" => {
            let mut m = valid();
            m.tensors.push(t("output.weight", &[32, 5], 0));
            m.bytes()
        }, "bad tensor 'output.weight'";
        attn_k_wrong_width: "layer-tensor-shapes" => {
            let mut m = valid();
            m.tensor_mut("blk.0.attn_k.weight").dims = vec![32, 32];
            m.bytes()
        }, "the hyperparameters make it [32, 16]";
        block_count_above_tensors: "layer-tensor-shapes" =>
            valid().set("llama.block_count", V::U32(2)).bytes(),
            "'blk.1.attn_norm.weight': the tensor is missing";
        tensors_beyond_block_count: "layer-tensor-shapes" => {
            let mut m = valid();
            m.tensors.push(t("blk.1.attn_norm.weight", &[32], 0));
            m.bytes()
        }, "it belongs to layer 1 but llama.block_count is 1";
        experts_in_wrong_dim: "layer-tensor-shapes" => {
            let mut m = Model::moe();
            m.tensor_mut("blk.0.ffn_up_exps.weight").dims = vec![32, 64, 3];
            m.bytes()
        }, "should hold 4 experts";
    }
}
