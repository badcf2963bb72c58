//! Grammar-constrained sampling: llama.cpp's GBNF grammar sampler and its
//! JSON Schema → GBNF converter (`common/json-schema-to-grammar.cpp`, through
//! `llama-cpp-sys-2`'s `common` wrappers, which turn C++ exceptions into
//! status codes and null pointers).
use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

use hypura_llama_sys as sys;

use super::model::Model;
use crate::error::EngineError;

/// The rule a grammar starts from.
pub const GRAMMAR_ROOT: &str = "root";

/// The schema behind `format: "json"` / `{"type": "json_object"}`: any JSON
/// object, as llama.cpp's generic JSON grammar (`root ::= object`).
pub const JSON_OBJECT_SCHEMA: &str = r#"{"type":"object"}"#;

/// Converts a JSON Schema (JSON text) into a GBNF grammar whose root is
/// [`GRAMMAR_ROOT`], with llama.cpp's own converter. A schema it rejects (an
/// unknown type, an unresolvable `$ref`, an invalid pattern…) is an
/// [`EngineError::InvalidArgument`]; llama.cpp's wrapper does not pass the
/// converter's reason on, so callers wanting one check the schema first.
pub fn json_schema_to_grammar(schema_json: &str) -> Result<String, EngineError> {
    let schema = CString::new(schema_json)
        .map_err(|_| EngineError::InvalidArgument("the JSON Schema contains a NUL byte".into()))?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `schema` is NUL-terminated; `out` is a valid place for the
    // wrapper to store a malloc'ed string (or null).
    let status = unsafe { sys::llama_rs_json_schema_to_grammar(schema.as_ptr(), true, &mut out) };
    if status != sys::LLAMA_RS_STATUS_OK || out.is_null() {
        if !out.is_null() {
            // SAFETY: `out` came from the wrapper's allocator; freed once.
            unsafe { sys::llama_rs_string_free(out) };
        }
        return Err(EngineError::InvalidArgument(
            "llama.cpp's JSON Schema converter rejected the schema: use a schema of \
             types, properties, required, enum, const, items, anyOf and local $refs"
                .into(),
        ));
    }
    // SAFETY: on success `out` is a NUL-terminated string owned by us.
    let grammar = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated by the wrapper, freed once with its own free function.
    unsafe { sys::llama_rs_string_free(out) };
    Ok(grammar)
}

/// One sequence's grammar state: which tokens may come next.
pub(crate) struct GrammarSampler {
    raw: NonNull<sys::llama_sampler>,
    /// The grammar, its root and the tokens accepted so far: what
    /// [`GrammarSampler::rebind`] rebuilds the state from.
    grammar: String,
    root: String,
    accepted: Vec<i32>,
}

// SAFETY: the sampler owns its state; used by one thread at a time (`&mut self`).
unsafe impl Send for GrammarSampler {}

impl GrammarSampler {
    /// Parses `grammar` (GBNF, starting at `root`) for `model`'s vocabulary.
    pub(crate) fn new(model: &Model, grammar: &str, root: &str) -> Result<Self, EngineError> {
        let bad = |what: &str| EngineError::InvalidArgument(format!("the grammar {what}"));
        let (grammar_text, root_text) = (grammar.to_string(), root.to_string());
        let text = CString::new(grammar).map_err(|_| bad("contains a NUL byte"))?;
        let root = CString::new(root).map_err(|_| bad("root contains a NUL byte"))?;
        // SAFETY: the vocab lives with the model; both strings are
        // NUL-terminated and only read during the call. The wrapper returns
        // null (never throws) when the grammar does not parse.
        let raw = unsafe {
            sys::llama_rs_sampler_init_grammar(model.vocab(), text.as_ptr(), root.as_ptr())
        };
        NonNull::new(raw)
            .map(|raw| GrammarSampler {
                raw,
                grammar: grammar_text,
                root: root_text,
                accepted: Vec::new(),
            })
            .ok_or_else(|| {
                bad("does not parse (llama.cpp logs where): check its GBNF syntax and rule names")
            })
    }

