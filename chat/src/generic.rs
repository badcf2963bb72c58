//! The generic tool-call format, for chat templates that cannot describe
//! tools (llama.cpp's fallback, `COMMON_CHAT_FORMAT_GENERIC`): the tools go
//! into the system prompt ([`system_prompt`], [`with_system`]), the reply is
//! one JSON object held to [`reply_schema`] by a grammar, and [`parse`]
//! reads it back. The object is one of
//!
//! - `{"tool_call": {"name": "f", "arguments": {…}}}` (one call),
//! - `{"tool_calls": [{"name": "f", "arguments": {…}}, …]}` (when parallel
//!   calls are allowed: one or more),
//! - `{"response": "…"}` (a reply to the user; not offered when a call is
//!   required).
//!
//! [`polyfill_messages`] turns a history's tool calls and tool results into
//! plain messages for templates that do not render them (used by
//! [`crate::ChatTemplate`] for every template, tools or not).
use serde_json::{json, Map, Value};

use crate::template::ChatMessage;
use crate::tools::{self, ParsedReply, ToolCall};

/// The system prompt that describes `tools` (an OpenAI tools array) and the
/// reply's shape. `parallel`: calls come as a `tool_calls` list;
/// `allow_response`: a plain reply is offered besides calls.
pub fn system_prompt(tools: &[Value], parallel: bool, allow_response: bool) -> String {
    let functions: Vec<Value> = tools
        .iter()
        .filter_map(|tool| tool.get("function"))
        .map(|function| {
            let mut out = Map::new();
            for key in ["name", "description", "parameters"] {
                if let Some(value) = function.get(key).filter(|v| !v.is_null()) {
                    out.insert(key.into(), value.clone());
                }
            }
            Value::Object(out)
        })
        .collect();
    let listed = serde_json::to_string_pretty(&functions).unwrap_or_default();
    // An example naming a real tool: small models copy it far more often
    // than a placeholder.
    let name = functions
        .first()
        .and_then(|f| f.get("name"))
        .cloned()
        .unwrap_or_else(|| "<tool name>".into());
    let call = format!("{{\"name\": {name}, \"arguments\": {{...}}}}");
    let example = if parallel {
        format!("{{\"tool_calls\": [{call}]}}")
    } else {
        format!("{{\"tool_call\": {call}}}")
    };
    let mut prompt = format!(
        "You can call these tools:\n{listed}\n\nTo call a tool, answer with JSON like {example}."
    );
    if allow_response {
        prompt.push_str(" To answer without a tool: {\"response\": \"...\"}");
    }
    prompt
}

/// `messages` with `system` added: after a leading system message's text
/// (separated by a blank line), or as a new first message.
pub fn with_system(messages: &[ChatMessage], system: &str) -> Vec<ChatMessage> {
    let mut out = messages.to_vec();
    match out.first_mut().filter(|m| m.role == "system") {
        Some(first) if first.content.is_empty() => first.content = system.to_string(),
        Some(first) => first.content = format!("{}\n\n{system}", first.content),
        None => out.insert(0, ChatMessage::new("system", system)),
    }
    out
}

/// The JSON Schema a reply must follow, for `tools` as `(name, parameters
/// schema)`. `required`: a call must be made (no `response`).
pub fn reply_schema(tools: &[(String, Value)], parallel: bool, required: bool) -> Value {
    let calls: Vec<Value> = tools
        .iter()
        .map(|(name, parameters)| tools::call_schema(name, parameters, "arguments"))
        .collect();
    let call = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(many) => json!({ "anyOf": many }),
    };
    let calls = if parallel {
        json!({
            "type": "object",
            "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
            "required": ["tool_calls"],
        })
    } else {
        json!({
            "type": "object",
            "properties": {"tool_call": call},
            "required": ["tool_call"],
        })
    };
    if required {
        return calls;
    }
    let response = json!({
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
    });
    json!({ "anyOf": [calls, response] })
}

/// A reply in the generic format → content and calls. Anything else (a
/// reply cut short, no grammar) stays content; a `response` cut short is
/// read as far as it goes.
pub fn parse(text: &str) -> ParsedReply {
    let whole = |content: &str| ParsedReply {
        content: content.to_string(),
        tool_calls: Vec::new(),
    };
    let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(text) else {
        return cut_response(text).map_or_else(|| whole(text), |c| whole(&c));
    };
    let calls: Option<Vec<ToolCall>> =
        match (object.remove("tool_calls"), object.remove("tool_call")) {
            (Some(Value::Array(list)), _) => list.into_iter().map(call).collect(),
            (_, Some(one)) => call(one).map(|c| vec![c]),
            _ => None,
        };
    match (calls, object.remove("response")) {
        (Some(tool_calls), _) if !tool_calls.is_empty() => ParsedReply {
            content: String::new(),
            tool_calls,
        },
        (_, Some(Value::String(response))) => whole(&response),
        (_, Some(other)) => whole(&other.to_string()),
        _ => whole(text),
    }
}

