//! What every Ollama route shares: the `options` object and how it becomes
//! the dialect-neutral [`GenerationParams`], and `format` as a [`Constraint`].
use llama_tiered::llama::SamplingParams;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::core::error::ApiError;
use crate::core::request::{Constraint, GenerationParams};
use crate::core::structured::schema_constraint;
use crate::core::validation::{
    check_integer_ranges, check_ranges, check_sampling, seed, StopSpec, ValidationError,
};

/// Ollama's `format`: absent, `""` or `null` for free text, `"json"` for any
/// JSON object, or a JSON Schema object (checked here; a local backend makes
/// it a grammar, an upstream passes it on).
pub fn ollama_format(format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Constraint::JsonObject)),
        Some(schema @ Value::Object(_)) => schema_constraint(schema, "format").map(Some),
        Some(other) => Err(ValidationError::InvalidFormat(other.to_string()).into()),
    }
}

/// Most decoding threads `options.num_thread` may name (0: the server's).
const MAX_THREADS: i64 = 1024;

/// Ollama's `options` object. Keys clients send that hypura does not use
/// (mirostat, tfs_z, numa, low_vram, f16_kv, use_mlock…) are ignored; a known
/// key of the wrong type is a 400.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
// Some keys are only type-checked: they are part of the API but hypura's own
// settings (threads, batch, placement) apply.
#[allow(dead_code)]
pub struct OllamaOptions {
    /// Context window for this request, up to the model's training context
    /// (a larger one than the model is loaded with reloads it).
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_ctx: Option<i64>,
    /// Most tokens to generate; -1 (default) or -2 = until the context is full.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_predict: Option<i64>,
    /// 0.8 by default; 0 is greedy.
    pub temperature: Option<f32>,
    /// 40 by default; 0 disables.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub top_k: Option<i32>,
    /// 0.9 by default; 1 disables.
    pub top_p: Option<f32>,
    /// 0 by default.
    pub min_p: Option<f32>,
    /// Accepted for compatibility; not applied.
    pub typical_p: Option<f32>,
    /// 64 by default; 0 disables the penalties, -1 = whole context.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub repeat_last_n: Option<i32>,
    /// 1.0 (off) by default, as Ollama's `DefaultOptions` since 2026 (1.1 before).
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// -1 (default) picks a random seed.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub seed: Option<i64>,
    /// Strings that end generation (not returned).
    #[schema(value_type = Vec<String>)]
    pub stop: Option<StopSpec>,
    /// Accepted; the server's batch size applies.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_batch: Option<i64>,
    /// Accepted; the server's thread count applies.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_thread: Option<i64>,
    /// Accepted; the placement is the scheduler's.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_gpu: Option<i64>,
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub num_keep: Option<i64>,
}

