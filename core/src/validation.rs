//! Raw request pieces → checked values, before anything runs: JSON bodies,
//! model names, `keep_alive` durations, the sampling values every dialect
//! sets (each dialect's own fields are read by this crate's callers, the
//! gateway's API modules). Every failure is a 400 that says which field was
//! wrong and how.
use std::time::Duration;

use llama_tiered::llama::{SamplingParams, MAX_TOP_LOGPROBS};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::request::EmbedText;

/// Why a request was refused before anything ran: one variant per rule the
/// gateway checks. Each message says what was wrong and what to send instead;
/// they are the wire messages (end-to-end tests assert them byte for byte).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// The body is empty or whitespace.
    #[error("missing request body: send a JSON object")]
    MissingBody,
    /// The body is not JSON, or a known field has the wrong type (the path and
    /// serde's message).
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    /// A required field (named) is missing or empty.
    #[error("{0} is required")]
    MissingField(String),
    /// A model name outside `[namespace/]model[:tag]`.
    #[error(
        "invalid {field} {name:?}: a model name is [namespace/]model[:tag] of letters, \
         digits and . _ - + characters"
    )]
    InvalidModelName { field: String, name: String },
    /// A model name whose tag (after `:`) breaks the tag rule.
    #[error(
        "invalid {field} {name:?}: its tag {tag:?} must start with a letter, digit or _ and \
         hold only letters, digits and . _ - characters (128 at most)"
    )]
    InvalidModelTag {
        field: String,
        name: String,
        tag: String,
    },
    /// A model name shaped like a file path (`../x`, `/x`, `a//b`, `./x`).
    #[error(
        "invalid {field} {name:?}: a model name is not a path: no leading or trailing '/', \
         no empty, '.' or '..' parts"
    )]
    PathLikeModelName { field: String, name: String },
    /// `keep_alive` (as JSON text) is neither seconds nor a Go duration.
    #[error(
        "invalid keep_alive {0}: use seconds (a number) or a duration such as \"5m\", \
         \"1h30m\", \"0\" (unload now) or \"-1\" (keep loaded)"
    )]
    InvalidKeepAlive(String),
    /// A sampling option outside the sampler's range (`prefix` is `options.`
    /// for Ollama; the message is the sampler's).
    #[error("{prefix}{message}")]
    SamplingOption {
        prefix: &'static str,
        message: String,
    },
    /// An OpenAI sampling field outside its documented range.
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange {
        field: &'static str,
        min: i32,
        max: i32,
        value: f32,
    },
    /// `options.num_predict` below -2 (or -2 < n < -1 never happens: integers).
    #[error("options.num_predict must be -1 (unlimited) or >= 0, got {0}")]
    NumPredict(i64),
    /// `options.num_ctx` negative.
    #[error("options.num_ctx must be positive, got {0}")]
    NumCtx(i64),
    /// The prompt alone fills the context window.
    #[error(
        "the prompt has {prompt_tokens} tokens but the context window holds {n_ctx}: \
         shorten the prompt, raise the context (options.num_ctx, up to the model's training \
         context) or let the oldest messages be dropped (truncate: true)"
    )]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    /// `options.num_ctx` above what the model can serve.
    #[error(
        "options.num_ctx {asked} is more than model '{model}' can serve: at most {limit} \
         tokens ({why})"
    )]
    NumCtxTooLarge {
        asked: u32,
        model: String,
        limit: u32,
        why: &'static str,
    },
    /// Ollama's `format` (as JSON text) is neither `"json"` nor a schema.
    #[error("invalid format {0}: use \"json\" or a JSON Schema object")]
    InvalidFormat(String),
    /// OpenAI's `response_format` (as JSON text) has an unknown `type`.
    #[error(
        "invalid response_format {0}: \"type\" must be \"text\", \"json_object\" or \
         \"json_schema\""
    )]
    InvalidResponseFormat(String),
    /// `"type": "json_schema"` without a schema.
    #[error(
        "response_format.json_schema.schema is required with \"type\": \"json_schema\": \
         give the JSON Schema the reply must follow"
    )]
    MissingResponseSchema,
    /// Stop sequences past [`MAX_STOP_SEQUENCES`] or [`MAX_STOP_CHARS`]:
    /// each is looked for after every token.
    #[error(
        "{field}: at most {MAX_STOP_SEQUENCES} stop sequences of at most {MAX_STOP_CHARS} \
         characters each, got {count} (the longest {longest} characters)"
    )]
    Stops {
        field: &'static str,
        count: usize,
        longest: usize,
    },
    /// A schema (in `field`) that is not valid JSON Schema.
    #[error("{field}: invalid JSON Schema: {message}")]
    InvalidSchema { field: String, message: String },
    /// A valid schema that cannot become a grammar.
    #[error("{field}: {message}")]
    UnsupportedSchema { field: String, message: String },
    /// A schema whose minimum count (`minLength`, `minItems`,
    /// `minProperties`) is above its maximum: nothing can satisfy it, and
    /// llama.cpp's grammar parser would expand it without end.
    #[error(
        "{field}: invalid JSON Schema: at {path}: {min_key} ({min}) is greater than {max_key} \
         ({max}): no value can satisfy it"
    )]
    SchemaBoundsInverted {
        field: String,
        path: String,
        min_key: &'static str,
        min: u64,
        max_key: &'static str,
        max: u64,
    },
    /// A schema count above what a grammar can hold.
    #[error("{field}: at {path}: {key} is {value}, more than the {limit} a grammar allows")]
    SchemaCountTooLarge {
        field: String,
        path: String,
        key: &'static str,
        value: u64,
        limit: u64,
    },
    /// A `pattern` refused for its length or its repetitions (`reason`).
    #[error("{field}: at {path}: pattern {pattern:?} is refused: {reason}")]
    SchemaPattern {
        field: String,
        path: String,
        pattern: String,
        reason: String,
    },
    /// A schema whose conversion into a grammar would cost more than a
    /// request may ([`crate::schema_cost`]).
    #[error(
        "{field}: the JSON Schema is too costly to turn into a grammar: {problem}: simplify it"
    )]
    SchemaTooCostly {
        field: String,
        problem: crate::schema_cost::CostProblem,
    },
    /// The grammar a schema becomes is too large to compile per request.
    #[error(
        "{field}: the schema becomes a grammar of {bytes} bytes, more than the {limit} \
         allowed: simplify the schema (fewer or shorter enum values, properties, patterns)"
    )]
    GrammarTooLarge {
        field: String,
        bytes: usize,
        limit: usize,
    },
    /// The grammar holds a repetition llama.cpp's parser cannot compile.
    #[error("{field}: the schema becomes a grammar with the repetition {repetition}, which cannot be compiled")]
    GrammarRepetition { field: String, repetition: String },
    /// `tool_choice` (as JSON text) is not one of its forms.
    #[error(
        "invalid tool_choice {0}: use \"auto\", \"none\", \"required\" or \
         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
    )]
    InvalidToolChoice(String),
    /// `tool_choice` forces a call but no tools were sent.
    #[error("tool_choice asks for a tool call but tools is empty: send the tools")]
    ToolChoiceWithoutTools,
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names function {0:?}, which is not among the tools")]
    ToolChoiceUnknownFunction(String),
    /// A forced tool call together with a response format.
    #[error(
        "a forced tool call (tool_choice) and a response format cannot be combined: \
         drop one of them"
    )]
    ToolChoiceWithFormat,
    /// Tools on a model whose template cannot describe them (its replies are
    /// held to the generic tool-call format) together with a response format.
    #[error(
        "tools and a response format cannot be combined on this model (its chat template \
         has no tool support, so tool replies are held to their own JSON format): drop one \
         of them"
    )]
    ToolsWithFormat,
    /// `tools[index]` (as JSON text) is not a function definition.
    #[error(
        "tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\", \
         \"description\", \"parameters\"}}}}, got {tool}"
    )]
    InvalidTool { index: usize, tool: String },
    /// A tool's `parameters` is not valid JSON Schema.
    #[error("tools: invalid parameters schema: {0}")]
    InvalidToolSchema(String),
    /// A tool's `parameters` cannot become a grammar.
    #[error("tools: parameters: {0}")]
    UnsupportedToolSchema(String),
    /// The model lacks a capability the request needs (`tools`, `images`,
    /// `thinking`); `model` is the name as the client sent it.
    #[error("\"{model}\" does not support {capability}")]
    Unsupported {
        model: String,
        capability: &'static str,
    },
    /// Ollama's `think` is not a boolean or a level (as JSON text).
    #[error("invalid think {0}: use true, false, \"low\", \"medium\" or \"high\"")]
    InvalidThink(String),
    /// A field hypura does not implement yet (the message says which and what to do).
    #[error("{0}")]
    NotSupportedYet(&'static str),
    /// OpenAI's `messages` is empty.
    #[error("messages must not be empty")]
    EmptyMessages,
    /// `messages[i].role` is empty.
    #[error("messages[{0}].role is empty")]
    EmptyRole(usize),
    /// `messages[i].role` is none the route knows.
    #[error("messages[{index}].role {role:?} is unknown: use one of {allowed}")]
    UnknownRole {
        index: usize,
        role: String,
        allowed: String,
    },
    /// An integer option outside its range (`top_k -1`, `num_thread 1000000`).
    #[error("{field} must be between {min} and {max}, got {value}")]
    IntegerOutOfRange {
        field: &'static str,
        min: i64,
        max: i64,
        value: i64,
    },
    /// A `keep_alive` longer than any a server keeps.
    #[error(
        "keep_alive {0} is longer than {MAX_KEEP_ALIVE_SECONDS} seconds: use a negative value \
         (\"-1\") to keep the model loaded"
    )]
    KeepAliveTooLong(String),
    /// An OpenAI content part with an image.
    #[error("messages[{0}]: this model does not support images")]
    ImagePart(usize),
    /// An OpenAI content part of an unknown type.
    #[error("messages[{index}]: unsupported content part type {kind:?}")]
    UnknownContentPart { index: usize, kind: String },
    /// OpenAI's `n` outside 1..=[`MAX_CHOICES`].
    #[error("n must be between 1 and {MAX_CHOICES}, got {0}")]
    ChoiceCount(u32),
    /// A count of alternative tokens to report (`top_logprobs`, or the
    /// legacy completions' `logprobs`) outside `0..=20`.
    #[error("{field} must be between 0 and {max}, got {value}", max = MAX_TOP_LOGPROBS)]
    TopLogprobs { field: &'static str, value: i64 },
    /// OpenAI's `top_logprobs` without `logprobs: true`.
    #[error("top_logprobs needs logprobs: true")]
    TopLogprobsWithoutLogprobs,
    /// A completion prompt given as a list of more than one string.
    #[error("prompt must be a string or a list of one string")]
    PromptList,
    /// A completion prompt that is empty.
    #[error("prompt must not be empty")]
    EmptyPrompt,
    /// Embedding input empty, or with an empty string.
    #[error("input must be a non-empty string or list of them")]
    EmptyInput,
    /// Embedding token ids that are no token ids (negative, or past 32 bits).
    #[error("input token ids must be integers from 0 to the model's vocabulary size")]
    TokenIds,
    /// An unknown `encoding_format`.
    #[error("encoding_format must be \"float\" or \"base64\", got {0:?}")]
    EncodingFormat(String),
    /// Embedding `dimensions` of 0, or more than the model's vectors have.
    #[error("dimensions must be between 1 and {max} (the model's embedding length), got {value}")]
    Dimensions { value: usize, max: usize },
    /// More embedding inputs than one request may carry.
    #[error("input has {count} texts, more than the {limit} one request may embed: split it")]
    TooManyInputs { count: usize, limit: usize },
    /// An embedding input far longer than the embedding context, with `truncate` off.
    #[error(
        "input {index} is {bytes} bytes, more than the {limit} bytes the embedding context can \
         hold: shorten it or set truncate: true"
    )]
    InputTooLarge {
        index: usize,
        bytes: usize,
        limit: usize,
    },
    /// A prompt of more bytes than the context window could hold as tokens
    /// (refused before it is tokenized).
    #[error(
        "the prompt is {bytes} bytes, more than a context window of {n_ctx} tokens can hold \
         ({limit} bytes at most): shorten the prompt"
    )]
    PromptTooLarge {
        bytes: usize,
        n_ctx: u32,
        limit: usize,
    },
    /// OpenAI's `logit_bias` refused (a key that is no token id, a bias out
    /// of range, too many tokens): the message names the field.
    #[error("logit_bias: {0}")]
    LogitBias(String),
    /// An option outside its range (`top_p 5`, `temperature -1`).
    #[error("{field} must be between {min} and {max}, got {value}")]
    OptionOutOfRange {
        field: &'static str,
        min: f32,
        max: f32,
        value: f32,
    },
}

