//! Chat as llama.cpp's server does it, in safe Rust and without llama.cpp: no model needed.
//!
//! - [`template`]: a GGUF's `tokenizer.chat_template` (Jinja) rendered into the prompt text
//!   llama.cpp's server builds, with its workarounds keyed on what the template can do.
//! - [`tools`]: tool-call syntax per template family: detection, parsing a reply back into
//!   calls, holding call text back while streaming, the grammar that forces a call.
//! - [`limits`]: the bounds every render runs under (fuel, recursion, sizes, time), since a
//!   template is untrusted input.
//! - [`generic`]: llama.cpp's generic tool-call format, for templates that cannot describe
//!   tools: the system prompt, the reply's schema, parsing; plain-message fallbacks for
//!   tool calls and results in a history.
//!
//! Fixtures shared with other crates' tests live in `fixtures/` (e.g. Qwen 2.5's template).
pub mod generic;
pub mod limits;
pub mod template;
pub mod tools;

pub use limits::{LimitExceeded, RenderLimits};
pub use template::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions};
