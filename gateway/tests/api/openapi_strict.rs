//! The OpenAPI document is as strict as the validation (issue 30, item 13): a schema fuzzer
//! reached generation once in 114,780 requests, because the document allowed any value the
//! server then refused (`format` an object, every option unbounded, roles any string…).
//!
//! For each generation route, requests are built from the document the server serves: a base
//! body (the document's examples where it has them), then every bounded field of it, of its
//! `options` and of its first message, at its minimum and maximum and at each of its enum
//! values, answered 200; a value just outside a bound (an integer past it, a number past it,
//! a string outside its enum or longer than its `maxLength`, a list shorter or longer than its
//! counts, a required field left out, a model name outside the pattern) is a 400 naming the
//! field. Where the answer depends on the model served or on another field (a context larger
//! than the model's, thinking on a model that does not think, a forced tool call without
//! tools), the document says so and [`exception`] gives the 400 it is.
#[path = "../common/mod.rs"]
mod common;

use common::{Server, MODEL};
use serde_json::{json, Value};

/// The generation routes, their request schema and a base body.
fn routes() -> Vec<(&'static str, &'static str, Value)> {
    let chat = json!([{"role": "user", "content": "hi"}]);
    vec![
        (
            "/api/generate",
            "GenerateRequest",
            json!({"model": MODEL, "prompt": "hi", "stream": false, "options": {"num_predict": 2}}),
        ),
        (
            "/api/chat",
            "ChatRequest",
            json!({"model": MODEL, "messages": chat, "stream": false,
                "options": {"num_predict": 2}}),
        ),
        (
            "/api/embed",
            "EmbedRequest",
            json!({"model": MODEL, "input": "hi"}),
        ),
        (
            "/api/embeddings",
            "EmbeddingsRequest",
            json!({"model": MODEL, "prompt": "hi"}),
        ),
        (
            "/v1/chat/completions",
            "ChatCompletionRequest",
            json!({"model": MODEL, "messages": chat, "max_tokens": 2, "logprobs": true}),
        ),
        (
            "/v1/completions",
            "CompletionRequest",
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        ),
        (
            "/v1/embeddings",
            "EmbeddingRequest",
            json!({"model": MODEL, "input": "hi"}),
        ),
        (
            "/v1/responses",
            "ResponsesRequest",
            json!({"model": MODEL, "input": "hi", "max_output_tokens": 2}),
        ),
        (
            "/v1/messages",
            "MessagesRequest",
            json!({"model": MODEL, "max_tokens": 2, "messages": chat}),
        ),
    ]
}

/// A value the document allows but the server answers otherwise, for a reason the document
/// states: the status and a word the message holds.
fn exception(route: &str, field: &str, value: &Value) -> Option<(u16, &'static str)> {
    match (route, field) {
        // Above SmolLM2's training context (8192 tokens), or too small for the prompt.
        ("/api/generate" | "/api/chat", "options.num_ctx")
            if value.as_i64().is_some_and(|n| !(64..=8192).contains(&n)) =>
        {
            Some((400, "options.num_ctx"))
        }
        // SmolLM2 does not think.
        (_, "think") if value != &json!(false) => Some((400, "thinking")),
        // A forced call needs tools.
        (_, "tool_choice") if value == "required" => Some((400, "tool_choice")),
        _ => None,
    }
}

/// The schema `schema` names when it is a `$ref`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")],
        None => schema,
    }
}

/// One request to send: `field` (a dotted path) set to `value` (or left out: `None`).
struct Probe {
    field: String,
    value: Option<Value>,
    /// The document allows it.
    allowed: bool,
}

