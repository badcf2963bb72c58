//! Structured output and tool calling, shared by both API families.
//!
//! - `format` (Ollama: `"json"` or a JSON Schema) and `response_format`
//!   (OpenAI: `json_object`, `json_schema`) become a GBNF grammar through
//!   llama.cpp's converter; the schema is checked here first so a bad one is
//!   a 400 that says what is wrong (the converter's own reason is lost in
//!   its C wrapper).
//! - `tools` are rendered through the model's chat template and the reply is
//!   parsed back into calls with the template family's syntax
//!   ([`hypura_chat::tools`]). `tool_choice`: `auto` (default) parses
//!   whatever the model writes, `none` leaves the tools out, `required` or
//!   `{"type": "function", "function": {"name"}}` force one call with a
//!   grammar. A template that never mentions `tools` cannot describe them:
//!   llama.cpp's generic format ([`hypura_chat::generic`]) puts them in the
//!   system prompt and a grammar holds the reply to a call or a response.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use hypura_chat::generic;
use hypura_chat::tools::{self, ParsedReply, ToolCall, ToolFamily, ToolStream};
use llama_tiered::llama::{json_schema_to_grammar, JSON_OBJECT_SCHEMA};
use serde_json::{json, Map, Value};

use crate::bounds::{self, BoundsProblem, GrammarProblem};
use crate::convert::{self, ConvertError};
use crate::error::ApiError;
use crate::request::{Constraint, GenerationParams, Prompt};
use crate::schema_cost::{self, CostProblem};
use crate::validation::ValidationError;

/// OpenAI's `response_format`: `{"type": "text"}`, `{"type": "json_object"}`
/// or `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`
/// (the schema is always enforced, `strict` or not). Returns the constraint.
pub fn openai_response_format(format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| !s.is_null())
                .ok_or(ValidationError::MissingResponseSchema)?;
            schema_constraint(schema, "response_format.json_schema.schema").map(Some)
        }
        _ => Err(ValidationError::InvalidResponseFormat(format.to_string()).into()),
    }
}

/// A JSON Schema as a [`Constraint`], or a 400 naming `field` and the
/// problem: its validity, bounds and conversion cost are checked here, when
/// the request is read; the conversion waits for a local backend
/// ([`constraint_grammar`]).
pub fn schema_constraint(schema: &Value, field: &str) -> Result<Constraint, ApiError> {
    check_all(schema).map_err(|fault| fault.into_error(field))?;
    Ok(Constraint::JsonSchema {
        schema: schema.clone(),
        field: field.to_string(),
    })
}

/// The grammar llama.cpp reads for `constraint` (what a local backend does
/// with it): a schema converted off the async runtime ([`convert`]), its
/// checks run again (it may come from another process).
pub fn constraint_grammar(constraint: &Constraint) -> Result<String, ApiError> {
    match constraint {
        Constraint::JsonObject => json_object_grammar(),
        Constraint::JsonSchema { schema, field } => schema_grammar(schema, field),
        Constraint::Grammar(grammar) => Ok(grammar.clone()),
    }
}

pub fn json_object_grammar() -> Result<String, ApiError> {
    json_schema_to_grammar(JSON_OBJECT_SCHEMA).map_err(|e| ApiError::Internal(e.to_string()))
}

/// A JSON Schema → a grammar, or a 400 naming `field` and the problem. The
/// schema's validity, bounds and conversion cost are checked first; the
/// conversion runs off the async runtime ([`convert`]).
pub fn schema_grammar(schema: &Value, field: &str) -> Result<String, ApiError> {
    check_all(schema).map_err(|fault| fault.into_error(field))?;
    let grammar = convert::schema_to_grammar(schema.to_string()).map_err(|e| match e {
        ConvertError::Rejected(message) => ValidationError::UnsupportedSchema {
            field: field.to_string(),
            message,
        }
        .into(),
        e => convert_failed(e),
    })?;
    check_grammar_text(&grammar, field)?;
    Ok(grammar)
}

/// Every check of a schema before its conversion; its cost first, the one
/// check whose own work is bounded (the others walk the whole document).
fn check_all(schema: &Value) -> Result<(), SchemaFault> {
    schema_cost::check(schema).map_err(|problem| match problem {
        CostProblem::RefCycle(_) => SchemaFault::Invalid(format!("at #: {problem}")),
        problem => SchemaFault::Cost(problem),
    })?;
    check_schema(schema, schema, "#")?;
    check_bounds(schema, "#")
}