/// Most tokens one request's `logit_bias` may name.
pub const MAX_LOGIT_BIAS_TOKENS: usize = 1024;
/// A `logit_bias` key: a token id in decimal (an `i32`).
pub const LOGIT_BIAS_KEY_PATTERN: &str = "^[0-9]{1,10}$";

/// OpenAI's `logit_bias` (token id as text → bias): the `(id, bias)` pairs
/// of [`SamplingParams::logit_bias`], each key a token id and each bias in
/// [-100, 100]. Whether the ids are in the vocabulary is checked where the
/// model is known (its backend).
pub fn logit_bias(
    map: &std::collections::BTreeMap<String, f64>,
) -> Result<Vec<(i32, f32)>, ValidationError> {
    use llama_tiered::llama::LOGIT_BIAS_MAX;
    if map.len() > MAX_LOGIT_BIAS_TOKENS {
        return Err(ValidationError::LogitBias(format!(
            "{} tokens, more than the {MAX_LOGIT_BIAS_TOKENS} one request may bias",
            map.len()
        )));
    }
    map.iter()
        .map(|(key, &bias)| {
            let token = key
                .parse::<i32>()
                .ok()
                .filter(|t| *t >= 0 && key.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    ValidationError::LogitBias(format!(
                        "key {:?} is not a token id: use token ids (integers from 0) as keys",
                        capped_key(key)
                    ))
                })?;
            let max = f64::from(LOGIT_BIAS_MAX);
            if !(-max..=max).contains(&bias) {
                return Err(ValidationError::LogitBias(format!(
                    "the bias of token {token} must be between -{max} and {max}, got {bias}"
                )));
            }
            Ok((token, bias as f32))
        })
        .collect()
}

