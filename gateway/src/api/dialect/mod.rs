//! What the routes of one API family share, one module per family: how its
//! own request fields become the dialect-neutral [`crate::core::request`]
//! types, and its shapes of what comes back.
//!
//! - [`ollama`]: Ollama's `options` ([`ollama::OllamaOptions`]).
//! - [`openai`]: OpenAI's sampling fields ([`openai::OpenAiSampling`]) and
//!   tool calls, shared by chat and text completions, Responses and
//!   Anthropic's Messages.
pub mod ollama;
pub mod openai;

/// Rules both families' sampling fields obey.
#[cfg(test)]
mod tests {
    use super::ollama::OllamaOptions;
    use super::openai::OpenAiSampling;
    use crate::core::validation::ValidationError;

    #[test]
    fn bad_sampling_values_are_400s() {
        let o = OllamaOptions {
            top_p: Some(-1.0),
            ..Default::default()
        };
        assert!(o.to_params().is_err());
        let s = OpenAiSampling {
            temperature: Some(3.0),
            ..Default::default()
        };
        assert!(s.to_params().is_err());
    }

    #[test]
    fn sampling_rules_have_their_own_variants() {
        let ollama = OllamaOptions {
            repeat_penalty: Some(0.0),
            ..OllamaOptions::default()
        };
        let e = ollama.to_params().unwrap_err();
        assert_eq!(
            e,
            ValidationError::SamplingOption {
                prefix: "options.",
                message: "repeat_penalty must be > 0 (1.0 disables it), got 0".into()
            }
        );
        let hot = OpenAiSampling {
            temperature: Some(3.0),
            ..OpenAiSampling::default()
        };
        let e = hot.to_params().unwrap_err();
        assert_eq!(
            e,
            ValidationError::OutOfRange {
                field: "temperature",
                min: 0,
                max: 2,
                value: 3.0
            }
        );
        assert_eq!(e.to_string(), "temperature must be between 0 and 2, got 3");
        let pushy = OpenAiSampling {
            presence_penalty: Some(-2.5),
            ..OpenAiSampling::default()
        };
        assert_eq!(
            pushy.to_params().unwrap_err().to_string(),
            "presence_penalty must be between -2 and 2, got -2.5"
        );
    }

    #[test]
    fn option_ranges_have_their_own_variant() {
        let top_p = OllamaOptions {
            top_p: Some(5.0),
            ..OllamaOptions::default()
        };
        let e = top_p.to_params().unwrap_err();
        assert_eq!(
            e,
            ValidationError::OptionOutOfRange {
                field: "options.top_p",
                min: 0.0,
                max: 1.0,
                value: 5.0
            }
        );
        assert_eq!(
            e.to_string(),
            "options.top_p must be between 0 and 1, got 5"
        );
        let cold = OllamaOptions {
            temperature: Some(-1.0),
            ..OllamaOptions::default()
        };
        assert_eq!(
            cold.to_params().unwrap_err().to_string(),
            "options.temperature must be between 0 and 10, got -1"
        );
        let typical = OllamaOptions {
            typical_p: Some(1.5),
            ..OllamaOptions::default()
        };
        assert!(matches!(
            typical.to_params().unwrap_err(),
            ValidationError::OptionOutOfRange {
                field: "options.typical_p",
                ..
            }
        ));
        let openai = OpenAiSampling {
            top_p: Some(1.5),
            ..OpenAiSampling::default()
        };
        assert_eq!(
            openai.to_params().unwrap_err().to_string(),
            "top_p must be between 0 and 1, got 1.5"
        );
        assert!(OllamaOptions::default().to_params().is_ok());
    }
}