/// A conversion that did not run or finish: the server's state, not the schema's fault.
fn convert_failed(e: ConvertError) -> ApiError {
    match e {
        ConvertError::Busy => ApiError::Unavailable(e.to_string()),
        e => ApiError::Internal(e.to_string()),
    }
}

/// The grammar's size and repetitions, before llama.cpp compiles it.
fn check_grammar_text(grammar: &str, field: &str) -> Result<(), ValidationError> {
    bounds::check_grammar(grammar).map_err(|problem| match problem {
        GrammarProblem::TooLarge { bytes } => ValidationError::GrammarTooLarge {
            field: field.to_string(),
            bytes,
            limit: bounds::MAX_GRAMMAR_BYTES,
        },
        GrammarProblem::Repetition(repetition) => ValidationError::GrammarRepetition {
            field: field.to_string(),
            repetition,
        },
    })
}

/// Why a schema was refused, before the field it came in is known.
#[derive(Debug)]
enum SchemaFault {
    /// Not valid JSON Schema (the message names the place).
    Invalid(String),
    /// Bounds a grammar cannot hold ([`bounds`]).
    Bounds(BoundsProblem),
    /// More than a conversion may cost ([`schema_cost`]).
    Cost(CostProblem),
}

impl SchemaFault {
    fn into_error(self, field: &str) -> ValidationError {
        let field = field.to_string();
        match self {
            SchemaFault::Invalid(message) => ValidationError::InvalidSchema { field, message },
            SchemaFault::Cost(problem) => ValidationError::SchemaTooCostly { field, problem },
            SchemaFault::Bounds(BoundsProblem::Inverted {
                path,
                min_key,
                min,
                max_key,
                max,
            }) => ValidationError::SchemaBoundsInverted {
                field,
                path,
                min_key,
                min,
                max_key,
                max,
            },
            SchemaFault::Bounds(BoundsProblem::TooLarge {
                path,
                key,
                value,
                limit,
            }) => ValidationError::SchemaCountTooLarge {
                field,
                path,
                key,
                value,
                limit,
            },
            SchemaFault::Bounds(BoundsProblem::Pattern {
                path,
                pattern,
                reason,
            }) => ValidationError::SchemaPattern {
                field,
                path,
                pattern,
                reason,
            },
        }
    }
}

/// The checks of llama.cpp's schema reader (`common/json-schema.cpp`), so
/// that their reasons reach the client, and the [`bounds`] that keep its
/// grammar finite. `path` is a JSON pointer.
fn check_schema(schema: &Value, root: &Value, path: &str) -> Result<(), SchemaFault> {
    let fail = |msg: String| Err(SchemaFault::Invalid(format!("at {path}: {msg}")));
    let Value::Object(map) = schema else {
        return fail(format!("a schema must be an object, got {schema}"));
    };
    if let Some(reference) = map.get("$ref") {
        return check_ref(reference, root).or_else(fail);
    }

    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(alternatives) = map.get(key) {
            let Some(list) = alternatives.as_array().filter(|l| !l.is_empty()) else {
                return fail(format!("{key} must be a non-empty array of schemas"));
            };
            for (i, alternative) in list.iter().enumerate() {
                check_schema(alternative, root, &format!("{path}/{key}/{i}"))?;
            }
        }
    }
    if let Some(values) = map.get("enum") {
        if values.as_array().is_none_or(|v| v.is_empty()) {
            return fail("enum must be a non-empty array".into());
        }
    }
    let types: Vec<&Value> = match map.get("type") {
        None => Vec::new(),
        Some(Value::Array(list)) if list.is_empty() => {
            return fail("type must not be empty".into())
        }
        Some(Value::Array(list)) => list.iter().collect(),
        Some(one) => vec![one],
    };
    const TYPES: [&str; 7] = [
        "object", "array", "string", "integer", "number", "boolean", "null",
    ];
    for t in types {
        match t.as_str() {
            Some(name) if TYPES.contains(&name) => {}
            Some(name) => {
                return fail(format!(
                    "unrecognized type {name:?}: use one of {}",
                    TYPES.join(", ")
                ))
            }
            None => {
                return fail(format!(
                    "type must be a string or an array of strings, got {t}"
                ))
            }
        }
    }
    check_keywords(map, root, path)
}

