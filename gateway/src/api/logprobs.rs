//! Log-probabilities in each dialect's shape: Ollama's `logprobs` list and
//! OpenAI chat's `choices[].logprobs.content` (the same entries:
//! `{token, logprob, bytes, top_logprobs}`), and the legacy completions'
//! `{tokens, token_logprobs, top_logprobs, text_offset}`.
//!
//! The engine reports them from the model's distribution after the
//! repetition penalties, before the grammar, top-k/p, min-p and temperature
//! ([`llama_tiered::llama::Sampler::log_probs`]); an end-of-generation token
//! and the tokens of a stop string have none.
use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use crate::core::backend::{Logprob, TokenLogprobs};

/// A token and its log-probability: an alternative at a position (Ollama's
/// `TokenLogprob`, OpenAI's `TopLogprob`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TopLogprob {
    /// Its text (U+FFFD where it holds part of a UTF-8 character).
    #[schema(example = " blue")]
    pub token: String,
    /// Natural log of its probability, `<= 0`.
    #[schema(example = -0.25)]
    pub logprob: f32,
    /// Its UTF-8 bytes (absent when it has none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bytes: Vec<u8>,
}

/// A sampled token: Ollama's `Logprob`, OpenAI's `ChatCompletionTokenLogprob`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenLogprob {
    #[schema(example = " blue")]
    pub token: String,
    #[schema(example = -0.25)]
    pub logprob: f32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bytes: Vec<u8>,
    /// The `top_logprobs` most likely tokens here, most likely first (Ollama
    /// leaves it out when none were asked; OpenAI always sends it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TopLogprob>>,
}

/// OpenAI chat's `choices[].logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// The legacy `/v1/completions` `choices[].logprobs`: one entry per token in
/// each list.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token, its alternatives: token text → log-probability.
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Per token, the offset of its first character in the choice's text.
    pub text_offset: Vec<usize>,
}

fn text(logprob: &Logprob) -> String {
    String::from_utf8_lossy(&logprob.bytes).into_owned()
}

fn top(logprob: &Logprob) -> TopLogprob {
    TopLogprob {
        token: text(logprob),
        logprob: logprob.logprob,
        bytes: logprob.bytes.clone(),
    }
}

fn entry(token: &TokenLogprobs, always_top: bool) -> TokenLogprob {
    let alternatives: Vec<TopLogprob> = token.top.iter().map(top).collect();
    TokenLogprob {
        token: text(&token.sampled),
        logprob: token.sampled.logprob,
        bytes: token.sampled.bytes.clone(),
        top_logprobs: (always_top || !alternatives.is_empty()).then_some(alternatives),
    }
}

/// Ollama's `logprobs` of a chunk (`None` when there are none, so the field
/// is left out as Ollama does).
pub fn ollama(logprobs: &[TokenLogprobs]) -> Option<Vec<TokenLogprob>> {
    (!logprobs.is_empty()).then(|| logprobs.iter().map(|t| entry(t, false)).collect())
}

/// OpenAI chat's `logprobs` of a choice or chunk.
pub fn openai_chat(logprobs: &[TokenLogprobs]) -> ChoiceLogprobs {
    ChoiceLogprobs {
        content: logprobs.iter().map(|t| entry(t, true)).collect(),
    }
}

/// The legacy completions' `logprobs` of a choice or chunk; `chars` is the
/// number of characters of the choice's text before these tokens, moved
/// past them.
pub fn openai_completion(logprobs: &[TokenLogprobs], chars: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs {
        tokens: Vec::new(),
        token_logprobs: Vec::new(),
        top_logprobs: Vec::new(),
        text_offset: Vec::new(),
    };
    for token in logprobs {
        out.tokens.push(text(&token.sampled));
        out.token_logprobs.push(token.sampled.logprob);
        out.top_logprobs
            .push(token.top.iter().map(|t| (text(t), t.logprob)).collect());
        out.text_offset.push(*chars);
        *chars += characters_begun(&token.sampled.bytes);
    }
    out
}

/// The UTF-8 characters that begin in `bytes` (a token may end or start
/// inside one: the character counts where it begins).
fn characters_begun(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn logprob(bytes: &[u8], logprob: f32) -> Logprob {
        Logprob {
            token: 0,
            bytes: bytes.to_vec(),
            logprob,
        }
    }

    /// "é" split over two tokens, then " ok" with one alternative.
    fn tokens() -> Vec<TokenLogprobs> {
        let e = "é".as_bytes();
        vec![
            TokenLogprobs {
                sampled: logprob(&e[..1], -0.5),
                top: vec![],
            },
            TokenLogprobs {
                sampled: logprob(&e[1..], -0.25),
                top: vec![],
            },
            TokenLogprobs {
                sampled: logprob(b" ok", -1.0),
                top: vec![logprob(b" ok", -1.0), logprob(b"!", -2.0)],
            },
        ]
    }

    #[test]
    fn ollama_leaves_out_what_was_not_asked() {
        assert_eq!(ollama(&[]), None);
        let value = serde_json::to_value(ollama(&tokens()[2..])).unwrap();
        assert_eq!(
            value,
            json!([{"token": " ok", "logprob": -1.0, "bytes": [32, 111, 107], "top_logprobs": [
                {"token": " ok", "logprob": -1.0, "bytes": [32, 111, 107]},
                {"token": "!", "logprob": -2.0, "bytes": [33]}]}])
        );
        let value = serde_json::to_value(ollama(&tokens()[..1])).unwrap();
        assert_eq!(
            value,
            json!([{"token": "\u{fffd}", "logprob": -0.5, "bytes": [0xC3]}])
        );
    }

    #[test]
    fn openai_chat_always_has_top_logprobs() {
        let value = serde_json::to_value(openai_chat(&tokens()[..1])).unwrap();
        assert_eq!(
            value,
            json!({"content": [{"token": "\u{fffd}", "logprob": -0.5, "bytes": [0xC3], "top_logprobs": []}]})
        );
    }

    #[test]
    fn completion_offsets_count_characters_across_pieces() {
        let mut chars = 3;
        let first = openai_completion(&tokens()[..2], &mut chars);
        assert_eq!(first.text_offset, [3, 4]);
        let second = openai_completion(&tokens()[2..], &mut chars);
        assert_eq!(
            serde_json::to_value(second).unwrap(),
            json!({"tokens": [" ok"], "token_logprobs": [-1.0],
                   "top_logprobs": [{" ok": -1.0, "!": -2.0}], "text_offset": [4]})
        );
        assert_eq!(chars, 7);
    }
}
