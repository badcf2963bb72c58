//! The runner protocol: what the gateway and a runner say to each other.
//!
//! One Unix stream socket per runner; each frame is one line of JSON (serde
//! escapes newlines inside strings, so a line is a frame). The gateway sends
//! [`Call`]s, the runner answers with [`Reply`]s carrying the call's `id`.
//! Calls are independent: replies of several calls interleave on the one
//! connection (many generations stream at once), and only the `id` says
//! which call a reply belongs to.
//!
//! A conversation:
//! 1. `hello {version}` → `hello {version, pid}` (a version the runner does
//!    not speak → `failed`, and the runner exits);
//! 2. `load {spec}` → `loaded {n_ctx_per_seq}` or `failed`, once;
//! 3. any number of calls: `generate` → `accepted`, then `event`s, the last
//!    a `done` or `error` event (or `failed` at once: not queued); `cancel
//!    {call}` ends a generation early (its stream then ends with whatever the
//!    engine says, or nothing more); `embed` → `embedded`; `count_tokens` and
//!    `prompt_tokens` → `count`; `status` → `status`; `memory` → `memory`; `streaming` →
//!    `streaming`; `kv_cache` → `kv_cache`; `set_residency` →
//!    `ok` once the move is made; `shutdown` → `ok` once in-flight work is
//!    done (new work is refused);
//! 4. the gateway closes the socket: the runner exits.
//!
//! `abort` makes the runner abort (as a failed `GGML_ASSERT` would); it is
//! honoured only when the runner runs with `HYPURA_RUNNER_TEST_HOOKS=1`.
use serde::{Deserialize, Serialize};

use hypura_scheduler::budget::Footprint;
use hypura_scheduler::plan::PlanSettings;
use hypura_scheduler::profile::HardwareProfile;
use llama_tiered::tiered::GpuShare;

use crate::core::backend::{
    BackendError, BackendEvent, BackendStatus, EmbedOutput, KvCache, Residency, StreamCounters,
    TierBytes,
};
use crate::core::request::{BackendRequest, EmbedBatch};

/// The protocol version this build speaks; a runner and a gateway of
/// different builds refuse each other at `hello`. 3: `prompt_tokens`;
/// generation events carry `logprobs`, and sampling `top_logprobs`. 4:
/// `budgeted.overhead`, `ballast`.
pub const VERSION: u32 = 4;

/// The environment variable that enables the test hooks ([`Op::Abort`],
/// [`Op::Ballast`]) in a runner.
pub const TEST_HOOKS_ENV: &str = "HYPURA_RUNNER_TEST_HOOKS";

/// Parses one frame. Without serde_json's nesting limit (128): a frame wraps
/// what it carries a few levels deeper, so a request's values within the
/// body limit ([`crate::bodies::MAX_JSON_DEPTH`]) or a reply's tool calls
/// parsed from a model's text (within serde_json's limit) could pass it,
/// and a frame one side cannot read ends the connection. The depth stays
/// that of what the other side wrote, which is bounded so.
pub fn parse_frame<T: serde::de::DeserializeOwned>(line: &str) -> serde_json::Result<T> {
    let mut frame = serde_json::Deserializer::from_str(line);
    frame.disable_recursion_limit();
    let value = T::deserialize(&mut frame)?;
    frame.end()?;
    Ok(value)
}

/// One request of the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// Unique per connection; every reply to this call carries it.
    pub id: u64,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Hello {
        version: u32,
    },
    Load(Box<LoadSpec>),
    Generate(Box<BackendRequest>),
    /// Ends the generation started by call `call`.
    Cancel {
        call: u64,
    },
    Embed(EmbedBatch),
    CountTokens {
        text: String,
    },
    /// Tokens a generation request would submit ([`ModelBackend::prompt_tokens`]).
    ///
    /// [`ModelBackend::prompt_tokens`]: crate::core::backend::ModelBackend::prompt_tokens
    PromptTokens(Box<BackendRequest>),
    Status,
    Memory,
    /// Its streaming counters since load ([`ModelBackend::streaming`]).
    ///
    /// [`ModelBackend::streaming`]: crate::core::backend::ModelBackend::streaming
    Streaming,
    /// Its KV cache now ([`ModelBackend::kv_cache`]).
    ///
    /// [`ModelBackend::kv_cache`]: crate::core::backend::ModelBackend::kv_cache
    KvCache,
    /// Moves the model from `from` to `to` (a stream-cache resize, or a
    /// switch between its streaming and full placements).
    SetResidency {
        from: Residency,
        to: Residency,
    },
    Shutdown,
    /// Test hook: abort the process.
    Abort,
    /// Test hook: take and keep `bytes` of memory besides the model's.
    Ballast {
        bytes: u64,
    },
}

/// One answer of the runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The call answered.
    pub id: u64,
    pub msg: Msg,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    Hello {
        version: u32,
        pid: u32,
    },
    Loaded {
        n_ctx_per_seq: u32,
        /// The placement it loaded (for the gateway's load span).
        placement: crate::telemetry::pool::Placement,
    },
    /// The generation is queued: events follow.
    Accepted,
    Event(BackendEvent),
    Embedded(EmbedOutput),
    Count(usize),
    Status(BackendStatus),
    Memory(TierBytes),
    Streaming(Option<StreamCounters>),
    KvCache(Option<KvCache>),
    Ok,
    Failed(BackendError),
}

