//! Translation to and from an upstream's own API: a [`BackendRequest`]
//! becomes the body of Ollama's `/api/chat` or `/api/generate`, or OpenAI's
//! `/v1/chat/completions` or `/v1/completions` (always streamed), its
//! constraint as `format` or `response_format` and its tools with their
//! choice; the NDJSON or SSE reply is read back, piece by piece, into
//! [`BackendEvent`]s ([`Reader`]), the peer's tool calls included.
//! Embeddings likewise (`/api/embed`, `/v1/embeddings`).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::config::UpstreamKind;
use crate::core::backend::{
    BackendError, BackendEvent, CalledTool, EmbedOutput, FinishReason, Finished,
};
use crate::core::request::{BackendRequest, Constraint, EmbedBatch, GenerationParams, Prompt};
use crate::core::structured::ToolChoice;

/// A reqwest error in words, without the URL (it would name the upstream's
/// address to clients).
pub fn describe(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_decode() {
        "sent a reply that could not be read"
    } else if e.is_body() {
        "broke off its reply"
    } else {
        "failed"
    };
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if std::ptr::addr_eq(cause, e) {
        what.to_string()
    } else {
        format!("{what} ({cause})")
    }
}

/// The route and body of a generation on an upstream of `kind`, asking for
/// a stream.
pub fn generate_body(
    kind: UpstreamKind,
    model: &str,
    request: &BackendRequest,
) -> Result<(&'static str, Value), BackendError> {
    let params = &request.params;
    let (path, mut body) = match (&request.prompt, kind.speaks_ollama()) {
        (
            Prompt::Messages {
                messages, tools, ..
            },
            true,
        ) => {
            let mut body = json!({"model": model, "messages": messages});
            if let Some(tools) = tools {
                body["tools"] = tools.clone();
            }
            ("/api/chat", body)
        }
        (Prompt::Text { text }, true) => {
            let mut body = json!({"model": model, "prompt": text, "raw": true});
            if !request.context.is_empty() {
                body["context"] = json!(request.context);
            }
            ("/api/generate", body)
        }
        (
            Prompt::Messages {
                messages, tools, ..
            },
            false,
        ) => {
            let mut body = json!({"model": model, "messages": messages});
            if let Some(tools) = tools {
                body["tools"] = tools.clone();
            }
            ("/v1/chat/completions", body)
        }
        (Prompt::Text { text }, false) if request.context.is_empty() => {
            ("/v1/completions", json!({"model": model, "prompt": text}))
        }
        (Prompt::Text { .. }, false) => {
            return Err(BackendError::Invalid(
                "`context` cannot be passed to an OpenAI-compatible upstream: send the whole \
                 conversation instead"
                    .into(),
            ))
        }
        (Prompt::Tokens(_) | Prompt::Load, _) => {
            return Err(BackendError::Invalid(
                "a prompt of token ids cannot be sent to an upstream server".into(),
            ))
        }
    };
    body["stream"] = json!(true);
    if kind.speaks_ollama() {
        if !params.sampling.logit_bias.is_empty() {
            return Err(BackendError::Invalid(
                "logit_bias cannot be passed on to this upstream server (Ollama's API has no \
                 logit_bias): omit it, or use a model whose upstream speaks OpenAI's API"
                    .into(),
            ));
        }
        body["options"] = ollama_options(params);
    } else {
        add_openai_sampling(&mut body, params);
    }
    if let Some(constraint) = &params.constraint {
        add_constraint(&mut body, kind, constraint)?;
    }
    if let (Some((choice, parallel)), Some(_)) = (&params.tool_choice, body.get("tools")) {
        add_tool_choice(&mut body, kind, choice, *parallel)?;
    }
    Ok((path, body))
}

/// The reply's constraint in the upstream's dialect: Ollama's `format`,
/// OpenAI's `response_format`.
fn add_constraint(
    body: &mut Value,
    kind: UpstreamKind,
    constraint: &Constraint,
) -> Result<(), BackendError> {
    body[if kind.speaks_ollama() {
        "format"
    } else {
        "response_format"
    }] = match (constraint, kind.speaks_ollama()) {
        (Constraint::JsonObject, true) => json!("json"),
        (Constraint::JsonObject, false) => json!({"type": "json_object"}),
        (Constraint::JsonSchema { schema, .. }, true) => schema.clone(),
        (Constraint::JsonSchema { schema, .. }, false) => json!({"type": "json_schema",
                "json_schema": {"name": "response", "schema": schema, "strict": true}}),
        (Constraint::Grammar(_), _) => {
            return Err(BackendError::Invalid(
                "a grammar cannot be passed on to an upstream server: ask a model served \
                     on this machine"
                    .into(),
            ))
        }
    };
    Ok(())
}