/// A map key as an error quotes it: at most 32 characters.
fn capped_key(key: &str) -> String {
    match key.char_indices().nth(32) {
        Some((end, _)) => format!("{}…", &key[..end]),
        None => key.to_string(),
    }
}

/// Integer fields that also take an integral float (`4.0`, as JavaScript
/// clients write every number): `#[serde(default, deserialize_with =
/// "integral::option")]` on an `Option` of any integer type. A fraction
/// (`4.5`) or a value outside the type is refused with serde's own words,
/// so the 400 names the field (`max_tokens: invalid type: floating point
/// `4.5`, expected u32`).
pub mod integral {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserializer, Unexpected, Visitor};

    /// An optional integer field; `null` is `None`.
    pub fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<i64> + TryFrom<u64>,
    {
        deserializer.deserialize_option(Optional(PhantomData))
    }

    /// Two to the 64th: the first integral `f64` past `u64`.
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

    struct Integer<T>(PhantomData<T>);

    impl<'de, T: TryFrom<i64> + TryFrom<u64>> Visitor<'de> for Integer<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(std::any::type_name::<T>())
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            T::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            T::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            if !v.is_finite() || v.fract() != 0.0 {
                return Err(E::invalid_type(Unexpected::Float(v), &self));
            }
            // Exact: an integral float within these bounds converts without rounding.
            if (0.0..TWO_POW_64).contains(&v) {
                self.visit_u64(v as u64)
            } else if (-TWO_POW_64 / 2.0..0.0).contains(&v) {
                self.visit_i64(v as i64)
            } else {
                Err(E::invalid_value(Unexpected::Float(v), &self))
            }
        }
    }

    struct Optional<T>(PhantomData<T>);

    impl<'de, T: TryFrom<i64> + TryFrom<u64>> Visitor<'de> for Optional<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(std::any::type_name::<T>())
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            d.deserialize_any(Integer(PhantomData)).map(Some)
        }
    }
}