impl Msg {
    /// Whether nothing more comes for the call after this.
    pub fn is_last(&self) -> bool {
        match self {
            Msg::Accepted => false,
            Msg::Event(event) => matches!(event, BackendEvent::Done(_) | BackendEvent::Error(_)),
            _ => true,
        }
    }
}

/// What a runner loads: one model file in the placement the gateway chose,
/// with the server's engine settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSpec {
    /// The name it is served under (for the log).
    pub name: String,
    pub path: std::path::PathBuf,
    pub engine: EngineSpec,
    /// Under a global budget: the model's placements and the residency to
    /// load it at. `None`: the planner's placement for the server's budgets.
    pub budgeted: Option<BudgetedSpec>,
}

/// The server's engine settings and the model's own (its policy), as
/// [`crate::pool::registry::EngineSettings`] and `ModelPolicy` hold them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSpec {
    pub n_ctx_per_seq: u32,
    pub n_parallel: u32,
    pub n_batch: u32,
    pub n_threads: u32,
    pub queue_limit: usize,
    pub gpu_budget_bytes: Option<u64>,
    pub ram_budget_bytes: Option<u64>,
    pub profile: HardwareProfile,
    pub model_n_ctx_per_seq: Option<u32>,
    pub model_n_parallel: Option<u32>,
    #[serde(default)]
    pub prompt_cache: llama_tiered::engine::PromptCacheConfig,
}

/// A model's placements under the budget
/// ([`crate::pool::residency::BudgetedModel`] less what the runner reads from
/// the file itself), and the residency to load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetedSpec {
    pub level: Residency,
    pub streaming_contexts: u64,
    #[serde(default)]
    pub streaming_gpu: Option<crate::pool::hybrid::StreamingGpu>,
    pub full: Option<FullSpec>,
    /// [`crate::pool::residency::BudgetedModel::cache_limit`].
    #[serde(default)]
    pub cache_limit: Option<u64>,
    pub settings: PlanSettings,
    /// What the gateway charges for the runner itself (an idle runner's
    /// memory): with it the runner knows its whole charge at each level.
    #[serde(default)]
    pub overhead: hypura_scheduler::budget::Footprint,
    /// [`crate::pool::residency::BudgetedModel::prompt_cache_bytes`].
    #[serde(default)]
    pub prompt_cache_bytes: u64,
    #[serde(default)]
    pub prompt_pass: u32,
}

/// [`crate::pool::residency::FullPlacement`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FullSpec {
    pub gpu: GpuShare,
    pub weights: Footprint,
    pub contexts: Footprint,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::backend::BackendError;

    /// A request's tool calls 123 levels deep passed the gateway's parse
    /// (serde_json's 128) and, wrapped 4 levels deeper in a frame, failed
    /// the runner's: the runner stopped, ending every request of its model.
    #[test]
    fn a_frame_is_read_at_any_depth_its_writer_made() {
        let depth = 200;
        let nested = format!("{}0{}", "[".repeat(depth), "]".repeat(depth));
        assert!(serde_json::from_str::<serde_json::Value>(&nested).is_err());
        let value: serde_json::Value = parse_frame(&nested).unwrap();
        assert_eq!(serde_json::to_string(&value).unwrap(), nested);
        assert!(parse_frame::<serde_json::Value>(&format!("{nested} x")).is_err());
    }

    #[test]
    fn frames_are_single_lines_of_json_with_the_call_id() {
        let call = Call {
            id: 7,
            op: Op::CountTokens {
                text: "two\nlines".into(),
            },
        };
        let line = serde_json::to_string(&call).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(
            line,
            r#"{"id":7,"op":{"count_tokens":{"text":"two\nlines"}}}"#
        );
        assert_eq!(serde_json::from_str::<Call>(&line).unwrap(), call);
        let reply = Reply {
            id: 7,
            msg: Msg::Event(BackendEvent::Text("hi".into())),
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"id":7,"msg":{"event":{"text":"hi"}}}"#
        );
    }

    #[test]
    fn logprobs_cross_as_one_event_before_their_text() {
        use crate::core::backend::{Logprob, TokenLogprobs};
        let hi = |logprob| Logprob {
            token: 42,
            bytes: b"hi".to_vec(),
            logprob,
        };
        let event = BackendEvent::Logprobs(vec![TokenLogprobs {
            sampled: hi(-0.5),
            top: vec![hi(-0.5)],
        }]);
        let line = serde_json::to_string(&Msg::Event(event.clone())).unwrap();
        assert_eq!(
            line,
            r#"{"event":{"logprobs":[{"sampled":{"token":42,"bytes":[104,105],"logprob":-0.5},"top":[{"token":42,"bytes":[104,105],"logprob":-0.5}]}]}}"#
        );
        assert_eq!(
            serde_json::from_str::<Msg>(&line).unwrap(),
            Msg::Event(event)
        );
        assert!(!Msg::Event(BackendEvent::Logprobs(Vec::new())).is_last());
    }

    #[test]
    fn a_generation_ends_at_done_or_error_and_other_calls_at_their_reply() {
        assert!(!Msg::Accepted.is_last());
        assert!(!Msg::Event(BackendEvent::FirstToken).is_last());
        assert!(Msg::Event(BackendEvent::Error(BackendError::Failed("x".into()))).is_last());
        assert!(Msg::Failed(BackendError::Busy("x".into())).is_last());
        assert!(Msg::Count(3).is_last());
    }
}
