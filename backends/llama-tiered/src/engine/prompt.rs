//! From messages or raw text to the token ids fed to the model.
use crate::error::EngineError;
use crate::llama::Model;
use hypura_chat::{ChatMessage, ChatTemplate, RenderOptions};

/// ChatML, used for models whose GGUF carries no `tokenizer.chat_template`
/// (llama.cpp's server falls back to it too).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The model's own chat template (ChatML when it has none).
pub fn model_template(model: &Model) -> Result<ChatTemplate, EngineError> {
    let source = model
        .meta("tokenizer.chat_template")
        .unwrap_or_else(|| CHATML_TEMPLATE.to_string());
    let bos = model
        .token_bos()
        .and_then(|t| model.token_text(t))
        .unwrap_or_default();
    let eos = model
        .token_eos()
        .and_then(|t| model.token_text(t))
        .unwrap_or_default();
    ChatTemplate::new(&source, &bos, &eos).map_err(|e| EngineError::Template(e.to_string()))
}

/// Renders `messages` with `template` (ending with the assistant's turn opened).
pub fn render_chat(
    template: &ChatTemplate,
    messages: &[ChatMessage],
) -> Result<String, EngineError> {
    if messages.is_empty() {
        return Err(EngineError::InvalidArgument("no messages to render".into()));
    }
    template
        .render(messages, &RenderOptions::default())
        .map_err(|e| EngineError::Template(e.to_string()))
}

/// Tokenizes a rendered chat prompt: special-token text becomes special
/// tokens, and BOS is added only when the model wants one and the template
/// did not already write it (so it is never doubled).
pub fn tokenize_chat(model: &Model, rendered: &str) -> Result<Vec<i32>, EngineError> {
    let bos_text = model
        .token_bos()
        .and_then(|t| model.token_text(t))
        .unwrap_or_default();
    let has_bos = !bos_text.is_empty() && rendered.starts_with(&bos_text);
    model.tokenize(rendered, !has_bos, true)
}

/// Tokenizes a raw prompt as llama.cpp's completion endpoint does: BOS added
/// when the model wants one, special-token text parsed.
pub fn tokenize_raw(model: &Model, prompt: &str) -> Result<Vec<i32>, EngineError> {
    model.tokenize(prompt, true, true)
}