/// Most texts one embedding request may carry (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;
/// Longest token of any vocabulary served, in bytes: a text of more than
/// `n_tokens * MAX_TOKEN_BYTES` bytes cannot fit in `n_tokens`, so it is
/// refused (or cut) before it is tokenized.
pub const MAX_TOKEN_BYTES: usize = 256;
/// Embedding inputs: at most [`MAX_EMBED_INPUTS`], none empty.
pub fn check_embed_inputs(inputs: &[EmbedText]) -> Result<(), ValidationError> {
    if inputs.len() > MAX_EMBED_INPUTS {
        return Err(ValidationError::TooManyInputs {
            count: inputs.len(),
            limit: MAX_EMBED_INPUTS,
        });
    }
    Ok(())
}

/// Embedding texts for a context of `n_ctx` tokens, before they are
/// tokenized: one of more bytes than `n_ctx` tokens can hold is cut there
/// (`truncate`) or refused.
pub fn check_embed_bytes(
    inputs: &mut [EmbedText],
    truncate: bool,
    n_ctx: usize,
) -> Result<(), ValidationError> {
    let limit = n_ctx.saturating_mul(MAX_TOKEN_BYTES);
    for (index, input) in inputs.iter_mut().enumerate() {
        let EmbedText::Text(text) = input else {
            continue;
        };
        if text.len() <= limit {
            continue;
        }
        if !truncate {
            return Err(ValidationError::InputTooLarge {
                index,
                bytes: text.len(),
                limit,
            });
        }
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    Ok(())
}

/// A prompt of `bytes` bytes for a context of `n_ctx` tokens: refused before
/// tokenizing when it cannot fit whatever the vocabulary.
pub fn check_prompt_bytes(bytes: usize, n_ctx: u32) -> Result<(), ValidationError> {
    let limit = (n_ctx as usize).saturating_mul(MAX_TOKEN_BYTES);
    if bytes > limit {
        return Err(ValidationError::PromptTooLarge {
            bytes,
            n_ctx,
            limit,
        });
    }
    Ok(())
}

/// Parses a JSON body whatever its content type (Ollama accepts bodies sent
/// without one, e.g. by `curl -d`). Unknown fields are ignored; a known field
/// of the wrong type is named with its path (`options.temperature: …`).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ValidationError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ValidationError::MissingBody);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ValidationError::InvalidJson(inner.to_string())
        } else {
            ValidationError::InvalidJson(format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ValidationError::InvalidJson(e.to_string()))?;
    Ok(value)
}

/// A model name `[namespace/]model[:tag]` with the tag defaulted to `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelName {
    /// `name:tag` as it should be shown (case kept).
    pub display: String,
    /// The lookup key: `display` in lower case.
    pub key: String,
}