/// Values at a schema's bounds (`allowed`) and just past them (not), for one field.
fn bounds(doc: &Value, schema: &Value) -> Vec<(Value, bool)> {
    let schema = resolve(doc, schema);
    let mut values = Vec::new();
    if let Some(alternatives) = schema["anyOf"].as_array() {
        // Inside any alternative is allowed; outside one is outside all only when no other
        // alternative takes that JSON type.
        let kinds: Vec<&str> = alternatives
            .iter()
            .map(|a| resolve(doc, a)["type"].as_str().unwrap_or("?"))
            .collect();
        for (i, alternative) in alternatives.iter().enumerate() {
            for (value, allowed) in bounds(doc, alternative) {
                let kind = json_type(&value);
                let elsewhere = kinds
                    .iter()
                    .enumerate()
                    .any(|(j, k)| j != i && (*k == kind || (*k == "number" && kind == "integer")));
                if allowed || !elsewhere {
                    values.push((value, allowed));
                }
            }
        }
        return values;
    }
    let int = |v: &Value| v.as_i64().map(i128::from).or(v.as_u64().map(i128::from));
    let number = |n: i128| -> Option<Value> {
        i64::try_from(n)
            .map(Value::from)
            .ok()
            .or_else(|| u64::try_from(n).ok().map(Value::from))
    };
    match schema["type"].as_str() {
        Some("integer") => {
            if let Some(min) = int(&schema["minimum"]) {
                values.extend(number(min).map(|v| (v, true)));
                values.extend(number(min - 1).map(|v| (v, false)));
            }
            if let Some(max) = int(&schema["maximum"]) {
                values.extend(number(max).map(|v| (v, true)));
                values.extend(number(max + 1).map(|v| (v, false)));
            }
        }
        Some("number") => {
            if let Some(min) = schema["minimum"].as_f64() {
                values.push((json!(min), true));
                values.push((json!(min - min.abs().max(1.0)), false));
            }
            if let Some(max) = schema["maximum"].as_f64() {
                values.push((json!(max), true));
                values.push((json!(max + max.abs().max(1.0)), false));
            }
        }
        Some("string") => {
            if let Some(options) = schema["enum"].as_array() {
                values.extend(options.iter().map(|o| (o.clone(), true)));
                values.push((json!("no-such-value"), false));
            }
            if let Some(max) = schema["maxLength"].as_u64().filter(|&m| m < 1000) {
                values.push((json!("x".repeat(max as usize + 1)), false));
            }
            if schema["minLength"].as_u64() == Some(1) && schema["pattern"].is_null() {
                values.push((json!(""), false));
            }
        }
        Some("boolean") if schema["enum"].is_array() => {
            for b in [false, true] {
                let allowed = schema["enum"].as_array().unwrap().contains(&json!(b));
                values.push((json!(b), allowed));
            }
        }
        Some("null") => {
            values.push((Value::Null, true));
            values.push((json!("x"), false));
        }
        Some("array") => {
            let item = sample(doc, &schema["items"]);
            if let Some(min) = schema["minItems"].as_u64().filter(|&m| m > 0) {
                values.push((json!(vec![item.clone(); min as usize - 1]), false));
            }
            if let Some(max) = schema["maxItems"].as_u64() {
                // 2,048 embedding inputs take a minute: only the one past them is sent.
                if max <= 64 {
                    values.push((json!(vec![item.clone(); max as usize]), true));
                }
                values.push((json!(vec![item; max as usize + 1]), false));
            }
        }
        _ => {}
    }
    values
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A small value the schema allows.
fn sample(doc: &Value, schema: &Value) -> Value {
    let schema = resolve(doc, schema);
    if let Some(first) = schema["anyOf"].as_array().and_then(|a| a.first()) {
        return sample(doc, first);
    }
    if let Some(first) = schema["enum"].as_array().and_then(|a| a.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("string") => json!("a"),
        Some("integer") | Some("number") => schema["minimum"].clone().max_zero(),
        Some("boolean") => json!(false),
        Some("array") => json!(vec![
            sample(doc, &schema["items"]);
            schema["minItems"].as_u64().unwrap_or(0) as usize
        ]),
        Some("object") => {
            let mut object = serde_json::Map::new();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap();
                object.insert(name.into(), sample(doc, &schema["properties"][name]));
            }
            Value::Object(object)
        }
        _ => Value::Null,
    }
}

trait MaxZero {
    fn max_zero(self) -> Value;
}

impl MaxZero for Value {
    fn max_zero(self) -> Value {
        match self.as_f64() {
            Some(n) if n > 0.0 => self,
            _ => json!(0),
        }
    }
}