fn check_keywords(map: &Map<String, Value>, root: &Value, path: &str) -> Result<(), SchemaFault> {
    let fail = |msg: String| Err(SchemaFault::Invalid(format!("at {path}: {msg}")));
    if let Some(properties) = map.get("properties") {
        let Some(properties) = properties.as_object() else {
            return fail("properties must be an object".into());
        };
        for (name, property) in properties {
            check_schema(property, root, &format!("{path}/properties/{name}"))?;
        }
    }
    match map.get("additionalProperties") {
        None | Some(Value::Bool(_)) => {}
        Some(schema @ Value::Object(_)) => {
            check_schema(schema, root, &format!("{path}/additionalProperties"))?
        }
        Some(_) => return fail("additionalProperties must be a boolean or a schema".into()),
    }
    for key in ["items", "prefixItems"] {
        match map.get(key) {
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    check_schema(item, root, &format!("{path}/{key}/{i}"))?;
                }
            }
            Some(item) => check_schema(item, root, &format!("{path}/{key}"))?,
            None => {}
        }
    }
    for key in [
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
    ] {
        if map.get(key).is_some_and(|v| v.as_u64().is_none()) {
            return fail(format!("{key} must be a non-negative integer"));
        }
    }
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if map.get(key).is_some_and(|v| !v.is_number()) {
            return fail(format!("{key} must be a number"));
        }
    }
    if let Some(step) = map.get("multipleOf") {
        if step.as_f64().is_none_or(|s| s <= 0.0) {
            return fail(format!(
                "multipleOf must be a number greater than 0, got {step}"
            ));
        }
    }
    if let Some(message) = empty_range(map) {
        return fail(message);
    }
    for key in ["pattern", "format"] {
        if map.get(key).is_some_and(|v| !v.is_string()) {
            return fail(format!("{key} must be a string"));
        }
    }
    Ok(())
}

/// Why no number can satisfy `map`'s bounds (`minimum` above `maximum`, or
/// for an integer no whole number between them), if none can: llama.cpp
/// would build a grammar that matches nothing, or ignore the bounds.
fn empty_range(map: &Map<String, Value>) -> Option<String> {
    let bound = |key: &'static str| map.get(key).and_then(Value::as_f64).map(|v| (key, v));
    let lower = bound("minimum")
        .into_iter()
        .chain(bound("exclusiveMinimum"));
    let upper = bound("maximum")
        .into_iter()
        .chain(bound("exclusiveMaximum"));
    let integer = map.get("type").and_then(Value::as_str) == Some("integer");
    for (low_key, low) in lower {
        for (high_key, high) in upper.clone() {
            let exclusive = low_key.starts_with("exclusive") || high_key.starts_with("exclusive");
            let empty = if integer {
                let least = if low_key == "minimum" {
                    low.ceil()
                } else {
                    low.floor() + 1.0
                };
                let most = if high_key == "maximum" {
                    high.floor()
                } else {
                    high.ceil() - 1.0
                };
                least > most
            } else {
                low > high || (exclusive && low >= high)
            };
            if empty {
                let kind = if integer { "integer" } else { "number" };
                return Some(format!(
                    "{low_key} ({low}) and {high_key} ({high}) leave no {kind} between them: no \
                     value can satisfy it"
                ));
            }
        }
    }
    None
}

