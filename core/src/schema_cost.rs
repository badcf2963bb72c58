//! What turning a JSON Schema into a grammar will cost llama.cpp, counted
//! before it runs, so that no schema can take the server's stack, time or
//! memory ([`check`]).
//!
//! llama.cpp's reader (`common/json-schema.cpp`) and converter
//! (`common/json-schema-to-grammar.cpp`, both in the vendored 0.1.161) work
//! on the schema *as expanded*:
//! - both recurse once per level, and a `$ref` followed is a level: a chain
//!   of 2,500 `$ref`s overflowed a 2 MiB thread stack;
//! - each `$ref` target is read and converted once (by its pointer), but a
//!   `type` list builds a copy of its whole schema per type, and an `allOf`
//!   converts the properties of each of its parts again, `$ref`s followed;
//! - an object's optional properties cost a rule per suffix of their list
//!   (quadratic in their number), each named by the path to it, so names
//!   grow with the depth: 100 properties nested 3 deep (10^6 in all) took
//!   over 100 s and made a grammar of 153 MB;
//! - an `allOf` part that is a `$ref` to a `$ref` … back to itself makes
//!   the converter recurse without end.
//!
//! [`check`] walks the schema the way they do, counting as it goes, and
//! stops at the first limit passed: its own work is bounded by the limits.
//! The counts are generous for real schemas (tool definitions of MCP
//! servers, OpenAI structured outputs) and keep a conversion within tens of
//! milliseconds.
use std::collections::HashSet;

use serde_json::{Map, Value};

use super::bounds::MAX_GRAMMAR_BYTES;

/// Deepest nesting of schemas, each `$ref` followed counting as a level.
pub const MAX_SCHEMA_DEPTH: u32 = 64;
/// Most schemas converted: each `$ref` target once, each copy a `type` list
/// makes, each property an `allOf` converts again.
pub const MAX_SCHEMA_NODES: u64 = 10_000;
/// Most object properties converted, across every level and copy.
pub const MAX_SCHEMA_PROPERTIES: u64 = 2_048;
/// Most units of the converter's other work: the rules of optional
/// properties (`n (n + 1) / 2` per object of `n`), the JSON values the
/// copies of `type` lists duplicate, the rules copied around each
/// `pattern`. A unit is 1–3 µs of conversion (measured: 12 objects of 128
/// optional properties, 99,000 units, converted in 0.32 s).
pub const MAX_SCHEMA_WORK: u64 = 100_000;

/// Why a schema costs too much to convert; the caller adds the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostProblem {
    #[error(
        "it nests more than {MAX_SCHEMA_DEPTH} levels deep (each $ref followed counts as a \
         level)"
    )]
    TooDeep,
    #[error(
        "it expands to more than {MAX_SCHEMA_NODES} schemas (each $ref target, each copy a \
         \"type\" list makes and each property an allOf merges counted)"
    )]
    TooManyNodes,
    #[error(
        "it has more than {MAX_SCHEMA_PROPERTIES} object properties in all (counted at every \
         level, and again where a \"type\" list or an allOf copies them)"
    )]
    TooManyProperties,
    #[error(
        "its conversion would take more than {MAX_SCHEMA_WORK} steps (objects with many \
         optional properties, \"type\" lists over large schemas)"
    )]
    TooMuchWork,
    #[error(
        "its property names and literal values alone make a grammar of more than \
         {MAX_GRAMMAR_BYTES} bytes (use fewer or shorter enum values, shorter property names, \
         less nesting)"
    )]
    GrammarTooLarge,
    #[error("$ref {0:?} leads back to itself through $refs only")]
    RefCycle(String),
}

/// Counts what converting `schema` (the whole document: `$ref`s point into
/// it) costs; the first limit passed.
pub fn check(schema: &Value) -> Result<(), CostProblem> {
    let mut walk = Walk {
        root: schema,
        nodes: 0,
        properties: 0,
        work: 0,
        grammar_bytes: 0,
        converted: HashSet::new(),
    };
    walk.node(schema, Place::ROOT)
}

/// Where the walk is: how deep, how long the converter's rule name is there,
/// and whether rules made here count towards the grammar's size (not in the
/// copies llama.cpp merges back into one rule).
#[derive(Debug, Clone, Copy)]
struct Place {
    depth: u32,
    name_bytes: u64,
    counts_bytes: bool,
}