/// The probes of one request schema: each property's bounds (those of `options` and of the
/// first element of a list the base has too, as `options.x`, `messages[0].x`), each required
/// property left out, and the model name.
fn probes(doc: &Value, schema: &Value, base: &Value, prefix: &str) -> Vec<Probe> {
    let schema = resolve(doc, schema);
    let mut out = Vec::new();
    let Some(properties) = schema["properties"].as_object() else {
        return out;
    };
    for (name, property) in properties {
        let field = format!("{prefix}{name}");
        let resolved = resolve(doc, property);
        if name == "model" {
            out.push(Probe {
                field: field.clone(),
                value: Some(json!("a b")),
                allowed: false,
            });
            out.push(Probe {
                field: field.clone(),
                value: Some(json!(format!("{}x", "m".repeat(350)))),
                allowed: false,
            });
            continue;
        }
        match (&base[name.as_str()], resolved["type"].as_str()) {
            (Value::Object(_), Some("object")) => {
                out.extend(probes(
                    doc,
                    resolved,
                    &base[name.as_str()],
                    &format!("{field}."),
                ));
            }
            (Value::Array(items), Some("array")) if items.first().is_some_and(Value::is_object) => {
                out.extend(probes(
                    doc,
                    &resolved["items"],
                    &items[0],
                    &format!("{field}[0]."),
                ));
            }
            _ => {}
        }
        for (value, allowed) in bounds(doc, property) {
            out.push(Probe {
                field: field.clone(),
                value: Some(value),
                allowed,
            });
        }
    }
    for name in schema["required"].as_array().into_iter().flatten() {
        let name = name.as_str().unwrap();
        if prefix.is_empty() && name != "model" {
            out.push(Probe {
                field: name.to_string(),
                value: None,
                allowed: false,
            });
        }
    }
    out
}

/// `body` with `field` (`a.b`, `a[0].b`) set to `value`, or removed.
fn with(body: &Value, field: &str, value: &Option<Value>) -> Value {
    let mut body = body.clone();
    let mut parts: Vec<String> = Vec::new();
    for part in field.split('.') {
        match part.split_once("[0]") {
            Some((name, _)) => {
                parts.push(name.to_string());
                parts.push("0".into());
            }
            None => parts.push(part.to_string()),
        }
    }
    let (last, path) = parts.split_last().unwrap();
    let mut target = &mut body;
    for part in path {
        target = match part.parse::<usize>() {
            Ok(i) => &mut target[i],
            Err(_) => {
                if target.get(part).is_none() {
                    target[part.as_str()] = json!({});
                }
                &mut target[part.as_str()]
            }
        };
    }
    match value {
        Some(v) => target[last.as_str()] = v.clone(),
        None => {
            target.as_object_mut().unwrap().remove(last.as_str());
        }
    }
    body
}

/// The message of an error body of any family.
fn message(reply: &Value) -> String {
    match &reply["error"] {
        Value::String(s) => s.clone(),
        e => e["message"].as_str().unwrap_or_default().to_string(),
    }
}

/// A server whose replies are short: 4 tokens unless asked, at most what is left of a
/// `context` window.
fn start(context: &str) -> Server {
    Server::start(&["--context", context, "--default-max-tokens", "4"])
}

