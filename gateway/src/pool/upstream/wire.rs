//! Translation to and from an upstream's own API: a [`BackendRequest`]
//! becomes the body of Ollama's `/api/chat` or `/api/generate`, or OpenAI's
//! `/v1/chat/completions` or `/v1/completions` (always streamed); the
//! NDJSON or SSE reply is read back, piece by piece, into
//! [`BackendEvent`]s ([`Reader`]). Embeddings likewise (`/api/embed`,
//! `/v1/embeddings`).
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::config::UpstreamKind;
use crate::core::backend::{BackendError, BackendEvent, EmbedOutput, FinishReason, Finished};
use crate::core::request::{BackendRequest, EmbedBatch, GenerationParams, Prompt};

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
    if params
        .sampling
        .grammar
        .as_deref()
        .is_some_and(|g| !g.is_empty())
    {
        return Err(BackendError::Invalid(
            "structured output (format, response_format, a forced tool call) is not passed on \
             to upstream servers yet: ask a model served on this machine"
                .into(),
        ));
    }
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
        body["options"] = ollama_options(params);
    } else {
        add_openai_sampling(&mut body, params);
    }
    Ok((path, body))
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
    fn grammars_and_token_prompts_are_refused_with_a_reason() {
        let mut constrained = request(Prompt::Text { text: "x".into() });
        constrained.params.sampling.grammar = Some("root ::= \"a\"".into());
        let e = generate_body(UpstreamKind::Hypura, "m", &constrained).unwrap_err();
        assert!(matches!(e, BackendError::Invalid(m) if m.contains("structured output")));
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