/// OpenAI's `tool_choice` and `parallel_tool_calls`; Ollama's API has no
/// tool choice, so there only `auto` (the default) passes.
fn add_tool_choice(
    body: &mut Value,
    kind: UpstreamKind,
    choice: &ToolChoice,
    parallel: bool,
) -> Result<(), BackendError> {
    let value = match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
    };
    if kind.speaks_ollama() {
        return match choice {
            ToolChoice::Auto => Ok(()),
            // The tools were left out: the model answers in text.
            ToolChoice::None => {
                if let Some(body) = body.as_object_mut() {
                    body.remove("tools");
                }
                Ok(())
            }
            _ => Err(BackendError::Invalid(format!(
                "tool_choice {value} cannot be passed on to this upstream server (Ollama's API \
                 has no tool_choice): use \"auto\", or a model whose upstream speaks OpenAI's API"
            ))),
        };
    }
    body["tool_choice"] = value;
    body["parallel_tool_calls"] = json!(parallel);
    Ok(())
}

/// Ollama's `options` for `params`.
fn ollama_options(params: &GenerationParams) -> Value {
    let s = &params.sampling;
    let mut options = json!({
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": s.repeat_last_n,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "num_predict": params.max_tokens.map_or(-1, i64::from),
    });
    if let Some(seed) = s.seed {
        options["seed"] = json!(seed);
    }
    if !params.stop.is_empty() {
        options["stop"] = json!(params.stop);
    }
    if let Some(n) = params.num_ctx {
        options["num_ctx"] = json!(n);
    }
    options
}

/// OpenAI's sampling fields (only the standard ones: a strict server refuses others).
fn add_openai_sampling(body: &mut Value, params: &GenerationParams) {
    let s = &params.sampling;
    body["stream_options"] = json!({"include_usage": true});
    body["temperature"] = json!(s.temperature);
    body["top_p"] = json!(s.top_p);
    body["presence_penalty"] = json!(s.presence_penalty);
    body["frequency_penalty"] = json!(s.frequency_penalty);
    if let Some(n) = params.max_tokens {
        body["max_tokens"] = json!(n);
    }
    if let Some(seed) = s.seed {
        body["seed"] = json!(seed);
    }
    if !params.stop.is_empty() {
        body["stop"] = json!(params.stop);
    }
    if !s.logit_bias.is_empty() {
        let bias: serde_json::Map<String, Value> = s
            .logit_bias
            .iter()
            .map(|&(token, bias)| (token.to_string(), json!(bias)))
            .collect();
        body["logit_bias"] = Value::Object(bias);
    }
}

/// The route and body of an embedding request.
pub fn embed_body(kind: UpstreamKind, model: &str, batch: &EmbedBatch) -> (&'static str, Value) {
    if kind.speaks_ollama() {
        (
            "/api/embed",
            json!({"model": model, "input": batch.inputs, "truncate": batch.truncate}),
        )
    } else {
        (
            "/v1/embeddings",
            json!({"model": model, "input": batch.inputs, "encoding_format": "float"}),
        )
    }
}

/// An embedding reply read back.
pub fn embed_output(kind: UpstreamKind, reply: &Value) -> Result<EmbedOutput, String> {
    let vector = |v: &Value| -> Option<Vec<f32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect()
    };
    let (vectors, tokens) = if kind.speaks_ollama() {
        let vectors = reply["embeddings"]
            .as_array()
            .map(|all| all.iter().map(vector).collect());
        (vectors, &reply["prompt_eval_count"])
    } else {
        let vectors = reply["data"]
            .as_array()
            .map(|all| all.iter().map(|d| vector(&d["embedding"])).collect());
        (vectors, &reply["usage"]["prompt_tokens"])
    };
    let vectors: Option<Vec<Vec<f32>>> = vectors.flatten();
    Ok(EmbedOutput {
        vectors: vectors.ok_or("the upstream's embedding reply has no vectors")?,
        prompt_tokens: tokens.as_u64().unwrap_or(0) as usize,
    })
}

/// The message of an upstream's error body (`{"error": "…"}` or
/// `{"error": {"message": "…"}}`), if it sent one.
pub fn error_message(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = &value["error"];
    error
        .as_str()
        .or_else(|| error["message"].as_str())
        .map(str::to_string)
}