#[test]
fn bodies_at_the_documents_bounds_are_answered_and_past_them_refused() {
    let s = start("128");
    let doc: Value = s.get("/openapi.json").json().unwrap();
    let mut failures = Vec::new();
    let mut sent = 0;
    for (route, schema, base) in routes() {
        let schema = &doc["components"]["schemas"][schema];
        // The base itself, and the document's example prompt where it has one.
        assert_eq!(s.post(route, base.clone()).status(), 200, "{route} {base}");
        if let Some(example) = schema["properties"]["prompt"]["example"].as_str() {
            let body = with(&base, "prompt", &Some(json!(example)));
            assert_eq!(s.post(route, body.clone()).status(), 200, "{body}");
        }
        for probe in probes(&doc, schema, &base, "") {
            let body = with(&base, &probe.field, &probe.value);
            let started = std::time::Instant::now();
            let r = s.post(route, body.clone());
            let status = r.status().as_u16();
            let text = r.text().unwrap();
            sent += 1;
            let last = probe.field.rsplit(['.', ']']).next().unwrap().to_string();
            let (want, word) = match probe
                .value
                .as_ref()
                .and_then(|v| exception(route, &probe.field, v))
            {
                Some((status, word)) if probe.allowed => (status, word.to_string()),
                _ if probe.allowed => (200, String::new()),
                _ => (400, last),
            };
            if started.elapsed().as_secs() >= 2 {
                eprintln!("{route} {}: {:?}", probe.field, started.elapsed());
            }
            let said = serde_json::from_str(&text)
                .map(|v| message(&v))
                .unwrap_or_default();
            if status != want || !said.contains(&word) {
                failures.push(format!(
                    "{route} {}={}: {status} (want {want} naming {word:?}): {}",
                    probe.field,
                    probe.value.map_or("<absent>".into(), |v| {
                        let v = v.to_string();
                        v.chars().take(80).collect::<String>()
                    }),
                    text.chars().take(300).collect::<String>()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {sent} probes answered otherwise than the document says:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(sent > 200, "{sent} probes");
}

/// The largest schema of the document's JSON Schema subset (as many properties as it allows,
/// each kind at its bounds) in every schema field of every route: the document allows it, so
/// the server turns it into a grammar and generates.
#[test]
fn the_largest_schema_the_document_allows_is_generated_with() {
    // The tools' descriptions take 860 tokens of the prompt.
    let s = start("2048");
    let doc: Value = s.get("/openapi.json").json().unwrap();
    let subset = &doc["components"]["schemas"];
    let property = &subset["JsonSchemaProperty"]["properties"];
    let most = |key: &str| property[key]["maximum"].as_i64().unwrap();
    let enum_size = property["enum"]["maxItems"].as_u64().unwrap() as usize;
    let enum_length = property["enum"]["items"]["maxLength"].as_u64().unwrap() as usize;
    let kinds = [
        json!({"type": "string", "maxLength": most("maxLength"), "description": "d".repeat(200)}),
        json!({"type": "integer", "minimum": property["minimum"]["minimum"], "maximum": most("maximum")}),
        json!({"type": "number", "minimum": property["minimum"]["minimum"], "maximum": most("maximum")}),
        json!({"type": "boolean"}),
        json!({"type": "null"}),
        json!({"type": "string", "enum": (0..enum_size)
            .map(|i| format!("{i}{}", "e".repeat(enum_length - 1))).collect::<Vec<_>>()}),
        json!({"type": "array", "items": {"type": "integer"}, "maxItems": most("maxItems")}),
        json!({"type": "array", "items": {"type": "string"}}),
    ];
    let count = subset["JsonSchema"]["properties"]["properties"]["maxProperties"]
        .as_u64()
        .unwrap() as usize;
    assert_eq!(count, kinds.len());
    let properties: serde_json::Map<String, Value> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| (format!("p{i}_{}", "n".repeat(28)), kind.clone()))
        .collect();
    let schema = json!({"type": "object", "properties": properties,
        "additionalProperties": false, "description": "d".repeat(200)});
    let chat = json!([{"role": "user", "content": "hi"}]);
    let tool = |flat: bool| {
        let function = json!({"name": "f".repeat(64), "description": "x", "parameters": schema});
        if flat {
            let mut tool = function;
            tool["type"] = "function".into();
            tool
        } else {
            json!({"type": "function", "function": function})
        }
    };
    for (route, body) in [
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "hi", "stream": false, "format": schema}),
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": chat, "stream": false, "format": schema}),
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": chat, "stream": false, "tools": [tool(false)]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "response_format":
            {"type": "json_schema", "json_schema": {"name": "n".repeat(64), "schema": schema, "strict": true}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "tools": [tool(false)]}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "hi", "text": {"format":
            {"type": "json_schema", "name": "n", "schema": schema, "strict": false}}}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "hi", "tools": [tool(true)]}),
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 4, "messages": chat, "tools":
            [{"type": "custom", "name": "f", "description": "x", "input_schema": schema}]}),
        ),
    ] {
        let r = s.post(route, body);
        let status = r.status().as_u16();
        assert_eq!(status, 200, "{route}: {}", r.text().unwrap());
    }
}

/// What the document cannot bound without knowing the model stays a 400 naming the field.
#[test]
fn the_document_states_the_cross_field_and_model_rules_it_cannot_bound() {
    let s = start("128");
    let doc: Value = s.get("/openapi.json").json().unwrap();
    let schemas = &doc["components"]["schemas"];
    for (schema, field, word) in [
        ("ChatCompletionRequest", "tool_choice", "need `tools`"),
        ("ResponsesRequest", "tool_choice", "need `tools`"),
        ("MessagesRequest", "tool_choice", "need `tools`"),
    ] {
        let description = schemas[schema]["properties"][field]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(
            description.contains(word),
            "{schema}.{field}: {description}"
        );
    }
    let chat = json!([{"role": "user", "content": "hi"}]);
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": chat, "tool_choice": "required"}),
    );
    assert_eq!(r.status(), 400);
    assert_eq!(
        message(&r.json().unwrap()),
        "tool_choice asks for a tool call but tools is empty: send the tools"
    );
}
