//! [`GgufFile::validate`]: what llama.cpp would otherwise fail on later, some of it by
//! aborting the whole process — tensor data inside the file (a truncated download), tensors
//! packed the way ggml's GGUF loader requires, a supported architecture, a tokenizer
//! llama.cpp can build.
use std::borrow::Cow;
use std::collections::HashSet;

use crate::reader::*;

impl GgufFile {
    /// Checks that llama.cpp can load this file and use its tokenizer:
    /// every tensor's data lies inside the file, aligned and packed in file order (as ggml's
    /// GGUF loader demands); the architecture is present and supported; the tokenizer is sane.
    pub fn validate(&self) -> Result<(), GgufError> {
        self.validate_tensor_layout()?;
        self.validate_architecture()?;
        self.validate_tokenizer()
    }

    fn validate_tensor_layout(&self) -> Result<(), GgufError> {
        if !self.tensors.is_empty() && self.data_offset > self.file_bytes {
            return Err(GgufError::Truncated {
                path: self.path.clone(),
                detail: format!(
                    "tensor data should start at byte {} but the file has {} bytes",
                    self.data_offset, self.file_bytes
                ),
            });
        }
        // ggml requires tensor i to start exactly where tensor i-1 ends, padded to the
        // alignment: no gaps, no overlaps, no reordering.
        let mut expected: u64 = 0;
        let mut previous: Option<&TensorInfo> = None;
        for (tensor, &offset) in self.tensors.iter().zip(&self.relative_offsets) {
            let bad = |detail: String| GgufError::BadTensor {
                path: self.path.clone(),
                tensor: tensor.name.clone(),
                detail,
            };
            if offset % self.alignment != 0 {
                return Err(bad(format!(
                    "its data offset {offset} is not a multiple of the file's alignment {}",
                    self.alignment
                )));
            }
            if offset < expected {
                let other =
                    previous.map_or(String::new(), |p| format!(" with tensor '{}'", p.name));
                return Err(bad(format!(
                    "its data at offset {offset} overlaps{other}, which ends at {expected}"
                )));
            }
            if offset > expected {
                return Err(bad(format!(
                    "its data starts at offset {offset} but ggml expects {expected}: \
                     tensor data must be packed in the order of the tensor table"
                )));
            }
            self.check_in_file(tensor)?;
            expected = tensor
                .n_bytes
                .checked_next_multiple_of(self.alignment)
                .and_then(|padded| offset.checked_add(padded))
                .ok_or_else(|| bad("its size overflows 64 bits".into()))?;
            previous = Some(tensor);
        }
        Ok(())
    }

    fn check_in_file(&self, tensor: &TensorInfo) -> Result<(), GgufError> {
        let start = tensor.offset_in_file;
        match tensor.end_in_file() {
            Some(end) if end <= self.file_bytes => Ok(()),
            end => Err(GgufError::Truncated {
                path: self.path.clone(),
                detail: format!(
                    "tensor {} needs bytes {start}..{} but the file has {} bytes",
                    tensor.name,
                    end.map_or_else(|| "(beyond 2^64)".to_string(), |e| e.to_string()),
                    self.file_bytes
                ),
            }),
        }
    }

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

    fn bad_tokenizer(&self, detail: String) -> GgufError {
        GgufError::BadTokenizer {
            path: self.path.clone(),
            detail,
        }
    }

    fn validate_tokenizer(&self) -> Result<(), GgufError> {
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
            "no_vocab",
            "none",
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
        if !KNOWN.contains(&model) {
            return Err(self.bad_tokenizer(format!("unknown tokenizer model '{model}'")));
        }
        if model == "no_vocab" || model == "none" {
            return Ok(());
        }
        let tokens = self.vocab_tokens()?;
        let n_vocab = tokens.len() as u64;
        self.check_parallel_array("tokenizer.ggml.scores", n_vocab, &["f32", "i32"])?;
        self.check_parallel_array("tokenizer.ggml.token_type", n_vocab, &["i32"])?;
        self.check_special_token_ids(n_vocab)?;
        let texts = self.unique_token_texts(tokens)?;
        match model {
            "llama" => self.check_byte_tokens(&texts),
            "gpt2" | "hybriddna" | "whitespace"
                if self.get_str("tokenizer.ggml.pre") == Some("kimi-k2") =>
            {
                Ok(())
            }
            "gpt2" | "hybriddna" | "whitespace" | "gemma4" => self.check_merges(model),
            _ => Ok(()),
        }
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
        Ok(tokens)
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

    /// Every `tokenizer.ggml.*_token_id` (bos, eos, eot, unknown, padding, ...) must be an
    /// integer: llama.cpp asserts on the type, which would abort the process. An id outside
    /// the vocabulary is only warned about: llama.cpp then disables that special token, and
    /// real models ship such ids (e.g. a padding id equal to the vocabulary size).
    fn check_special_token_ids(&self, n_vocab: u64) -> Result<(), GgufError> {
        let special = self
            .metadata()
            .filter(|(key, _)| key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id"));
        for (key, value) in special {
            match value.as_i64() {
                Some(id) if id >= 0 && (id as u64) < n_vocab => {}
                Some(id) => tracing::warn!(
                    "{}: {key} is {id}, outside the vocabulary of {n_vocab} tokens; llama.cpp will ignore it",
                    self.path.display()
                ),
                None => {
                    return Err(self.bad_tokenizer(format!(
                        "{key} must be an integer token id, found {}",
                        value.type_name()
                    )))
                }
            }
        }
        Ok(())
    }

    /// The token texts as llama.cpp indexes them (an empty token becomes `[EMPTY_<id>]`).
    /// llama.cpp aborts the process (GGML_ASSERT) when two tokens have the same text.
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
    fn check_byte_tokens(&self, texts: &HashSet<Cow<'_, [u8]>>) -> Result<(), GgufError> {
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

    fn check_merges(&self, model: &str) -> Result<(), GgufError> {
        const KEY: &str = "tokenizer.ggml.merges";
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
