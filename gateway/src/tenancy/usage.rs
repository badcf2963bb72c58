//! Usage per user: the request a task serves carries its user
//! ([`CURRENT`], set by [`super::http`] around the handler and each poll of
//! the response body), so the end of a generation ([`generation_ended`],
//! called by [`crate::metrics::generation_ended`]) is counted for it, in
//! `/metrics` and against its key's tokens per minute, and a generation
//! that starts is capped at its key's context ([`context_cap`]).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::limits::Limiter;
use crate::core::infer::GenerationRecord;
use crate::metrics::users::{users, REJECTIONS};

/// Whose request a task serves.
pub struct RequestUser {
    /// The label of its key.
    pub user: Arc<str>,
    /// Tokens its generations used (the fair queue charges them).
    pub tokens: Arc<AtomicU64>,
    pub limiter: Arc<Limiter>,
}

tokio::task_local! {
    /// The user of the request being served.
    pub static CURRENT: Arc<RequestUser>;
}

/// Counts a generation's tokens for the user of the request being served
/// (none outside a request, e.g. in unit tests).
pub fn generation_ended(record: &GenerationRecord<'_>) {
    let Some(finished) = record.finished else {
        return;
    };
    let _ = CURRENT.try_with(|current| {
        let prompt = finished.prompt_tokens as u64;
        let generated = finished.generated_tokens as u64;
        let cached = finished
            .prompt_tokens
            .saturating_sub(finished.prompt_eval_tokens) as u64;
        crate::metrics::users::tokens(&current.user, prompt, generated, cached);
        current
            .tokens
            .fetch_add(prompt + generated, Ordering::Relaxed);
        current
            .limiter
            .used(&current.user, prompt + generated, Instant::now());
    });
}

/// The context cap of the request being served: its key's `max_context`
/// (none outside a request, or for a key without one). Core asks it when a
/// generation starts ([`crate::core::observer::Observer::context_cap`]), so
/// the cap holds on every route: the OpenAI and Anthropic ones have no
/// context field of their own to cap.
pub fn context_cap() -> Option<u32> {
    CURRENT
        .try_with(|current| current.limiter.max_context(&current.user))
        .ok()
        .flatten()
}

/// One user's usage since the server started (`GET /api/usage`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserUsage {
    pub user: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub queue_seconds: f64,
    /// Requests refused, by reason (rpm, tpm, concurrent, model).
    pub rejected: std::collections::BTreeMap<String, u64>,
    /// Requests of this user holding a slot and waiting now, all models.
    pub running: usize,
    pub waiting: usize,
}

/// The usage of `names` (every user seen, from the counters).
pub fn usage_of(names: &[String]) -> Vec<UserUsage> {
    let m = users();
    names
        .iter()
        .map(|name| {
            let u = [name.as_str()];
            UserUsage {
                user: name.clone(),
                requests: m.requests.with_label_values(&u).get(),
                prompt_tokens: m.prompt_tokens.with_label_values(&u).get(),
                generation_tokens: m.generation_tokens.with_label_values(&u).get(),
                cached_prompt_tokens: m.cached_prompt_tokens.with_label_values(&u).get(),
                queue_seconds: m.queue_seconds.with_label_values(&u).get(),
                rejected: REJECTIONS
                    .iter()
                    .map(|r| {
                        (
                            r.to_string(),
                            m.rejected.with_label_values(&[name.as_str(), r]).get(),
                        )
                    })
                    .collect(),
                running: 0,
                waiting: 0,
            }
        })
        .collect()
}