/// [`bounds::check_object`] on every object of the document but literal
/// values (`enum`, `const`, `default`, `examples`): a `$ref` may point
/// anywhere in it, `$defs` or not, and llama.cpp converts what it finds.
fn check_bounds(value: &Value, path: &str) -> Result<(), SchemaFault> {
    match value {
        Value::Object(map) => {
            bounds::check_object(map, path).map_err(SchemaFault::Bounds)?;
            for (key, child) in map {
                if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    check_bounds(child, &format!("{path}/{key}"))?;
                }
            }
        }
        Value::Array(list) => {
            for (i, child) in list.iter().enumerate() {
                check_bounds(child, &format!("{path}/{i}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A `$ref` must point into the same document (`#/…`) at something there.
fn check_ref(reference: &Value, root: &Value) -> Result<(), String> {
    let Some(text) = reference.as_str() else {
        return Err("$ref must be a string".into());
    };
    let Some(pointer) = text.strip_prefix('#').filter(|p| p.starts_with('/')) else {
        return Err(format!(
            "unsupported $ref {text:?}: only references into the same schema (\"#/…\") are supported"
        ));
    };
    let unescaped = pointer.replace("~1", "/").replace("~0", "~");
    if root.pointer(pointer).is_none() && root.pointer(&unescaped).is_none() {
        return Err(format!("$ref {text:?} points at nothing in the schema"));
    }
    Ok(())
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// The model must not call tools: they are left out of the prompt.
    None,
    /// The model must call one of the tools.
    Required,
    /// The model must call this one.
    Function(String),
}

impl ToolChoice {
    pub fn parse(value: Option<&Value>) -> Result<ToolChoice, ValidationError> {
        let bad = |v: &Value| ValidationError::InvalidToolChoice(v.to_string());
        match value {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                _ => Err(bad(value.unwrap_or(&Value::Null))),
            },
            Some(v @ Value::Object(_)) => v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .map(|name| ToolChoice::Function(name.to_string()))
                .ok_or_else(|| bad(v)),
            Some(v) => Err(bad(v)),
        }
    }
}

/// A request's tools, checked against the model's template.
#[derive(Debug, Clone)]
pub struct Tools {
    pub family: ToolFamily,
    /// The `tools` array, for the template.
    pub definitions: Value,
    /// Forces a call (tool_choice `required` or a named function) or, for
    /// [`ToolFamily::Generic`], holds the reply to a call or a response.
    grammar: Option<String>,
    /// [`ToolFamily::Generic`]: the system prompt that describes the tools.
    system_prompt: Option<String>,
}

/// Checks `tools` and `tool_choice` for the model whose chat template is
/// `template` (`None`: it has none). `parallel`: the model may call several
/// tools at once. `None` when no tools take part.
pub fn prepare_tools(
    tools: Option<&[Value]>,
    choice: &ToolChoice,
    parallel: bool,
    template: Option<&str>,
) -> Result<Option<Tools>, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.is_empty() {
        return match choice {
            ToolChoice::Required | ToolChoice::Function(_) => {
                Err(ValidationError::ToolChoiceWithoutTools.into())
            }
            _ => Ok(None),
        };
    }
    if *choice == ToolChoice::None {
        return Ok(None);
    }
    let family = template
        .and_then(ToolFamily::detect)
        .unwrap_or(ToolFamily::Generic);
    let mut named = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let function = tool
            .get("function")
            .filter(|_| tool.get("type").and_then(Value::as_str) == Some("function"));
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(function), Some(name)) = (function, name.filter(|n| !n.is_empty())) else {
            return Err(ValidationError::InvalidTool {
                index: i,
                tool: tool.to_string(),
            }
            .into());
        };
        let parameters = function.get("parameters").cloned().unwrap_or(Value::Null);
        named.push((name.to_string(), parameters));
    }
    let forced: Vec<(String, Value)> = match choice {
        ToolChoice::Required => named.clone(),
        ToolChoice::Function(name) => {
            let one: Vec<_> = named.iter().filter(|(n, _)| n == name).cloned().collect();
            if one.is_empty() {
                return Err(ValidationError::ToolChoiceUnknownFunction(name.clone()).into());
            }
            one
        }
        ToolChoice::Auto | ToolChoice::None => Vec::new(),
    };
    let required = !forced.is_empty();
    if family == ToolFamily::Generic {
        let offered = if required { forced } else { named };
        let schema = generic::reply_schema(&offered, parallel, required);
        return Ok(Some(Tools {
            family,
            system_prompt: Some(generic::system_prompt(tools, parallel, !required)),
            definitions: Value::Array(tools.to_vec()),
            grammar: Some(generic::compact_grammar(&tool_grammar(
                &schema.to_string(),
            )?)),
        }));
    }
    let grammar = if required {
        Some(tools::forced_call_grammar(family, &forced, tool_grammar)?)
    } else {
        None
    };
    Ok(Some(Tools {
        family,
        definitions: Value::Array(tools.to_vec()),
        grammar,
        system_prompt: None,
    }))
}

/// A grammar for a schema built from the tools' parameters: a bad one is
/// the tools' fault.
fn tool_grammar(schema: &str) -> Result<String, ApiError> {
    let value: Value = serde_json::from_str(schema).unwrap_or(Value::Null);
    check_all(&value).map_err(|fault| match fault {
        SchemaFault::Invalid(message) => ValidationError::InvalidToolSchema(message),
        fault => fault.into_error("tools"),
    })?;
    let grammar = convert::schema_to_grammar(schema.to_string()).map_err(|e| match e {
        ConvertError::Rejected(message) => ValidationError::UnsupportedToolSchema(message).into(),
        e => convert_failed(e),
    })?;
    check_grammar_text(&grammar, "tools")?;
    Ok(grammar)
}

impl Tools {
    /// Keeps the family's marker tokens in the text and adds the forcing
    /// grammar; a forced call cannot also follow a response format.
    pub fn apply(&self, params: &mut GenerationParams) -> Result<(), ApiError> {
        params.sampling.preserved_tokens = self
            .family
            .markers()
            .iter()
            .map(|m| m.to_string())
            .collect();
        if let Some(grammar) = &self.grammar {
            if params.constraint.is_some() {
                return Err(match self.family {
                    ToolFamily::Generic => ValidationError::ToolsWithFormat,
                    _ => ValidationError::ToolChoiceWithFormat,
                }
                .into());
            }
            params.constraint = Some(Constraint::Grammar(grammar.clone()));
        }
        Ok(())
    }

    /// Puts the tools in `prompt`: for the template, or (generic format) in
    /// its system prompt.
    pub fn render_into(&self, prompt: &mut Prompt) {
        if let Prompt::Messages {
            messages, tools, ..
        } = prompt
        {
            match &self.system_prompt {
                Some(system) => *messages = generic::with_system(messages, system),
                None => *tools = Some(self.definitions.clone()),
            }
        }
    }

    pub fn stream(&self) -> ToolStream {
        ToolStream::new(self.family)
    }

    pub fn parse(&self, text: &str) -> ParsedReply {
        tools::parse(self.family, text)
    }
}

/// Ollama's `message.tool_calls`: `[{"function": {"index", "name", "arguments": {…}}}]`.
pub fn ollama_tool_calls(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            json!({"function": {
                "index": index,
                "name": call.name,
                "arguments": call.arguments,
            }})
        })
        .collect()
}

