//! Ollama's Modelfile, the text `/api/create` takes in its legacy
//! `modelfile` field and `/api/show` answers: read into a [`Modelfile`],
//! written back by [`render`]. Pure: no files, no models.
//!
//! ```text
//! # a comment
//! FROM SmolLM2-135M-Instruct.Q4_1
//! SYSTEM You are a pirate.
//! TEMPLATE """{% for m in messages %}…{% endfor %}"""
//! PARAMETER temperature 0
//! PARAMETER stop "<|im_end|>"
//! MESSAGE user Ahoy?
//! ```
//!
//! Commands are case-insensitive, one a line; a value runs to the end of its
//! line, or is quoted: `"…"` or `"""…"""`, either spanning lines. `stop` may
//! be given several times (its values gather in a list); other parameters
//! are typed from their text (integer, number, `true`/`false`, else text)
//! and checked against Ollama's options by the caller.
use serde_json::{Map, Value};

/// What a Modelfile asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modelfile {
    /// A model name, a blob digest (`sha256:…`, or `@sha256:…` as older
    /// clients write it) or a GGUF file's path.
    pub from: String,
    pub template: Option<String>,
    pub system: Option<String>,
    /// Ollama option names → values.
    pub parameters: Map<String, Value>,
    /// `(role, content)` pairs put before every conversation.
    pub messages: Vec<(String, String)>,
    /// `ADAPTER` lines (LoRA adapters: refused by the caller).
    pub adapters: Vec<String>,
}

/// A Modelfile that cannot be read: the line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("modelfile line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Commands Ollama knows that change nothing here (licence text, its
/// renderer and parser names, a version it requires).
const IGNORED: &[&str] = &["license", "renderer", "parser", "requires"];

const MESSAGE_ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// Reads a Modelfile; it must have a `FROM` line.
pub fn parse(text: &str) -> Result<Modelfile, ParseError> {
    let mut file = Modelfile::default();
    let mut from = None;
    let mut rest = text.trim_start_matches('\u{feff}');
    let mut line = 1;
    loop {
        let skipped = skip_blank_and_comments(rest);
        line += count_lines(&rest[..rest.len() - skipped.len()]);
        rest = skipped;
        if rest.is_empty() {
            break;
        }
        let at = line;
        let error = |message: String| ParseError { line: at, message };
        let (command, after) = word(rest);
        let command = command.to_ascii_lowercase();
        let (value, after) = match command.as_str() {
            "parameter" | "message" => {
                let (key, after) = word(after);
                if key.is_empty() {
                    return Err(error(format!("{command} needs a name and a value")));
                }
                let (value, after) = value(after).map_err(error)?;
                match command.as_str() {
                    "parameter" => add_parameter(&mut file.parameters, key, &value),
                    _ => {
                        let role = key.to_ascii_lowercase();
                        if !MESSAGE_ROLES.contains(&role.as_str()) {
                            return Err(error(format!(
                                "MESSAGE role '{key}' is not one of system, user, assistant, tool"
                            )));
                        }
                        file.messages.push((role, value.clone()));
                    }
                }
                (value, after)
            }
            _ => value(after).map_err(error)?,
        };
        match command.as_str() {
            "from" => from = Some(value.trim().to_string()),
            "template" => file.template = Some(value),
            "system" => file.system = Some(value),
            "adapter" => file.adapters.push(value.trim().to_string()),
            "parameter" | "message" => {}
            other if IGNORED.contains(&other) => {}
            other => {
                return Err(error(format!(
                    "unknown command '{other}': use FROM, TEMPLATE, SYSTEM, PARAMETER or MESSAGE"
                )))
            }
        }
        line += count_lines(&rest[..rest.len() - after.len()]);
        rest = after;
    }
    match from {
        Some(from) if !from.is_empty() => Ok(Modelfile { from, ..file }),
        _ => Err(ParseError {
            line: 1,
            message: "no FROM line: name the model or GGUF file to build on".into(),
        }),
    }
}

fn count_lines(text: &str) -> usize {
    text.matches('\n').count()
}

/// `text` after any blank lines, spaces and `#` comment lines.
fn skip_blank_and_comments(mut text: &str) -> &str {
    loop {
        text = text.trim_start();
        match text.strip_prefix('#') {
            Some(comment) => text = comment.split_once('\n').map_or("", |(_, next)| next),
            None => return text,
        }
    }
}

/// The first word of `text` and what follows it (spaces, not newlines, skipped).
fn word(text: &str) -> (&str, &str) {
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    let (word, rest) = text.split_at(end);
    (word, rest.trim_start_matches([' ', '\t']))
}

/// A value: `"""…"""`, `"…"`, or the rest of the line; and the text after it.
fn value(text: &str) -> Result<(String, &str), String> {
    for quote in ["\"\"\"", "\""] {
        if let Some(inner) = text.strip_prefix(quote) {
            let end = inner
                .find(quote)
                .ok_or_else(|| format!("a value opened with {quote} is never closed"))?;
            return Ok((inner[..end].to_string(), &inner[end + quote.len()..]));
        }
    }
    let end = text.find('\n').unwrap_or(text.len());
    Ok((text[..end].trim().to_string(), &text[end..]))
}

