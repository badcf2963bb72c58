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
/// Most `properties` of one object: llama.cpp's converter writes a rule per
/// suffix of the optional ones, in time and memory quadratic in their
/// number (2000 took over a minute).
pub const MAX_PROPERTIES: u64 = 128;
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
    if let Some(properties) = map.get("properties").and_then(Value::as_object) {
        let count = properties.len() as u64;
        if count > MAX_PROPERTIES {
            return Err(BoundsProblem::TooLarge {
                path: path.to_string(),
                key: "properties",
                value: count,
                limit: MAX_PROPERTIES,
            });
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
/// groups nest; `\\` escapes the next character; `[...]` is one item.
///
/// Two costs are bounded. Nested counts multiply the grammar
/// ([`MAX_PATTERN_PRODUCT`]). Items that may match nothing (`a?`, `(b*)`,
/// `x{0,3}`) one after another, or repeated, let llama.cpp's grammar reach
/// each of them without reading a character: it keeps one stack per such
/// place and walks all of them for every token of the vocabulary, so
/// `^(a?){2000}$` held a decode thread for minutes; their number is bounded
/// by [`MAX_EMPTY_RUN`], and an unbounded repetition of one is refused.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "it is {} bytes long, more than {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    let mut scan = PatternScan::default();
    let bytes = pattern.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                scan.item(Item::atom())?;
                i += 1;
            }
            b'[' => {
                scan.item(Item::atom())?;
                i += 1;
                if i < bytes.len() && bytes[i] == b']' {
                    i += 1;
                }
                while i < bytes.len() && bytes[i] != b']' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' => scan.open()?,
            b')' => scan.close()?,
            b'|' => scan.alternative()?,
            b'?' => scan.quantify(0, 1)?,
            b'*' => scan.quantify(0, u64::MAX)?,
            b'+' => scan.quantify(1, u64::MAX)?,
            b'{' => {
                let close = pattern[i..]
                    .find('}')
                    .map(|n| i + n)
                    .ok_or_else(|| "a '{' without its '}'".to_string())?;
                let (min, max) = parse_braces(&pattern[i + 1..close])?;
                scan.quantify(min, max)?;
                i = close;
            }
            b'^' | b'$' => {}
            _ => scan.item(Item::atom())?,
        }
        i += 1;
    }
    scan.finish()
}

/// Most places a pattern's grammar can reach without reading a character:
/// items that may match nothing, one after another or repeated.
pub const MAX_EMPTY_RUN: u64 = 64;

/// One item of a pattern, once read (its quantifier applied).
#[derive(Debug, Clone, Copy)]
struct Item {
    /// It may match nothing.
    empty: bool,
    /// Places inside it reachable without reading (a group's longest run).
    run: u64,
    /// Product of the counts of the repetitions nested inside it.
    product: u64,
}

impl Item {
    fn atom() -> Item {
        Item {
            empty: false,
            run: 0,
            product: 1,
        }
    }
}

/// One open group (the whole pattern is the outermost).
#[derive(Debug, Default)]
struct Level {
    /// The item read last, waiting for a quantifier.
    pending: Option<Item>,
    /// Length of the current run of items that may match nothing.
    run: u64,
    max_run: u64,
    /// Every item of the current alternative so far may match nothing.
    alternative_empty: bool,
    /// Some finished alternative may match nothing.
    any_alternative_empty: bool,
    max_product: u64,
}

impl Level {
    fn new() -> Level {
        Level {
            alternative_empty: true,
            max_product: 1,
            ..Level::default()
        }
    }

    /// Folds the pending item into the current alternative.
    fn flush(&mut self) -> Result<(), String> {
        let Some(item) = self.pending.take() else {
            return Ok(());
        };
        self.max_product = self.max_product.max(item.product);
        if item.empty {
            self.run += item.run.max(1);
            self.max_run = self.max_run.max(self.run);
            if self.run > MAX_EMPTY_RUN {
                return Err(format!(
                    "more than {MAX_EMPTY_RUN} parts of it in a row may match nothing"
                ));
            }
        } else {
            self.max_run = self.max_run.max(item.run);
            self.run = 0;
            self.alternative_empty = false;
        }
        Ok(())
    }