impl ModelName {
    /// Checks and completes a client's model name; `field` names the field in errors.
    pub fn parse(raw: &str, field: &str) -> Result<ModelName, ValidationError> {
        let name = raw.trim();
        if name.is_empty() {
            return Err(ValidationError::MissingField(field.to_string()));
        }
        let valid = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:+".contains(c));
        let base = name.rsplit('/').next().unwrap_or(name);
        if !valid || name.len() > 350 || base.starts_with(':') || name.ends_with(':') {
            return Err(ValidationError::InvalidModelName {
                field: field.to_string(),
                name: name.to_string(),
            });
        }
        let path_like = name
            .split(':')
            .next()
            .unwrap_or(name)
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
        if path_like {
            return Err(ValidationError::PathLikeModelName {
                field: field.to_string(),
                name: name.to_string(),
            });
        }
        if let Some((_, tag)) = base.split_once(':') {
            // Ollama's tag rule: a letter, digit or `_`, then those, `.` and `-`.
            let valid_tag = tag.len() <= 128
                && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !valid_tag {
                return Err(ValidationError::InvalidModelTag {
                    field: field.to_string(),
                    name: name.to_string(),
                    tag: tag.to_string(),
                });
            }
        }
        let display = if base.contains(':') {
            name.to_string()
        } else {
            format!("{name}:latest")
        };
        Ok(ModelName {
            key: display.to_lowercase(),
            display,
        })
    }

    /// The name under which a model file is served: its stem with `:latest`,
    /// characters outside model-name syntax replaced by `-`.
    pub fn from_file_stem(stem: &str) -> ModelName {
        let clean: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let clean = if clean.is_empty() {
            "model".to_string()
        } else {
            clean
        };
        let display = format!("{clean}:latest");
        ModelName {
            key: display.to_lowercase(),
            display,
        }
    }
}

/// The longest `keep_alive` a request may ask for: 10 years, in seconds
/// (a longer one is surely a mistake; a negative one keeps a model loaded).
pub const MAX_KEEP_ALIVE_SECONDS: u64 = 315_360_000;

/// How long a model stays loaded after its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepAlive {
    Forever,
    For(Duration),
}

impl KeepAlive {
    /// Parses Ollama's `keep_alive`: a number of seconds or a Go duration
    /// string (`"10m"`, `"1h30m"`, `"0"`, `"-1"`); negative means forever.
    pub fn from_json(value: &serde_json::Value) -> Result<KeepAlive, ValidationError> {
        let bad = || ValidationError::InvalidKeepAlive(value.to_string());
        match value {
            serde_json::Value::Number(n) => {
                let seconds = n.as_f64().ok_or_else(bad)?;
                Self::from_seconds(seconds).bounded(value)
            }
            serde_json::Value::String(s) => {
                let s = s.trim();
                if let Ok(seconds) = s.parse::<f64>() {
                    return Self::from_seconds(seconds).bounded(value);
                }
                parse_go_duration(s).ok_or_else(bad)?.bounded(value)
            }
            _ => Err(bad()),
        }
    }

    /// Parses the command line's `--keep-alive`.
    pub fn from_flag(text: &str) -> Result<KeepAlive, String> {
        Self::from_json(&serde_json::Value::String(text.to_string())).map_err(|e| e.to_string())
    }

    fn from_seconds(seconds: f64) -> KeepAlive {
        if seconds < 0.0 {
            KeepAlive::Forever
        } else if seconds.is_finite() {
            KeepAlive::For(Duration::from_secs_f64(seconds.min(1e12)))
        } else {
            KeepAlive::Forever
        }
    }

    /// A duration of at most [`MAX_KEEP_ALIVE_SECONDS`] (`value` as sent, for the error).
    fn bounded(self, value: &serde_json::Value) -> Result<KeepAlive, ValidationError> {
        match self {
            KeepAlive::For(d) if d.as_secs_f64() > MAX_KEEP_ALIVE_SECONDS as f64 => {
                Err(ValidationError::KeepAliveTooLong(value.to_string()))
            }
            k => Ok(k),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == KeepAlive::For(Duration::ZERO)
    }
}

/// A Go `time.ParseDuration` string: an optional sign, then one or more
/// `<decimal><unit>` with units ns, us/µs, ms, s, m, h; `"0"` alone is zero.
fn parse_go_duration(s: &str) -> Option<KeepAlive> {
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(KeepAlive::For(Duration::ZERO));
    }
    if rest.is_empty() {
        return None;
    }
    let mut total_seconds = 0.0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total_seconds += number * scale;
    }
    if negative && total_seconds > 0.0 {
        return Some(KeepAlive::Forever);
    }
    Some(KeepAlive::from_seconds(total_seconds))
}

/// `stop` given as one string or a list of strings.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

