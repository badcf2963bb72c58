//! Tool calling in the text a model writes: which tool-call syntax a chat
//! template teaches ([`ToolFamily::detect`]), parsing a finished reply back
//! into content and calls ([`parse`]), holding tool-call text back while
//! streaming ([`ToolStream`]), and the grammar that forces a call
//! ([`forced_call_grammar`]). Pure text work: no model needed.
//!
//! The families, with what their models write:
//! - [`ToolFamily::Hermes`] (Qwen 2.5, Qwen 3, Hermes 2 Pro):
//!   `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, one block per call.
//! - [`ToolFamily::Llama3`] (Llama 3.1, 3.2, 3.3): a bare
//!   `{"name": "f", "parameters": {…}}`, optionally after `<|python_tag|>`.
//! - [`ToolFamily::Mistral`]: `[TOOL_CALLS][{"name": "f", "arguments": {…}}, …]`
//!   (or, in newer tokenizers, `[TOOL_CALLS]f[ARGS]{…}`).
//! - [`ToolFamily::Json`]: any other template that mentions `tools`: a bare
//!   JSON call object (or array of them) as the whole reply, as Ollama reads it.
//! - [`ToolFamily::Generic`]: templates that do not mention `tools`: llama.cpp's
//!   generic format ([`crate::generic`]), `{"tool_call": …}` or `{"response": …}`.
use serde_json::{json, Map, Value};

/// How a template's model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFamily {
    Hermes,
    Llama3,
    Mistral,
    Json,
    /// The template cannot describe tools: [`crate::generic`] does.
    Generic,
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object (a model's JSON-string arguments are parsed).
    pub arguments: Map<String, Value>,
    /// The id the model gave the call (Mistral writes them), if any.
    pub id: Option<String>,
    /// The arguments as the model wrote them when the reply stopped inside
    /// them (the token limit): not valid JSON. `arguments` then holds what
    /// of them could be read.
    pub cut_arguments: Option<String>,
}

/// A finished reply split into text and calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    /// The text outside the calls (trimmed when there are calls; the whole
    /// reply, untouched, when there are none).
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

/// Name of the rule a forced call's JSON grammar is renamed to.
const CALL_RULE: &str = "hypura-tool-call";

impl ToolFamily {
    /// The family of a chat template, or `None` when the template does not
    /// reference `tools` (it cannot describe tools to the model).
    pub fn detect(template: &str) -> Option<ToolFamily> {
        if !template.contains("tools") {
            return None;
        }
        Some(if template.contains(HERMES_OPEN) {
            ToolFamily::Hermes
        } else if template.contains(MISTRAL_CALLS) {
            ToolFamily::Mistral
        } else if template.contains(PYTHON_TAG) || template.contains("<|start_header_id|>") {
            ToolFamily::Llama3
        } else {
            ToolFamily::Json
        })
    }

    /// Special-token texts the reply must keep so the calls can be found
    /// (for `SamplingParams::preserved_tokens`).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFamily::Hermes => &[HERMES_OPEN, HERMES_CLOSE],
            ToolFamily::Llama3 => &[PYTHON_TAG],
            ToolFamily::Mistral => &[MISTRAL_CALLS, MISTRAL_ARGS],
            ToolFamily::Json | ToolFamily::Generic => &[],
        }
    }

    /// The key the family's call objects hold the arguments under.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolFamily::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// Where tool-call text starts in a reply, for [`ToolStream`]: a marker,
    /// or (`None`) a bare JSON object at the start of the reply.
    fn start_marker(self) -> Option<&'static str> {
        match self {
            ToolFamily::Hermes => Some(HERMES_OPEN),
            ToolFamily::Mistral => Some(MISTRAL_CALLS),
            ToolFamily::Llama3 | ToolFamily::Json | ToolFamily::Generic => None,
        }
    }
}

