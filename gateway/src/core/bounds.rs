//! Limits on what a JSON Schema may ask of llama.cpp's grammar machinery, so
//! that no `format` / `response_format` / forced tool call can take the
//! server's memory or time.
//!
//! Why each limit, from the vendored llama.cpp (0.1.161):
//! - `common/json-schema-to-grammar.cpp` turns `minLength`/`maxLength`,
//!   `minItems`/`maxItems` and a `pattern`'s `{m,n}` into GBNF `X{m,n}`
//!   verbatim, without comparing the bounds.
//! - `src/llama-grammar.cpp` (`parse_sequence`) expands `X{m,n}` into
//!   `n - m` rules computed in `uint64_t`: with `m > n` that count wraps to
//!   about 2^64 and the parser allocates until the process dies
//!   (`{10,1}` grew 180 MB/s). It refuses `m > 2000`
//!   (`MAX_REPETITION_THRESHOLD`) only when the grammar is compiled — in the
//!   decode worker, after the request was admitted — and treats `n > 2000`
//!   as "no upper bound".
//! - `json-schema.cpp` reads counts with `get<int>()`: larger numbers wrap.
//! - Each character of a literal is one 8-byte grammar element per
//!   sequence; an enum of megabytes is a grammar of hundreds of megabytes.
//! - A repetition of something that may be empty (`(a?){n}`) makes the
//!   grammar's stacks grow with the product of the nested counts.
//!
//! So: every count is a non-negative integer; a minimum is at most its
//! maximum and at most [`MAX_REPEAT`]; a maximum is at most [`MAX_COUNT`];
//! a pattern is at most [`MAX_PATTERN_BYTES`] long, its `{m,n}` obey the same
//! rules and the product of nested repetition counts is at most
//! [`MAX_PATTERN_PRODUCT`]; the grammar text is at most [`MAX_GRAMMAR_BYTES`]
//! and its repetitions are checked again as the parser will read them.
use serde_json::{Map, Value};

/// llama.cpp's `MAX_REPETITION_THRESHOLD`: the parser refuses more required
/// repetitions than this.
pub const MAX_REPEAT: u64 = 2000;
/// The largest maximum count accepted (llama.cpp treats any maximum above
/// [`MAX_REPEAT`] as unbounded; this keeps `get<int>` from wrapping).
pub const MAX_COUNT: u64 = 1_000_000;
/// Longest `pattern`, in bytes.
pub const MAX_PATTERN_BYTES: usize = 4096;
/// Largest product of the counts of repetitions nested in one pattern.
pub const MAX_PATTERN_PRODUCT: u64 = 10_000;
/// Largest grammar text, in bytes (about 8 bytes of parsed grammar per byte,
/// per sequence using it).
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// What is wrong with a schema's bounds; the caller adds the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundsProblem {
    /// `min_key` (`min`) above `max_key` (`max`) at `path`.
    Inverted {
        path: String,
        min_key: &'static str,
        min: u64,
        max_key: &'static str,
        max: u64,
    },
    /// `key` at `path` is `value`, above `limit`.
    TooLarge {
        path: String,
        key: &'static str,
        value: u64,
        limit: u64,
    },
    /// `pattern` at `path` is refused for `reason`.
    Pattern {
        path: String,
        pattern: String,
        reason: String,
    },
}

/// The count pairs of JSON Schema: (minimum keyword, maximum keyword).
const COUNT_PAIRS: [(&str, &str); 3] = [
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
];

/// Checks one schema object's own counts and pattern (not its children):
/// called by the schema walk for every object it visits. Counts that are not
/// non-negative integers are left to the walk's type checks.
pub fn check_object(map: &Map<String, Value>, path: &str) -> Result<(), BoundsProblem> {
    for (min_key, max_key) in COUNT_PAIRS {
        let min = map.get(min_key).and_then(Value::as_u64);
        let max = map.get(max_key).and_then(Value::as_u64);
        if let Some(min) = min.filter(|&m| m > MAX_REPEAT) {
            return Err(BoundsProblem::TooLarge {
                path: path.to_string(),
                key: min_key,
                value: min,
                limit: MAX_REPEAT,
            });
        }
        if let Some(max) = max.filter(|&m| m > MAX_COUNT) {
            return Err(BoundsProblem::TooLarge {
                path: path.to_string(),
                key: max_key,
                value: max,
                limit: MAX_COUNT,
            });
        }
        if let (Some(min), Some(max)) = (min, max) {
            if min > max {
                return Err(BoundsProblem::Inverted {
                    path: path.to_string(),
                    min_key,
                    min,
                    max_key,
                    max,
                });
            }
        }
    }
    if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
        check_pattern(pattern).map_err(|reason| BoundsProblem::Pattern {
            path: path.to_string(),
            pattern: shorten(pattern),
            reason,
        })?;
    }
    Ok(())
}