/// Most stop sequences one request may give. OpenAI takes 4 and Ollama sets
/// no limit; clients send a handful (a template's end markers). Each is
/// looked for in the reply after every token, so their number and length
/// bound that work.
pub const MAX_STOP_SEQUENCES: usize = 32;
/// The longest stop sequence, in characters.
pub const MAX_STOP_CHARS: usize = 1024;

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }

    /// The stop sequences, refused past [`MAX_STOP_SEQUENCES`] or
    /// [`MAX_STOP_CHARS`]; `field` names them in the error.
    pub fn checked(self, field: &'static str) -> Result<Vec<String>, ValidationError> {
        let stops = self.into_vec();
        let longest = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0);
        if stops.len() > MAX_STOP_SEQUENCES || longest > MAX_STOP_CHARS {
            return Err(ValidationError::Stops {
                field,
                count: stops.len(),
                longest,
            });
        }
        Ok(stops)
    }
}

/// Most choices (`n`) of one OpenAI request: each is a generation of its own.
pub const MAX_CHOICES: u32 = 8;

/// The log-probabilities a request asks for, as
/// [`SamplingParams::top_logprobs`]: none unless `wanted`, then `top`
/// alternatives (a field named `field`, default 0), checked either way.
pub fn logprobs(
    wanted: bool,
    field: &'static str,
    top: Option<i64>,
) -> Result<Option<u32>, ValidationError> {
    let n = top.unwrap_or(0);
    if !(0..=i64::from(MAX_TOP_LOGPROBS)).contains(&n) {
        return Err(ValidationError::TopLogprobs { field, value: n });
    }
    Ok(wanted.then_some(n as u32))
}

/// A negative seed (Ollama's -1) asks for a random one; larger seeds are
/// folded into 32 bits (llama.cpp's seed width).
pub fn seed(seed: Option<i64>) -> Option<u32> {
    match seed {
        Some(s) if s >= 0 => Some((s as u64 % u64::from(u32::MAX)) as u32),
        _ => None,
    }
}

