//! The OpenAPI document (`GET /openapi.json`, rendered at `GET /docs`).
//!
//! utoipa writes each operation from its handler's `#[utoipa::path]`; the
//! route table ([`routes::ROUTES`]) decides which of them the document
//! lists, each one's security requirement (open, the API key, the admin
//! key) and the statuses the server's layers answer on it. The request
//! bodies are then made as strict as their validation ([`tighten`]).
use serde_json::{json, Map, Value};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{ContentBuilder, PathItem, Ref, ResponseBuilder};
use utoipa::OpenApi;

use super::routes::{self, Auth, Family, Route, ROUTES};
use super::{anthropic, blobs, create, health, ollama, openai, pull, responses};
use crate::api::dialect::ollama::OllamaOptions;
use crate::core::bounds::MAX_REPEAT;
use crate::core::error::{OllamaErrorBody, OpenAiErrorBody, OpenAiErrorDetail};
use crate::core::validation::{
    StopSpec, LOGIT_BIAS_KEY_PATTERN, MAX_CHOICES, MAX_EMBED_INPUTS, MAX_KEEP_ALIVE_SECONDS,
    MAX_LOGIT_BIAS_TOKENS, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, OLLAMA_ROLES, OPENAI_ROLES,
};
use llama_tiered::llama::{LOGIT_BIAS_MAX, MAX_TOP_LOGPROBS};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hypura",
        description = "Ollama- and OpenAI-compatible inference over GGUF models. Durations are \
                       integer nanoseconds; timestamps RFC 3339. A path with a trailing slash is \
                       the same route. Chat routes drop the oldest messages of a conversation too \
                       long for the context window (`x-hypura-truncated-messages` counts them) \
                       unless `truncate` is false."
    ),
    // The handlers utoipa writes operations from; the route table says
    // which the document lists (a test holds the two together).
    paths(
        ollama::root,
        ollama::version,
        ollama::tags,
        ollama::ps,
        ollama::show,
        ollama::generate,
        ollama::chat,
        ollama::embed,
        ollama::embeddings,
        ollama::delete_model,
        ollama::copy,
        pull::pull,
        create::create,
        create::push,
        blobs::head_blob,
        blobs::post_blob,
        openai::list_models,
        openai::retrieve_model,
        openai::chat_completions,
        openai::completions,
        openai::embeddings,
        responses::create_response,
        anthropic::messages,
        anthropic::count_tokens,
        health::health,
        health::ready,
    ),
    components(schemas(
        OllamaErrorBody,
        OpenAiErrorBody,
        OpenAiErrorDetail,
        OllamaOptions,
        StopSpec,
        anthropic::AnthropicErrorBody,
    )),
    tags(
        (name = "ollama", description = "Ollama's API"),
        (name = "openai", description = "OpenAI's API, under /v1"),
        (name = "anthropic", description = "Anthropic's Messages API, /v1/messages"),
        (name = "health", description = "Liveness and readiness for load balancers"),
    )
)]
pub struct ApiDoc;

/// The security scheme of `Authorization: Bearer <key>`.
const BEARER: &str = "bearer";
/// The security scheme of `x-api-key: <key>` (Anthropic's clients).
const X_API_KEY: &str = "x-api-key";
/// The role an admin route's requirement names (OpenAPI 3.1 lets a
/// requirement of an HTTP or API-key scheme list roles).
const ADMIN_ROLE: &str = "admin";

/// The document of every route the table marks documented, with on each
/// operation its security requirement and the statuses the server's layers
/// answer besides the handler's own: 400 (a body that breaks a rule: JSON,
/// names, options, schema bounds, sizes), 401 (the API key, but on open
/// routes), 403 (a foreign web origin or `Host`, or a route needing the
/// admin key), 413 (the body limit), and where a model runs 404, 503 (a
/// full queue) and 500.
///
/// Then every generation route's request body is replaced by the schema of
/// what its validation accepts ([`tighten`]): the same bounds, from the same
/// constants, so a body the document allows is one the server runs, bar the
/// model name, what depends on the model (its context, vocabulary and
/// embedding length) and the cross-field rules each field's description
/// states.
pub fn document() -> Value {
    let mut doc = ApiDoc::openapi();
    let mut written = std::mem::take(&mut doc.paths.paths);
    for route in ROUTES.iter().filter(|r| r.documented) {
        let path = route.openapi_path();
        // A documented route without a handler in `paths(...)` is caught by
        // the tests, not here.
        if let Some(mut item) = written.remove(&path) {
            answer_for_layers(route, &mut item);
            doc.paths.paths.insert(path, item);
        }
    }
    if let Some(info) = doc.info.description.as_mut() {
        info.push(' ');
        info.push_str(&auth_words());
    }
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The API key or the admin key"))
                .build(),
        ),
    );
    components.add_security_scheme(
        X_API_KEY,
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "x-api-key",
            "The API key or the admin key",
        ))),
    );
    let mut doc = serde_json::to_value(doc).unwrap_or_default();
    tighten(&mut doc);
    doc
}