/// Reads a streamed reply, as its bytes arrive, into events.
pub struct Reader {
    ollama: bool,
    /// Bytes of a line not yet complete.
    partial: Vec<u8>,
    sent: Instant,
    first_token: Option<Instant>,
    finish_reason: Option<FinishReason>,
    usage: (usize, usize),
    /// OpenAI's streamed calls, by index: id, name and the arguments' text
    /// as its pieces arrive.
    calls: BTreeMap<u64, (Option<String>, String, String)>,
    ended: bool,
}

impl Reader {
    /// A reader of a reply to a request sent at `sent`.
    pub fn new(kind: UpstreamKind, sent: Instant) -> Reader {
        Reader {
            ollama: kind.speaks_ollama(),
            partial: Vec::new(),
            sent,
            first_token: None,
            finish_reason: None,
            usage: (0, 0),
            calls: BTreeMap::new(),
            ended: false,
        }
    }

    /// Whether the reply ended (`Done` or `Error` was yielded).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The events of the complete lines in `bytes` (and those before it).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<BackendEvent> {
        self.partial.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if self.ended {
                continue;
            }
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            if self.ollama {
                self.ollama_line(line, &mut events);
            } else if let Some(data) = line.strip_prefix("data:") {
                self.sse_data(data.trim(), &mut events);
            }
        }
        events
    }

    /// The reply's bytes ended: the events of its last line. A reply cut
    /// short leaves [`Reader::ended`] false.
    pub fn end(&mut self) -> Vec<BackendEvent> {
        self.feed(b"\n")
    }

    fn text(&mut self, text: &str, events: &mut Vec<BackendEvent>) {
        if text.is_empty() {
            return;
        }
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
            events.push(BackendEvent::FirstToken);
        }
        events.push(BackendEvent::Text(text.to_string()));
    }

    fn error(&mut self, message: &str, events: &mut Vec<BackendEvent>) {
        self.ended = true;
        events.push(BackendEvent::Error(BackendError::Failed(format!(
            "the upstream server failed: {message}"
        ))));
    }

    fn ollama_line(&mut self, line: &str, events: &mut Vec<BackendEvent>) {
        if line.is_empty() {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(line) else {
            return self.error("it sent a line that is not JSON", events);
        };
        if let Some(message) = error_message(line.as_bytes()) {
            return self.error(&message, events);
        }
        let text = chunk["message"]["content"]
            .as_str()
            .or_else(|| chunk["response"].as_str())
            .unwrap_or_default();
        self.text(text, events);
        if let Some(calls) = chunk["message"]["tool_calls"].as_array() {
            let calls: Vec<CalledTool> = calls
                .iter()
                .map(|call| CalledTool {
                    id: call["id"].as_str().map(str::to_string),
                    name: call["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    arguments: call["function"]["arguments"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                })
                .collect();
            if !calls.is_empty() {
                events.push(BackendEvent::ToolCalls(calls));
            }
        }
        if chunk["done"] == json!(true) {
            let count = |key: &str| chunk[key].as_u64().unwrap_or(0) as usize;
            let nanos = |key: &str| Duration::from_nanos(chunk[key].as_u64().unwrap_or(0));
            let context = chunk["context"]
                .as_array()
                .map(|ids| {
                    ids.iter()
                        .filter_map(|i| i.as_i64())
                        .map(|i| i as i32)
                        .collect()
                })
                .unwrap_or_default();
            self.ended = true;
            events.push(BackendEvent::Done(Finished {
                finish_reason: finish_reason(chunk["done_reason"].as_str()),
                prompt_tokens: count("prompt_eval_count"),
                generated_tokens: count("eval_count"),
                prompt_eval_tokens: count("prompt_eval_count"),
                prompt_eval_duration: nanos("prompt_eval_duration"),
                eval_duration: nanos("eval_duration"),
                context,
            }));
        }
    }

    fn sse_data(&mut self, data: &str, events: &mut Vec<BackendEvent>) {
        if data == "[DONE]" {
            if !self.calls.is_empty() {
                let calls = std::mem::take(&mut self.calls)
                    .into_values()
                    .map(|(id, name, arguments)| CalledTool {
                        id,
                        name,
                        arguments: serde_json::from_str(&arguments).unwrap_or_default(),
                    })
                    .collect();
                events.push(BackendEvent::ToolCalls(calls));
            }
            let now = Instant::now();
            let first = self.first_token.unwrap_or(now);
            self.ended = true;
            events.push(BackendEvent::Done(Finished {
                finish_reason: self.finish_reason.unwrap_or(FinishReason::Stop),
                prompt_tokens: self.usage.0,
                generated_tokens: self.usage.1,
                prompt_eval_tokens: self.usage.0,
                // OpenAI's API reports no timings: measured here, from the
                // request's sending to its first token, then to its end.
                prompt_eval_duration: first.duration_since(self.sent),
                eval_duration: now.duration_since(first),
                context: Vec::new(),
            }));
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return self.error("it sent an event that is not JSON", events);
        };
        if let Some(message) = error_message(data.as_bytes()) {
            return self.error(&message, events);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let count = |key: &str| usage[key].as_u64().unwrap_or(0) as usize;
            self.usage = (count("prompt_tokens"), count("completion_tokens"));
        }
        let choice = &chunk["choices"][0];
        let text = choice["delta"]["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .unwrap_or_default();
        self.text(text, events);
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().unwrap_or(0);
            let (id, name, arguments) = self.calls.entry(index).or_default();
            if let Some(given) = call["id"].as_str() {
                *id = Some(given.to_string());
            }
            if let Some(given) = call["function"]["name"].as_str() {
                name.push_str(given);
            }
            if let Some(piece) = call["function"]["arguments"].as_str() {
                arguments.push_str(piece);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(finish_reason(Some(reason)));
        }
    }
}

fn finish_reason(reason: Option<&str>) -> FinishReason {
    match reason {
        Some("length") => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::request::GenerationParams;
    use hypura_chat::ChatMessage;

    fn request(prompt: Prompt) -> BackendRequest {
        let mut params = GenerationParams {
            max_tokens: Some(8),
            stop: vec!["\n".into()],
            ..Default::default()
        };
        params.sampling.seed = Some(7);
        BackendRequest {
            prompt,
            context: Vec::new(),
            params,
        }
    }

    #[test]
    fn logit_bias_goes_to_openai_peers_and_is_refused_for_ollama_s_api() {
        let mut chat = request(Prompt::messages(vec![ChatMessage::new("user", "hi")]));
        chat.params.sampling.logit_bias = vec![(42, -100.0), (7, 2.5)];
        let (_, body) = generate_body(UpstreamKind::Openai, "m", &chat).unwrap();
        assert_eq!(body["logit_bias"], json!({"42": -100.0, "7": 2.5}));
        let refused = generate_body(UpstreamKind::Ollama, "m", &chat).unwrap_err();
        assert!(refused.to_string().contains("logit_bias"), "{refused}");
        chat.params.sampling.logit_bias.clear();
        let (_, body) = generate_body(UpstreamKind::Openai, "m", &chat).unwrap();
        assert!(body.get("logit_bias").is_none());
    }

    #[test]
    fn chats_go_to_each_dialect_s_chat_route_streamed() {
        let chat = request(Prompt::messages(vec![ChatMessage::new("user", "hi")]));
        let (path, body) = generate_body(UpstreamKind::Hypura, "m:latest", &chat).unwrap();
        assert_eq!(path, "/api/chat");
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["messages"][0]["content"], json!("hi"));
        assert_eq!(body["options"]["num_predict"], json!(8));
        assert_eq!(body["options"]["seed"], json!(7));
        assert_eq!(body["options"]["stop"], json!(["\n"]));
        let (path, body) = generate_body(UpstreamKind::Openai, "m", &chat).unwrap();
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(body["max_tokens"], json!(8));
        assert_eq!(body["stream_options"]["include_usage"], json!(true));
        assert!(body.get("options").is_none());
    }

    #[test]
    fn raw_text_goes_to_generate_or_completions() {
        let text = request(Prompt::Text {
            text: "Once".into(),
        });
        let (path, body) = generate_body(UpstreamKind::Ollama, "m", &text).unwrap();
        assert_eq!((path, &body["raw"]), ("/api/generate", &json!(true)));
        let (path, body) = generate_body(UpstreamKind::Openai, "m", &text).unwrap();
        assert_eq!((path, &body["prompt"]), ("/v1/completions", &json!("Once")));
    }

    #[test]
    fn constraints_and_tool_choices_pass_on_in_each_dialect() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let mut chat = request(Prompt::Messages {
            messages: vec![ChatMessage::new("user", "hi")],
            tools: Some(json!([{"type": "function", "function": {"name": "f"}}])),
            template_override: None,
            template_extra: Default::default(),
        });
        chat.params.constraint = Some(Constraint::JsonSchema {
            schema: schema.clone(),
            field: "format".into(),
        });
        chat.params.tool_choice = Some((ToolChoice::Auto, true));
        let (_, body) = generate_body(UpstreamKind::Hypura, "m", &chat).unwrap();
        assert_eq!(body["format"], schema);
        assert!(body.get("tool_choice").is_none());
        let (_, body) = generate_body(UpstreamKind::Openai, "m", &chat).unwrap();
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema,
                "strict": true}})
        );
        assert_eq!(body["tool_choice"], json!("auto"));
        assert_eq!(body["parallel_tool_calls"], json!(true));
        chat.params.constraint = Some(Constraint::JsonObject);
        chat.params.tool_choice = Some((ToolChoice::Function("f".into()), false));
        let e = generate_body(UpstreamKind::Ollama, "m", &chat).unwrap_err();
        assert!(matches!(e, BackendError::Invalid(m) if m.contains("tool_choice")));
        let (_, body) = generate_body(UpstreamKind::Openai, "m", &chat).unwrap();
        assert_eq!(body["response_format"], json!({"type": "json_object"}));
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        chat.params.tool_choice = Some((ToolChoice::None, true));
        let (_, body) = generate_body(UpstreamKind::Hypura, "m", &chat).unwrap();
        assert_eq!(body["format"], json!("json"));
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn grammars_and_token_prompts_are_refused_with_a_reason() {
        let mut constrained = request(Prompt::Text { text: "x".into() });
        constrained.params.constraint = Some(Constraint::Grammar("root ::= \"a\"".into()));
        let e = generate_body(UpstreamKind::Hypura, "m", &constrained).unwrap_err();
        assert!(matches!(e, BackendError::Invalid(m) if m.contains("grammar")));
        let tokens = request(Prompt::Tokens(vec![1, 2]));
        assert!(generate_body(UpstreamKind::Hypura, "m", &tokens).is_err());
    }

    #[test]
    fn ndjson_split_anywhere_reads_the_same() {
        let body = concat!(
            "{\"message\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"done\":false}\n",
            "{\"message\":{\"role\":\"assistant\",\"content\":\"lo\"},\"done\":false}\n",
            "{\"message\":{\"content\":\"\"},\"done\":true,\"done_reason\":\"length\",",
            "\"prompt_eval_count\":5,\"eval_count\":2,\"prompt_eval_duration\":1000,\"eval_duration\":2000}\n"
        );
        for split in [1, 7, 40, body.len() - 1] {
            let mut reader = Reader::new(UpstreamKind::Hypura, Instant::now());
            let mut events = reader.feed(&body.as_bytes()[..split]);
            events.extend(reader.feed(&body.as_bytes()[split..]));
            events.extend(reader.end());
            assert!(reader.ended());
            let text: String = events
                .iter()
                .filter_map(|e| match e {
                    BackendEvent::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(text, "Hello");
            assert_eq!(events[0], BackendEvent::FirstToken);
            let Some(BackendEvent::Done(done)) = events.last() else {
                panic!("{events:?}")
            };
            assert_eq!(done.finish_reason, FinishReason::Length);
            assert_eq!((done.prompt_tokens, done.generated_tokens), (5, 2));
            assert_eq!(done.eval_duration, Duration::from_nanos(2000));
        }
    }

    #[test]
    fn sse_reads_text_finish_and_usage() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n",
            "data: [DONE]\n\n"
        );
        let mut reader = Reader::new(UpstreamKind::Openai, Instant::now());
        let events = reader.feed(body.as_bytes());
        assert_eq!(events[1], BackendEvent::Text("Hi".into()));
        let Some(BackendEvent::Done(done)) = events.last() else {
            panic!("{events:?}")
        };
        assert_eq!((done.prompt_tokens, done.generated_tokens), (4, 1));
        assert!(reader.ended());
    }

    #[test]
    fn an_error_line_or_a_cut_reply_ends_with_an_error() {
        let mut reader = Reader::new(UpstreamKind::Hypura, Instant::now());
        let events = reader.feed(b"{\"error\":\"model crashed\"}\n");
        assert!(
            matches!(&events[0], BackendEvent::Error(BackendError::Failed(m)) if m.contains("model crashed"))
        );
        let mut reader = Reader::new(UpstreamKind::Hypura, Instant::now());
        reader.feed(b"{\"response\":\"a\",\"done\":false}\n");
        assert!(reader.end().is_empty());
        assert!(!reader.ended(), "a reply cut short has not ended");
    }

    #[test]
    fn embeddings_read_from_both_dialects() {
        let ollama = embed_output(
            UpstreamKind::Ollama,
            &json!({"embeddings": [[0.6, 0.8]], "prompt_eval_count": 3}),
        )
        .unwrap();
        assert_eq!(
            (ollama.vectors, ollama.prompt_tokens),
            (vec![vec![0.6, 0.8]], 3)
        );
        let openai = embed_output(
            UpstreamKind::Openai,
            &json!({"data": [{"embedding": [1.0]}], "usage": {"prompt_tokens": 2}}),
        )
        .unwrap();
        assert_eq!((openai.vectors, openai.prompt_tokens), (vec![vec![1.0]], 2));
    }
}