impl OllamaOptions {
    /// Ollama's defaults (its `DefaultOptions`): temperature 0.8, top_k 40,
    /// top_p 0.9, min_p 0, repeat_last_n 64, repeat_penalty 1.0, random
    /// seed; no limit here (the server's `default_max_tokens` then applies).
    pub fn to_params(&self) -> Result<GenerationParams, ValidationError> {
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(0.8),
            top_k: self.top_k.unwrap_or(40),
            top_p: self.top_p.unwrap_or(0.9),
            min_p: self.min_p.unwrap_or(0.0),
            repeat_penalty: self.repeat_penalty.unwrap_or(1.0),
            repeat_last_n: self.repeat_last_n.unwrap_or(64),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: seed(self.seed),
            ..SamplingParams::default()
        };
        check_ranges(&[
            ("options.temperature", Some(sampling.temperature), 0.0, 10.0),
            ("options.top_p", Some(sampling.top_p), 0.0, 1.0),
            ("options.min_p", Some(sampling.min_p), 0.0, 1.0),
            ("options.typical_p", self.typical_p, 0.0, 1.0),
            (
                "options.presence_penalty",
                Some(sampling.presence_penalty),
                -2.0,
                2.0,
            ),
            (
                "options.frequency_penalty",
                Some(sampling.frequency_penalty),
                -2.0,
                2.0,
            ),
        ])?;
        check_sampling(&sampling, "options.")?;
        let most = i64::from(i32::MAX);
        check_integer_ranges(&[
            ("options.top_k", self.top_k.map(i64::from), 0, most),
            ("options.num_thread", self.num_thread, 0, MAX_THREADS),
            ("options.num_batch", self.num_batch, 1, most),
            ("options.num_gpu", self.num_gpu, -1, most),
            ("options.num_keep", self.num_keep, -1, most),
        ])?;
        let max_tokens = match self.num_predict {
            None | Some(-1) | Some(-2) => None,
            Some(n) if n < 0 => return Err(ValidationError::NumPredict(n)),
            Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        };
        let num_ctx = match self.num_ctx {
            None => None,
            Some(n) if n < 1 => return Err(ValidationError::NumCtx(n)),
            Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        };
        Ok(GenerationParams {
            sampling,
            max_tokens,
            stop: match self.stop.clone() {
                Some(stop) => stop.checked("options.stop")?,
                None => Vec::new(),
            },
            num_ctx,
            skip_prompt_cache: false,
            constraint: None,
            tool_choice: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::validation::parse_json;
    use serde_json::json;

    #[test]
    fn formats_become_constraints() {
        assert_eq!(ollama_format(None).unwrap(), None);
        assert_eq!(ollama_format(Some(&json!(""))).unwrap(), None);
        assert_eq!(
            ollama_format(Some(&json!("json"))).unwrap(),
            Some(Constraint::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            ollama_format(Some(&schema)).unwrap(),
            Some(Constraint::JsonSchema {
                schema,
                field: "format".into()
            })
        );
        let err = ollama_format(Some(&json!("yaml"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid format \"yaml\": use \"json\" or a JSON Schema object"
        );
        // A schema is checked when the request is read, before any model.
        assert!(ollama_format(Some(&json!({"enum": []}))).is_err());
    }

    #[test]
    fn options_map_to_params_with_ollama_defaults() {
        let o: OllamaOptions = parse_json(
            br#"{"num_predict":5,"temperature":0,"seed":42,"stop":["\n"],"mirostat":2,"num_ctx":256}"#,
        )
        .unwrap();
        let p = o.to_params().unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.seed, Some(42));
        assert_eq!(p.sampling.top_k, 40);
        assert_eq!(p.sampling.top_p, 0.9);
        assert_eq!(p.stop, vec!["\n"]);
        assert_eq!(p.num_ctx, Some(256));
        let p = OllamaOptions::default().to_params().unwrap();
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.sampling.seed, None);
    }

    #[test]
    fn wrong_option_types_name_the_field() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Req {
            options: Option<OllamaOptions>,
        }
        let e = parse_json::<Req>(br#"{"options":{"temperature":"hot"}}"#).unwrap_err();
        assert!(
            e.to_string().contains("options.temperature"),
            "{}",
            e.to_string()
        );
        let e = parse_json::<Req>(b"{not json").unwrap_err();
        assert!(e.to_string().starts_with("invalid JSON body"), "{e}");
        let e = parse_json::<Req>(b"").unwrap_err();
        assert!(e.to_string().contains("missing request body"), "{e}");
    }

    #[test]
    fn body_rules_have_their_own_variants() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Req {
            options: Option<OllamaOptions>,
        }
        assert_eq!(
            parse_json::<Req>(b"  \n").unwrap_err(),
            ValidationError::MissingBody
        );
        assert!(matches!(
            parse_json::<Req>(b"{not json").unwrap_err(),
            ValidationError::InvalidJson(m) if m.starts_with("key must be a string")
        ));
        assert!(matches!(
            parse_json::<Req>(br#"{"options":{"top_k":"many"}}"#).unwrap_err(),
            ValidationError::InvalidJson(m) if m.starts_with("options.top_k: invalid type")
        ));
    }

    #[test]
    fn length_options_have_their_own_variants() {
        let options = |num_predict, num_ctx| OllamaOptions {
            num_predict,
            num_ctx,
            ..OllamaOptions::default()
        };
        assert_eq!(
            options(Some(-3), None).to_params().unwrap_err(),
            ValidationError::NumPredict(-3)
        );
        assert_eq!(
            options(None, Some(-1)).to_params().unwrap_err(),
            ValidationError::NumCtx(-1)
        );
        assert_eq!(
            options(None, Some(0)).to_params().unwrap_err(),
            ValidationError::NumCtx(0)
        );
        let top_k = OllamaOptions {
            top_k: Some(-1),
            ..OllamaOptions::default()
        };
        assert_eq!(
            top_k.to_params().unwrap_err().to_string(),
            "options.top_k must be between 0 and 2147483647, got -1"
        );
        let threads = OllamaOptions {
            num_thread: Some(1_000_000),
            ..OllamaOptions::default()
        };
        assert_eq!(
            threads.to_params().unwrap_err().to_string(),
            "options.num_thread must be between 0 and 1024, got 1000000"
        );
    }
}