    fn end_alternative(&mut self) -> Result<(), String> {
        self.flush()?;
        self.any_alternative_empty |= self.alternative_empty;
        self.alternative_empty = true;
        self.run = 0;
        Ok(())
    }
}

#[derive(Debug)]
struct PatternScan {
    levels: Vec<Level>,
}

impl Default for PatternScan {
    fn default() -> Self {
        PatternScan {
            levels: vec![Level::new()],
        }
    }
}

impl PatternScan {
    fn top(&mut self) -> &mut Level {
        let last = self.levels.len() - 1;
        &mut self.levels[last]
    }

    fn item(&mut self, item: Item) -> Result<(), String> {
        self.top().flush()?;
        self.top().pending = Some(item);
        Ok(())
    }

    fn open(&mut self) -> Result<(), String> {
        self.top().flush()?;
        self.levels.push(Level::new());
        Ok(())
    }

    fn close(&mut self) -> Result<(), String> {
        if self.levels.len() == 1 {
            return Ok(());
        }
        let Some(mut level) = self.levels.pop() else {
            return Ok(());
        };
        level.end_alternative()?;
        self.top().pending = Some(Item {
            empty: level.any_alternative_empty,
            run: level.max_run,
            product: level.max_product,
        });
        Ok(())
    }

    fn alternative(&mut self) -> Result<(), String> {
        self.top().end_alternative()
    }

    fn quantify(&mut self, min: u64, max: u64) -> Result<(), String> {
        let Some(mut item) = self.top().pending else {
            return Ok(());
        };
        let factor = if max <= MAX_REPEAT { max } else { min.max(1) };
        if item.empty {
            if max > MAX_REPEAT {
                return Err("it repeats without bound something that may match nothing".into());
            }
            item.run = item.run.max(1).saturating_mul(factor.max(1));
        }
        item.product = item.product.saturating_mul(factor.max(1));
        if item.product > MAX_PATTERN_PRODUCT {
            return Err(format!(
                "its nested repetitions multiply to {}, more than {MAX_PATTERN_PRODUCT}",
                item.product
            ));
        }
        item.empty |= min == 0;
        self.top().pending = Some(item);
        Ok(())
    }

    fn finish(mut self) -> Result<(), String> {
        while self.levels.len() > 1 {
            self.close()?;
        }
        self.top().end_alternative()
    }
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
                let close = grammar[i..].find('}').map(|n| i + n).ok_or_else(|| {
                    GrammarProblem::Repetition(grammar[i..].chars().take(16).collect())
                })?;
                let inside = &grammar[i + 1..close];
                parse_braces(inside)
                    .map_err(|_| GrammarProblem::Repetition(format!("{{{inside}}}")))?;
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
            Err(BoundsProblem::TooLarge {
                key: "maxLength",
                ..
            })
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
            check_pattern("^((ab){200}){200}$").unwrap_err(),
            "its nested repetitions multiply to 40000, more than 10000"
        );
        assert!(check_pattern("^((a{100}){100}){100}$").is_err());
        assert!(check_pattern("^(a{100}b{100}){50}$").is_ok());
        assert!(check_pattern(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
    }

    #[test]
    fn runs_of_items_that_may_match_nothing_are_bounded() {
        for ok in [
            "^(a?){64}$",
            "^a?b?c?$",
            "^(ab?){2000}$",
            "^[a-z]{0,2000}$",
            "^(a|b){0,2000}$",
            "^(-?[0-9]+)(,[0-9]*)*$",
        ] {
            assert_eq!(check_pattern(ok), Ok(()), "{ok}");
        }
        for bad in [
            "^(a?){2000}$",
            "^(a?){65}$",
            &format!("^{}$", "a?".repeat(65)),
            "^((a|){100}){2}$",
            "^(a*)*$",
            "^(b?c?){40}$",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad}");
        }
        assert_eq!(
            check_pattern("^(a?){2000}$").unwrap_err(),
            "more than 64 parts of it in a row may match nothing"
        );
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
