//! JSON Schema → grammar conversions, off the async runtime.
//!
//! llama.cpp's converter is synchronous and recursive. Each conversion runs
//! on a thread of its own with a [`CONVERSION_STACK_BYTES`] stack (far more
//! than the deepest schema [`super::schema_cost`] lets through needs), at
//! most [`MAX_CONCURRENT_CONVERSIONS`] at once; the request waits for its
//! turn and its grammar through [`off_runtime`], so the runtime's workers
//! keep serving everything else meanwhile.
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use llama_tiered::llama::json_schema_to_grammar;

use super::blocking::off_runtime;

/// Stack of a conversion thread (address space; only what it touches is used).
pub const CONVERSION_STACK_BYTES: usize = 64 << 20;
/// Conversions running at once, server-wide.
pub const MAX_CONCURRENT_CONVERSIONS: usize = 2;
/// How long a conversion waits for its turn before the request is refused.
pub const CONVERSION_WAIT: Duration = Duration::from_secs(30);

/// Why no grammar came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// llama.cpp's converter refused the schema (its message).
    #[error("{0}")]
    Rejected(String),
    /// Every conversion slot stayed busy for [`CONVERSION_WAIT`].
    #[error(
        "the server is busy converting other JSON Schemas into grammars: send the request \
         again shortly"
    )]
    Busy,
    /// The conversion thread could not start or did not finish.
    #[error("converting the JSON Schema failed: {0}")]
    Failed(String),
}

/// Converts `schema_json` (JSON text) into a GBNF grammar, on a conversion
/// thread, waiting off the runtime.
pub fn schema_to_grammar(schema_json: String) -> Result<String, ConvertError> {
    off_runtime(move || {
        let _slot = SLOTS.acquire(CONVERSION_WAIT).ok_or(ConvertError::Busy)?;
        let worker = std::thread::Builder::new()
            .name("schema-grammar".into())
            .stack_size(CONVERSION_STACK_BYTES)
            .spawn(move || json_schema_to_grammar(&schema_json))
            .map_err(|e| ConvertError::Failed(format!("starting its thread: {e}")))?;
        worker
            .join()
            .map_err(|_| ConvertError::Failed("its thread panicked".into()))?
            .map_err(|e| ConvertError::Rejected(e.to_string()))
    })
}

/// Conversion slots in use, and a signal when one frees.
static SLOTS: Slots = Slots {
    used: Mutex::new(0),
    freed: Condvar::new(),
};

struct Slots {
    used: Mutex<usize>,
    freed: Condvar,
}

/// A slot held; given back when dropped.
struct Slot(&'static Slots);

impl Slots {
    fn acquire(&'static self, wait: Duration) -> Option<Slot> {
        let deadline = Instant::now() + wait;
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while *used >= MAX_CONCURRENT_CONVERSIONS {
            let left = deadline.checked_duration_since(Instant::now())?;
            used = self
                .freed
                .wait_timeout(used, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *used += 1;
        Some(Slot(self))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.used.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_rejects() {
        let grammar = schema_to_grammar(r#"{"type":"boolean"}"#.into()).unwrap();
        assert!(grammar.contains("root ::= "), "{grammar}");
        assert!(matches!(
            schema_to_grammar(r#"{"type":"banana"}"#.into()),
            Err(ConvertError::Rejected(_))
        ));
    }

    /// A `$ref` chain that overflows a 2 MiB stack converts on the
    /// conversion thread's (the schema check refuses it long before).
    #[test]
    fn deep_ref_chains_fit_the_conversion_stack() {
        let n = 3_000;
        let defs: Vec<String> = (0..n)
            .map(|i| match i + 1 < n {
                true => format!(r##""a{i}":{{"$ref":"#/$defs/a{}"}}"##, i + 1),
                false => format!(r#""a{i}":{{"type":"string"}}"#),
            })
            .collect();
        let schema = format!(
            r##"{{"$defs":{{{}}},"$ref":"#/$defs/a0"}}"##,
            defs.join(",")
        );
        assert!(schema_to_grammar(schema).is_ok());
    }

    #[test]
    fn slots_are_bounded_and_given_back() {
        static TEST_SLOTS: Slots = Slots {
            used: Mutex::new(0),
            freed: Condvar::new(),
        };
        let held: Vec<Slot> = (0..MAX_CONCURRENT_CONVERSIONS)
            .map(|_| TEST_SLOTS.acquire(Duration::ZERO).unwrap())
            .collect();
        assert!(TEST_SLOTS.acquire(Duration::from_millis(10)).is_none());
        drop(held);
        assert!(TEST_SLOTS.acquire(Duration::ZERO).is_some());
    }
}