    /// Sets the logit of every token the grammar forbids next to -inf.
    pub(crate) fn apply(&mut self, candidates: &mut [sys::llama_token_data]) {
        let mut array = sys::llama_token_data_array {
            data: candidates.as_mut_ptr(),
            size: candidates.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: `array` points at `candidates`, valid for the call; the
        // grammar sampler only rewrites logits in place.
        unsafe { sys::llama_sampler_apply(self.raw.as_ptr(), &mut array) }
    }

    /// Whether the grammar allows `token` next.
    pub(crate) fn allows(&mut self, token: i32) -> bool {
        let mut one = [sys::llama_token_data {
            id: token,
            logit: 1.0,
            p: 0.0,
        }];
        self.apply(&mut one);
        one[0].logit != f32::NEG_INFINITY
    }

    /// Advances the grammar past `token`, which [`Self::allows`] must have
    /// allowed (llama.cpp aborts on an end-of-generation token it forbids).
    pub(crate) fn accept(&mut self, token: i32) -> Result<(), EngineError> {
        // SAFETY: the sampler is alive; the wrapper catches C++ exceptions.
        let status = unsafe { sys::llama_rs_sampler_accept(self.raw.as_ptr(), token) };
        if status == sys::LLAMA_RS_STATUS_OK {
            self.accepted.push(token);
            Ok(())
        } else {
            Err(EngineError::InvalidArgument(format!(
                "token {token} does not fit the grammar"
            )))
        }
    }
}

impl GrammarSampler {
    /// The same grammar state on `model`'s vocabulary: llama.cpp's sampler
    /// points at the vocabulary of the model it was made for, so a sequence
    /// moving to another load of the same file rebuilds it there and replays
    /// the tokens accepted so far.
    pub(crate) fn rebind(&mut self, model: &Model) -> Result<(), EngineError> {
        let mut fresh = GrammarSampler::new(model, &self.grammar, &self.root)?;
        for &token in &self.accepted {
            fresh.accept(token)?;
        }
        *self = fresh;
        Ok(())
    }
}

impl Drop for GrammarSampler {
    fn drop(&mut self) {
        // SAFETY: frees the sampler once.
        unsafe { sys::llama_sampler_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_becomes_a_grammar_rooted_at_root() {
        let grammar = json_schema_to_grammar(
            r#"{"type":"object","properties":{"city":{"enum":["Paris","Berlin"]}},"required":["city"]}"#,
        )
        .unwrap();
        assert!(grammar.contains("root ::= "), "{grammar}");
        assert!(grammar.contains(r#""\"Paris\"""#), "{grammar}");
        let any_object = json_schema_to_grammar(JSON_OBJECT_SCHEMA).unwrap();
        assert!(any_object.contains("root ::= "), "{any_object}");
    }

    #[test]
    fn rejected_schemas_are_errors_not_crashes() {
        for bad in [
            r#"{"type":"banana"}"#,
            r##"{"$ref":"#/$defs/missing"}"##,
            "not json",
            "[1, 2]",
        ] {
            let err = json_schema_to_grammar(bad).unwrap_err();
            assert!(
                matches!(err, EngineError::InvalidArgument(_)),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_grammar_allows_only_its_tokens() {
        let model = crate::test_models::smollm2_model();
        let mut grammar = GrammarSampler::new(&model, r#"root ::= "yes" | "no""#, "root").unwrap();
        let yes = model.tokenize("yes", false, false).unwrap();
        let maybe = model.tokenize("maybe", false, false).unwrap();
        assert!(grammar.allows(yes[0]));
        assert!(!grammar.allows(maybe[0]));
        let eos = model.token_eos().unwrap();
        assert!(!grammar.allows(eos), "the grammar is not complete yet");
        for &t in &yes {
            grammar.accept(t).unwrap();
        }
        assert!(grammar.allows(eos), "after \"yes\" the grammar is complete");
        let bad = GrammarSampler::new(&model, "root ::= undefined-rule", "root");
        assert!(matches!(bad, Err(EngineError::InvalidArgument(_))));
        assert!(GrammarSampler::new(&model, "root ::= (", "root").is_err());
    }
}
