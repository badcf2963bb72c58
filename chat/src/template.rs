//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja) rendered with
//! minijinja into the same prompt string llama.cpp's server builds.
//!
//! What we mirror, with the llama.cpp sources it comes from (the vendored
//! `llama-cpp-sys-2` 0.1.161 tree: `common/chat.cpp` and its own Jinja engine in
//! `common/jinja/`):
//!
//! - **Whitespace**: `trim_blocks` and `lstrip_blocks` on, one trailing newline
//!   of the source dropped (`jinja/lexer.cpp`, "default config for chat
//!   template"), like Hugging Face transformers.
//! - **Context** (`common_chat_template_direct_apply_impl`): `messages`,
//!   `bos_token`, `eos_token`, `enable_thinking` (true), `tools` only when there
//!   is at least one, then `datetime` ("%b %d %Y") and `date_string`
//!   ("%d %b %Y") of now in local time (`common_chat_extra_context`), then the
//!   caller's extra variables (`chat_template_kwargs`, which override those),
//!   and `add_generation_prompt` *only when true* (otherwise it is undefined).
//!   `preserve_reasoning` and `reasoning_effort` are aliased as llama.cpp does
//!   (`jinja/caps.cpp`).
//! - **Messages** as `common_chat_msg::to_json_oaicompat` writes them: keys
//!   `role`, `content` (always a string, `""` when empty), `name`,
//!   `tool_call_id`, `tool_calls` (`{type, function: {name, arguments}, id}`),
//!   in that order; tools as `{type, function: {name, description, parameters}}`
//!   (`common_chat_tools_to_json_oaicompat`).
//! - **Workarounds keyed on what the template can do** (`common_chat_templates_apply_jinja`;
//!   llama.cpp finds the capabilities by tracing value use while rendering probe
//!   conversations, we find them by rendering probes with marker strings, see
//!   [`TemplateCaps`]): `developer` becomes `system` (unless the template is
//!   GPT-OSS's, which has `<|channel|>`); a system message the template ignores or
//!   rejects is merged into the next message with `"\n"`; content becomes
//!   `[{"type": "text", "text": …}]` for templates that only read typed
//!   content; tool-call arguments are parsed into objects for templates that
//!   read them as objects.
//! - **Functions and filters**: `raise_exception(msg)` fails the render with
//!   [`ChatTemplateError::Raised`] carrying `msg`; `strftime_now(fmt)` formats now
//!   in local time; Python string/dict methods (`.strip()`, `.split()`,
//!   `.items()`, …) through minijinja-contrib's pycompat; `tojson` with Python
//!   `json.dumps` spacing (`", "`, `": "`, `","` when indenting), key order
//!   kept, non-ASCII kept unless `ensure_ascii=true` (`jinja/value.cpp`,
//!   `tojson`); `{{ x }}` and `|string` print `True`/`False`/`None` and Python
//!   reprs of lists and dicts, as llama.cpp does; `{% generation %}` blocks
//!   (transformers-only) are accepted and ignored (`jinja/parser.cpp`).
//!
//! **BOS**: many templates write `bos_token` themselves. llama.cpp then strips
//! that leading BOS text when the vocabulary adds BOS on its own and tokenizes
//! with special tokens added (chat.cpp, end of `common_chat_template_direct_apply_impl`);
//! [`ChatTemplate::render`] returns the template's full output and
//! [`ChatTemplate::strip_vocab_specials`] applies llama.cpp's stripping, so
//! `tokenize(strip_vocab_specials(r, add_bos, add_eos), add_special = true,
//! parse_special = true)` gives llama.cpp's tokens. Equivalently, tokenize the
//! full output with `add_special = false` when [`ChatTemplate::starts_with_bos`].
//!
//! Known differences: llama.cpp prints floats through C++ streams (`tojson`:
//! six significant digits, `1.0` → `1`; `{{ x }}`: `%f` with trailing zeros
//! cut) and so do we; `tojson(sort_keys=true)` sorts here but is an error in
//! llama.cpp; local time comes from chrono's `Local` (the `TZ` variable or
//! `/etc/localtime`), as C's `localtime` reads them.
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, Local};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value as Json};

use crate::limits::{self, LimitExceeded, RenderLimits};

/// Name of the one template in each environment.
const TEMPLATE_NAME: &str = "chat_template";
/// Context variable carrying the render's clock (Unix milliseconds) to
/// `strftime_now`; the double underscore keeps it out of templates' way.
const NOW_VAR: &str = "__hypura_now_unix_ms";

/// One chat message, as OpenAI-style APIs send it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (`developer` is read as `system`).
    pub role: String,
    /// The text; a JSON `null` (assistant turns that only call tools) reads as `""`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// OpenAI tool calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`,
    /// `arguments` a JSON string or object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Json>,
    /// For `tool` messages: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For `tool` messages: the id of the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with only a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            name: None,
            tool_call_id: None,
        }
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_default())
}

/// Per-request rendering inputs besides the messages.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// End with the opening of an assistant turn (llama.cpp's default: true).
    pub add_generation_prompt: bool,
    /// OpenAI `tools` array; `None`, `null` or `[]` leave `tools` undefined.
    pub tools: Option<Json>,
    /// Extra template variables (llama.cpp's `chat_template_kwargs`), e.g.
    /// `enable_thinking`, `date_string`; they override the built-in ones.
    pub extra: Map<String, Json>,
    /// Clock for `date_string`, `datetime` and `strftime_now`; `None` is now.
    pub now: Option<SystemTime>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            tools: None,
            extra: Map::new(),
            now: None,
        }
    }
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source is not valid Jinja; override the model's template.
    #[error("the chat template does not compile: {0}; override it with a valid Jinja template")]
    Syntax(String),
    /// The template called `raise_exception(message)`: the conversation breaks
    /// one of its rules (e.g. roles must alternate user/assistant).
    #[error("the chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering failed inside the template (an unsupported construct, a type error).
    #[error("the chat template failed to render: {0}")]
    Render(String),
    /// A message or tool is malformed.
    #[error("invalid {field}: {reason}")]
    InvalidInput { field: &'static str, reason: String },
    /// The render hit one of its [`RenderLimits`]: the template loops,
    /// recurses or builds text without bound.
    #[error("the chat template was stopped: {0}; fix the template or override it")]
    Limit(#[from] LimitExceeded),
}

/// What a template does with its inputs, found at [`ChatTemplate::new`] by
/// rendering probe conversations (llama.cpp: `jinja::caps_get`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateCaps {
    /// A leading system message reaches the output; when false it is merged
    /// into the next message.
    pub system_role: bool,
    /// Plain string content reaches the output; when false (templates that
    /// only read `[{"type": "text", "text": …}]` parts) content is wrapped.
    pub string_content: bool,
    /// Tool-call arguments are read as an object (e.g. `arguments | tojson`);
    /// when true, string arguments are parsed before rendering.
    pub object_arguments: bool,
    /// An assistant's `tool_calls` reach the output; when false they are
    /// written into its content ([`crate::generic::polyfill_messages`]).
    pub tool_calls: bool,
    /// A `tool` message's content reaches the output (the template does not
    /// skip or reject the role); when false it becomes a user message.
    pub tool_responses: bool,
}