/// Splits a finished reply into content and tool calls. Text that looks like
/// a call but does not parse as one stays in the content.
pub fn parse(family: ToolFamily, text: &str) -> ParsedReply {
    let parsed = match family {
        ToolFamily::Hermes => parse_hermes(text),
        ToolFamily::Mistral => parse_mistral(text),
        ToolFamily::Llama3 => parse_llama3(text),
        ToolFamily::Json => parse_bare(text).map(|calls| (String::new(), calls)),
        ToolFamily::Generic => return crate::generic::parse(text),
    };
    match parsed {
        Some((content, tool_calls)) if !tool_calls.is_empty() => ParsedReply {
            content: content.trim().to_string(),
            tool_calls,
        },
        _ => ParsedReply {
            content: text.to_string(),
            tool_calls: Vec::new(),
        },
    }
}

fn parse_hermes(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(HERMES_OPEN) {
        let after = &rest[at + HERMES_OPEN.len()..];
        // A reply cut right after the JSON (end of generation) still counts.
        let (inner, next) = match after.find(HERMES_CLOSE) {
            Some(end) => (&after[..end], &after[end + HERMES_CLOSE.len()..]),
            None => (after, ""),
        };
        match call_from_text(inner.trim(), false) {
            Some(call) => {
                content.push_str(&rest[..at]);
                calls.push(call);
                rest = next;
            }
            None => {
                content.push_str(&rest[..at + HERMES_OPEN.len()]);
                rest = after;
            }
        }
    }
    content.push_str(rest);
    Some((content, calls))
}

fn parse_mistral(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let at = text.find(MISTRAL_CALLS)?;
    let content = text[..at].to_string();
    let mut calls = Vec::new();
    for segment in text[at..].split(MISTRAL_CALLS).skip(1) {
        let segment = segment.trim();
        if segment.starts_with('[') {
            let (value, _) = first_json(segment)?;
            for item in value.as_array()? {
                calls.push(call_from_value(item.clone(), false)?);
            }
        } else {
            // `name[ARGS]{…}`
            let (name, args) = segment.split_once(MISTRAL_ARGS)?;
            let (arguments, _) = first_json(args.trim_start())?;
            calls.push(ToolCall {
                name: name.trim().to_string(),
                arguments: arguments_object(arguments)?,
                id: None,
                cut_arguments: None,
            });
        }
    }
    Some((content, calls))
}

fn parse_llama3(text: &str) -> Option<(String, Vec<ToolCall>)> {
    match text.find(PYTHON_TAG) {
        Some(at) => {
            let calls = parse_bare(&text[at + PYTHON_TAG.len()..])?;
            Some((text[..at].to_string(), calls))
        }
        None => parse_bare(text).map(|calls| (String::new(), calls)),
    }
}

/// A reply that is only call objects: one, several separated by whitespace
/// or `;`, or an array of them.
fn parse_bare(text: &str) -> Option<Vec<ToolCall>> {
    let mut rest = text.trim();
    if rest.starts_with('[') {
        let (value, tail) = first_json(rest)?;
        if !tail.trim().is_empty() {
            return None;
        }
        return value
            .as_array()?
            .iter()
            .map(|v| call_from_value(v.clone(), true))
            .collect();
    }
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let (value, tail) = first_json(rest)?;
        calls.push(call_from_value(value, true)?);
        rest = tail.trim_start().trim_start_matches(';').trim_start();
    }
    Some(calls)
}

