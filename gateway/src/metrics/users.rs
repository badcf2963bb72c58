//! Usage per user (label `user`: a key's name in the keys file, `api-key`
//! for `--api-key`, `admin` for `--admin-key`, `anonymous` without a key;
//! so as many values as keys, never a client-chosen string) and the fair
//! queue in front of each model ([`crate::tenancy::fair`]).
use std::sync::OnceLock;

use prometheus::{CounterVec, IntCounterVec, IntGaugeVec};

use super::{counter, float_counter, gauge, metrics};
use crate::tenancy::keys::Priority;
use crate::tenancy::limits::Exceeded;

pub struct UserMetrics {
    pub requests: IntCounterVec,
    pub prompt_tokens: IntCounterVec,
    pub generation_tokens: IntCounterVec,
    pub cached_prompt_tokens: IntCounterVec,
    pub queue_seconds: CounterVec,
    pub rejected: IntCounterVec,
    pub fair_waiting: IntGaugeVec,
}

/// Why a user's request was refused before it ran.
pub const REJECTIONS: &[&str] = &["rpm", "tpm", "concurrent", "model"];

pub fn users() -> &'static UserMetrics {
    static USERS: OnceLock<UserMetrics> = OnceLock::new();
    USERS.get_or_init(|| {
        let r = &metrics().registry;
        let u = &["user"];
        UserMetrics {
            requests: counter(
                r,
                "hypura_user_requests_total",
                "Generation and embedding requests a user's key ran (past its limits).",
                u,
            ),
            prompt_tokens: counter(
                r,
                "hypura_user_prompt_tokens_total",
                "Prompt tokens of a user's finished generations.",
                u,
            ),
            generation_tokens: counter(
                r,
                "hypura_user_generation_tokens_total",
                "Tokens generated for a user (finished generations).",
                u,
            ),
            cached_prompt_tokens: counter(
                r,
                "hypura_user_cached_prompt_tokens_total",
                "Prompt tokens of a user's generations that a cache held (not evaluated again).",
                u,
            ),
            queue_seconds: float_counter(
                r,
                "hypura_user_queue_seconds_total",
                "Seconds a user's requests waited for a slot of their model.",
                u,
            ),
            rejected: counter(
                r,
                "hypura_user_rejected_total",
                "A user's requests refused by its key's limits: rpm, tpm, concurrent (429), model (403).",
                &["user", "reason"],
            ),
            fair_waiting: gauge(
                r,
                "hypura_fair_queue_requests",
                "Requests waiting at a model's fair queue for a slot, by priority (interactive, batch).",
                &["model", "priority"],
            ),
        }
    })
}

/// Makes a user's series exist at 0 (a key from the keys file, before its
/// first request).
pub fn known_user(user: &str) {
    let m = users();
    let u = [user];
    m.requests.with_label_values(&u);
    m.prompt_tokens.with_label_values(&u);
    m.generation_tokens.with_label_values(&u);
    m.cached_prompt_tokens.with_label_values(&u);
    m.queue_seconds.with_label_values(&u);
    for reason in REJECTIONS {
        m.rejected.with_label_values(&[user, reason]);
    }
}

/// A request of `user` let in, after `queued_seconds` at the fair queue.
pub fn request_started(user: &str, queued_seconds: f64) {
    let m = users();
    m.requests.with_label_values(&[user]).inc();
    m.queue_seconds
        .with_label_values(&[user])
        .inc_by(queued_seconds);
}

/// Tokens of a generation of `user` that finished.
pub fn tokens(user: &str, prompt: u64, generated: u64, cached: u64) {
    let m = users();
    let u = [user];
    m.prompt_tokens.with_label_values(&u).inc_by(prompt);
    m.generation_tokens.with_label_values(&u).inc_by(generated);
    m.cached_prompt_tokens.with_label_values(&u).inc_by(cached);
}

/// A request of `user` refused by a limit (`None`: a model it may not use).
pub fn rejected(user: &str, why: Option<Exceeded>) {
    let reason = why.map_or("model", Exceeded::as_str);
    users().rejected.with_label_values(&[user, reason]).inc();
}

/// Requests of `priority` waiting at `model`'s fair queue now.
pub fn fair_waiting(model: &str, priority: Priority, waiting: usize) {
    users()
        .fair_waiting
        .with_label_values(&[model, priority.as_str()])
        .set(waiting as i64);
}

/// Requests waiting at `model`'s fair queue now, both priorities.
pub fn fair_waiting_total(model: &str) -> usize {
    let m = users();
    [Priority::Interactive, Priority::Batch]
        .iter()
        .map(|p| {
            m.fair_waiting
                .with_label_values(&[model, p.as_str()])
                .get()
                .max(0) as usize
        })
        .sum()
}