impl Place {
    const ROOT: Place = Place {
        depth: 0,
        name_bytes: 0,
        counts_bytes: true,
    };

    /// One level down, the rule name extended by `-` and `part_bytes`.
    fn child(self, part_bytes: usize) -> Place {
        Place {
            depth: self.depth + 1,
            name_bytes: self.name_bytes + 1 + part_bytes as u64,
            ..self
        }
    }

    fn copy(self) -> Place {
        Place {
            counts_bytes: false,
            ..self
        }
    }
}

struct Walk<'a> {
    root: &'a Value,
    nodes: u64,
    properties: u64,
    work: u64,
    /// A lower bound of the grammar's size: the rule names of properties,
    /// the literal values.
    grammar_bytes: u64,
    /// `$ref`s whose targets were counted (llama.cpp converts each once).
    converted: HashSet<&'a str>,
}

impl<'a> Walk<'a> {
    /// `build_node` and `visit`: one schema.
    fn node(&mut self, schema: &'a Value, at: Place) -> Result<(), CostProblem> {
        if at.depth > MAX_SCHEMA_DEPTH {
            return Err(CostProblem::TooDeep);
        }
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(CostProblem::TooManyNodes);
        }
        let Value::Object(map) = schema else {
            return Ok(());
        };
        if let Some(reference) = map.get("$ref") {
            return self.reference(reference, at);
        }
        if let Some(alternatives) = map.get("oneOf").or_else(|| map.get("anyOf")) {
            for (i, alternative) in as_list(alternatives).iter().enumerate() {
                self.node(alternative, at.child(digits(i)))?;
            }
            return Ok(());
        }
        match map.get("type") {
            Some(Value::Array(types)) => {
                // Each type builds a copy of the whole schema.
                let copied = json_values(schema, MAX_SCHEMA_WORK + 1);
                for (i, kind) in types.iter().enumerate() {
                    self.add_work(copied)?;
                    let place = if i == 0 { at } else { at.copy() };
                    self.typed(map, kind.as_str(), place.child(digits(i)))?;
                }
                Ok(())
            }
            kind => self.typed(map, kind.and_then(Value::as_str), at),
        }
    }

    /// A `$ref`: its target, one level down, counted the first time only.
    fn reference(&mut self, reference: &'a Value, at: Place) -> Result<(), CostProblem> {
        let Some(text) = reference.as_str() else {
            return Ok(());
        };
        if !self.converted.insert(text) {
            return Ok(());
        }
        let Some(target) = resolve(self.root, text) else {
            return Ok(());
        };
        let place = Place {
            depth: at.depth + 1,
            name_bytes: 3 + text.len() as u64,
            ..at
        };
        self.node(target, place)
    }

    /// What `$ref` `text` finally points at, past `$ref`s to `$ref`s
    /// (`None`: nowhere; the schema check reports it).
    fn through_refs(&self, text: &'a str) -> Result<Option<&'a Value>, CostProblem> {
        let mut seen = HashSet::from([text]);
        let mut target = resolve(self.root, text);
        while let Some(next) = target.and_then(|t| t.get("$ref")).and_then(Value::as_str) {
            if !seen.insert(next) {
                return Err(CostProblem::RefCycle(text.to_string()));
            }
            if seen.len() as u32 > MAX_SCHEMA_DEPTH {
                return Err(CostProblem::TooDeep);
            }
            target = resolve(self.root, next);
        }
        Ok(target)
    }

    /// A schema of one `type` (or none), as the reader chooses its kind.
    fn typed(
        &mut self,
        map: &'a Map<String, Value>,
        kind: Option<&str>,
        at: Place,
    ) -> Result<(), CostProblem> {
        if let Some(literal) = map.get("const").or_else(|| map.get("enum")) {
            if at.counts_bytes {
                self.literal_bytes(literal)?;
            }
            return Ok(());
        }
        let has_properties = map.contains_key("properties")
            || map
                .get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(true));
        let all_of = map.get("allOf");
        let items = map.contains_key("items") || map.contains_key("prefixItems");
        match (kind, all_of) {
            (None, _) if has_properties => self.object(map, at),
            (None | Some("object") | Some("string"), Some(parts)) => self.all_of(parts, at),
            (None, None) if items => self.array(map, at),
            (Some("object"), None) => self.object(map, at),
            (Some("array"), _) => self.array(map, at),
            _ => {
                if map.contains_key("pattern") {
                    // The converter copies all its rules so far around each
                    // pattern (2,048 patterns took 1.4 s, 768 took 0.07 s).
                    self.add_work(1 + self.nodes / 8)?;
                }
                Ok(())
            }
        }
    }

    fn object(&mut self, map: &'a Map<String, Value>, at: Place) -> Result<(), CostProblem> {
        let required: HashSet<&str> = map
            .get("required")
            .map(as_list)
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let properties = map.get("properties").and_then(Value::as_object);
        let mut optional = 0;
        for (name, property) in properties.into_iter().flatten() {
            optional += u64::from(!required.contains(name.as_str()));
            self.property(name, property, at)?;
        }
        let additional = map.get("additionalProperties").filter(|a| a.is_object());
        if let Some(additional) = additional {
            optional += 1;
            self.node(additional, at.child("additional-value".len()))?;
        }
        self.add_work(optional * (optional + 1) / 2)
    }

    fn property(&mut self, name: &str, schema: &'a Value, at: Place) -> Result<(), CostProblem> {
        self.properties += 1;
        if self.properties > MAX_SCHEMA_PROPERTIES {
            return Err(CostProblem::TooManyProperties);
        }
        let place = at.child(name.len());
        if at.counts_bytes {
            // `<path>-<name>-kv ::= "\"<name>\"" …`, one rule per property.
            self.grammar_bytes += place.name_bytes + 3 + name.len() as u64;
            if self.grammar_bytes > MAX_GRAMMAR_BYTES as u64 {
                return Err(CostProblem::GrammarTooLarge);
            }
        }
        self.node(schema, place)
    }

    fn array(&mut self, map: &'a Map<String, Value>, at: Place) -> Result<(), CostProblem> {
        let items = map.get("items").or_else(|| map.get("prefixItems"));
        match items {
            Some(Value::Array(tuple)) => {
                for (i, item) in tuple.iter().enumerate() {
                    self.node(item, at.child("tuple-".len() + digits(i)))?;
                }
                Ok(())
            }
            Some(item) => self.node(item, at.child("item".len())),
            None => Ok(()),
        }
    }

    /// `allOf`: its parts as schemas of their own (the reader), then the
    /// properties of each part that is an object, or of each alternative of
    /// a part that is an `anyOf`, `$ref`s followed, merged into one object
    /// and converted again (the converter).
    fn all_of(&mut self, parts: &'a Value, at: Place) -> Result<(), CostProblem> {
        let parts = as_list(parts);
        for (i, part) in parts.iter().enumerate() {
            self.node(part, at.child(digits(i)))?;
        }
        let mut merged = 0;
        for part in parts {
            let alternatives = part.get("anyOf").or_else(|| part.get("oneOf"));
            let components = match alternatives {
                Some(list) if part.get("$ref").is_none() => as_list(list),
                _ => std::slice::from_ref(part),
            };
            for component in components {
                let component = match component.get("$ref").and_then(Value::as_str) {
                    Some(text) => self.through_refs(text)?,
                    None => Some(component),
                };
                let properties = component
                    .and_then(|c| c.get("properties"))
                    .and_then(Value::as_object);
                for (name, property) in properties.into_iter().flatten() {
                    merged += 1;
                    self.property(name, property, at.copy())?;
                }
            }
        }
        self.add_work(merged * (merged + 1) / 2)
    }

    /// A `const` or `enum`: its values are in the grammar, as JSON text at
    /// least (serialized only as far as the grammar's room goes).
    fn literal_bytes(&mut self, literal: &Value) -> Result<(), CostProblem> {
        let mut counter = ByteCounter {
            bytes: 0,
            room: (MAX_GRAMMAR_BYTES as u64).saturating_sub(self.grammar_bytes),
        };
        if serde_json::to_writer(&mut counter, literal).is_err() {
            return Err(CostProblem::GrammarTooLarge);
        }
        // Less an enum's brackets and commas.
        let separators = literal
            .as_array()
            .map_or(0, |values| values.len() as u64 + 1);
        self.grammar_bytes += counter.bytes.saturating_sub(separators);
        if self.grammar_bytes > MAX_GRAMMAR_BYTES as u64 {
            return Err(CostProblem::GrammarTooLarge);
        }
        Ok(())
    }

    fn add_work(&mut self, units: u64) -> Result<(), CostProblem> {
        self.work = self.work.saturating_add(units);
        if self.work > MAX_SCHEMA_WORK {
            return Err(CostProblem::TooMuchWork);
        }
        Ok(())
    }
}