/// The document's words on keys, from the table: which routes are open and
/// which need the admin key.
fn auth_words() -> String {
    let paths = |auth: Auth| {
        ROUTES
            .iter()
            .filter(|r| r.documented && r.auth == auth)
            .map(|r| format!("`{}`", r.openapi_path()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "When the server has an API key, every route but {} needs `Authorization: Bearer <key>` \
         (or `x-api-key: <key>`); when it has an admin key, {} need that one (their security \
         names the role `{ADMIN_ROLE}`).",
        paths(Auth::Open),
        paths(Auth::Admin)
    )
}

/// Who may call `auth`'s routes, as OpenAPI says it: nothing for an open
/// route, else either key header, with the admin role on admin routes.
fn security(auth: Auth) -> Option<Vec<SecurityRequirement>> {
    let roles: &[&str] = match auth {
        Auth::Open => return None,
        Auth::Key | Auth::Scrape => &[],
        Auth::Admin => &[ADMIN_ROLE],
    };
    Some(vec![
        SecurityRequirement::new(BEARER, roles.iter().copied()),
        SecurityRequirement::new(X_API_KEY, roles.iter().copied()),
    ])
}

/// Adds to each operation of `route` its security and the statuses of the
/// layers in front of its handler, each unless the handler states it.
fn answer_for_layers(route: &Route, item: &mut PathItem) {
    let body = match routes::family(route.path) {
        Family::Anthropic => "AnthropicErrorBody",
        Family::OpenAi => "OpenAiErrorBody",
        Family::Ollama => "OllamaErrorBody",
    };
    let operations = [
        item.get.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.head.as_mut(),
    ];
    for operation in operations.into_iter().flatten() {
        operation.security = security(route.auth);
        answer_for_layers_on(route, operation, body);
    }
}

fn answer_for_layers_on(route: &Route, operation: &mut Operation, body: &str) {
    let has_body = operation.request_body.is_some();
    let mut add = |status: &str, description: &str| {
        let error = ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(body)))
                    .build(),
            )
            .build();
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| error.into());
    };
    if has_body {
        add(
            "400",
            "The body breaks a rule (JSON, a field's type or range, a model name, a \
             JSON Schema's bounds, a prompt or input too large); the message says which",
        );
        add(
            "413",
            "The body is larger than the server's limit (--max-body-bytes, 32 MiB by default)",
        );
    }
    if route.auth == Auth::Admin {
        add(
            "403",
            "The request comes from a web page whose origin is not allowed, names a Host the \
             server does not answer to, or needs the admin key",
        );
    } else {
        add(
            "403",
            "The request comes from a web page whose origin is not allowed, or names a Host \
             the server does not answer to",
        );
    }
    if route.auth != Auth::Open {
        add("401", "An API key is set and the request lacks it");
    }
    if route.runs_model {
        add("404", "No model of that name");
        add(
            "503",
            "The model's queue is full, or it is stopping: retry later",
        );
        add("500", "The model failed");
    }
}

// ---------------------------------------------------------------------------------------------
// The request bodies as strict as their validation
// ---------------------------------------------------------------------------------------------

/// [`crate::core::validation::ModelName::parse`]'s rule as a pattern: parts of
/// letters, digits and `._+-` (the document's parts do not start with `.`, so
/// none is `.` or `..`) joined by `/`, then an optional tag of Ollama's rule
/// (a letter, digit or `_`, then letters, digits and `._-`, 128 at most).
pub const MODEL_NAME_PATTERN: &str = "^([A-Za-z0-9_+-][A-Za-z0-9._+-]*/)*\
                                      [A-Za-z0-9_+-][A-Za-z0-9._+-]*\
                                      (:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$";
/// Longest model name `ModelName::parse` accepts.
pub const MAX_MODEL_NAME_BYTES: u64 = 350;
/// Most decoding threads `options.num_thread` may name (the Ollama dialect's
/// `MAX_THREADS`; `tests/api/openapi_strict.rs` holds the two together).
pub const MAX_THREADS: i64 = 1024;
/// A Go duration `keep_alive` as the document states it: seconds (a number
/// as text) or one `<number><unit>`, at most 9,999 hours (within
/// [`MAX_KEEP_ALIVE_SECONDS`]); a leading `-` keeps the model loaded.
pub const KEEP_ALIVE_PATTERN: &str =
    "^-?([0-9]{1,6}(\\.[0-9]{1,3})?(ns|us|ms|s|m)?|[0-9]{1,4}(\\.[0-9]{1,3})?h)$";