/// A compiled chat template with the model's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    limits: RenderLimits,
    source: String,
    bos_token: String,
    eos_token: String,
    caps: TemplateCaps,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("caps", &self.caps)
            .field("limits", &self.limits)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` once and probes what it supports. `bos_token` and
    /// `eos_token` are the texts of the vocabulary's BOS/EOS tokens (empty if
    /// it has none).
    /// Every render, the probes included, runs under [`RenderLimits::default`]:
    /// a template that hits a limit on a probe conversation is refused here.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        Self::with_limits(source, bos_token, eos_token, RenderLimits::default())
    }

    /// [`ChatTemplate::new`] with other render limits.
    pub fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: RenderLimits,
    ) -> Result<Self, ChatTemplateError> {
        let env = build_environment(source, limits)?;
        let mut template = Self {
            env,
            limits,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            caps: TemplateCaps {
                system_role: true,
                string_content: true,
                object_arguments: false,
                tool_calls: true,
                tool_responses: true,
            },
        };
        template.caps = template.probe_caps()?;
        Ok(template)
    }

    /// Renders the conversation; the result is the template's whole output
    /// (BOS text included if the template writes it).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let messages = self.messages_json(messages)?;
        let tools = tools_json(opts.tools.as_ref())?;
        let context = self.context(messages, tools, opts);
        self.render_json(context)
    }

    /// Whether the template source mentions `tools` (it can describe tools).
    pub fn supports_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// The template text as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS text the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The limits every render runs under.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// What the probes found the template to support.
    pub fn caps(&self) -> TemplateCaps {
        self.caps
    }

    /// True when `rendered` begins with the BOS text, so tokenizing it must
    /// not add another BOS.
    pub fn starts_with_bos(&self, rendered: &str) -> bool {
        !self.bos_token.is_empty() && rendered.starts_with(&self.bos_token)
    }

    /// The prompt llama.cpp hands its tokenizer (which then adds the
    /// vocabulary's special tokens): a leading BOS text is cut when the
    /// vocabulary adds BOS itself, a trailing EOS text when it adds EOS.
    pub fn strip_vocab_specials<'a>(
        &self,
        rendered: &'a str,
        vocab_adds_bos: bool,
        vocab_adds_eos: bool,
    ) -> &'a str {
        let mut prompt = rendered;
        if vocab_adds_bos {
            prompt = prompt
                .strip_prefix(self.bos_token.as_str())
                .unwrap_or(prompt);
        }
        if vocab_adds_eos {
            prompt = prompt
                .strip_suffix(self.eos_token.as_str())
                .unwrap_or(prompt);
        }
        prompt
    }

    fn render_json(&self, context: Map<String, Json>) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|err| ChatTemplateError::Render(err.to_string()))?;
        let rendered = template
            .render(Value::from_serialize(&context))
            .map_err(|err| render_error(err, &self.limits))?;
        if rendered.len() > self.limits.max_output_bytes {
            return Err(LimitExceeded::Output {
                max_bytes: self.limits.max_output_bytes,
                what: format!("the rendered prompt, {} bytes", rendered.len()),
            }
            .into());
        }
        Ok(rendered)
    }

    /// The variables llama.cpp passes, in its order (later keys override).
    fn context(
        &self,
        messages: Json,
        tools: Option<Json>,
        opts: &RenderOptions,
    ) -> Map<String, Json> {
        let now = opts.now.unwrap_or_else(SystemTime::now);
        let local = DateTime::<Local>::from(now);
        let mut context = Map::new();
        context.insert("messages".into(), messages);
        context.insert("bos_token".into(), self.bos_token.clone().into());
        context.insert("eos_token".into(), self.eos_token.clone().into());
        context.insert("enable_thinking".into(), true.into());
        if let Some(tools) = tools {
            context.insert("tools".into(), tools);
        }
        let datetime = local.format("%b %d %Y").to_string();
        let date_string = local.format("%d %b %Y").to_string();
        context.insert("datetime".into(), datetime.into());
        context.insert("date_string".into(), date_string.into());
        for (key, value) in &opts.extra {
            context.insert(key.clone(), value.clone());
        }
        if opts.add_generation_prompt {
            context.insert("add_generation_prompt".into(), true.into());
        }
        apply_reasoning_aliases(&mut context);
        context.insert(NOW_VAR.into(), unix_millis(now).into());
        context
    }

    /// Messages as llama.cpp's jinja path sees them, workarounds applied.
    fn messages_json(&self, messages: &[ChatMessage]) -> Result<Json, ChatTemplateError> {
        let map_developer = !self.source.contains("<|channel|>");
        let messages = crate::generic::polyfill_messages(
            messages,
            !self.caps.tool_calls,
            !self.caps.tool_responses,
        );
        let mut out = Vec::with_capacity(messages.len());
        for message in &messages {
            let mut json = message_json(message, self.caps.object_arguments)?;
            if map_developer && message.role == "developer" {
                json.insert("role".into(), "system".into());
            }
            out.push(json);
        }
        if !self.caps.system_role {
            merge_system_into_next(&mut out);
        }
        if !self.caps.string_content {
            for message in &mut out {
                wrap_content_as_parts(message);
            }
        }
        Ok(Json::Array(out.into_iter().map(Json::Object).collect()))
    }

    fn probe_caps(&self) -> Result<TemplateCaps, ChatTemplateError> {
        const SYSTEM_MARKER: &str = "hypura-probe-system";
        const CONTENT_MARKER: &str = "hypura-probe-content";
        let system_role = self
            .probe(json!([
                {"role": "system", "content": SYSTEM_MARKER},
                {"role": "user", "content": "User message"},
            ]))?
            .is_some_and(|out| out.contains(SYSTEM_MARKER));
        let reads_string = self
            .probe(json!([{"role": "user", "content": CONTENT_MARKER}]))?
            .is_some_and(|out| out.contains(CONTENT_MARKER));
        let reads_parts = self
            .probe(json!([
                {"role": "user", "content": [{"type": "text", "text": CONTENT_MARKER}]}
            ]))?
            .is_some_and(|out| out.contains(CONTENT_MARKER));
        // llama.cpp's tool-call probe: the call's name or arguments, and the
        // tool's answer, reach the output.
        let tools_probe = self.probe(tool_call_probe(json!({ "arg": TOOL_ARG_MARKER })))?;
        let shows = |marker: &str| tools_probe.as_ref().is_some_and(|out| out.contains(marker));
        Ok(TemplateCaps {
            system_role,
            string_content: reads_string || !reads_parts,
            object_arguments: self.probe_object_arguments(tools_probe.as_deref()),
            tool_calls: shows(TOOL_NAME_MARKER) || shows(TOOL_ARG_MARKER),
            tool_responses: shows(TOOL_RESPONSE_MARKER),
        })
    }

    /// llama.cpp counts arguments as read as an object when the template
    /// touches a member (`arguments.x`, `| items`, `| tojson`); printing the
    /// whole object (`{{ arguments }}`, a Python repr) does not count. So: the
    /// marker must reach the output some other way than that repr.
    fn probe_object_arguments(&self, tools_probe: Option<&str>) -> bool {
        let printed_whole = format!("{{'arg': '{TOOL_ARG_MARKER}'}}");
        tools_probe.is_some_and(|out| out.replace(&printed_whole, "").contains(TOOL_ARG_MARKER))
    }

    /// Renders a probe conversation with llama.cpp's probe context
    /// (`caps_try_execute`): empty `tools`, empty BOS/EOS, generation prompt on.
    /// A probe the template rejects is `None`; one that hits a limit, an error.
    fn probe(&self, messages: Json) -> Result<Option<String>, ChatTemplateError> {
        let mut context = Map::new();
        context.insert("messages".into(), messages);
        context.insert("tools".into(), probe_tools());
        context.insert("bos_token".into(), "".into());
        context.insert("eos_token".into(), "".into());
        context.insert("add_generation_prompt".into(), true.into());
        context.insert(NOW_VAR.into(), unix_millis(SystemTime::now()).into());
        match self.render_json(context) {
            Ok(rendered) => Ok(Some(rendered)),
            Err(err @ ChatTemplateError::Limit(_)) => Err(err),
            Err(_) => Ok(None),
        }
    }
}

fn build_environment(
    source: &str,
    limits: RenderLimits,
) -> Result<Environment<'static>, ChatTemplateError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    limits::bound_environment(&mut env, limits);
    env.set_formatter(move |out, state, value| {
        limits::check_printable(&limits, value)?;
        let text = python_str(value);
        limits::charge_output(state, &limits, text.len())?;
        Ok(out.write_str(&text)?)
    });
    let tojson = Value::from_function(tojson);
    limits::add_bounded_filter(&mut env, limits, "tojson", tojson);
    let string = Value::from_function(|value: &Value| python_str(value));
    limits::add_bounded_filter(&mut env, limits, "string", string);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(TEMPLATE_NAME, normalize_source(source))
        .map_err(|err| ChatTemplateError::Syntax(err.to_string()))?;
    Ok(env)
}

/// What llama.cpp's lexer does before reading a template: `\r\n` and lone
/// `\r` become `\n` (`jinja/lexer.cpp`), and `{% generation %}` tags are
/// dropped (`jinja/parser.cpp`).
fn normalize_source(source: &str) -> String {
    without_generation_tags(&source.replace("\r\n", "\n").replace('\r', "\n"))
}

/// Turns transformers' `{% generation %}…{% endgeneration %}` into
/// `{% if true %}…{% endif %}`, keeping whitespace-control markers.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let Some(close) = rest[open..].find("%}").map(|i| open + i) else {
            break;
        };
        let inner = &rest[open + 2..close];
        let word = inner
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        out.push_str(&rest[..open + 2]);
        match replacement {
            Some(new_word) => out.push_str(&inner.replacen(word, new_word, 1)),
            None => out.push_str(inner),
        }
        out.push_str("%}");
        rest = &rest[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Marks an error as coming from the template's own `raise_exception`.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = python_str(&message);
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedByTemplate(message)))
}

fn render_error(err: Error, limits: &RenderLimits) -> ChatTemplateError {
    if let Some(hit) = LimitExceeded::from_error(&err, limits) {
        return ChatTemplateError::Limit(hit);
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(current) = cause {
        if let Some(raised) = current.downcast_ref::<RaisedByTemplate>() {
            return ChatTemplateError::Raised(raised.0.clone());
        }
        cause = current.source();
    }
    ChatTemplateError::Render(err.to_string())
}

/// `strftime_now(format)`: the render's clock in local time, C `strftime` syntax.
fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|ms| ms.as_i64())
        .and_then(|ms| u64::try_from(ms).ok())
        .map_or_else(SystemTime::now, |ms| UNIX_EPOCH + Duration::from_millis(ms));
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        DateTime::<Local>::from(now).format_with_items(items.into_iter())
    )?;
    Ok(out)
}

fn unix_millis(time: SystemTime) -> i64 {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    i64::try_from(millis).unwrap_or(i64::MAX)
}

/// llama.cpp's `caps_apply_preserve_reasoning` / `caps_apply_reasoning_effort`.
fn apply_reasoning_aliases(context: &mut Map<String, Json>) {
    if let Some(&Json::Bool(preserve)) = context.get("preserve_reasoning") {
        context.insert("preserve_thinking".into(), preserve.into());
        for key in [
            "clear_thinking",
            "truncate_history_thinking",
            "drop_thinking",
        ] {
            context.insert(key.into(), (!preserve).into());
        }
    }
    if let Some(Json::String(effort)) = context.get("reasoning_effort") {
        if !effort.is_empty() {
            let effort = effort.clone();
            context.insert("reasoning_strength".into(), effort.into());
        }
    }
}

/// One message as `common_chat_msg::to_json_oaicompat` writes it.
fn message_json(
    message: &ChatMessage,
    object_arguments: bool,
) -> Result<Map<String, Json>, ChatTemplateError> {
    let mut json = Map::new();
    json.insert("role".into(), message.role.clone().into());
    json.insert("content".into(), message.content.clone().into());
    if let Some(name) = message.name.as_ref().filter(|name| !name.is_empty()) {
        json.insert("name".into(), name.clone().into());
    }
    if let Some(id) = message.tool_call_id.as_ref().filter(|id| !id.is_empty()) {
        json.insert("tool_call_id".into(), id.clone().into());
    }
    if let Some(calls) = &message.tool_calls {
        let calls = tool_calls_json(calls, object_arguments)?;
        if !calls.is_empty() {
            json.insert("tool_calls".into(), Json::Array(calls));
        }
    }
    Ok(json)
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ChatTemplateError {
    ChatTemplateError::InvalidInput {
        field,
        reason: reason.into(),
    }
}

/// Tool calls rebuilt as llama.cpp does (`common_chat_msgs_parse_oaicompat`),
/// arguments a JSON string, or the parsed object for `object_arguments` templates.
fn tool_calls_json(calls: &Json, object_arguments: bool) -> Result<Vec<Json>, ChatTemplateError> {
    let calls = match calls {
        Json::Null => return Ok(Vec::new()),
        Json::Array(calls) => calls,
        other => {
            return Err(invalid(
                "tool_calls",
                format!("expected an array, got {other}"),
            ))
        }
    };
    calls
        .iter()
        .map(|call| tool_call_json(call, object_arguments))
        .collect()
}

fn tool_call_json(call: &Json, object_arguments: bool) -> Result<Json, ChatTemplateError> {
    if call.get("type").and_then(Json::as_str) != Some("function") {
        return Err(invalid(
            "tool_calls",
            format!("each call needs \"type\": \"function\", got {call}"),
        ));
    }
    let function = call.get("function");
    let Some(name) = function.and_then(|f| f.get("name")).and_then(Json::as_str) else {
        return Err(invalid(
            "tool_calls",
            format!("call without a function name: {call}"),
        ));
    };
    let arguments = match function.and_then(|f| f.get("arguments")) {
        Some(Json::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => {
            return Err(invalid(
                "tool_calls",
                format!("call {name} has no arguments"),
            ))
        }
    };
    let arguments = if object_arguments {
        serde_json::from_str(&arguments).map_err(|err| {
            invalid(
                "tool_calls",
                format!("arguments of call {name} are not JSON: {err}"),
            )
        })?
    } else {
        Json::String(arguments)
    };
    let mut out = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(id) = call
        .get("id")
        .and_then(Json::as_str)
        .filter(|id| !id.is_empty())
    {
        out["id"] = id.into();
    }
    Ok(out)
}

/// Tools rebuilt as llama.cpp does; `None` when there are none.
fn tools_json(tools: Option<&Json>) -> Result<Option<Json>, ChatTemplateError> {
    let tools = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(tools)) => tools,
        Some(other) => return Err(invalid("tools", format!("expected an array, got {other}"))),
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let tools = tools.iter().map(tool_json).collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Json::Array(tools)))
}

fn tool_json(tool: &Json) -> Result<Json, ChatTemplateError> {
    if tool.get("type").and_then(Json::as_str) != Some("function") {
        return Err(invalid(
            "tools",
            format!("each tool needs \"type\": \"function\", got {tool}"),
        ));
    }
    let function = tool.get("function");
    let Some(name) = function.and_then(|f| f.get("name")).and_then(Json::as_str) else {
        return Err(invalid(
            "tools",
            format!("tool without a function name: {tool}"),
        ));
    };
    let field = |key: &str| function.and_then(|f| f.get(key)).filter(|v| !v.is_null());
    let description = field("description").cloned().unwrap_or_else(|| "".into());
    let parameters = field("parameters").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }))
}

/// llama.cpp's `system_message_not_supported` workaround.
fn merge_system_into_next(messages: &mut Vec<Map<String, Json>>) {
    if messages
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Json::as_str)
        != Some("system")
    {
        return;
    }
    let system = messages.remove(0);
    if let Some(next) = messages.first_mut() {
        let text = |m: &Map<String, Json>| {
            m.get("content")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let merged = format!("{}\n{}", text(&system), text(next));
        next.insert("content".into(), merged.into());
    }
}

fn wrap_content_as_parts(message: &mut Map<String, Json>) {
    if let Some(Json::String(text)) = message.get("content") {
        let parts = json!([{"type": "text", "text": text}]);
        message.insert("content".into(), parts);
    }
}

const TOOL_ARG_MARKER: &str = "hypura-probe-argument";
const TOOL_NAME_MARKER: &str = "tool1";
const TOOL_RESPONSE_MARKER: &str = "Tool response";

/// llama.cpp's tool-call probe conversation (`caps_get`), with `arguments` given.
fn tool_call_probe(arguments: Json) -> Json {
    json!([
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call00001",
            "type": "function",
            "function": {"name": TOOL_NAME_MARKER, "arguments": arguments},
        }]},
        {"role": "tool", "content": TOOL_RESPONSE_MARKER, "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ])
}

fn probe_tools() -> Json {
    json!([{
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }])
}

/// How `{{ value }}` prints: strings as they are, everything else as llama.cpp's
/// (Python-like) `as_string`.
fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => python_repr(value),
    }
}

/// Python-like repr: `True`, `None`, `'text'`, `['a', 1]`, `{'k': 'v'}`.
fn python_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_str(value),
        ValueKind::String => {
            let text = value.as_str().unwrap_or_default();
            if text.contains('\'') {
                let mut out = String::new();
                write_json_string(&mut out, text, false);
                out
            } else {
                format!("'{text}'")
            }
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = iter_values(value).map(|item| python_repr(&item)).collect();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = iter_values(value)
                .map(|key| {
                    let item = value.get_item(&key).unwrap_or_default();
                    format!("{}: {}", python_repr(&key), python_repr(&item))
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

fn iter_values(value: &Value) -> impl Iterator<Item = Value> {
    value.try_iter().into_iter().flatten()
}

/// Integers in decimal; floats as C++ `std::to_string` with trailing zeros cut
/// (llama.cpp `value_float_t::as_string`): `0.5`, `2.0`.
fn number_str(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if !float.is_finite() {
        return c_nonfinite(float);
    }
    let mut out = format!("{float:.6}");
    out.truncate(out.trim_end_matches('0').len());
    if out.ends_with('.') {
        out.push('0');
    }
    out
}

fn c_nonfinite(float: f64) -> String {
    match (float.is_nan(), float.is_sign_negative()) {
        (true, _) => "nan".into(),
        (false, true) => "-inf".into(),
        (false, false) => "inf".into(),
    }
}

/// Floats as a C++ stream writes a double (llama.cpp `value_to_json`): `%g`
/// with six significant digits, so `1.0` → `1`, `1e-07`.
fn json_float(float: f64) -> String {
    if !float.is_finite() {
        return c_nonfinite(float);
    }
    if float == 0.0 {
        return if float.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let scientific = format!("{float:.5e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim_fraction(mantissa), exponent.abs());
    }
    let decimals = usize::try_from(5 - exponent).unwrap_or(0);
    trim_fraction(&format!("{float:.decimals$}")).to_owned()
}

fn trim_fraction(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

/// Output style of `tojson`, as Python's `json.dumps` arguments.
struct JsonStyle {
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// the signature transformers and llama.cpp give it.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match ensure_ascii {
        Some(value) => Some(value),
        None => kwargs.get::<Option<Value>>("ensure_ascii")?,
    };
    let indent = match indent {
        Some(value) => Some(value),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = indent
        .and_then(|v| v.as_i64())
        .and_then(|v| usize::try_from(v).ok());
    let separator = |index: usize| {
        let separators = separators.as_ref()?;
        let item = separators.get_item_by_index(index).ok()?;
        item.as_str().map(str::to_owned)
    };
    let style = JsonStyle {
        indent,
        item_separator: separator(0)
            .unwrap_or_else(|| if indent.is_some() { "," } else { ", " }.into()),
        key_separator: separator(1).unwrap_or_else(|| ": ".into()),
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0);
    Ok(Value::from(out))
}

fn write_json(out: &mut String, value: &Value, style: &JsonStyle, level: usize) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => {
            out.push_str(&json_float(
                f64::try_from(value.clone()).unwrap_or(f64::NAN),
            ));
        }
        ValueKind::String => {
            write_json_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = iter_values(value).collect();
            write_json_container(out, ('[', ']'), items.len(), style, level, |out, index| {
                write_json(out, &items[index], style, level + 1);
            });
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = iter_values(value).collect();
            if style.sort_keys {
                keys.sort_by_cached_key(python_str);
            }
            write_json_container(out, ('{', '}'), keys.len(), style, level, |out, index| {
                let key = &keys[index];
                write_json_string(out, &python_str(key), style.ensure_ascii);
                out.push_str(&style.key_separator);
                let item = value.get_item(key).unwrap_or_default();
                write_json(out, &item, style, level + 1);
            });
        }
        _ => out.push_str("null"),
    }
}

fn write_json_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    style: &JsonStyle,
    level: usize,
    mut write_item: impl FnMut(&mut String, usize),
) {
    out.push(open);
    if len > 0 {
        for index in 0..len {
            if index > 0 {
                out.push_str(&style.item_separator);
            }
            if let Some(indent) = style.indent {
                out.push('\n');
                out.push_str(&" ".repeat(indent * (level + 1)));
            }
            write_item(out, index);
        }
        if let Some(indent) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent * level));
        }
    }
    out.push(close);
}

/// A JSON string as Python's `json.dumps` writes it.
fn write_json_string(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HuggingFaceTB/SmolLM2-135M-Instruct (as embedded in its GGUF).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// Plain ChatML (teknium/OpenHermes-2.5-Mistral-7B).
    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// mistralai/Mixtral-8x7B-Instruct-v0.1 and Mistral-7B-Instruct-v0.2.
    const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

    /// google/gemma-2-2b-it.
    const GEMMA_2: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

    /// google/gemma-3-*-it.
    const GEMMA_3: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"#;

    /// meta-llama/Llama-3.1-8B-Instruct (identical in Llama-3.3-70B-Instruct).
    const LLAMA_3_1: &str = r#"{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

    /// Qwen/Qwen2.5-*-Instruct.
    const QWEN_2_5: &str = include_str!("../fixtures/qwen2.5-instruct.jinja");

    const QUESTION: &str = "What is the capital of France?";

    fn template(source: &str, bos: &str, eos: &str) -> ChatTemplate {
        ChatTemplate::new(source, bos, eos).expect("template compiles")
    }

    fn render_with(tmpl: &ChatTemplate, messages: &[ChatMessage], opts: &RenderOptions) -> String {
        tmpl.render(messages, opts).expect("template renders")
    }

    fn render(tmpl: &ChatTemplate, messages: &[ChatMessage]) -> String {
        render_with(tmpl, messages, &RenderOptions::default())
    }

    fn one_user() -> Vec<ChatMessage> {
        vec![ChatMessage::new("user", QUESTION)]
    }

    /// System + user + assistant + user.
    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "You are a helpful assistant"),
            ChatMessage::new("user", "Hello"),
            ChatMessage::new("assistant", "Hi there"),
            ChatMessage::new("user", "Who are you"),
        ]
    }

    fn with_date_string(date: &str) -> RenderOptions {
        let mut opts = RenderOptions::default();
        opts.extra.insert("date_string".into(), date.into());
        opts
    }

    /// 2023-11-14 12:00:00 UTC: the same calendar day in every zone from UTC-11 to UTC+11.
    fn noon_14_nov_2023() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_699_963_200)
    }

    fn weather_tool() -> Json {
        serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather",
                "description": "Get the current weather in a city",
                "parameters": {"type": "object",
                    "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
                    "required": ["city"]}}}]"#,
        )
        .expect("valid JSON")
    }

    fn with_tools(tools: Json) -> RenderOptions {
        RenderOptions {
            tools: Some(tools),
            ..RenderOptions::default()
        }
    }

    #[test]
    fn smollm2_adds_its_default_system_prompt() {
        let tmpl = template(SMOLLM2, "<|im_start|>", "<|im_end|>");
        assert_eq!(
            render(&tmpl, &one_user()),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_keeps_a_given_system_prompt() {
        let tmpl = template(SMOLLM2, "<|im_start|>", "<|im_end|>");
        assert_eq!(
            render(&tmpl, &conversation()),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_renders_turns_and_generation_prompt() {
        let tmpl = template(CHATML, "<s>", "</s>");
        assert_eq!(
            render(&tmpl, &one_user()),
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(&tmpl, &conversation()),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"
        );
        let no_prompt = RenderOptions {
            add_generation_prompt: false,
            ..RenderOptions::default()
        };
        assert_eq!(
            render_with(&tmpl, &one_user(), &no_prompt),
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        );
        assert!(!tmpl.starts_with_bos(&render(&tmpl, &one_user())));
    }

    #[test]
    fn llama_3_1_writes_bos_headers_and_the_date() {
        let tmpl = template(LLAMA_3_1, "<|begin_of_text|>", "<|eot_id|>");
        let opts = with_date_string("15 Mar 2025");
        assert_eq!(
            render_with(&tmpl, &one_user(), &opts),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 15 Mar 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render_with(&tmpl, &conversation(), &opts),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 15 Mar 2025\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn date_string_defaults_to_the_render_clock_like_llama_cpp() {
        let tmpl = template(LLAMA_3_1, "<|begin_of_text|>", "<|eot_id|>");
        let opts = RenderOptions {
            now: Some(noon_14_nov_2023()),
            ..RenderOptions::default()
        };
        let rendered = render_with(&tmpl, &one_user(), &opts);
        assert!(
            rendered.contains("Today Date: 14 Nov 2023\n\n"),
            "{rendered}"
        );
    }

    #[test]
    fn llama_3_1_puts_tools_in_the_first_user_message_with_indented_json() {
        let tmpl = template(LLAMA_3_1, "<|begin_of_text|>", "<|eot_id|>");
        let mut opts = with_tools(weather_tool());
        opts.extra
            .insert("date_string".into(), "15 Mar 2025".into());
        let tool = r#"{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "City name, e.g. Paris"
                }
            },
            "required": [
                "city"
            ]
        }
    }
}"#;
        let expected = format!(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 15 Mar 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {{\"name\": function name, \"parameters\": dictionary of argument name and its value}}.Do not use variables.\n\n{tool}\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(render_with(&tmpl, &one_user(), &opts), expected);
    }

    /// A call and its result, as OpenAI clients send them back.
    fn called_and_answered() -> Vec<ChatMessage> {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(serde_json::json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]));
        let mut result = ChatMessage::new("tool", "18 C");
        result.tool_call_id = Some("call_1".into());
        vec![ChatMessage::new("user", "Weather in Paris?"), call, result]
    }

    /// SmolLM2 prints neither calls (written into the content, as llama.cpp
    /// does) nor anything tool-specific, but does print a `tool` turn.
    #[test]
    fn smollm2_gets_calls_as_content_and_keeps_its_tool_turn() {
        let tmpl = template(SMOLLM2, "<|im_start|>", "<|im_end|>");
        assert!(!tmpl.caps().tool_calls);
        assert!(tmpl.caps().tool_responses);
        assert_eq!(
            render(&tmpl, &called_and_answered()),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nWeather in Paris?<|im_end|>\n\
             <|im_start|>assistant\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"},\"id\":\"call_1\"}]}<|im_end|>\n\
             <|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// Gemma 2 rejects any role but user and model: a tool result becomes a user turn.
    #[test]
    fn gemma_2_gets_tool_results_as_user_turns() {
        let tmpl = template(GEMMA_2, "<bos>", "<eos>");
        assert!(!tmpl.caps().tool_calls && !tmpl.caps().tool_responses);
        assert_eq!(
            render(&tmpl, &called_and_answered()),
            "<bos><start_of_turn>user\nWeather in Paris?<end_of_turn>\n\
             <start_of_turn>model\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"},\"id\":\"call_1\"}]}<end_of_turn>\n\
             <start_of_turn>user\n{\"tool_response\":{\"content\":\"18 C\",\"tool_call_id\":\"call_1\"}}<end_of_turn>\n\
             <start_of_turn>model\n"
        );
        let qwen = template(QWEN_2_5, "", "<|im_end|>");
        assert!(qwen.caps().tool_calls && qwen.caps().tool_responses);
    }

    #[test]
    fn gemma_2_gets_the_system_prompt_merged_into_the_first_user_turn() {
        let tmpl = template(GEMMA_2, "<bos>", "<eos>");
        assert!(!tmpl.caps().system_role);
        assert_eq!(
            render(&tmpl, &one_user()),
            "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render(&tmpl, &conversation()),
            "<bos><start_of_turn>user\nYou are a helpful assistant\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn gemma_3_folds_the_system_prompt_itself() {
        let tmpl = template(GEMMA_3, "<bos>", "<eos>");
        assert!(tmpl.caps().system_role);
        assert_eq!(
            render(&tmpl, &one_user()),
            "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render(&tmpl, &conversation()),
            "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn mistral_wraps_user_turns_in_inst_and_merges_the_system_prompt() {
        let tmpl = template(MISTRAL, "<s>", "</s>");
        assert_eq!(
            render(&tmpl, &one_user()),
            "<s>[INST] What is the capital of France? [/INST]"
        );
        let rendered = render(&tmpl, &conversation());
        assert_eq!(
            rendered,
            "<s>[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
        );
        assert!(tmpl.starts_with_bos(&rendered));
        assert_eq!(
            tmpl.strip_vocab_specials(&rendered, true, false),
            "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
        );
        assert_eq!(tmpl.strip_vocab_specials(&rendered, false, false), rendered);
    }

    #[test]
    fn raise_exception_fails_with_the_templates_message() {
        let tmpl = template(MISTRAL, "<s>", "</s>");
        let messages = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        match tmpl.render(&messages, &RenderOptions::default()) {
            Err(ChatTemplateError::Raised(message)) => assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            ),
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn qwen_2_5_without_tools_adds_its_default_system_prompt() {
        let tmpl = template(QWEN_2_5, "", "<|im_end|>");
        assert_eq!(
            render(&tmpl, &one_user()),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(&tmpl, &conversation()),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    const QWEN_TOOLS_HEADER: &str = "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
    const QWEN_TOOLS_FOOTER: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

    #[test]
    fn qwen_2_5_lists_tools_as_python_json_dumps_would() {
        let tmpl = template(QWEN_2_5, "", "<|im_end|>");
        let tool = r#"{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}}, "required": ["city"]}}}"#;
        let expected = format!(
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.{QWEN_TOOLS_HEADER}{tool}{QWEN_TOOLS_FOOTER}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render_with(&tmpl, &one_user(), &with_tools(weather_tool())),
            expected
        );
    }

    #[test]
    fn qwen_2_5_renders_tool_calls_with_object_arguments_and_tool_responses() {
        let tmpl = template(QWEN_2_5, "", "<|im_end|>");
        assert!(tmpl.caps().object_arguments);
        let messages: Vec<ChatMessage> = serde_json::from_str(
            r#"[
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "content": "{\"temperature_c\": 18}", "tool_call_id": "call_1"}
            ]"#,
        )
        .expect("valid messages");
        let expected = format!(
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.{QWEN_TOOLS_HEADER}{}{QWEN_TOOLS_FOOTER}<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Paris\"}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{{\"temperature_c\": 18}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}}, "required": ["city"]}}}"#
        );
        assert_eq!(
            render_with(&tmpl, &messages, &with_tools(weather_tool())),
            expected
        );
    }

    fn assistant_calling(arguments: Json) -> ChatMessage {
        let mut message = ChatMessage::new("assistant", "");
        message.tool_calls = Some(serde_json::json!([{"type": "function",
            "function": {"name": "f", "arguments": arguments}}]));
        message
    }

    #[test]
    fn tool_calls_stay_strings_for_templates_that_print_them() {
        let source = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments }}{% endfor %}{% endfor %}";
        let tmpl = template(source, "", "");
        assert!(!tmpl.caps().object_arguments);
        let message = assistant_calling(serde_json::json!({"b": 1, "a": "x"}));
        assert_eq!(render(&tmpl, &[message]), r#"{"b":1,"a":"x"}"#);
    }

    /// Qwen 3's pattern: llama.cpp sees `tojson` read the object, so parses strings.
    #[test]
    fn tool_calls_become_objects_for_templates_that_can_serialize_them() {
        let source = "{% for m in messages %}{% for c in m.tool_calls %}{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}{% endfor %}{% endfor %}";
        let tmpl = template(source, "", "");
        assert!(tmpl.caps().object_arguments);
        let message = assistant_calling(serde_json::json!("{\"b\":1,\"a\":\"x\"}"));
        assert_eq!(render(&tmpl, &[message]), r#"{"b": 1, "a": "x"}"#);
    }

    #[test]
    fn malformed_tools_and_tool_calls_are_input_errors() {
        let tmpl = template(QWEN_2_5, "", "<|im_end|>");
        let bad_tools = with_tools(serde_json::json!({"name": "f"}));
        assert!(matches!(
            tmpl.render(&one_user(), &bad_tools),
            Err(ChatTemplateError::InvalidInput { field: "tools", .. })
        ));
        let mut message = ChatMessage::new("assistant", "");
        message.tool_calls = Some(serde_json::json!([{"type": "function",
            "function": {"name": "f", "arguments": "not json"}}]));
        assert!(matches!(
            tmpl.render(&[message], &RenderOptions::default()),
            Err(ChatTemplateError::InvalidInput {
                field: "tool_calls",
                ..
            })
        ));
    }

    #[test]
    fn syntax_errors_fail_at_new() {
        for source in [
            "{% for message in messages %}{{ message.content }}",
            "{{ 'a' + }}",
            "{% if x %}",
        ] {
            assert!(
                matches!(
                    ChatTemplate::new(source, "", ""),
                    Err(ChatTemplateError::Syntax(_))
                ),
                "{source}"
            );
        }
    }

    #[test]
    fn supports_tools_follows_the_source() {
        assert!(template(QWEN_2_5, "", "").supports_tools());
        assert!(template(LLAMA_3_1, "", "").supports_tools());
        assert!(!template(SMOLLM2, "", "").supports_tools());
        assert!(!template(CHATML, "", "").supports_tools());
    }

    #[test]
    fn developer_messages_are_system_messages() {
        let tmpl = template(CHATML, "", "");
        let messages = [
            ChatMessage::new("developer", "Be brief"),
            ChatMessage::new("user", "Hi"),
        ];
        assert_eq!(
            render(&tmpl, &messages),
            "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn content_parts_only_templates_get_wrapped_content() {
        let source = "{% for m in messages %}{% for p in m.content %}{% if p.type == 'text' %}[{{ p.text }}]{% endif %}{% endfor %}{% endfor %}";
        let tmpl = template(source, "", "");
        assert!(!tmpl.caps().string_content);
        assert_eq!(render(&tmpl, &[ChatMessage::new("user", "Hi")]), "[Hi]");
    }

    fn render_source(source: &str, opts: &RenderOptions) -> String {
        render_with(&template(source, "<s>", "</s>"), &one_user(), opts)
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let mut opts = RenderOptions::default();
        let value = serde_json::json!({"b": 1, "a": [1, 2.5, "é \"q\"\n\u{1}"], "c": null, "d": true, "e": {}});
        opts.extra.insert("x".into(), value);
        assert_eq!(
            render_source("{{ x | tojson }}", &opts),
            r#"{"b": 1, "a": [1, 2.5, "é \"q\"\n\u0001"], "c": null, "d": true, "e": {}}"#
        );
        assert_eq!(
            render_source("{{ x | tojson(indent=2) }}", &opts),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    \"é \\\"q\\\"\\n\\u0001\"\n  ],\n  \"c\": null,\n  \"d\": true,\n  \"e\": {}\n}"
        );
        assert_eq!(
            render_source("{{ x.a | tojson(ensure_ascii=true) }}", &opts),
            r#"[1, 2.5, "\u00e9 \"q\"\n\u0001"]"#
        );
        assert_eq!(
            render_source(
                "{{ x | tojson(separators=(',', ':'), sort_keys=true) }}",
                &opts
            ),
            r#"{"a":[1,2.5,"é \"q\"\n\u0001"],"b":1,"c":null,"d":true,"e":{}}"#
        );
        assert_eq!(
            render_source("{{ '😀' | tojson(true) }}", &opts),
            r#""\ud83d\ude00""#
        );
    }

    #[test]
    fn floats_print_as_llama_cpp_prints_them() {
        let mut opts = RenderOptions::default();
        let value = serde_json::json!([1.0, 0.1, 123456789.0, 0.00001234, -2.5]);
        opts.extra.insert("x".into(), value);
        assert_eq!(
            render_source("{{ x | tojson }}", &opts),
            "[1, 0.1, 1.23457e+08, 1.234e-05, -2.5]"
        );
        assert_eq!(
            render_source("{{ x[0] }} {{ x[1] }} {{ x[4] }}", &opts),
            "1.0 0.1 -2.5"
        );
    }

    #[test]
    fn values_print_like_python() {
        let opts = RenderOptions::default();
        assert_eq!(
            render_source("{{ true }} {{ none }} {{ [1, 'a', \"it's\"] }} {{ {'k': false} }} {{ [1] | string }}", &opts),
            r#"True None [1, 'a', "it's"] {'k': False} [1]"#
        );
    }

    #[test]
    fn python_string_and_dict_methods_work() {
        let opts = RenderOptions::default();
        assert_eq!(
            render_source(
                "{{ '  hi  '.strip() }}|{{ 'a,b'.split(',') }}|{% for k, v in {'x': 1}.items() %}{{ k }}={{ v }}{% endfor %}|{{ 'abc'.startswith('ab') }}|{{ 'Ab'.lower() }}",
                &opts
            ),
            "hi|['a', 'b']|x=1|True|ab"
        );
    }

    #[test]
    fn strftime_now_formats_the_render_clock() {
        let opts = RenderOptions {
            now: Some(noon_14_nov_2023()),
            ..RenderOptions::default()
        };
        assert_eq!(
            render_source("{{ strftime_now('%Y-%m-%d') }}", &opts),
            "2023-11-14"
        );
        assert_eq!(
            render_source("{{ strftime_now('%d %b %Y') }}", &opts),
            "14 Nov 2023"
        );
    }

    #[test]
    fn context_variables_follow_llama_cpp() {
        let source = "{{ add_generation_prompt is defined }} {{ enable_thinking }} {{ tools is defined }} {{ bos_token }}{{ eos_token }}";
        let without_prompt = RenderOptions {
            add_generation_prompt: false,
            ..RenderOptions::default()
        };
        assert_eq!(
            render_source(source, &without_prompt),
            "False True False <s></s>"
        );
        let mut opts = with_tools(serde_json::json!([]));
        opts.extra.insert("enable_thinking".into(), false.into());
        assert_eq!(render_source(source, &opts), "True False False <s></s>");
    }

    #[test]
    fn blocks_trim_and_lstrip_like_llama_cpp() {
        let source = "{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}\n";
        let tmpl = template(source, "", "");
        let messages = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert_eq!(render(&tmpl, &messages), "a\nb\n");
    }

    #[test]
    fn crlf_sources_render_like_lf_sources() {
        let tmpl = template(&CHATML.replace('\n', "\r\n"), "", "");
        assert_eq!(
            render(&tmpl, &one_user()),
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn generation_blocks_are_ignored() {
        let source = "{% for m in messages %}{%- generation -%} {{ m.content }} {%- endgeneration %}{% endfor %}";
        let tmpl = template(source, "", "");
        assert_eq!(render(&tmpl, &one_user()), QUESTION);
    }

    #[test]
    fn null_content_deserializes_as_empty() {
        let message: ChatMessage =
            serde_json::from_str(r#"{"role": "assistant", "content": null}"#).expect("valid");
        assert_eq!(message.content, "");
        let message: ChatMessage = serde_json::from_str(r#"{"role": "user"}"#).expect("valid");
        assert_eq!(message.content, "");
    }

    /// `tokenizer.chat_template` and the BOS/EOS token texts of a GGUF file.
    fn gguf_chat_metadata(path: &std::path::Path) -> (String, String, String) {
        let file = hypura_gguf::GgufFile::open(path).expect("model opens");
        let tokens = file
            .get_array("tokenizer.ggml.tokens")
            .and_then(|tokens| tokens.as_strings())
            .expect("token texts");
        let token = |key: &str| {
            let id = usize::try_from(file.get_u64(key).expect("token id")).expect("fits");
            tokens[id].to_string_lossy().into_owned()
        };
        let source = file
            .get_str("tokenizer.chat_template")
            .expect("chat template");
        (
            source.to_string(),
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        )
    }

    #[test]
    fn smollm2_gguf_embedded_template_renders_as_llama_cpp() {
        let (source, bos, eos) = gguf_chat_metadata(&hypura_gguf::testing::smollm2());
        assert_eq!(source, SMOLLM2);
        assert_eq!((bos.as_str(), eos.as_str()), ("<|im_start|>", "<|im_end|>"));
        let tmpl = template(&source, &bos, &eos);
        assert!(!tmpl.supports_tools());
        assert_eq!(
            render(&tmpl, &one_user()),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