fn call(value: Value) -> Option<ToolCall> {
    let Value::Object(mut object) = value else {
        return None;
    };
    let name = object.remove("name")?.as_str()?.to_string();
    let arguments = match object.remove("arguments") {
        Some(Value::Object(map)) => map,
        Some(Value::String(text)) => serde_json::from_str(&text).ok()?,
        None | Some(Value::Null) => Map::new(),
        Some(_) => return None,
    };
    Some(ToolCall {
        name,
        arguments,
        id: None,
    })
}

/// The text of `{"response": "…` when the reply stopped inside the string
/// (the token limit).
fn cut_response(text: &str) -> Option<String> {
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest.strip_prefix("\"response\"")?.trim_start();
    let rest = rest.strip_prefix(':')?.trim_start().strip_prefix('"')?;
    // Drop what ends inside an escape (`\`, `\u00`) until the rest reads.
    (0..=6.min(rest.len())).find_map(|cut| {
        let head = rest.get(..rest.len() - cut)?;
        serde_json::from_str::<String>(&format!("\"{head}\"")).ok()
    })
}

/// The history with tool calls and tool results as plain messages, for a
/// template that does not render them (`calls`: assistant `tool_calls`;
/// `results`: `tool` messages), as llama.cpp's template polyfills do: an
/// assistant's calls become its content, `{"tool_calls": [{"name",
/// "arguments", "id"}], "content"}` (the generic format's own shape); a
/// tool result becomes a user message `{"tool_response": {"tool",
/// "content", "tool_call_id"}}`.
pub fn polyfill_messages(messages: &[ChatMessage], calls: bool, results: bool) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|message| match message {
            m if calls && m.tool_calls.as_ref().is_some_and(|c| !c.is_null()) => {
                calls_as_content(m)
            }
            m if results && m.role == "tool" => result_as_user(m),
            m => m.clone(),
        })
        .collect()
}

fn calls_as_content(message: &ChatMessage) -> ChatMessage {
    let list = message
        .tool_calls
        .as_ref()
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let calls: Vec<Value> = list
        .iter()
        .map(|c| {
            let function = c.get("function").unwrap_or(c);
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) => {
                    serde_json::from_str(text).unwrap_or_else(|_| text.clone().into())
                }
                Some(other) => other.clone(),
                None => json!({}),
            };
            let mut out = json!({"name": function.get("name"), "arguments": arguments});
            if let Some(id) = c.get("id").filter(|id| id.is_string()) {
                out["id"] = id.clone();
            }
            out
        })
        .collect();
    let mut content = json!({ "tool_calls": calls });
    if !message.content.is_empty() {
        content["content"] = message.content.clone().into();
    }
    ChatMessage {
        tool_calls: None,
        content: content.to_string(),
        ..message.clone()
    }
}