/// Adds one `PARAMETER` line: `stop` gathers a list, others take their typed value.
fn add_parameter(parameters: &mut Map<String, Value>, key: &str, text: &str) {
    let key = key.to_ascii_lowercase();
    if key == "stop" {
        let stops = parameters
            .entry("stop")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = stops {
            list.push(Value::String(text.to_string()));
        }
        return;
    }
    let value = if let Ok(n) = text.parse::<i64>() {
        Value::from(n)
    } else if let Some(n) = text.parse::<f64>().ok().filter(|n| n.is_finite()) {
        Value::from(n)
    } else if let Ok(b) = text.parse::<bool>() {
        Value::from(b)
    } else {
        Value::String(text.to_string())
    };
    parameters.insert(key, value);
}

/// A value as a Modelfile writes it: bare when it is one plain line,
/// else in `"""` quotes.
fn quoted(text: &str) -> String {
    let plain = !text.is_empty()
        && !text.contains(['\n', '"', '#'])
        && text.trim() == text
        && !text.starts_with('"');
    if plain {
        text.to_string()
    } else {
        format!("\"\"\"{text}\"\"\"")
    }
}

/// A parameter's value as text: strings bare, numbers and booleans as JSON.
fn parameter_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Each parameter as `(name, value text)` by name, one pair per `stop` string.
pub fn parameter_lines(parameters: &Map<String, Value>) -> Vec<(String, String)> {
    let mut keys: Vec<&String> = parameters.keys().collect();
    keys.sort();
    let mut lines = Vec::new();
    for (key, value) in keys.into_iter().map(|k| (k, &parameters[k])) {
        match value {
            Value::Array(list) => {
                lines.extend(list.iter().map(|v| (key.clone(), parameter_text(v))));
            }
            other => lines.push((key.clone(), parameter_text(other))),
        }
    }
    lines
}

/// Writes `file` as a Modelfile that [`parse`] reads back to the same.
pub fn render(file: &Modelfile) -> String {
    let mut text = format!("FROM {}\n", file.from);
    if let Some(template) = &file.template {
        text.push_str(&format!("TEMPLATE {}\n", quoted(template)));
    }
    if let Some(system) = &file.system {
        text.push_str(&format!("SYSTEM {}\n", quoted(system)));
    }
    for (key, value) in parameter_lines(&file.parameters) {
        text.push_str(&format!("PARAMETER {key} {}\n", quoted(&value)));
    }
    for (role, content) in &file.messages {
        text.push_str(&format!("MESSAGE {role} {}\n", quoted(content)));
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_every_command_and_quoting() {
        let text = "\u{feff}# a pirate\n\
            from SmolLM2:latest\n\
            SYSTEM \"\"\"You are a pirate.\nSay arr.\"\"\"\n\
            TEMPLATE \"{{ messages }}\"\n\
            \n\
            PARAMETER temperature 0\n\
            PARAMETER top_p 0.5\n\
            parameter stop <|im_end|>\n\
            PARAMETER stop \"two words\"\n\
            PARAMETER num_predict 5\n\
            PARAMETER penalize_newline true\n\
            MESSAGE user Ahoy?\n\
            MESSAGE assistant \"\"\"Arr!\"\"\"\n\
            LICENSE \"\"\"MIT\nlicence\"\"\"\n";
        let file = parse(text).unwrap();
        assert_eq!(file.from, "SmolLM2:latest");
        assert_eq!(file.system.as_deref(), Some("You are a pirate.\nSay arr."));
        assert_eq!(file.template.as_deref(), Some("{{ messages }}"));
        assert_eq!(
            Value::Object(file.parameters.clone()),
            json!({"temperature": 0, "top_p": 0.5, "stop": ["<|im_end|>", "two words"],
                   "num_predict": 5, "penalize_newline": true})
        );
        assert_eq!(
            file.messages,
            [
                ("user".to_string(), "Ahoy?".to_string()),
                ("assistant".to_string(), "Arr!".to_string())
            ]
        );
        assert_eq!(parse(&render(&file)).unwrap(), file);
    }

    #[test]
    fn refuses_what_it_cannot_read_naming_the_line() {
        for (text, line, words) in [
            ("SYSTEM hi\n", 1, "no FROM line"),
            ("FROM m\n\nBOGUS x\n", 3, "unknown command 'bogus'"),
            ("FROM m\nSYSTEM \"\"\"open\n", 2, "never closed"),
            (
                "FROM m\nMESSAGE narrator hi\n",
                2,
                "MESSAGE role 'narrator'",
            ),
            ("FROM m\nPARAMETER\n", 2, "needs a name and a value"),
            ("", 1, "no FROM line"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(words), "{text:?}: {e}");
        }
    }

    #[test]
    fn adapters_are_kept_for_the_caller_to_refuse() {
        let file = parse("FROM m\nADAPTER ./lora.gguf\n").unwrap();
        assert_eq!(file.adapters, ["./lora.gguf"]);
    }

    #[test]
    fn renders_values_that_need_quotes_in_triple_quotes() {
        let mut parameters = Map::new();
        parameters.insert("stop".into(), json!(["\n", "END"]));
        parameters.insert("temperature".into(), json!(0.2));
        let file = Modelfile {
            from: "/m/smol.gguf".into(),
            system: Some("Line one\n\"two\" three".into()),
            parameters,
            ..Modelfile::default()
        };
        let text = render(&file);
        assert_eq!(
            text,
            "FROM /m/smol.gguf\nSYSTEM \"\"\"Line one\n\"two\" three\"\"\"\nPARAMETER stop \"\"\"\n\"\"\"\n\
             PARAMETER stop END\nPARAMETER temperature 0.2\n"
        );
        assert_eq!(parse(&text).unwrap(), file);
    }
}