/// The first JSON value at the start of `text`, and the text after it.
fn first_json(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

fn call_from_text(text: &str, need_arguments: bool) -> Option<ToolCall> {
    let (value, tail) = first_json(text)?;
    if !tail.trim().is_empty() {
        return None;
    }
    call_from_value(value, need_arguments)
}

/// `{"name", "arguments" | "parameters", "id"?}` → a call. Bare-JSON
/// families need the arguments key, so that an ordinary JSON reply with a
/// `name` field is not taken for a call.
fn call_from_value(value: Value, need_arguments: bool) -> Option<ToolCall> {
    let Value::Object(mut object) = value else {
        return None;
    };
    let name = match object.remove("name")? {
        Value::String(name) if !name.is_empty() => name,
        _ => return None,
    };
    let arguments = match object
        .remove("arguments")
        .or_else(|| object.remove("parameters"))
    {
        Some(arguments) => arguments_object(arguments)?,
        None if need_arguments => return None,
        None => Map::new(),
    };
    let id = match object.remove("id") {
        Some(Value::String(id)) if !id.is_empty() => Some(id),
        _ => None,
    };
    Some(ToolCall {
        name,
        arguments,
        id,
        cut_arguments: None,
    })
}

/// Arguments as an object; a JSON string holding an object is parsed.
fn arguments_object(arguments: Value) -> Option<Map<String, Value>> {
    match arguments {
        Value::Object(map) => Some(map),
        Value::Null => Some(Map::new()),
        Value::String(text) => match serde_json::from_str(&text).ok()? {
            Value::Object(map) => Some(map),
            _ => None,
        },
        _ => None,
    }
}

/// Streams a reply's content while holding back tool-call text: text is
/// released as it comes until a tool call may be starting (a marker, or
/// for bare-JSON families a `{`/`[` opening the reply); from there on
/// everything is held and parsed by [`ToolStream::finish`], as Ollama does.
#[derive(Debug)]
pub struct ToolStream {
    family: ToolFamily,
    /// Text not released yet.
    pending: String,
    /// A call may have started: hold everything from here on.
    holding: bool,
    /// Bare-JSON families: the first non-blank character has been seen and was not a call.
    passing: bool,
}

impl ToolStream {
    pub fn new(family: ToolFamily) -> Self {
        ToolStream {
            family,
            pending: String::new(),
            holding: false,
            passing: false,
        }
    }

    /// Adds a piece of the reply; returns the content that can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        if self.holding {
            return String::new();
        }
        match self.family.start_marker() {
            Some(marker) => self.release_before(marker),
            None if self.passing => self.release_before(PYTHON_TAG),
            None => {
                let start = self.pending.trim_start();
                if start.is_empty() || PYTHON_TAG.starts_with(start) {
                    return String::new();
                }
                if start.starts_with('{') || start.starts_with('[') || start.starts_with(PYTHON_TAG)
                {
                    self.holding = true;
                    return String::new();
                }
                self.passing = true;
                self.release_before(PYTHON_TAG)
            }
        }
    }

    /// Releases the text before `marker` (holding from it on) or, without
    /// one, all but a tail that could be the marker's beginning.
    fn release_before(&mut self, marker: &str) -> String {
        if let Some(at) = self.pending.find(marker) {
            self.holding = true;
            return self.pending.drain(..at).collect();
        }
        let keep = (1..marker.len())
            .rev()
            .find(|&n| marker.is_char_boundary(n) && self.pending.ends_with(&marker[..n]))
            .unwrap_or(0);
        let release = self.pending.len() - keep;
        self.pending.drain(..release).collect()
    }

    /// The end of the reply: what was held, as content and calls.
    pub fn finish(self) -> ParsedReply {
        parse(self.family, &self.pending)
    }
}