/// A pattern quoted in an error: its first 64 characters.
fn shorten(pattern: &str) -> String {
    match pattern.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &pattern[..cut]),
        None => pattern.to_string(),
    }
}

/// Checks a regular expression's repetitions as llama.cpp's pattern
/// converter reads them: `{m}`, `{m,}`, `{,n}`, `{m,n}` after an item;
/// groups nest; `\` escapes the next character; `[...]` is one item.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "it is {} bytes long, more than {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    let bytes = pattern.as_bytes();
    // Per open group, the largest product of nested counts inside it so far;
    // `last` is that of the item just read (a group's inner product, or 1).
    let mut maxes: Vec<u64> = vec![1];
    let mut last: u64 = 1;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                last = 1;
                i += 1;
            }
            b'[' => {
                last = 1;
                i += 1;
                if i < bytes.len() && bytes[i] == b']' {
                    i += 1;
                }
                while i < bytes.len() && bytes[i] != b']' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' => {
                maxes.push(1);
                last = 1;
            }
            b')' => {
                last = if maxes.len() > 1 { maxes.pop().unwrap_or(1) } else { 1 };
                if let Some(top) = maxes.last_mut() {
                    *top = (*top).max(last);
                }
            }
            b'{' => {
                let close = pattern[i..]
                    .find('}')
                    .map(|n| i + n)
                    .ok_or_else(|| "a '{' without its '}'".to_string())?;
                let (min, max) = parse_braces(&pattern[i + 1..close])?;
                let factor = if max <= MAX_REPEAT { max } else { min.max(1) };
                let product = last.saturating_mul(factor.max(1));
                if product > MAX_PATTERN_PRODUCT {
                    return Err(format!(
                        "its nested repetitions multiply to {product}, more than \
                         {MAX_PATTERN_PRODUCT}"
                    ));
                }
                if let Some(top) = maxes.last_mut() {
                    *top = (*top).max(product);
                }
                last = 1;
                i = close;
            }
            b'*' | b'+' | b'?' => {}
            _ => last = 1,
        }
        i += 1;
    }
    Ok(())
}

/// `m`, `m,`, `,n` or `m,n` (the inside of braces) → (min, max), checked.
fn parse_braces(inside: &str) -> Result<(u64, u64), String> {
    let number = |text: &str, default: u64| -> Result<u64, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(default);
        }
        text.parse::<u64>()
            .map_err(|_| format!("{{{inside}}} is not a repetition count"))
    };
    let (min, max) = match inside.split_once(',') {
        None => {
            let n = number(inside, u64::MAX)?;
            if n == u64::MAX {
                return Err("{} is not a repetition count".into());
            }
            (n, n)
        }
        Some((min, max)) => (number(min, 0)?, number(max, u64::MAX)?),
    };
    if min > max {
        return Err(format!(
            "{{{inside}}} asks for at least {min} but at most {max} repetitions"
        ));
    }
    if min > MAX_REPEAT {
        return Err(format!(
            "{{{inside}}} repeats at least {min} times, more than {MAX_REPEAT}"
        ));
    }
    if max != u64::MAX && max > MAX_COUNT {
        return Err(format!(
            "{{{inside}}} allows up to {max} repetitions, more than {MAX_COUNT}"
        ));
    }
    Ok((min, max))
}

/// What is wrong with a grammar llama.cpp would have to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarProblem {
    /// The text is longer than [`MAX_GRAMMAR_BYTES`].
    TooLarge { bytes: usize },
    /// A `{m,n}` the parser would explode on or refuse (the braces' text).
    Repetition(String),
}