/// Counts the bytes written to it, failing once they pass `room`.
struct ByteCounter {
    bytes: u64,
    room: u64,
}

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes += buf.len() as u64;
        if self.bytes > self.room {
            return Err(std::io::Error::other("past the grammar's room"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn as_list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

/// Bytes of `i` in decimal.
fn digits(i: usize) -> usize {
    i.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The values in `value` (itself included), counting no further than `cap`.
fn json_values(value: &Value, cap: u64) -> u64 {
    let mut count = 0;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        count += 1;
        if count >= cap {
            break;
        }
        match v {
            Value::Array(list) => stack.extend(list),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    count
}

/// `$ref` `text` resolved as llama.cpp's reader does it: `#/` then keys or
/// array indices separated by `/`, taken literally.
fn resolve<'v>(root: &'v Value, text: &str) -> Option<&'v Value> {
    let pointer = text.strip_prefix("#/")?;
    pointer.split('/').try_fold(root, |at, token| match at {
        Value::Object(map) => map.get(token),
        Value::Array(list) => token.parse::<usize>().ok().and_then(|i| list.get(i)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `$defs` a0 → a1 → … → a{n-1} → a string.
    pub(crate) fn ref_chain(n: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"$ref": format!("#/$defs/a{}", i + 1)})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("a{i}"), next);
        }
        json!({"$defs": defs, "$ref": "#/$defs/a0"})
    }

    /// An object of `width` properties, each such an object, `depth` levels;
    /// `required`: every property required.
    pub(crate) fn nested_objects(width: usize, depth: usize, required: bool) -> Value {
        let mut schema = json!({"type": "string"});
        for _ in 0..depth {
            let properties: Map<String, Value> = (0..width)
                .map(|i| (format!("p{i}"), schema.clone()))
                .collect();
            let names: Vec<&String> = properties.keys().filter(|_| required).collect();
            schema = json!({"type": "object", "properties": properties, "required": names});
        }
        schema
    }

    #[test]
    fn ordinary_schemas_pass() {
        let schema = json!({"$defs": {"address": {"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"}}}},
            "type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "minLength": 1},
                "tags": {"type": "array", "items": {"type": "string"}},
                "home": {"$ref": "#/$defs/address"},
                "work": {"$ref": "#/$defs/address"},
                "age": {"type": ["integer", "null"]},
                "kind": {"enum": ["a", "b"]},
                "both": {"allOf": [{"$ref": "#/$defs/address"}, {"type": "object",
                    "properties": {"zip": {"type": "string"}}}]}}});
        assert_eq!(check(&schema), Ok(()));
        // Recursion through a $ref is converted once.
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"});
        assert_eq!(check(&tree), Ok(()));
        assert_eq!(check(&nested_objects(40, 2, false)), Ok(()));
    }

    #[test]
    fn ref_chains_are_bounded_by_depth() {
        assert_eq!(check(&ref_chain(60)), Ok(()));
        assert_eq!(check(&ref_chain(2_500)), Err(CostProblem::TooDeep));
        assert_eq!(check(&ref_chain(100_000)), Err(CostProblem::TooDeep));
    }

    #[test]
    fn expansions_are_bounded() {
        // The 28 MB schema of the issue, its optional properties quadratic.
        assert_eq!(
            check(&nested_objects(100, 3, false)),
            Err(CostProblem::TooMuchWork)
        );
        assert_eq!(
            check(&nested_objects(100, 3, true)),
            Err(CostProblem::TooManyProperties)
        );
        // 2^20 copies through nested type lists.
        let mut doubling = json!({"type": "string"});
        for _ in 0..20 {
            doubling = json!({"type": ["object", "array"], "properties": {"a": doubling}, "items": doubling});
        }
        assert!(check(&doubling).is_err());
        // allOf of the same object again and again, each level merging twice.
        let mut defs = Map::new();
        for i in 0..30 {
            let next = if i < 29 {
                json!({"allOf": [{"$ref": format!("#/$defs/d{}", i + 1)},
                    {"$ref": format!("#/$defs/d{}", i + 1)}]})
            } else {
                json!({"type": "string"})
            };
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"x": next}}),
            );
        }
        let merging = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(check(&merging).is_err());
        let optional: Map<String, Value> = (0..100)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        let many_objects: Map<String, Value> = (0..20)
            .map(|i| {
                (
                    format!("o{i}"),
                    json!({"type": "object", "properties": optional}),
                )
            })
            .collect();
        assert_eq!(
            check(&json!({"type": "object", "properties": many_objects})),
            Err(CostProblem::TooMuchWork)
        );
        let long_name = "n".repeat(4_000);
        let mut deep = json!({"type": "string"});
        for _ in 0..60 {
            deep = json!({"type": "object", "properties": {long_name.clone(): deep}});
        }
        assert_eq!(check(&deep), Err(CostProblem::GrammarTooLarge));
        let values: Vec<String> = (0..40_000).map(|i| format!("value number {i}")).collect();
        assert_eq!(
            check(&json!({"enum": values})),
            Err(CostProblem::GrammarTooLarge)
        );
        assert_eq!(
            check(&json!({"const": "x".repeat(300_000)})),
            Err(CostProblem::GrammarTooLarge)
        );
        assert_eq!(check(&json!({"enum": ["x".repeat(200_000)]})), Ok(()));
    }

    /// Conversion times of schemas just within each limit (run with
    /// `--ignored --nocapture`; measured, not asserted).
    #[test]
    #[ignore]
    fn measure_conversions_at_the_limits() {
        let optional: Map<String, Value> = (0..128)
            .map(|i| (format!("property_{i}"), json!({"type": "string"})))
            .collect();
        let objects = |n: usize| -> Value {
            let props: Map<String, Value> = (0..n)
                .map(|i| {
                    (
                        format!("o{i}"),
                        json!({"type": "object", "properties": optional}),
                    )
                })
                .collect();
            json!({"type": "object", "properties": props})
        };
        let mut alternatives = Vec::new();
        for i in 0..4_000 {
            alternatives.push(json!({"const": i}));
        }
        let pattern_object = |n: usize| -> Value {
            let props: Map<String, Value> = (0..n)
                .map(|i| {
                    (
                        format!("p{i}"),
                        json!({"type": "string", "pattern": "^[a-z]{2,8}$"}),
                    )
                })
                .collect();
            let names: Vec<&String> = props.keys().collect();
            json!({"type": "object", "properties": props, "required": names})
        };
        let pattern_objects = |k: usize| -> Value {
            let props: Map<String, Value> = (0..k)
                .map(|i| (format!("o{i}"), pattern_object(128)))
                .collect();
            json!({"type": "object", "properties": props})
        };
        let cases = [
            ("12 objects of 128 optional properties", objects(12)),
            ("4 x 128 pattern properties", pattern_objects(4)),
            ("6 x 128 pattern properties", pattern_objects(6)),
            ("16 x 128 pattern properties", pattern_objects(16)),
            ("4000 anyOf consts", json!({"anyOf": alternatives})),
            ("15 x 15 x 9 nested", nested_objects(15, 3, false)),
            ("ref chain of 60", ref_chain(60)),
        ];
        for (what, schema) in cases {
            let started = std::time::Instant::now();
            let checked = check(&schema);
            let checked_in = started.elapsed();
            let started = std::time::Instant::now();
            let grammar = llama_tiered::llama::json_schema_to_grammar(&schema.to_string());
            eprintln!(
                "{what}: check {checked:?} in {checked_in:?}; conversion {} bytes in {:?}",
                grammar.map_or(0, |g| g.len()),
                started.elapsed()
            );
        }
    }

    #[test]
    fn ref_only_cycles_are_refused() {
        let cycle = json!({"allOf": [{"$ref": "#/$defs/a"}],
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}});
        assert_eq!(
            check(&cycle),
            Err(CostProblem::RefCycle("#/$defs/a".into()))
        );
    }

    #[test]
    fn refs_resolve_as_llama_cpp_reads_them() {
        let root = json!({"a": {"b": [1, {"c": 2}]}});
        assert_eq!(resolve(&root, "#/a/b/1/c"), Some(&json!(2)));
        assert_eq!(resolve(&root, "#/a/x"), None);
        assert_eq!(resolve(&root, "#a"), None);
        assert_eq!(digits(0), 1);
        assert_eq!(digits(10), 2);
    }
}
