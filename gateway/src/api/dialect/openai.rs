//! What every OpenAI-style route shares (chat and text completions,
//! Responses, Anthropic's Messages): the sampling fields and how they become
//! the dialect-neutral [`GenerationParams`], and tool calls in OpenAI's shape.
use hypura_chat::tools::ToolCall;
use llama_tiered::llama::SamplingParams;
use serde_json::{json, Value};

use crate::core::request::GenerationParams;
use crate::core::structured::unique_id;
use crate::core::validation::{check_ranges, check_sampling, seed, StopSpec, ValidationError};

/// OpenAI's sampling fields, with OpenAI's defaults (temperature 1, top_p 1,
/// no top-k or min-p).
#[derive(Debug, Clone, Default)]
pub struct OpenAiSampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub max_tokens: Option<u32>,
    pub stop: Option<StopSpec>,
}

impl OpenAiSampling {
    pub fn to_params(&self) -> Result<GenerationParams, ValidationError> {
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: 0,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: seed(self.seed),
            ..SamplingParams::default()
        };
        check_sampling(&sampling, "")?;
        check_ranges(&[("top_p", Some(sampling.top_p), 0.0, 1.0)])?;
        if !(0.0..=2.0).contains(&sampling.temperature) {
            return Err(ValidationError::OutOfRange {
                field: "temperature",
                min: 0,
                max: 2,
                value: sampling.temperature,
            });
        }
        for (name, value) in [
            ("frequency_penalty", sampling.frequency_penalty),
            ("presence_penalty", sampling.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return Err(ValidationError::OutOfRange {
                    field: name,
                    min: -2,
                    max: 2,
                    value,
                });
            }
        }
        Ok(GenerationParams {
            sampling,
            max_tokens: self.max_tokens,
            stop: match self.stop.clone() {
                Some(stop) => stop.checked("stop")?,
                None => Vec::new(),
            },
            num_ctx: None,
            skip_prompt_cache: false,
            constraint: None,
            tool_choice: None,
        })
    }
}

/// OpenAI's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments": "<JSON text>"}}]`; `with_index` adds `index` (stream deltas).
pub fn openai_tool_calls(calls: &[ToolCall], with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let id = call.id.clone().unwrap_or_else(|| unique_id("call_"));
            // A call cut by the token limit keeps its text as written (not
            // JSON), as OpenAI reports one.
            let arguments = call
                .cut_arguments
                .clone()
                .unwrap_or_else(|| Value::Object(call.arguments.clone()).to_string());
            let mut value = json!({
                "id": id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            });
            if with_index {
                value["index"] = index.into();
            }
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_in_openais_shape() {
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}).as_object().unwrap().clone(),
            id: Some("call_1".into()),
            cut_arguments: None,
        };
        assert_eq!(
            openai_tool_calls(std::slice::from_ref(&call), true),
            vec![json!({"id": "call_1", "type": "function", "index": 0,
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})]
        );
    }
}