/// A `template` the document allows: text without Jinja's `{` and `}` (the
/// server renders any template; one whose syntax is broken is a 400, and an
/// empty one renders an empty prompt, a 400 too).
pub const PLAIN_TEMPLATE_PATTERN: &str = "^[^{}]*$";

/// Object properties the document's JSON Schema subset names, at most.
const DOC_SCHEMA_PROPERTIES: u64 = 8;
/// Enum values of the document's JSON Schema subset, at most.
const DOC_SCHEMA_ENUM: u64 = 8;

fn integer(min: i64, max: i64) -> Value {
    json!({"type": "integer", "minimum": min, "maximum": max})
}

fn number(min: f64, max: f64) -> Value {
    json!({"type": "number", "minimum": min, "maximum": max})
}

/// A number above 0 that stays above 0 as an `f32` (its smallest is
/// `f32::from_bits(1)`; a smaller one would round to 0), and finite.
fn positive_f32() -> Value {
    number(f64::from(f32::from_bits(1)), f64::from(f32::MAX))
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn string() -> Value {
    json!({"type": "string"})
}

/// One of the strings of `values`.
fn one_of(values: &[&str]) -> Value {
    json!({"type": "string", "enum": values})
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn object(properties: Value, required: &[&str]) -> Value {
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

fn any_of(alternatives: Vec<Value>) -> Value {
    json!({"anyOf": alternatives})
}

fn array(items: Value, min: u64, max: Option<u64>) -> Value {
    let mut schema = json!({"type": "array", "items": items, "minItems": min});
    if let Some(max) = max {
        schema["maxItems"] = max.into();
    }
    schema
}

fn model() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME_BYTES,
        "pattern": MODEL_NAME_PATTERN, "example": "SmolLM2-135M-Instruct.Q4_1:latest"})
}

/// `keep_alive`: seconds (negative: keep loaded) or a duration.
fn keep_alive() -> Value {
    any_of(vec![
        json!({"type": "number", "maximum": MAX_KEEP_ALIVE_SECONDS}),
        json!({"type": "string", "pattern": KEEP_ALIVE_PATTERN}),
    ])
}

/// `stop`: a string or a list of them.
fn stop() -> Value {
    let one = json!({"type": "string", "maxLength": MAX_STOP_CHARS});
    any_of(vec![
        one.clone(),
        array(one, 0, Some(MAX_STOP_SEQUENCES as u64)),
    ])
}

/// The document's subset of JSON Schema, the shape of every schema field
/// (`format`, `response_format`, `text.format`, tool parameters): an object
/// of typed properties, each a scalar, an enum of strings or an array of
/// scalars. The server accepts much more (`$ref`, `anyOf`, patterns… within
/// [`crate::core::bounds`] and [`crate::core::schema_cost`]); this is what a
/// generated request may hold.
fn json_schema_components() -> Vec<(&'static str, Value)> {
    let scalar = one_of(&["string", "integer", "number", "boolean", "null"]);
    let property = json!({
        "type": "object",
        "description": "A property of the document's JSON Schema subset: a scalar type, \
                        maybe bounded, an enum of strings, or an array of scalars.",
        "additionalProperties": false,
        "properties": {
            "type": one_of(&["string", "integer", "number", "boolean", "null", "array"]),
            "description": {"type": "string", "maxLength": 200},
            "enum": array(json!({"type": "string", "maxLength": 32}), 1, Some(DOC_SCHEMA_ENUM)),
            "maxLength": integer(0, MAX_REPEAT as i64),
            "minimum": integer(-1_000_000, 0),
            "maximum": integer(0, 1_000_000),
            "items": {"type": "object", "additionalProperties": false,
                "properties": {"type": scalar}, "required": ["type"]},
            "maxItems": integer(0, 16),
        },
        "required": ["type"],
    });
    let schema = json!({
        "type": "object",
        "description": "A JSON Schema, as the document states it: an object of properties \
                        (the server takes any JSON Schema llama.cpp can turn into a grammar, \
                        within the bounds of its 400s).",
        "additionalProperties": false,
        "properties": {
            "type": one_of(&["object"]),
            "description": {"type": "string", "maxLength": 200},
            "properties": {"type": "object", "maxProperties": DOC_SCHEMA_PROPERTIES,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,31}$"},
                "additionalProperties": reference("JsonSchemaProperty")},
            "additionalProperties": boolean(),
        },
        "required": ["type"],
    });
    vec![("JsonSchemaProperty", property), ("JsonSchema", schema)]
}