/// Checks a GBNF text before llama.cpp compiles it: its size, and every
/// `{m,n}` outside string literals and character classes as
/// `llama-grammar.cpp` reads it (a second line of defence behind the schema
/// checks: a converter change must not reopen the hole).
pub fn check_grammar(grammar: &str) -> Result<(), GrammarProblem> {
    if grammar.len() > MAX_GRAMMAR_BYTES {
        return Err(GrammarProblem::TooLarge {
            bytes: grammar.len(),
        });
    }
    let bytes = grammar.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'[' => {
                let end = if bytes[i] == b'"' { b'"' } else { b']' };
                i += 1;
                while i < bytes.len() && bytes[i] != end {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'{' => {
                let close = grammar[i..]
                    .find('}')
                    .map(|n| i + n)
                    .ok_or_else(|| GrammarProblem::Repetition(grammar[i..].chars().take(16).collect()))?;
                let inside = &grammar[i + 1..close];
                parse_braces(inside).map_err(|_| GrammarProblem::Repetition(format!("{{{inside}}}")))?;
                i = close;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn inverted_and_huge_counts_are_refused() {
        assert_eq!(
            check_object(&object(json!({"minLength": 10, "maxLength": 1})), "#"),
            Err(BoundsProblem::Inverted {
                path: "#".into(),
                min_key: "minLength",
                min: 10,
                max_key: "maxLength",
                max: 1
            })
        );
        for (min_key, max_key) in COUNT_PAIRS {
            let mut m = Map::new();
            m.insert(min_key.into(), json!(3));
            m.insert(max_key.into(), json!(2));
            assert!(matches!(
                check_object(&m, "#/x"),
                Err(BoundsProblem::Inverted { .. })
            ));
            m.insert(max_key.into(), json!(3));
            assert_eq!(check_object(&m, "#/x"), Ok(()));
        }
        assert_eq!(
            check_object(&object(json!({"minItems": 2001})), "#"),
            Err(BoundsProblem::TooLarge {
                path: "#".into(),
                key: "minItems",
                value: 2001,
                limit: MAX_REPEAT
            })
        );
        assert!(check_object(&object(json!({"maxLength": 5000})), "#").is_ok());
        assert!(matches!(
            check_object(&object(json!({"maxLength": 10_000_000_000u64})), "#"),
            Err(BoundsProblem::TooLarge { key: "maxLength", .. })
        ));
    }

    #[test]
    fn pattern_repetitions_are_checked() {
        for ok in [
            "^a{5}$",
            "^[a-z]{3,64}$",
            r"^\d{4}-\d{2}-\d{2}$",
            "^a{2,}$",
            "^(ab){0,100}$",
            r"^\{1,0\}$",
            "^[{]{1}$",
            "^([a-f0-9]{8})-([a-f0-9]{4})$",
        ] {
            assert_eq!(check_pattern(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            check_pattern("^a{5,1}$").unwrap_err(),
            "{5,1} asks for at least 5 but at most 1 repetitions"
        );
        assert_eq!(
            check_pattern("^a{100000}$").unwrap_err(),
            "{100000} repeats at least 100000 times, more than 2000"
        );
        assert!(check_pattern("^a{1,99999999999}$").is_err());
        assert!(check_pattern("^a{x}$").is_err());
        assert!(check_pattern("^a{3").is_err());
        assert_eq!(
            check_pattern("^((a?){200}){200}$").unwrap_err(),
            "its nested repetitions multiply to 40000, more than 10000"
        );
        assert!(check_pattern("^((a{100}){100}){100}$").is_err());
        assert!(check_pattern("^(a{100}b{100}){50}$").is_ok());
        assert!(check_pattern(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
    }

    #[test]
    fn grammars_are_checked_as_the_parser_reads_them() {
        assert_eq!(check_grammar("root ::= \"a\"{2,5}\n"), Ok(()));
        assert_eq!(check_grammar("root ::= [{]{2} \"{10,1}\"\n"), Ok(()));
        assert_eq!(
            check_grammar("root ::= \"a\"{10,1}\n"),
            Err(GrammarProblem::Repetition("{10,1}".into()))
        );
        assert_eq!(
            check_grammar("root ::= x{3000}\n"),
            Err(GrammarProblem::Repetition("{3000}".into()))
        );
        let big = format!("root ::= \"{}\"\n", "a".repeat(MAX_GRAMMAR_BYTES));
        assert!(matches!(
            check_grammar(&big),
            Err(GrammarProblem::TooLarge { .. })
        ));
    }
}