fn result_as_user(message: &ChatMessage) -> ChatMessage {
    let mut response = Map::new();
    if let Some(name) = message.name.as_ref().filter(|n| !n.is_empty()) {
        response.insert("tool".into(), name.clone().into());
    }
    response.insert("content".into(), message.content.clone().into());
    if let Some(id) = message.tool_call_id.as_ref().filter(|id| !id.is_empty()) {
        response.insert("tool_call_id".into(), id.clone().into());
    }
    ChatMessage::new("user", json!({ "tool_response": response }).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Current weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn the_system_prompt_lists_the_functions_and_the_reply_shapes() {
        let prompt = system_prompt(&[weather()], true, true);
        assert_eq!(
            prompt,
            "You can call these tools:\n\
             [\n  {\n    \"name\": \"get_weather\",\n    \"description\": \"Current weather\",\n    \
             \"parameters\": {\n      \"type\": \"object\",\n      \"properties\": {\n        \
             \"city\": {\n          \"type\": \"string\"\n        }\n      },\n      \
             \"required\": [\n        \"city\"\n      ]\n    }\n  }\n]\n\n\
             To call a tool, answer with JSON like \
             {\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {...}}]}. \
             To answer without a tool: {\"response\": \"...\"}"
        );
        let forced_one = system_prompt(&[weather()], false, false);
        assert!(
            forced_one.ends_with(
                "like {\"tool_call\": {\"name\": \"get_weather\", \"arguments\": {...}}}."
            ),
            "{forced_one}"
        );
    }

    #[test]
    fn the_system_prompt_joins_a_leading_system_message() {
        let user = ChatMessage::new("user", "Hi");
        let added = with_system(std::slice::from_ref(&user), "TOOLS");
        assert_eq!(
            added,
            vec![ChatMessage::new("system", "TOOLS"), user.clone()]
        );
        let joined = with_system(
            &[ChatMessage::new("system", "Be brief."), user.clone()],
            "TOOLS",
        );
        assert_eq!(joined[0], ChatMessage::new("system", "Be brief.\n\nTOOLS"));
        assert_eq!(joined.len(), 2);
    }

    #[test]
    fn the_schema_allows_a_call_or_a_response() {
        let tools = [("get_weather".to_string(), json!({"type": "object"}))];
        let call = json!({"type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object"}},
            "required": ["name", "arguments"]});
        assert_eq!(
            reply_schema(&tools, false, true),
            json!({"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]})
        );
        let auto = reply_schema(&tools, true, false);
        assert_eq!(
            auto["anyOf"][0]["properties"]["tool_calls"],
            json!({"type": "array", "items": call, "minItems": 1})
        );
        assert_eq!(
            auto["anyOf"][1],
            json!({"type": "object", "properties": {"response": {"type": "string"}},
                "required": ["response"]})
        );
        let two = [("a".to_string(), json!({})), ("b".to_string(), Value::Null)];
        let items = &reply_schema(&two, true, true)["properties"]["tool_calls"]["items"];
        assert_eq!(items["anyOf"].as_array().unwrap().len(), 2);
        assert_eq!(
            items["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
    }

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.as_object().unwrap().clone(),
            id: None,
        }
    }

    #[test]
    fn replies_parse_into_calls_or_content() {
        let one =
            parse(r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}"#);
        assert_eq!(
            one,
            ParsedReply {
                content: String::new(),
                tool_calls: vec![call("get_weather", json!({"city": "Paris"}))],
            }
        );
        let two = parse(
            r#" {"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\"x\": 1}"}]} "#,
        );
        assert_eq!(
            two.tool_calls,
            vec![call("a", json!({})), call("b", json!({"x": 1}))]
        );
        assert_eq!(
            parse(r#"{"response": "It is sunny.\nEnjoy!"}"#),
            ParsedReply {
                content: "It is sunny.\nEnjoy!".into(),
                tool_calls: vec![],
            }
        );
        assert_eq!(parse(r#"{"response": {"a": 1}}"#).content, r#"{"a":1}"#);
        for other in ["Plain words.", r#"{"name": "x"}"#, r#"{"tool_calls": []}"#] {
            assert_eq!(parse(other).content, other);
            assert!(parse(other).tool_calls.is_empty());
        }
    }

    #[test]
    fn a_response_cut_short_reads_as_far_as_it_goes() {
        assert_eq!(parse(r#"{"response": "Hello, wor"#).content, "Hello, wor");
        assert_eq!(parse(r#"{ "response" : "a\"b\"#).content, "a\"b");
        assert_eq!(parse(r#"{"response": "caf\u00"#).content, "caf");
        let cut_call = r#"{"tool_call": {"name": "get_we"#;
        assert_eq!(parse(cut_call).content, cut_call);
    }

    #[test]
    fn tool_calls_and_results_become_plain_messages() {
        let mut assistant = ChatMessage::new("assistant", "");
        assistant.tool_calls = Some(json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]));
        let mut result = ChatMessage::new("tool", "18 C");
        result.name = Some("get_weather".into());
        result.tool_call_id = Some("call_1".into());
        let user = ChatMessage::new("user", "Weather?");
        let history = [user.clone(), assistant.clone(), result.clone()];

        let plain = polyfill_messages(&history, true, true);
        assert_eq!(plain[0], user);
        assert_eq!(
            plain[1],
            ChatMessage::new(
                "assistant",
                r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"},"id":"call_1"}]}"#
            )
        );
        assert_eq!(
            plain[2],
            ChatMessage::new(
                "user",
                r#"{"tool_response":{"tool":"get_weather","content":"18 C","tool_call_id":"call_1"}}"#
            )
        );
        assert_eq!(polyfill_messages(&history, false, false), history.to_vec());
        let only_results = polyfill_messages(&history, false, true);
        assert_eq!(only_results[1], assistant);
        assert_eq!(only_results[2].role, "user");
    }
}