/// Ollama's `options`, as [`OllamaOptions::to_params`] checks them.
fn ollama_options() -> Value {
    let most = i64::from(i32::MAX);
    object(
        json!({
            "num_ctx": integer(1, most),
            "num_predict": integer(-2, i64::MAX),
            "temperature": number(0.0, 10.0),
            "top_k": integer(0, most),
            "top_p": number(0.0, 1.0),
            "min_p": number(0.0, 1.0),
            "typical_p": number(0.0, 1.0),
            "repeat_last_n": integer(-1, most),
            "repeat_penalty": positive_f32(),
            "presence_penalty": number(-2.0, 2.0),
            "frequency_penalty": number(-2.0, 2.0),
            "seed": {"type": "integer"},
            "stop": stop(),
            "num_batch": integer(1, most),
            "num_thread": integer(0, MAX_THREADS),
            "num_gpu": integer(-1, most),
            "num_keep": integer(-1, most),
        }),
        &[],
    )
}

/// Ollama's `format`: `"json"`, `""` (free text) or a JSON Schema.
fn ollama_format() -> Value {
    any_of(vec![one_of(&["json", ""]), reference("JsonSchema")])
}

/// An OpenAI chat tool: `{"type": "function", "function": {"name", "description", "parameters"}}`.
fn openai_tool() -> Value {
    object(
        json!({
            "type": one_of(&["function"]),
            "function": object(json!({
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "description": string(),
                "parameters": reference("JsonSchema"),
            }), &["name"]),
        }),
        &["type", "function"],
    )
}

/// OpenAI's `response_format` / Responses' `text.format` (`flat`: the
/// schema's fields beside `type`, as Responses has them).
fn response_format(flat: bool) -> Value {
    let schema_fields = json!({
        "name": {"type": "string", "maxLength": 64},
        "schema": reference("JsonSchema"),
        "strict": boolean(),
    });
    let json_schema = if flat {
        let mut fields = schema_fields;
        fields["type"] = one_of(&["json_schema"]);
        object(fields, &["type", "schema"])
    } else {
        object(
            json!({
                "type": one_of(&["json_schema"]),
                "json_schema": object(schema_fields, &["schema"]),
            }),
            &["type", "json_schema"],
        )
    };
    any_of(vec![
        object(json!({"type": one_of(&["text", "json_object"])}), &["type"]),
        json_schema,
    ])
}

/// OpenAI's `tool_choice`, chat (`flat`: false) or Responses (`flat`: true).
fn tool_choice(flat: bool) -> Value {
    let named = if flat {
        object(
            json!({"type": one_of(&["function"]), "name": string()}),
            &["type", "name"],
        )
    } else {
        object(
            json!({"type": one_of(&["function"]),
                "function": object(json!({"name": string()}), &["name"])}),
            &["type", "function"],
        )
    };
    let mut choice = any_of(vec![one_of(&["auto", "none", "required"]), named]);
    choice["description"] = "`\"auto\"` (default), `\"none\"` (the tools are left out), \
        `\"required\"` or a named function: the last two need `tools`, and the named one \
        must be among them (else 400)"
        .into();
    choice
}

/// OpenAI's `tool_calls` of an assistant message.
fn openai_tool_calls() -> Value {
    array(
        object(
            json!({
                "id": string(),
                "type": one_of(&["function"]),
                "function": object(json!({"name": string(), "arguments": string()}),
                    &["name", "arguments"]),
            }),
            &["type", "function"],
        ),
        0,
        None,
    )
}

/// OpenAI's `logit_bias`: token ids (decimal keys) to a bias in [-100, 100].
fn logit_bias() -> Value {
    let max = f64::from(LOGIT_BIAS_MAX);
    json!({
        "type": "object",
        "propertyNames": {"type": "string", "pattern": LOGIT_BIAS_KEY_PATTERN},
        "additionalProperties": number(-max, max),
        "maxProperties": MAX_LOGIT_BIAS_TOKENS,
        "description": "Token id (decimal, as text) → a bias added to its logit before \
            sampling: -100 bans the token, 100 all but forces it. Each id must be below the \
            model's vocabulary size (`/api/show`'s `model_info`: `<architecture>.vocab_size`): \
            one past it is a 400 naming `logit_bias`.",
    })
}

