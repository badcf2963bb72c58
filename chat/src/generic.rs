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

/// Most calls of one reply when parallel calls are allowed (one otherwise):
/// a small model repeating itself stops there rather than at the token limit.
pub const MAX_CALLS: usize = 8;

/// The JSON Schema a reply must follow, for `tools` as `(name, parameters
/// schema)`. `required`: a call must be made (no `response`); `parallel`:
/// up to [`MAX_CALLS`] calls in a `tool_calls` list, else one `tool_call`.
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
            "properties": {"tool_calls": {
                "type": "array", "items": call, "minItems": 1, "maxItems": MAX_CALLS,
            }},
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

/// `grammar` (llama.cpp's conversion of [`reply_schema`]) without free
/// whitespace between tokens: its `space` rule allows up to two newlines
/// and twenty blanks at every turn, which a small model spends its tokens
/// on (a pretty-printed reply cut by the token limit); here one blank at
/// most, as in `{"name": "f"}`.
pub fn compact_grammar(grammar: &str) -> String {
    grammar
        .lines()
        .map(|line| match line.strip_prefix("space ::=") {
            Some(_) => "space ::= \" \"?",
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
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
        if let Some(response) = cut_response(text) {
            return whole(&response);
        }
        // Internal JSON is never content: a reply cut before a call or a
        // response began says nothing.
        return cut_calls(text)
            .unwrap_or_else(|| whole(if looks_generic(text) { "" } else { text }));
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
        cut_arguments: None,
    })
}

/// Whether `text` is the beginning of a generic-format object: `{`, then
/// nothing or the start of one of its keys.
fn looks_generic(text: &str) -> bool {
    let Some(rest) = text.trim_start().strip_prefix('{') else {
        return false;
    };
    let rest = rest.trim_start();
    let key = rest.strip_prefix('"').unwrap_or(rest);
    let key = key.split('"').next().unwrap_or_default();
    rest.is_empty()
        || (rest.starts_with('"')
            && ["tool_calls", "tool_call", "response"]
                .iter()
                .any(|k| k.starts_with(key) || key.starts_with(k)))
}

/// The calls of a reply that stopped inside its `tool_call` or
/// `tool_calls` (the token limit), as OpenAI reports one: every call whose
/// name was written, the last with the arguments as far as they go (read
/// into `arguments`, as written in `cut_arguments`).
fn cut_calls(text: &str) -> Option<ParsedReply> {
    let scan = PartialJson::scan(text);
    let Value::Object(mut object) = scan.closed()? else {
        return None;
    };
    let list = match (object.remove("tool_calls"), object.remove("tool_call")) {
        (Some(Value::Array(list)), _) => list,
        (_, Some(one)) => vec![one],
        _ => return None,
    };
    // A call is known once its arguments began (its name, written before
    // them, is whole); the text stops in the last one's arguments, or after
    // them.
    let cut_in_last = list.last().is_some_and(|c| c.get("arguments").is_some());
    let mut tool_calls: Vec<ToolCall> = list
        .into_iter()
        .filter(|c| c.get("arguments").is_some())
        .filter_map(call)
        .collect();
    let last = tool_calls.last_mut()?;
    let arguments = scan.last_value_of("arguments").unwrap_or_default();
    let whole = serde_json::Deserializer::from_str(arguments)
        .into_iter::<Value>()
        .next()
        .is_some_and(|v| v.is_ok());
    if cut_in_last && !whole {
        last.cut_arguments = Some(arguments.to_string());
    }
    Some(ParsedReply {
        content: String::new(),
        tool_calls,
    })
}

/// A prefix of a JSON text, scanned: where each object key's value starts,
/// and what is left open at its end.
struct PartialJson<'a> {
    text: &'a str,
    /// `(depth, key, where its value starts)` for every key, in order.
    keys: Vec<(usize, String, usize)>,
}

impl<'a> PartialJson<'a> {
    fn scan(text: &'a str) -> PartialJson<'a> {
        let mut keys = Vec::new();
        let mut stack: Vec<u8> = Vec::new();
        let mut in_string = false;
        let mut escaped = false;
        let mut expect_key = false;
        let mut string_start = 0;
        let mut pending_key: Option<String> = None;
        for (i, c) in text.char_indices() {
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        in_string = false;
                        if expect_key {
                            pending_key = serde_json::from_str(&text[string_start..=i]).ok();
                            expect_key = false;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => {
                    in_string = true;
                    string_start = i;
                }
                '{' => {
                    stack.push(b'{');
                    expect_key = true;
                }
                '[' => stack.push(b'['),
                '}' | ']' => {
                    stack.pop();
                }
                ',' => expect_key = stack.last() == Some(&b'{'),
                ':' => {
                    if let Some(key) = pending_key.take() {
                        let start =
                            i + 1 + (text[i + 1..].len() - text[i + 1..].trim_start().len());
                        keys.push((stack.len(), key, start));
                    }
                }
                _ => {}
            }
        }
        PartialJson { text, keys }
    }

    /// The text of the last value of `key` at the shallowest depth it has,
    /// to the end of the text.
    fn last_value_of(&self, key: &str) -> Option<&'a str> {
        let depth = self.keys.iter().filter(|k| k.1 == key).map(|k| k.0).min()?;
        let (_, _, start) = self
            .keys
            .iter()
            .rev()
            .find(|k| k.1 == key && k.0 == depth)?;
        Some(&self.text[*start..])
    }