/// A fresh id: `prefix`, the time and a process-wide counter (`call_…`, `chatcmpl-…`).
pub fn unique_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{nanos:x}{n:04x}")
}

/// Ollama's input `tool_calls` (`[{"function": {"name", "arguments": {…}}}]`)
/// in the OpenAI shape the chat templates read (`"type": "function"` added).
pub fn ollama_input_tool_calls(calls: Option<&Value>) -> Option<Value> {
    let calls = calls.filter(|v| !v.is_null())?;
    let Value::Array(list) = calls else {
        return Some(calls.clone());
    };
    let list = list
        .iter()
        .map(|call| match call {
            Value::Object(map) if !map.contains_key("type") => {
                let mut map = map.clone();
                map.insert("type".into(), "function".into());
                Value::Object(map)
            }
            other => other.clone(),
        })
        .collect();
    Some(Value::Array(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ollama's `format` as the gateway's Ollama route reads it (its
    /// `ollama_format`, in the gateway's API modules), then as a local
    /// backend makes it a grammar.
    fn ollama_format(format: Option<&Value>) -> Result<Option<String>, ApiError> {
        let constraint = match format {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) if s.is_empty() => return Ok(None),
            Some(Value::String(s)) if s == "json" => Constraint::JsonObject,
            Some(schema @ Value::Object(_)) => schema_constraint(schema, "format")?,
            Some(other) => return Err(ValidationError::InvalidFormat(other.to_string()).into()),
        };
        constraint_grammar(&constraint).map(Some)
    }

    /// OpenAI's `response_format`, then its grammar.
    fn response_format_grammar(format: Option<&Value>) -> Result<Option<String>, ApiError> {
        openai_response_format(format)?
            .map(|c| constraint_grammar(&c))
            .transpose()
    }

    fn schema_error(schema: Value) -> String {
        ollama_format(Some(&schema)).unwrap_err().to_string()
    }

    #[test]
    fn formats_become_grammars() {
        assert_eq!(ollama_format(None).unwrap(), None);
        assert_eq!(ollama_format(Some(&json!(""))).unwrap(), None);
        let json_grammar = ollama_format(Some(&json!("json"))).unwrap().unwrap();
        assert!(
            json_grammar.lines().any(|l| l == "root ::= object"),
            "{json_grammar}"
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert!(ollama_format(Some(&schema)).unwrap().is_some());
        let err = ollama_format(Some(&json!("yaml"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid format \"yaml\": use \"json\" or a JSON Schema object"
        );
        assert_eq!(
            response_format_grammar(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            response_format_grammar(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(json_grammar)
        );
        let err = response_format_grammar(Some(&json!({"type": "json_schema"}))).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("response_format.json_schema.schema is required"));
    }

    #[test]
    fn number_bounds_that_nothing_satisfies_are_refused() {
        let n = |bounds: Value| {
            let mut schema = json!({"type": "integer"});
            schema
                .as_object_mut()
                .unwrap()
                .extend(bounds.as_object().unwrap().clone());
            schema_grammar(&schema, "format")
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            n(json!({"minimum": 10, "maximum": 5})).unwrap(),
            "format: invalid JSON Schema: at #: minimum (10) and maximum (5) leave no integer \
             between them: no value can satisfy it"
        );
        assert!(n(json!({"minimum": 1.5, "maximum": 1.9})).is_some());
        assert!(n(json!({"exclusiveMinimum": 3, "maximum": 3})).is_some());
        assert!(n(json!({"minimum": 5, "maximum": 5})).is_none());
        assert_eq!(
            n(json!({"multipleOf": 0})).unwrap(),
            "format: invalid JSON Schema: at #: multipleOf must be a number greater than 0, got 0"
        );
        assert!(n(json!({"multipleOf": -2})).is_some());
        let number = json!({"type": "number", "minimum": 1.5, "maximum": 1.9});
        assert!(schema_grammar(&number, "format").is_ok());
        let number = json!({"type": "number", "minimum": 2, "exclusiveMaximum": 2});
        assert!(schema_grammar(&number, "format").is_err());
    }

    #[test]
    fn bad_schemas_say_where_and_what() {
        assert_eq!(
            schema_error(json!({"type": "object", "properties": {"a": {"type": "banana"}}})),
            "format: invalid JSON Schema: at #/properties/a: unrecognized type \"banana\": use \
             one of object, array, string, integer, number, boolean, null"
        );
        assert_eq!(
            schema_error(json!({"$ref": "#/$defs/nowhere"})),
            "format: invalid JSON Schema: at #: $ref \"#/$defs/nowhere\" points at nothing in \
             the schema"
        );
        assert_eq!(
            schema_error(json!({"enum": []})),
            "format: invalid JSON Schema: at #: enum must be a non-empty array"
        );
        assert_eq!(
            schema_error(json!({"type": "string", "maxLength": -1})),
            "format: invalid JSON Schema: at #: maxLength must be a non-negative integer"
        );
        let ok = json!({"$defs": {"p": {"type": "string"}}, "type": "object",
            "properties": {"p": {"$ref": "#/$defs/p"}}});
        assert!(ollama_format(Some(&ok)).is_ok());
    }

    /// Every bound that made llama.cpp's grammar parser allocate without end
    /// is its own 400, through each field a schema comes in.
    #[test]
    fn schema_bounds_have_their_own_variants() {
        let rule = |r: Result<Option<String>, ApiError>| match r {
            Err(ApiError::Validation(v)) => v,
            other => panic!("not a validation error: {other:?}"),
        };
        let inverted = json!({"type": "string", "minLength": 10, "maxLength": 1});
        let e = rule(ollama_format(Some(&inverted)));
        assert_eq!(
            e,
            ValidationError::SchemaBoundsInverted {
                field: "format".into(),
                path: "#".into(),
                min_key: "minLength",
                min: 10,
                max_key: "maxLength",
                max: 1
            }
        );
        assert_eq!(
            e.to_string(),
            "format: invalid JSON Schema: at #: minLength (10) is greater than maxLength (1): \
             no value can satisfy it"
        );
        let through_openai = rule(response_format_grammar(Some(
            &json!({"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object", "properties":
                {"tags": {"type": "array", "minItems": 3, "maxItems": 2}}}}}),
        )));
        assert!(matches!(through_openai,
            ValidationError::SchemaBoundsInverted { field, path, min_key: "minItems", .. }
                if field == "response_format.json_schema.schema" && path == "#/properties/tags"));
        assert!(matches!(
            rule(ollama_format(Some(
                &json!({"type": "object", "minProperties": 2, "maxProperties": 1})
            ))),
            ValidationError::SchemaBoundsInverted {
                min_key: "minProperties",
                ..
            }
        ));
        assert!(matches!(
            rule(ollama_format(Some(&json!({"type": "string", "pattern": "^a{5,1}$"})))),
            ValidationError::SchemaPattern { reason, .. } if reason.contains("at least 5 but at most 1")
        ));
        assert!(matches!(
            rule(ollama_format(Some(
                &json!({"type": "string", "pattern": "^a{100000}$"})
            ))),
            ValidationError::SchemaPattern { .. }
        ));
        assert!(matches!(
            rule(ollama_format(Some(
                &json!({"type": "array", "minItems": 100000})
            ))),
            ValidationError::SchemaCountTooLarge {
                key: "minItems",
                value: 100000,
                limit: 2000,
                ..
            }
        ));
        // Behind a $ref, even outside $defs.
        let hidden =
            json!({"$ref": "#/x", "x": {"type": "string", "minLength": 9, "maxLength": 2}});
        assert!(matches!(
            rule(ollama_format(Some(&hidden))),
            ValidationError::SchemaBoundsInverted { path, .. } if path == "#/x"
        ));
        // Literal values are not schemas.
        let literal = json!({"enum": [{"minLength": 9, "maxLength": 2}]});
        assert!(ollama_format(Some(&literal)).is_ok());
        let huge_enum: Vec<String> = (0..40_000).map(|i| format!("value number {i}")).collect();
        assert!(matches!(
            rule(ollama_format(Some(&json!({"enum": huge_enum})))),
            ValidationError::SchemaTooCostly {
                problem: CostProblem::GrammarTooLarge,
                ..
            }
        ));
        // Below the estimate, the grammar's own size is checked once made.
        let long_names: Vec<String> = (0..20_000).map(|i| format!("{i:0>10}")).collect();
        assert!(matches!(
            rule(ollama_format(Some(
                &json!({"enum": long_names, "type": "string"})
            ))),
            ValidationError::GrammarTooLarge { .. }
        ));
        let ok = json!({"type": "string", "minLength": 2, "maxLength": 2, "pattern": "^[a-z]{2}$"});
        assert!(ollama_format(Some(&ok)).is_ok());
        let tools = vec![json!({"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties":
                {"s": {"type": "string", "minLength": 4, "maxLength": 3}}}}})];
        let e = prepare_tools(Some(&tools), &ToolChoice::Required, true, Some(QWEN_LIKE))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, ApiError::Validation(ValidationError::SchemaBoundsInverted { ref field, .. }) if field == "tools"),
            "{e:?}"
        );
    }

    #[test]
    fn tool_choice_values() {
        assert_eq!(ToolChoice::parse(None).unwrap(), ToolChoice::Auto);
        assert_eq!(
            ToolChoice::parse(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            ToolChoice::parse(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            ToolChoice::Function("f".into())
        );
        assert!(ToolChoice::parse(Some(&json!("sometimes"))).is_err());
    }

    const QWEN_LIKE: &str = "{% if tools %}{{ tools | tojson }}{% endif %}<tool_call>";

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
        ]
    }

    #[test]
    fn tools_take_the_template_family_or_the_generic_format() {
        let none = prepare_tools(Some(&weather()), &ToolChoice::None, true, None).unwrap();
        assert!(none.is_none());
        let tools = prepare_tools(Some(&weather()), &ToolChoice::Auto, true, Some(QWEN_LIKE))
            .unwrap()
            .unwrap();
        assert_eq!(tools.family, ToolFamily::Hermes);
        assert!(tools.grammar.is_none() && tools.system_prompt.is_none());
        let bad = vec![json!({"type": "function"})];
        let err = prepare_tools(Some(&bad), &ToolChoice::Auto, true, Some(QWEN_LIKE)).unwrap_err();
        assert!(err.to_string().starts_with("tools[0] must be"), "{err}");
        let err = prepare_tools(Some(&bad), &ToolChoice::Auto, true, None).unwrap_err();
        assert!(err.to_string().starts_with("tools[0] must be"), "{err}");
    }

    /// A template without tools (or none): the tools go into the system
    /// prompt and a grammar allows a call or a response (only calls when
    /// one is required), as one `tool_call` or a `tool_calls` list.
    #[test]
    fn templates_without_tools_get_the_generic_format() {
        for template in [Some("{{ x }}"), None] {
            let tools = prepare_tools(Some(&weather()), &ToolChoice::Auto, true, template)
                .unwrap()
                .unwrap();
            assert_eq!(tools.family, ToolFamily::Generic);
            let mut params = GenerationParams::default();
            tools.apply(&mut params).unwrap();
            let Some(Constraint::Grammar(grammar)) = params.constraint else {
                panic!("no grammar")
            };
            assert!(grammar.contains("\"\\\"tool_calls\\\"\""), "{grammar}");
            assert!(grammar.contains("\"\\\"response\\\"\""), "{grammar}");
            assert!(params.sampling.preserved_tokens.is_empty());
            let mut prompt = Prompt::messages(vec![hypura_chat::ChatMessage::new("user", "Hi")]);
            tools.render_into(&mut prompt);
            let Prompt::Messages {
                messages,
                tools: for_template,
                ..
            } = prompt
            else {
                unreachable!()
            };
            assert_eq!(for_template, None, "the template cannot take them");
            assert_eq!(messages[0].role, "system");
            assert_eq!(
                messages[0].content,
                generic::system_prompt(&weather(), true, true)
            );
        }
        let one = prepare_tools(
            Some(&weather()),
            &ToolChoice::Function("get_weather".into()),
            false,
            None,
        )
        .unwrap()
        .unwrap();
        let grammar = one.grammar.clone().unwrap();
        assert!(grammar.contains("\"\\\"tool_call\\\"\""), "{grammar}");
        assert!(!grammar.contains("tool_calls") && !grammar.contains("response"));
        let mut with_format = GenerationParams {
            constraint: Some(Constraint::JsonObject),
            ..Default::default()
        };
        assert!(matches!(
            one.apply(&mut with_format),
            Err(ApiError::Validation(ValidationError::ToolsWithFormat))
        ));
    }

    #[test]
    fn forced_calls_get_a_grammar_and_exclude_formats() {
        let required = prepare_tools(
            Some(&weather()),
            &ToolChoice::Required,
            true,
            Some(QWEN_LIKE),
        )
        .unwrap()
        .unwrap();
        let mut params = GenerationParams::default();
        required.apply(&mut params).unwrap();
        let Some(Constraint::Grammar(grammar)) = params.constraint.clone() else {
            panic!("no grammar")
        };
        assert!(
            grammar
                .starts_with("root ::= \"<tool_call>\\n\" hypura-tool-call \"\\n</tool_call>\"\n"),
            "{grammar}"
        );
        assert_eq!(
            params.sampling.preserved_tokens,
            vec!["<tool_call>", "</tool_call>"]
        );
        let mut with_format = GenerationParams {
            constraint: Some(Constraint::JsonObject),
            ..Default::default()
        };
        assert!(required.apply(&mut with_format).is_err());
        let err = prepare_tools(
            Some(&weather()),
            &ToolChoice::Function("nope".into()),
            true,
            Some(QWEN_LIKE),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tool_choice names function \"nope\", which is not among the tools"
        );
    }

    #[test]
    fn tool_calls_in_each_family_shape() {
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}).as_object().unwrap().clone(),
            id: Some("call_1".into()),
            cut_arguments: None,
        };
        assert_eq!(
            ollama_tool_calls(std::slice::from_ref(&call)),
            vec![
                json!({"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}})
            ]
        );
        let input = json!([{"function": {"name": "f", "arguments": {"a": 1}}}]);
        assert_eq!(
            ollama_input_tool_calls(Some(&input)).unwrap(),
            json!([{"function": {"name": "f", "arguments": {"a": 1}}, "type": "function"}])
        );
    }

    /// Format, schema and tool rules: each its own variant.
    #[test]
    fn format_and_tool_rules_have_their_own_variants() {
        let rule = |r: Result<Option<String>, ApiError>| match r {
            Err(ApiError::Validation(v)) => v,
            other => panic!("not a validation error: {other:?}"),
        };
        assert_eq!(
            rule(ollama_format(Some(&json!(3)))),
            ValidationError::InvalidFormat("3".into())
        );
        assert_eq!(
            rule(response_format_grammar(Some(&json!({"type": "xml"})))),
            ValidationError::InvalidResponseFormat(r#"{"type":"xml"}"#.into())
        );
        assert_eq!(
            rule(response_format_grammar(Some(
                &json!({"type": "json_schema"})
            ))),
            ValidationError::MissingResponseSchema
        );
        assert!(matches!(
            rule(ollama_format(Some(&json!({"enum": []})))),
            ValidationError::InvalidSchema { field, .. } if field == "format"
        ));
        assert_eq!(
            ToolChoice::parse(Some(&json!("sometimes"))).unwrap_err(),
            ValidationError::InvalidToolChoice("\"sometimes\"".into())
        );
        let tools_rule = |r: Result<Option<Tools>, ApiError>| match r {
            Err(ApiError::Validation(v)) => v,
            other => panic!("not a validation error: {:?}", other.map(|t| t.is_some())),
        };
        assert_eq!(
            tools_rule(prepare_tools(
                None,
                &ToolChoice::Required,
                true,
                Some(QWEN_LIKE)
            )),
            ValidationError::ToolChoiceWithoutTools
        );
        assert_eq!(
            tools_rule(prepare_tools(
                Some(&weather()),
                &ToolChoice::Function("nope".into()),
                true,
                Some(QWEN_LIKE)
            )),
            ValidationError::ToolChoiceUnknownFunction("nope".into())
        );
        assert!(matches!(
            tools_rule(prepare_tools(
                Some(&[json!({"type": "function"})]),
                &ToolChoice::Auto,
                true,
                Some(QWEN_LIKE)
            )),
            ValidationError::InvalidTool { index: 0, .. }
        ));
        let forced = prepare_tools(
            Some(&weather()),
            &ToolChoice::Required,
            true,
            Some(QWEN_LIKE),
        )
        .unwrap()
        .unwrap();
        let mut params = GenerationParams {
            constraint: Some(Constraint::JsonObject),
            ..GenerationParams::default()
        };
        assert!(matches!(
            forced.apply(&mut params),
            Err(ApiError::Validation(ValidationError::ToolChoiceWithFormat))
        ));
    }
}