/// The request bodies of the generation routes, by component name.
fn request_schemas() -> Vec<(&'static str, Value)> {
    let top_logprobs = integer(0, i64::from(MAX_TOP_LOGPROBS));
    let choices = integer(1, i64::from(MAX_CHOICES));
    let tokens = integer(0, i64::from(u32::MAX));
    let images = json!({"type": "array", "items": string(), "maxItems": 0,
        "description": "No model served takes images: a non-empty list is a 400."});
    let think = any_of(vec![boolean(), one_of(&["low", "medium", "high"])]);
    let ollama_message = object(
        json!({
            "role": one_of(OLLAMA_ROLES),
            "content": string(),
            "images": images.clone(),
            "tool_calls": array(object(json!({"function": object(json!({
                "name": string(), "arguments": {"type": "object"}}), &["name"])}),
                &["function"]), 0, None),
            "tool_name": string(),
            "thinking": string(),
        }),
        &["role"],
    );
    let openai_part = object(
        json!({"type": one_of(&["text"]), "text": string()}),
        &["type"],
    );
    let openai_message = object(
        json!({
            "role": one_of(OPENAI_ROLES),
            "content": any_of(vec![string(), array(openai_part, 0, None), json!({"type": "null"})]),
            "name": string(),
            "tool_calls": openai_tool_calls(),
            "tool_call_id": string(),
        }),
        &["role"],
    );
    let responses_content = any_of(vec![
        string(),
        array(
            object(
                json!({"type": one_of(&["input_text", "output_text", "text", "refusal"]),
                    "text": string()}),
                &["type"],
            ),
            0,
            None,
        ),
    ]);
    let responses_item = any_of(vec![
        object(
            json!({"type": one_of(&["message"]), "role": one_of(OPENAI_ROLES),
                "content": responses_content.clone()}),
            &["role", "content"],
        ),
        object(
            json!({"type": one_of(&["function_call"]), "call_id": string(), "name": string(),
                "arguments": string()}),
            &["type", "call_id", "name"],
        ),
        object(
            json!({"type": one_of(&["function_call_output"]), "call_id": string(),
                "output": responses_content}),
            &["type", "call_id", "output"],
        ),
    ]);
    let anthropic_text = object(
        json!({"type": one_of(&["text"]), "text": string()}),
        &["type", "text"],
    );
    let anthropic_block = any_of(vec![
        anthropic_text.clone(),
        object(
            json!({"type": one_of(&["tool_use"]), "id": string(), "name": string(),
                "input": {"type": "object"}}),
            &["type", "id", "name"],
        ),
        object(
            json!({"type": one_of(&["tool_result"]), "tool_use_id": string(),
                "content": any_of(vec![string(), array(anthropic_text.clone(), 0, None)]),
                "is_error": boolean()}),
            &["type", "tool_use_id"],
        ),
        object(
            json!({"type": one_of(&["thinking", "redacted_thinking"])}),
            &["type"],
        ),
    ]);
    let stream_options = object(json!({"include_usage": boolean()}), &[]);
    vec![
        ("OllamaOptions", ollama_options()),
        ("StopSpec", stop()),
        ("Message", ollama_message),
        (
            "GenerateRequest",
            object(
                json!({
                    "model": model(),
                    "prompt": string(),
                    "suffix": {"type": "string", "maxLength": 0},
                    "system": string(),
                    "template": {"type": "string", "minLength": 1,
                        "pattern": PLAIN_TEMPLATE_PATTERN},
                    "raw": boolean(),
                    "context": array(tokens.clone(), 0, None),
                    "images": images,
                    "format": ollama_format(),
                    "options": reference("OllamaOptions"),
                    "stream": boolean(),
                    "keep_alive": keep_alive(),
                    "think": think.clone(),
                    "logprobs": boolean(),
                    "top_logprobs": top_logprobs.clone(),
                    "cache_prompt": boolean(),
                }),
                &["model"],
            ),
        ),
        (
            "ChatRequest",
            object(
                json!({
                    "model": model(),
                    "messages": array(reference("Message"), 0, None),
                    "tools": array(openai_tool(), 0, None),
                    "format": ollama_format(),
                    "options": reference("OllamaOptions"),
                    "stream": boolean(),
                    "keep_alive": keep_alive(),
                    "think": think,
                    "truncate": boolean(),
                    "logprobs": boolean(),
                    "top_logprobs": top_logprobs.clone(),
                    "cache_prompt": boolean(),
                }),
                &["model"],
            ),
        ),
        (
            "EmbedRequest",
            object(
                json!({
                    "model": model(),
                    "input": any_of(vec![
                        json!({"type": "string", "minLength": 1}),
                        array(json!({"type": "string", "minLength": 1}), 0,
                            Some(MAX_EMBED_INPUTS as u64)),
                    ]),
                    "truncate": boolean(),
                    "dimensions": {"type": "integer", "minimum": 1},
                    "options": reference("OllamaOptions"),
                    "keep_alive": keep_alive(),
                }),
                &["model"],
            ),
        ),
        (
            "EmbeddingsRequest",
            object(
                json!({
                    "model": model(),
                    "prompt": string(),
                    "options": reference("OllamaOptions"),
                    "keep_alive": keep_alive(),
                }),
                &["model"],
            ),
        ),
        ("ChatCompletionMessage", openai_message),
        ("StreamOptions", stream_options),
        (
            "ChatCompletionRequest",
            object(
                json!({
                    "model": model(),
                    "messages": array(reference("ChatCompletionMessage"), 1, None),
                    "stream": boolean(),
                    "stream_options": reference("StreamOptions"),
                    "max_tokens": tokens.clone(),
                    "max_completion_tokens": tokens.clone(),
                    "temperature": number(0.0, 2.0),
                    "top_p": number(0.0, 1.0),
                    "seed": {"type": "integer"},
                    "stop": stop(),
                    "frequency_penalty": number(-2.0, 2.0),
                    "presence_penalty": number(-2.0, 2.0),
                    "response_format": response_format(false),
                    "tools": array(openai_tool(), 0, None),
                    "parallel_tool_calls": boolean(),
                    "tool_choice": tool_choice(false),
                    "n": choices.clone(),
                    "truncate": boolean(),
                    "logprobs": boolean(),
                    "top_logprobs": top_logprobs.clone(),
                    "cache_prompt": boolean(),
                    "logit_bias": logit_bias(),
                }),
                &["model", "messages"],
            ),
        ),
        (
            "CompletionRequest",
            object(
                json!({
                    "model": model(),
                    "prompt": any_of(vec![
                        json!({"type": "string", "minLength": 1}),
                        array(json!({"type": "string", "minLength": 1}), 1, Some(1)),
                    ]),
                    "stream": boolean(),
                    "stream_options": reference("StreamOptions"),
                    "max_tokens": tokens.clone(),
                    "temperature": number(0.0, 2.0),
                    "top_p": number(0.0, 1.0),
                    "seed": {"type": "integer"},
                    "stop": stop(),
                    "frequency_penalty": number(-2.0, 2.0),
                    "presence_penalty": number(-2.0, 2.0),
                    "suffix": {"type": "string", "maxLength": 0},
                    "echo": boolean(),
                    "n": choices,
                    "logprobs": top_logprobs.clone(),
                    "cache_prompt": boolean(),
                    "logit_bias": logit_bias(),
                }),
                &["model", "prompt"],
            ),
        ),
        (
            "EmbeddingRequest",
            object(
                json!({
                    "model": model(),
                    "input": any_of(vec![
                        json!({"type": "string", "minLength": 1}),
                        array(json!({"type": "string", "minLength": 1}), 1,
                            Some(MAX_EMBED_INPUTS as u64)),
                        array(tokens.clone(), 1, None),
                        array(array(tokens.clone(), 1, None), 1, Some(MAX_EMBED_INPUTS as u64)),
                    ]),
                    "encoding_format": one_of(&["float", "base64"]),
                    "dimensions": {"type": "integer", "minimum": 1},
                }),
                &["model", "input"],
            ),
        ),
        (
            "TextConfig",
            object(json!({"format": response_format(true)}), &[]),
        ),
        (
            "ResponsesRequest",
            object(
                json!({
                    "model": model(),
                    "input": any_of(vec![string(), array(responses_item, 1, None)]),
                    "instructions": string(),
                    "stream": boolean(),
                    "max_output_tokens": tokens.clone(),
                    "temperature": number(0.0, 2.0),
                    "top_p": number(0.0, 1.0),
                    "text": reference("TextConfig"),
                    "tools": array(object(json!({
                        "type": one_of(&["function"]),
                        "name": {"type": "string", "minLength": 1, "maxLength": 64},
                        "description": string(),
                        "parameters": reference("JsonSchema"),
                    }), &["type", "name"]), 0, None),
                    "tool_choice": tool_choice(true),
                    "parallel_tool_calls": boolean(),
                    "previous_response_id": {"type": "null"},
                    "store": boolean(),
                    "background": {"type": "boolean", "enum": [false]},
                    "conversation": {"type": "null"},
                    "metadata": {"type": "object"},
                    "cache_prompt": boolean(),
                }),
                &["model", "input"],
            ),
        ),
        (
            "MessageParam",
            object(
                json!({
                    "role": one_of(&["user", "assistant"]),
                    "content": any_of(vec![string(), array(anthropic_block, 0, None)]),
                }),
                &["role", "content"],
            ),
        ),
        (
            "MessagesRequest",
            object(
                json!({
                    "model": model(),
                    "max_tokens": tokens,
                    "messages": array(reference("MessageParam"), 1, None),
                    "system": any_of(vec![string(), array(anthropic_text, 0, None)]),
                    "stream": boolean(),
                    "temperature": number(0.0, 2.0),
                    "top_p": number(0.0, 1.0),
                    "top_k": integer(i64::from(i32::MIN), i64::from(i32::MAX)),
                    "stop_sequences": array(string(), 0, None),
                    "tools": array(object(json!({
                        "type": one_of(&["custom"]),
                        "name": {"type": "string", "minLength": 1, "maxLength": 64},
                        "description": string(),
                        "input_schema": reference("JsonSchema"),
                    }), &["name"]), 0, None),
                    "tool_choice": {
                        "anyOf": [
                            object(json!({"type": one_of(&["auto", "any", "none"]),
                                "disable_parallel_tool_use": boolean()}), &["type"]),
                            object(json!({"type": one_of(&["tool"]), "name": string(),
                                "disable_parallel_tool_use": boolean()}), &["type", "name"]),
                        ],
                        "description": "`any` and `tool` need `tools`, and the named tool \
                                        must be among them (else 400)",
                    },
                    "cache_prompt": boolean(),
                }),
                &["model", "max_tokens", "messages"],
            ),
        ),
    ]
}