    /// The text closed into a JSON value: the longest prefix that parses
    /// once its open string and containers are closed (a key without its
    /// value, a dangling comma or a half-written literal is dropped).
    fn closed(&self) -> Option<Value> {
        let ends = self
            .text
            .char_indices()
            .map(|(i, _)| i)
            .chain([self.text.len()]);
        let mut ends: Vec<usize> = ends.collect();
        ends.reverse();
        // Dropping a key or a literal takes a few characters, never many.
        ends.into_iter().take(64).find_map(|end| {
            let head = &self.text[..end];
            serde_json::from_str(&format!("{head}{}", closers(head))).ok()
        })
    }
}

/// What closes `head`: its open string, then its open containers.
fn closers(head: &str) -> String {
    let mut stack = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in head.chars() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => stack.push('}'),
            '[' => stack.push(']'),
            '}' | ']' => {
                stack.pop();
            }
            _ => {}
        }
    }
    let mut out = String::from(if in_string { "\"" } else { "" });
    out.extend(stack.iter().rev());
    out
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
            json!({"type": "array", "items": call, "minItems": 1, "maxItems": MAX_CALLS})
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
            cut_arguments: None,
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
    fn the_grammar_has_no_free_whitespace() {
        let grammar = "root ::= \"{\" space \"}\"\nspace ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\nx ::= \"a\"";
        assert_eq!(
            compact_grammar(grammar),
            "root ::= \"{\" space \"}\"\nspace ::= \" \"?\nx ::= \"a\""
        );
        let schema = reply_schema(&[("f".to_string(), json!({"type": "object"}))], true, false);
        assert_eq!(
            schema["anyOf"][0]["properties"]["tool_calls"]["maxItems"],
            MAX_CALLS
        );
    }

    #[test]
    fn a_call_cut_short_keeps_its_arguments_as_written() {
        let cut = |text: &str| {
            let reply = parse(text);
            assert_eq!(reply.content, "", "{text}");
            reply.tool_calls
        };
        let calls = cut(r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par"#);
        assert_eq!(
            calls,
            vec![ToolCall {
                cut_arguments: Some(r#"{"city": "Par"#.into()),
                ..call("get_weather", json!({"city": "Par"}))
            }]
        );
        let calls = cut(r#"{"tool_call": {"name": "a", "arguments": {"n": 1.5, "x"#);
        assert_eq!(calls[0].arguments, *json!({"n": 1.5}).as_object().unwrap());
        assert_eq!(calls[0].cut_arguments.as_deref(), Some(r#"{"n": 1.5, "x"#));
        // Whole calls before the cut one stay whole; one without its
        // arguments yet is left out.
        let two = r#"{"tool_calls": [{"name": "a", "arguments": {"x": "\"q\""}}, {"name": "b", "arguments": {"y": [1, tr"#;
        let calls = cut(two);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], call("a", json!({"x": "\"q\""})));
        assert_eq!(calls[1].arguments, *json!({"y": [1]}).as_object().unwrap());
        assert_eq!(calls[1].cut_arguments.as_deref(), Some(r#"{"y": [1, tr"#));
        let calls = cut(r#"{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b"#);
        assert_eq!(calls, vec![call("a", json!({}))]);
        let calls = cut(r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}"#);
        assert_eq!(calls, vec![call("a", json!({"x": 1}))]);
        // Cut before any call or response began: nothing, never the JSON.
        for text in [
            "{",
            "{\"",
            "{\"tool_c",
            "{\"tool_calls\": [",
            "{\"tool_call\": {\"name\": \"get_w",
        ] {
            assert!(cut(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn a_response_cut_short_reads_as_far_as_it_goes() {
        assert_eq!(parse(r#"{"response": "Hello, wor"#).content, "Hello, wor");
        assert_eq!(parse(r#"{ "response" : "a\"b\"#).content, "a\"b");
        assert_eq!(parse(r#"{"response": "caf\u00"#).content, "caf");
        let cut_call = r#"{"tool_call": {"name": "get_we"#;
        assert_eq!(parse(cut_call), ParsedReply::default());
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