/// A GBNF grammar that makes the model write exactly one call, in its
/// family's syntax, to one of `tools` (`(name, parameters schema)`), given
/// `json_to_grammar` (llama.cpp's JSON Schema converter, root rule `root`).
pub fn forced_call_grammar<E>(
    family: ToolFamily,
    tools: &[(String, Value)],
    json_to_grammar: impl Fn(&str) -> Result<String, E>,
) -> Result<String, E> {
    let key = family.arguments_key();
    let calls: Vec<Value> = tools
        .iter()
        .map(|(name, parameters)| call_schema(name, parameters, key))
        .collect();
    let schema = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(many) => json!({ "anyOf": many }),
    };
    let call_grammar = json_to_grammar(&schema.to_string())?;
    let renamed: String = call_grammar
        .lines()
        .map(|line| match line.strip_prefix("root ::=") {
            Some(body) => format!("{CALL_RULE} ::={body}\n"),
            None => format!("{line}\n"),
        })
        .collect();
    let root = match family {
        ToolFamily::Hermes => format!(r#"root ::= "<tool_call>\n" {CALL_RULE} "\n</tool_call>""#),
        ToolFamily::Mistral => format!(r#"root ::= "[TOOL_CALLS][" {CALL_RULE} "]""#),
        ToolFamily::Llama3 | ToolFamily::Json | ToolFamily::Generic => {
            format!("root ::= {CALL_RULE}")
        }
    };
    Ok(format!("{root}\n{renamed}"))
}

/// The JSON Schema of one call to `name`: `{"name": name, key: arguments}`
/// (`parameters`, the arguments' schema, any object when it is not one).
pub(crate) fn call_schema(name: &str, parameters: &Value, key: &str) -> Value {
    let parameters = if parameters.is_object() {
        parameters.clone()
    } else {
        json!({"type": "object"})
    };
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters},
        "required": ["name", key],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.as_object().unwrap().clone(),
            id: None,
            cut_arguments: None,
        }
    }

    #[test]
    fn families_are_detected_from_the_template_text() {
        let qwen = "{%- if tools %}…<tool_call>\\n{\"name\": <function-name>…";
        assert_eq!(ToolFamily::detect(qwen), Some(ToolFamily::Hermes));
        let llama = "{%- if tools is not none %}<|start_header_id|>…<|python_tag|>";
        assert_eq!(ToolFamily::detect(llama), Some(ToolFamily::Llama3));
        let mistral = "{%- if tools %}[AVAILABLE_TOOLS]…{{ \"[TOOL_CALLS][\" }}";
        assert_eq!(ToolFamily::detect(mistral), Some(ToolFamily::Mistral));
        assert_eq!(
            ToolFamily::detect("{% if tools %}{{ tools | tojson }}{% endif %}"),
            Some(ToolFamily::Json)
        );
        let chatml = "{% for message in messages %}<|im_start|>{{ message.role }}";
        assert_eq!(ToolFamily::detect(chatml), None);
    }

    #[test]
    fn qwen_2_5_tool_call_blocks() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
        assert_eq!(
            parse(ToolFamily::Hermes, text),
            ParsedReply {
                content: String::new(),
                tool_calls: vec![call(
                    "get_weather",
                    json!({"city": "Paris", "unit": "celsius"})
                )],
            }
        );
    }

    #[test]
    fn hermes_keeps_content_and_reads_several_calls_and_string_arguments() {
        let text = "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}\n</tool_call>";
        let parsed = parse(ToolFamily::Hermes, text);
        assert_eq!(parsed.content, "Let me check both.");
        assert_eq!(
            parsed.tool_calls,
            vec![
                call("get_weather", json!({"city": "Paris"})),
                call("get_time", json!({"zone": "CET"})),
            ]
        );
    }

    #[test]
    fn hermes_without_closing_tag_or_with_broken_json() {
        let cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(
            parse(ToolFamily::Hermes, cut).tool_calls,
            vec![call("f", json!({}))]
        );
        let broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>";
        assert_eq!(
            parse(ToolFamily::Hermes, broken),
            ParsedReply {
                content: broken.into(),
                tool_calls: vec![],
            }
        );
        let plain = "  The weather is fine.\n";
        assert_eq!(parse(ToolFamily::Hermes, plain).content, plain);
    }

    #[test]
    fn llama_3_1_bare_json_and_python_tag() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        assert_eq!(
            parse(ToolFamily::Llama3, text).tool_calls,
            vec![call("get_weather", json!({"city": "Paris"}))]
        );
        let tagged =
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Berlin\"}}";
        assert_eq!(
            parse(ToolFamily::Llama3, tagged),
            ParsedReply {
                content: String::new(),
                tool_calls: vec![call("get_weather", json!({"city": "Berlin"}))],
            }
        );
        let two =
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}";
        assert_eq!(
            parse(ToolFamily::Llama3, two).tool_calls,
            vec![call("a", json!({})), call("b", json!({"x": 1}))]
        );
    }

    #[test]
    fn llama_3_json_that_is_not_a_call_stays_content() {
        for text in [
            "{\"name\": \"Paris\", \"population\": 2100000}",
            "{\"name\": \"f\", \"parameters\": {}} and some words",
            "The answer is 4.",
        ] {
            assert_eq!(
                parse(ToolFamily::Llama3, text),
                ParsedReply {
                    content: text.into(),
                    tool_calls: vec![],
                },
                "{text}"
            );
        }
    }

    #[test]
    fn mistral_tool_calls_array_with_ids() {
        let text = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]";
        assert_eq!(
            parse(ToolFamily::Mistral, text).tool_calls,
            vec![ToolCall {
                id: Some("abc123def".into()),
                ..call("get_weather", json!({"city": "Paris"}))
            }]
        );
        let newer = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}";
        assert_eq!(
            parse(ToolFamily::Mistral, newer).tool_calls,
            vec![call("get_weather", json!({"city": "Rome"}))]
        );
        let no_calls = "Bonjour !";
        assert_eq!(parse(ToolFamily::Mistral, no_calls).content, no_calls);
    }

    fn stream(family: ToolFamily, pieces: &[&str]) -> (String, ParsedReply) {
        let mut s = ToolStream::new(family);
        let streamed: String = pieces.iter().map(|p| s.push(p)).collect();
        (streamed, s.finish())
    }

    #[test]
    fn streaming_holds_tool_call_text_from_the_marker() {
        let (streamed, rest) = stream(
            ToolFamily::Hermes,
            &[
                "Sure.\n<to",
                "ol_call>\n{\"name\": \"f\", ",
                "\"arguments\": {\"x\": 1}}\n</tool_call>",
            ],
        );
        assert_eq!(streamed, "Sure.\n");
        assert_eq!(
            rest,
            ParsedReply {
                content: String::new(),
                tool_calls: vec![call("f", json!({"x": 1}))],
            }
        );
        let (streamed, rest) = stream(ToolFamily::Hermes, &["a <", "b> c"]);
        assert_eq!((streamed.as_str(), rest.content.as_str()), ("a <b> c", ""));
    }

    #[test]
    fn streaming_bare_json_families_decide_on_the_first_character() {
        let (streamed, rest) = stream(
            ToolFamily::Llama3,
            &["\n", "{\"name\": \"f\",", " \"parameters\": {}}"],
        );
        assert_eq!(streamed, "");
        assert_eq!(rest.tool_calls, vec![call("f", json!({}))]);
        let (streamed, rest) = stream(ToolFamily::Llama3, &[" Hello", " {there}"]);
        assert_eq!(streamed, " Hello {there}");
        assert_eq!(rest, ParsedReply::default());
        let (streamed, rest) = stream(ToolFamily::Json, &["{\"a\": 1}"]);
        assert_eq!(streamed, "");
        assert_eq!(rest.content, "{\"a\": 1}");
    }

    #[test]
    fn forced_call_grammar_wraps_the_call_rule() {
        let tools = vec![(
            "get_weather".to_string(),
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )];
        let seen = std::cell::RefCell::new(String::new());
        let fake_converter = |schema: &str| -> Result<String, ()> {
            *seen.borrow_mut() = schema.to_string();
            Ok("root ::= \"{\" space \"}\"\nspace ::= \" \"?\n".to_string())
        };
        let grammar = forced_call_grammar(ToolFamily::Hermes, &tools, fake_converter).unwrap();
        assert_eq!(
            grammar,
            "root ::= \"<tool_call>\\n\" hypura-tool-call \"\\n</tool_call>\"\n\
             hypura-tool-call ::= \"{\" space \"}\"\nspace ::= \" \"?\n"
        );
        assert_eq!(
            *seen.borrow(),
            r#"{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string"}}}},"required":["name","arguments"]}"#
        );
        let two = vec![("a".to_string(), json!({})), ("b".to_string(), Value::Null)];
        forced_call_grammar(ToolFamily::Llama3, &two, fake_converter).unwrap();
        assert!(seen.borrow().starts_with(
            r#"{"anyOf":[{"type":"object","properties":{"name":{"const":"a"},"parameters":{}}"#
        ));
    }
}