/// Each `(field, value, min, max)`: the value, when given, within `[min, max]`.
pub fn check_ranges(
    ranges: &[(&'static str, Option<f32>, f32, f32)],
) -> Result<(), ValidationError> {
    for &(field, value, min, max) in ranges {
        if let Some(value) = value.filter(|v| !(min..=max).contains(v)) {
            return Err(ValidationError::OptionOutOfRange {
                field,
                min,
                max,
                value,
            });
        }
    }
    Ok(())
}

/// `sampling` as llama.cpp's sampler accepts it; a field it refuses is named
/// with `prefix` (`options.` for Ollama).
pub fn check_sampling(
    sampling: &SamplingParams,
    prefix: &'static str,
) -> Result<(), ValidationError> {
    sampling
        .validate()
        .map_err(|e| ValidationError::SamplingOption {
            prefix,
            message: match e {
                llama_tiered::EngineError::InvalidArgument(message) => message,
                e => e.to_string(),
            },
        })
}

/// Integer options in their ranges: `(field, value, min, max)`.
pub fn check_integer_ranges(
    ranges: &[(&'static str, Option<i64>, i64, i64)],
) -> Result<(), ValidationError> {
    for &(field, value, min, max) in ranges {
        if let Some(value) = value.filter(|v| !(min..=max).contains(v)) {
            return Err(ValidationError::IntegerOutOfRange {
                field,
                min,
                max,
                value,
            });
        }
    }
    Ok(())
}

/// Message roles Ollama's `/api/chat` takes.
pub const OLLAMA_ROLES: &[&str] = &["system", "user", "assistant", "tool"];
/// Message roles OpenAI's chat completions and Responses take.
pub const OPENAI_ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// `messages[index].role`: present and one of `allowed`.
pub fn check_role(index: usize, role: &str, allowed: &[&str]) -> Result<(), ValidationError> {
    if role.trim().is_empty() {
        return Err(ValidationError::EmptyRole(index));
    }
    if !allowed.contains(&role) {
        return Err(ValidationError::UnknownRole {
            index,
            role: role.to_string(),
            allowed: allowed.join(", "),
        });
    }
    Ok(())
}

/// Checks the prompt against the context window and caps `max_tokens` so
/// prompt + reply fit in it.
pub fn fit_to_context(
    prompt_tokens: usize,
    max_tokens: &mut Option<u32>,
    n_ctx: u32,
) -> Result<(), ValidationError> {
    if prompt_tokens >= n_ctx as usize {
        return Err(ValidationError::PromptTooLong {
            prompt_tokens,
            n_ctx,
        });
    }
    let room = (n_ctx as usize - prompt_tokens) as u32;
    *max_tokens = Some(max_tokens.map_or(room, |m| m.min(room)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    struct Integers {
        #[serde(default, deserialize_with = "integral::option")]
        n: Option<u32>,
        #[serde(default, deserialize_with = "integral::option")]
        seed: Option<i64>,
    }

    fn integers(body: &str) -> Result<Integers, ValidationError> {
        parse_json(body.as_bytes())
    }

    #[test]
    fn integer_fields_take_integral_floats_and_nothing_else() {
        let n = integers(r#"{"n": 4.0, "seed": -3.0}"#).unwrap();
        assert_eq!((n.n, n.seed), (Some(4), Some(-3)));
        let n = integers(r#"{"n": 4, "seed": null}"#).unwrap();
        assert_eq!((n.n, n.seed), (Some(4), None));
        assert_eq!(integers("{}").unwrap().n, None);
        for (body, message) in [
            (
                r#"{"n": 4.5}"#,
                "n: invalid type: floating point `4.5`, expected u32",
            ),
            (
                r#"{"n": -1.0}"#,
                "n: invalid value: integer `-1`, expected u32",
            ),
            (
                r#"{"n": 1e300}"#,
                "n: invalid value: floating point `1e+300`, expected u32",
            ),
            (
                r#"{"n": "4"}"#,
                "n: invalid type: string \"4\", expected u32",
            ),
            (
                r#"{"seed": 1e19}"#,
                "seed: invalid value: integer `10000000000000000000`, expected i64",
            ),
        ] {
            let error = integers(body).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("invalid JSON body: {message}")),
                "{body}: {error}"
            );
        }
    }

    #[test]
    fn logit_bias_keys_are_token_ids_and_biases_within_100() {
        let map = |pairs: &[(&str, f64)]| {
            pairs
                .iter()
                .map(|&(k, v)| (k.to_string(), v))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(
            logit_bias(&map(&[("7", -100.0), ("42", 2.5)])).unwrap(),
            [(42, 2.5), (7, -100.0)]
        );
        for (pairs, message) in [
            (
                vec![("x", 1.0)],
                "logit_bias: key \"x\" is not a token id: use token ids (integers from 0) as keys",
            ),
            (
                vec![("+1", 1.0)],
                "logit_bias: key \"+1\" is not a token id: use token ids (integers from 0) as keys",
            ),
            (
                vec![("1", 100.5)],
                "logit_bias: the bias of token 1 must be between -100 and 100, got 100.5",
            ),
        ] {
            assert_eq!(logit_bias(&map(&pairs)).unwrap_err().to_string(), message);
        }
        let many: Vec<(String, f64)> = (0..=MAX_LOGIT_BIAS_TOKENS)
            .map(|i| (i.to_string(), 1.0))
            .collect();
        let many = many.into_iter().collect();
        assert_eq!(
            logit_bias(&many).unwrap_err().to_string(),
            "logit_bias: 1025 tokens, more than the 1024 one request may bias"
        );
    }

    #[test]
    fn names_get_latest_and_lower_case_keys() {
        let n = ModelName::parse("SmolLM2", "model").unwrap();
        assert_eq!(n.display, "SmolLM2:latest");
        assert_eq!(n.key, "smollm2:latest");
        let n = ModelName::parse("library/qwen3:0.6b", "model").unwrap();
        assert_eq!(n.display, "library/qwen3:0.6b");
        assert!(ModelName::parse("", "model").is_err());
        assert!(ModelName::parse("a b", "model").is_err());
        assert!(ModelName::parse("x:", "model").is_err());
        let n = ModelName::from_file_stem("SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(n.display, "SmolLM2-135M-Instruct.Q4_1:latest");
    }

    #[test]
    fn keep_alive_accepts_seconds_and_go_durations() {
        let ka = |v: serde_json::Value| KeepAlive::from_json(&v).unwrap();
        assert_eq!(ka(json!(0)), KeepAlive::For(Duration::ZERO));
        assert_eq!(ka(json!("0")), KeepAlive::For(Duration::ZERO));
        assert_eq!(ka(json!(30)), KeepAlive::For(Duration::from_secs(30)));
        assert_eq!(ka(json!("10m")), KeepAlive::For(Duration::from_secs(600)));
        assert_eq!(
            ka(json!("1h30m")),
            KeepAlive::For(Duration::from_secs(5400))
        );
        assert_eq!(
            ka(json!("1.5s")),
            KeepAlive::For(Duration::from_millis(1500))
        );
        assert_eq!(ka(json!(-1)), KeepAlive::Forever);
        assert_eq!(ka(json!("-1m")), KeepAlive::Forever);
        assert_eq!(ka(json!("-1")), KeepAlive::Forever);
        for bad in [json!("soon"), json!("5x"), json!(true), json!("")] {
            assert!(KeepAlive::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn context_fit_caps_max_tokens() {
        let mut max_tokens = None;
        fit_to_context(10, &mut max_tokens, 16).unwrap();
        assert_eq!(max_tokens, Some(6));
        let err = fit_to_context(16, &mut max_tokens, 16).unwrap_err();
        assert!(err.to_string().contains("16 tokens"), "{err}");
    }

    /// The rules' variants, one family at a time; messages checked byte for
    /// byte where clients see them.
    #[test]
    fn logprobs_are_asked_with_up_to_twenty_alternatives() {
        assert_eq!(logprobs(false, "top_logprobs", Some(3)), Ok(None));
        assert_eq!(logprobs(true, "top_logprobs", None), Ok(Some(0)));
        assert_eq!(logprobs(true, "logprobs", Some(20)), Ok(Some(20)));
        for value in [-1, 21] {
            let e = logprobs(false, "top_logprobs", Some(value)).unwrap_err();
            assert_eq!(
                e,
                ValidationError::TopLogprobs {
                    field: "top_logprobs",
                    value
                }
            );
        }
        assert_eq!(
            logprobs(true, "logprobs", Some(21))
                .unwrap_err()
                .to_string(),
            "logprobs must be between 0 and 20, got 21"
        );
    }

    #[test]
    fn model_name_rules_have_their_own_variants() {
        assert_eq!(
            ModelName::parse("  ", "model").unwrap_err(),
            ValidationError::MissingField("model".into())
        );
        let e = ModelName::parse("a b", "name").unwrap_err();
        assert_eq!(
            e,
            ValidationError::InvalidModelName {
                field: "name".into(),
                name: "a b".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "invalid name \"a b\": a model name is [namespace/]model[:tag] of letters, digits \
             and . _ - + characters"
        );
    }

    #[test]
    fn path_like_names_have_their_own_variant() {
        for bad in [
            "../x",
            "../../etc/passwd",
            "/abs",
            "a//b",
            "./x",
            "a/./b",
            "x/",
        ] {
            assert_eq!(
                ModelName::parse(bad, "destination").unwrap_err(),
                ValidationError::PathLikeModelName {
                    field: "destination".into(),
                    name: bad.into()
                },
                "{bad}"
            );
        }
        for ok in [
            "hf.co/user/repo:Q4_K_M",
            "library/llama3:8b",
            "a.b:1.0",
            "x..y",
        ] {
            assert!(ModelName::parse(ok, "model").is_ok(), "{ok}");
        }
    }

    #[test]
    fn keep_alive_rule_has_its_own_variant() {
        let e = KeepAlive::from_json(&json!("soon")).unwrap_err();
        assert_eq!(e, ValidationError::InvalidKeepAlive("\"soon\"".into()));
        assert_eq!(
            e.to_string(),
            "invalid keep_alive \"soon\": use seconds (a number) or a duration such as \"5m\", \
             \"1h30m\", \"0\" (unload now) or \"-1\" (keep loaded)"
        );
        assert_eq!(
            KeepAlive::from_json(&json!(true)).unwrap_err(),
            ValidationError::InvalidKeepAlive("true".into())
        );
    }

    #[test]
    fn embed_and_prompt_sizes_have_their_own_variants() {
        let many = vec![EmbedText::Text("x".into()); MAX_EMBED_INPUTS + 1];
        assert_eq!(
            check_embed_inputs(&many).unwrap_err(),
            ValidationError::TooManyInputs {
                count: MAX_EMBED_INPUTS + 1,
                limit: MAX_EMBED_INPUTS
            }
        );
        let limit = 512 * MAX_TOKEN_BYTES;
        let mut long = vec![
            EmbedText::Text("é".repeat(limit)),
            EmbedText::Tokens(vec![1; 600]),
        ];
        assert!(matches!(
            check_embed_bytes(&mut long.clone(), false, 512).unwrap_err(),
            ValidationError::InputTooLarge { index: 0, .. }
        ));
        check_embed_bytes(&mut long, true, 512).unwrap();
        assert!(matches!(&long[0], EmbedText::Text(t) if t.len() == limit));
        // Token ids are measured once they are known, by the backend.
        assert_eq!(long[1], EmbedText::Tokens(vec![1; 600]));
        assert_eq!(
            check_prompt_bytes(28_000_000, 4096).unwrap_err(),
            ValidationError::PromptTooLarge {
                bytes: 28_000_000,
                n_ctx: 4096,
                limit: 4096 * MAX_TOKEN_BYTES
            }
        );
        assert!(check_prompt_bytes(4096 * MAX_TOKEN_BYTES, 4096).is_ok());
    }

    #[test]
    fn length_rules_have_their_own_variants() {
        let mut max_tokens = None;
        let e = fit_to_context(512, &mut max_tokens, 512).unwrap_err();
        assert_eq!(
            e,
            ValidationError::PromptTooLong {
                prompt_tokens: 512,
                n_ctx: 512
            }
        );
        assert!(e.to_string().starts_with(
            "the prompt has 512 tokens but the context window holds 512: shorten the prompt"
        ));
        fit_to_context(500, &mut max_tokens, 512).unwrap();
        assert_eq!(max_tokens, Some(12));
    }
}