/// Replaces the generation routes' request schemas of `doc` by
/// [`request_schemas`], keeping the descriptions and examples utoipa wrote
/// from the structs' comments.
fn tighten(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, mut tight) in json_schema_components()
        .into_iter()
        .chain(request_schemas())
    {
        if let Some(old) = schemas.get(name) {
            keep_words(old, &mut tight);
        }
        schemas.insert(name.to_string(), tight);
    }
}

/// Copies `description` and `example` of `old` and of its properties into
/// `tight` where `tight` has none.
fn keep_words(old: &Value, tight: &mut Value) {
    let copy = |from: &Value, to: &mut Value| {
        let Some(to) = to.as_object_mut() else { return };
        for key in ["description", "example"] {
            if let Some(word) = from.get(key).filter(|_| !to.contains_key(key)) {
                to.insert(key.to_string(), word.clone());
            }
        }
    };
    copy(old, tight);
    let empty = Map::new();
    let old_properties = old["properties"].as_object().unwrap_or(&empty);
    if let Some(properties) = tight.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, property) in properties.iter_mut() {
            if let Some(old) = old_properties.get(name) {
                copy(old, property);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// (path, method) of every operation of `paths`, an OpenAPI `paths` object.
    fn operations(paths: &Value) -> BTreeSet<(String, String)> {
        let mut found = BTreeSet::new();
        for (path, item) in paths.as_object().unwrap() {
            for method in ["get", "head", "post", "put", "delete", "patch", "options"] {
                if item.get(method).is_some() {
                    found.insert((path.clone(), method.to_string()));
                }
            }
        }
        found
    }

    /// (path, method) of every endpoint of the table's documented routes.
    fn documented_endpoints() -> BTreeSet<(String, String)> {
        ROUTES
            .iter()
            .filter(|r| r.documented)
            .flat_map(|r| {
                r.endpoints.iter().map(|e| {
                    (
                        r.openapi_path(),
                        e.verb.method().as_str().to_ascii_lowercase(),
                    )
                })
            })
            .collect()
    }

    /// The handlers of `paths(...)` are the table's documented endpoints,
    /// no more (a handler the table leaves out would vanish from the
    /// document unseen) and no fewer (a documented route would be missing).
    #[test]
    fn utoipa_writes_exactly_the_tables_documented_endpoints() {
        let written = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(operations(&written["paths"]), documented_endpoints());
        assert_eq!(operations(&document()["paths"]), documented_endpoints());
    }

    #[test]
    fn each_operations_security_is_its_routes_auth() {
        let doc = document();
        let key = json!([{"bearer": []}, {"x-api-key": []}]);
        let admin = json!([{"bearer": ["admin"]}, {"x-api-key": ["admin"]}]);
        for route in ROUTES.iter().filter(|r| r.documented) {
            for endpoint in route.endpoints {
                let method = endpoint.verb.method().as_str().to_ascii_lowercase();
                let operation = &doc["paths"][route.openapi_path()][&method];
                let expected = match route.auth {
                    Auth::Open => None,
                    Auth::Key | Auth::Scrape => Some(&key),
                    Auth::Admin => Some(&admin),
                };
                assert_eq!(
                    operation.get("security"),
                    expected,
                    "{method} {}",
                    route.path
                );
            }
        }
        assert_eq!(
            doc["paths"]["/api/pull"]["post"]["security"], admin,
            "pull needs the admin key"
        );
        assert!(doc["paths"]["/health"]["get"].get("security").is_none());
        let schemes = &doc["components"]["securitySchemes"];
        assert_eq!(schemes["bearer"]["type"], "http");
        assert_eq!(schemes["bearer"]["scheme"], "bearer");
        assert_eq!(schemes["x-api-key"]["type"], "apiKey");
        assert_eq!(schemes["x-api-key"]["in"], "header");
        assert_eq!(schemes["x-api-key"]["name"], "x-api-key");
    }

    #[test]
    fn the_description_names_the_open_and_admin_routes_of_the_table() {
        let description = document()["info"]["description"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            description.ends_with(
                "When the server has an API key, every route but `/`, `/api/version`, \
                 `/health`, `/ready` needs `Authorization: Bearer <key>` (or `x-api-key: \
                 <key>`); when it has an admin key, `/api/delete`, `/api/copy`, `/api/pull`, \
                 `/api/create`, `/api/push`, `/api/blobs/{digest}` need that one (their \
                 security names the role `admin`)."
            ),
            "{description}"
        );
    }

    /// 401 on every route but the open ones, 404, 503 and 500 where a model
    /// runs: as the table says.
    #[test]
    fn the_layers_statuses_follow_the_table() {
        let doc = document();
        for route in ROUTES.iter().filter(|r| r.documented) {
            for endpoint in route.endpoints {
                let method = endpoint.verb.method().as_str().to_ascii_lowercase();
                let responses = &doc["paths"][route.openapi_path()][&method]["responses"];
                let has = |code: &str| responses.get(code).is_some();
                assert!(has("403"), "{method} {} 403", route.path);
                assert_eq!(
                    has("401"),
                    route.auth != Auth::Open,
                    "{method} {} 401",
                    route.path
                );
                if route.runs_model {
                    for code in ["404", "503", "500"] {
                        assert!(has(code), "{method} {} {code}", route.path);
                    }
                }
            }
        }
        let pull = &doc["paths"]["/api/pull"]["post"]["responses"];
        assert!(pull.get("404").is_none(), "a pull names no loaded model");
        assert!(
            doc["paths"]["/api/copy"]["post"]["responses"]["403"]["description"]
                .as_str()
                .unwrap()
                .ends_with("or needs the admin key")
        );
        assert!(
            !doc["paths"]["/api/chat"]["post"]["responses"]["403"]["description"]
                .as_str()
                .unwrap()
                .contains("admin")
        );
    }

    #[test]
    fn every_route_lists_the_statuses_of_the_layers() {
        let doc = document();
        let status = |path: &str, method: &str, code: &str| {
            doc["paths"][path][method]["responses"].get(code).is_some()
        };
        for (path, method) in [
            ("/api/generate", "post"),
            ("/api/chat", "post"),
            ("/api/pull", "post"),
            ("/v1/chat/completions", "post"),
            ("/v1/embeddings", "post"),
        ] {
            for code in ["200", "400", "401", "403", "413"] {
                assert!(status(path, method, code), "{method} {path} {code}");
            }
        }
        assert!(status("/api/generate", "post", "503"));
        assert!(status("/api/tags", "get", "403"));
        assert!(!status("/api/version", "get", "401"));
        assert_eq!(
            doc["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]
                ["application/json"]["schema"]["$ref"],
            "#/components/schemas/OpenAiErrorBody"
        );
        assert_eq!(
            doc["paths"]["/v1/messages"]["post"]["responses"]["401"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/AnthropicErrorBody"
        );
    }

    #[test]
    fn logprobs_are_in_every_dialects_schemas() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        // A schema with a flattened field is an `allOf` of parts.
        let property = |schema: &str, name: &str| {
            let s = &schemas[schema];
            let parts = s["allOf"].as_array().cloned().unwrap_or_default();
            std::iter::once(s)
                .chain(&parts)
                .any(|part| part["properties"].get(name).is_some())
        };
        for schema in ["GenerateRequest", "ChatRequest", "ChatCompletionRequest"] {
            assert!(property(schema, "logprobs"), "{schema}");
            assert!(property(schema, "top_logprobs"), "{schema}");
        }
        for schema in [
            "CompletionRequest",
            "GenerateChunk",
            "ChatChunk",
            "ChatChoice",
            "CompletionChoice",
        ] {
            assert!(property(schema, "logprobs"), "{schema}");
        }
        assert!(property("TokenLogprob", "top_logprobs"));
        assert!(property("CompletionLogprobs", "text_offset"));
    }

    #[test]
    fn document_lists_every_route() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/",
            "/api/version",
            "/api/tags",
            "/api/ps",
            "/api/show",
            "/api/generate",
            "/api/chat",
            "/api/embed",
            "/api/embeddings",
            "/api/delete",
            "/api/copy",
            "/api/pull",
            "/api/create",
            "/api/push",
            "/api/blobs/{digest}",
            "/v1/models",
            "/v1/models/{id}",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
            "/health",
            "/ready",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
    }
}
