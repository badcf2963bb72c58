//! Fitting a request into its context window.
//!
//! A conversation too long for the window loses its oldest messages, as
//! Ollama's `chatPrompt` (`server/prompt.go`) does: system messages are
//! always kept, and so is the last turn (from the last `user` message on:
//! the question, and the tool calls, tool results or assistant prefill
//! after it). Unlike Ollama, whose runner shifts the context while it
//! generates, the engine stops when the window is full, so the kept prompt
//! leaves room for the reply: [`reply_room`] tokens. With `truncate: false`,
//! or when even the last turn does not fit, the request is refused with
//! [`ValidationError::PromptTooLong`] (OpenAI's `context_length_exceeded`).
//!
//! Counting renders the template and tokenizes ([`ModelBackend::prompt_tokens`]),
//! so the work is kept proportional to the window, whatever the request:
//! - every message takes at least one token of the rendered prompt (each
//!   template marks a message's role), so no more than the window's tokens
//!   in messages are ever rendered: a conversation with more is cut to that
//!   many before anything is counted (with truncation), or refused at once
//!   ([`FitError::TooManyMessages`]);
//! - the conversation is counted once; when it is too long, the first
//!   message to keep is guessed from the messages' bytes (tokens in
//!   proportion) and the guess checked, by counting only what would be
//!   kept, from there outward in doubling steps, then by bisection between
//!   the last two: a few counts of about the window each.
use hypura_chat::ChatMessage;

use super::backend::{BackendError, ModelBackend};
use super::error::ApiError;
use super::request::{BackendRequest, Prompt};
use super::validation::ValidationError;

/// Why a request could not be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    TooLong(#[from] ValidationError),
    /// More messages than tokens in the window, truncation off: it can never fit.
    #[error(
        "the conversation has {messages} messages but the context window holds {n_ctx} tokens, \
         and each message takes at least one: send at most {n_ctx} messages, or turn truncation \
         on to drop the oldest"
    )]
    TooManyMessages { messages: usize, n_ctx: u32 },
    /// More system messages and messages of the last turn (what truncation
    /// keeps) than tokens in the window.
    #[error(
        "the conversation's system messages and last turn are {kept} messages but the context \
         window holds {n_ctx} tokens, and each message takes at least one: send at most {n_ctx}"
    )]
    TooManyKept { kept: usize, n_ctx: u32 },
    /// Rendering or counting failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<FitError> for ApiError {
    fn from(e: FitError) -> Self {
        match e {
            FitError::TooLong(e) => e.into(),
            e @ (FitError::TooManyMessages { .. } | FitError::TooManyKept { .. }) => {
                ApiError::BadRequest(e.to_string())
            }
            FitError::Backend(e) => e.into(),
        }
    }
}

/// Tokens of the window kept free for the reply when a conversation is cut:
/// its `max_tokens`, at most a quarter of the window.
pub fn reply_room(window: u32, max_tokens: Option<u32>) -> u32 {
    max_tokens.unwrap_or(window).min(window / 4)
}

/// Bytes a message's markers (its role, the template's separators) are
/// guessed to add to its content when guessing where to cut.
const MARKER_BYTES: usize = 16;

/// Fits `request` into `window` tokens: when its prompt leaves no room for
/// the reply and `truncate` is on, drops the oldest messages that are not
/// system messages. Returns how many messages were dropped.
pub fn fit(
    backend: &dyn ModelBackend,
    request: &mut BackendRequest,
    window: u32,
    truncate: bool,
) -> Result<usize, FitError> {
    let limit = window.saturating_sub(reply_room(window, request.params.max_tokens)) as usize;
    let cut = cap_messages(request, window, limit, truncate)?;
    let tokens = backend.prompt_tokens(request)?;
    let last_turn = match &request.prompt {
        Prompt::Messages { messages, .. } if truncate && tokens > limit => last_turn(messages),
        _ => 0,
    };
    if last_turn == 0 {
        check(tokens, window)?;
        return Ok(cut);
    }
    let start = first_fitting(backend, request, tokens, limit, last_turn)?;
    let fitted = from(request, start);
    let tokens = backend.prompt_tokens(&fitted)?;
    check(tokens, window)?;
    let dropped = cut + dropped(messages_of(request), start);
    *request = fitted;
    Ok(dropped)
}

/// Cuts a conversation of more messages than could fit `limit` tokens to
/// as many (the oldest go, never a system message or one of the last turn)
/// when `truncate` is on; refuses one that cannot fit `window` whatever is
/// dropped. Returns how many messages were dropped.
fn cap_messages(
    request: &mut BackendRequest,
    window: u32,
    limit: usize,
    truncate: bool,
) -> Result<usize, FitError> {
    let messages = messages_of(request);
    if messages.len() <= limit {
        return Ok(0);
    }
    if !truncate {
        if messages.len() > window as usize {
            return Err(FitError::TooManyMessages {
                messages: messages.len(),
                n_ctx: window,
            });
        }
        return Ok(0);
    }
    let last = last_turn(messages);
    let systems_before = messages[..last]
        .iter()
        .filter(|m| m.role == "system")
        .count();
    let kept_at_least = systems_before + (messages.len() - last);
    if kept_at_least > window as usize {
        return Err(FitError::TooManyKept {
            kept: kept_at_least,
            n_ctx: window,
        });
    }
    // The latest messages before the last turn, as many as leave room.
    let mut room = limit.saturating_sub(kept_at_least);
    let mut start = last;
    while start > 0 && room > 0 {
        start -= 1;
        if messages[start].role != "system" {
            room -= 1;
        }
    }
    if start == 0 {
        return Ok(0);
    }
    let dropped = dropped(messages, start);
    *request = from(request, start);
    Ok(dropped)
}

/// The smallest start in 1..=`last_turn` whose prompt fits `limit` (fewer
/// messages, fewer tokens), `request`'s whole prompt being `tokens`; the
/// last turn when none does (it is kept whatever its length).
fn first_fitting(
    backend: &dyn ModelBackend,
    request: &BackendRequest,
    tokens: usize,
    limit: usize,
    last_turn: usize,
) -> Result<usize, BackendError> {
    let fits = |start: usize| -> Result<bool, BackendError> {
        Ok(start >= last_turn || backend.prompt_tokens(&from(request, start))? <= limit)
    };
    let guess = guess_start(messages_of(request), tokens - limit, tokens, last_turn);
    // Bracket the answer in `low..=high` (`high` fits), stepping out from
    // the guess in doubling steps.
    let (mut low, mut high);
    if fits(guess)? {
        high = guess;
        let mut step = 1;
        loop {
            if high == 1 {
                low = 1;
                break;
            }
            let probe = high.saturating_sub(step).max(1);
            if !fits(probe)? {
                low = probe + 1;
                break;
            }
            high = probe;
            step *= 2;
        }
    } else {
        low = guess + 1;
        let mut step = 1;
        loop {
            let probe = (guess + step).min(last_turn);
            if fits(probe)? {
                high = probe;
                break;
            }
            low = probe + 1;
            step *= 2;
        }
    }
    while low < high {
        let middle = (low + high) / 2;
        if fits(middle)? {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Ok(high)
}

/// Where to cut to drop `excess` of the conversation's `tokens`, guessing
/// each message's share of them from its bytes.
fn guess_start(messages: &[ChatMessage], excess: usize, tokens: usize, last_turn: usize) -> usize {
    let weight = |m: &ChatMessage| (m.content.len() + MARKER_BYTES) as f64;
    let per_weight = tokens as f64 / messages.iter().map(weight).sum::<f64>();
    let mut dropped = 0.0;
    for (i, message) in messages[..last_turn].iter().enumerate() {
        if message.role != "system" {
            dropped += weight(message) * per_weight;
        }
        if dropped >= excess as f64 {
            return i + 1;
        }
    }
    last_turn
}

/// The prompt must leave at least one token for the reply.
fn check(prompt_tokens: usize, window: u32) -> Result<(), ValidationError> {
    if prompt_tokens >= window as usize {
        return Err(ValidationError::PromptTooLong {
            prompt_tokens,
            n_ctx: window,
        });
    }
    Ok(())
}

fn messages_of(request: &BackendRequest) -> &[ChatMessage] {
    match &request.prompt {
        Prompt::Messages { messages, .. } => messages,
        _ => &[],
    }
}

/// Where the last turn starts: the last `user` message (the last message
/// when there is none).
fn last_turn(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .rposition(|m| m.role == "user")
        .unwrap_or(messages.len().saturating_sub(1))
}

/// Messages before `start` that are dropped (all but the system ones).
fn dropped(messages: &[ChatMessage], start: usize) -> usize {
    messages[..start]
        .iter()
        .filter(|m| m.role != "system")
        .count()
}

/// `request` with the messages from `start` on, after the system messages before it.
fn from(request: &BackendRequest, start: usize) -> BackendRequest {
    let mut kept = request.clone();
    if let Prompt::Messages { messages, .. } = &mut kept.prompt {
        let (before, after) = messages.split_at(start);
        *messages = before
            .iter()
            .filter(|m| m.role == "system")
            .chain(after)
            .cloned()
            .collect();
    }
    kept
}

#[cfg(test)]
mod tests {
    use futures_util::future::BoxFuture;

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::backend::{
        BackendStatus, EmbedOutput, EventStream, MemoryUse, ModelFacts, Residency,
    };
    use crate::request::{EmbedBatch, GenerationParams};

    /// Counts each message as its words plus 4, as the trait's estimate does.
    struct Words;

    /// [`Words`], counting the counts and the most messages one rendered.
    #[derive(Default)]
    struct Counted {
        counts: AtomicUsize,
        most_messages: AtomicUsize,
    }

    impl ModelBackend for Counted {
        fn generate(&self, _: BackendRequest) -> BoxFuture<'_, Result<EventStream, BackendError>> {
            unreachable!()
        }
        fn embed(&self, _: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
            unreachable!()
        }
        fn count_tokens(&self, text: &str) -> Result<usize, BackendError> {
            Words.count_tokens(text)
        }
        fn prompt_tokens(&self, request: &BackendRequest) -> Result<usize, BackendError> {
            self.counts.fetch_add(1, Ordering::Relaxed);
            self.most_messages
                .fetch_max(messages_of(request).len(), Ordering::Relaxed);
            Words.prompt_tokens(request)
        }
        fn status(&self) -> BackendStatus {
            unreachable!()
        }
        fn facts(&self) -> ModelFacts {
            unreachable!()
        }
        fn memory(&self) -> MemoryUse {
            unreachable!()
        }
        fn set_residency(&self, _: Residency) -> Result<(), BackendError> {
            unreachable!()
        }
    }

    impl ModelBackend for Words {
        fn generate(&self, _: BackendRequest) -> BoxFuture<'_, Result<EventStream, BackendError>> {
            unreachable!()
        }
        fn embed(&self, _: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
            unreachable!()
        }
        fn count_tokens(&self, text: &str) -> Result<usize, BackendError> {
            Ok(text.split_whitespace().count())
        }
        fn status(&self) -> BackendStatus {
            unreachable!()
        }
        fn facts(&self) -> ModelFacts {
            unreachable!()
        }
        fn memory(&self) -> MemoryUse {
            unreachable!()
        }
        fn set_residency(&self, _: Residency) -> Result<(), BackendError> {
            unreachable!()
        }
    }

    /// A message of `words` words (so `words + 4` tokens).
    fn message(role: &str, words: usize) -> ChatMessage {
        ChatMessage::new(role, vec!["w"; words].join(" "))
    }

    fn request(messages: Vec<ChatMessage>, max_tokens: Option<u32>) -> BackendRequest {
        BackendRequest {
            prompt: Prompt::messages(messages),
            context: Vec::new(),
            params: GenerationParams {
                max_tokens,
                ..GenerationParams::default()
            },
        }
    }

    fn roles(request: &BackendRequest) -> Vec<(String, usize)> {
        messages_of(request)
            .iter()
            .map(|m| (m.role.clone(), m.content.split_whitespace().count()))
            .collect()
    }

    #[test]
    fn a_fitting_conversation_is_left_alone() {
        let mut r = request(vec![message("user", 10)], Some(10));
        assert_eq!(fit(&Words, &mut r, 100, true).unwrap(), 0);
        assert_eq!(roles(&r), [("user".into(), 10)]);
    }

    #[test]
    fn the_oldest_messages_go_and_system_messages_and_the_last_turn_stay() {
        // 24 + 4 × 20 + 14 + 9 = 127 tokens; 100 - 10 for the reply leaves 90.
        let messages = vec![
            message("system", 20),
            message("user", 16),
            message("assistant", 16),
            message("user", 16),
            message("assistant", 16),
            message("user", 10),
            message("assistant", 5),
        ];
        let mut r = request(messages, Some(10));
        assert_eq!(fit(&Words, &mut r, 100, true).unwrap(), 2);
        assert_eq!(
            roles(&r),
            [
                ("system".into(), 20),
                ("user".into(), 16),
                ("assistant".into(), 16),
                ("user".into(), 10),
                ("assistant".into(), 5)
            ]
        );
        assert!(Words.prompt_tokens(&r).unwrap() <= 90);
    }

    #[test]
    fn the_reply_keeps_at_most_a_quarter_of_the_window() {
        assert_eq!(reply_room(4096, None), 1024);
        assert_eq!(reply_room(4096, Some(100)), 100);
        assert_eq!(reply_room(4096, Some(5000)), 1024);
    }

    #[test]
    fn without_truncation_or_room_the_request_is_too_long() {
        let messages = vec![message("user", 60), message("user", 60)];
        let mut r = request(messages.clone(), None);
        let e = fit(&Words, &mut r, 100, false).unwrap_err();
        assert!(
            matches!(
                e,
                FitError::TooLong(ValidationError::PromptTooLong {
                    prompt_tokens: 128,
                    n_ctx: 100
                })
            ),
            "{e:?}"
        );
        // Truncated, the last turn alone (64 tokens) fits.
        let mut r = request(messages, None);
        assert_eq!(fit(&Words, &mut r, 100, true).unwrap(), 1);
        // Too long alone, it is refused.
        let mut r = request(vec![message("user", 5), message("user", 200)], None);
        assert!(fit(&Words, &mut r, 100, true).is_err());
    }

    /// The start a linear scan finds: the first whose prompt fits.
    fn first_fitting_by_scan(r: &BackendRequest, limit: usize) -> usize {
        let last = last_turn(messages_of(r));
        (1..last)
            .find(|&s| Words.prompt_tokens(&from(r, s)).unwrap() <= limit)
            .unwrap_or(last)
    }

    #[test]
    fn the_cut_is_where_a_scan_finds_it_in_a_few_counts() {
        // Conversations of uneven messages (the guess from bytes is off),
        // system messages among them.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for case in 0..200 {
            let n = 2 + next(300);
            let messages: Vec<ChatMessage> = (0..n)
                .map(|i| {
                    let role = match next(10) {
                        0 if i > 0 => "system",
                        r if r % 2 == 0 => "user",
                        _ => "assistant",
                    };
                    let most = if next(4) == 0 { 200 } else { 12 };
                    message(role, next(most))
                })
                .collect();
            let window = 64 + next(2000) as u32;
            let max_tokens = Some(next(100) as u32);
            let original = request(messages, max_tokens);
            let counted = Counted::default();
            let mut r = original.clone();
            let fitted = fit(&counted, &mut r, window, true);
            let limit = window as usize - reply_room(window, max_tokens) as usize;
            let total = Words.prompt_tokens(&original).unwrap();
            if total <= limit || messages_of(&original).len() > limit {
                continue;
            }
            let start = first_fitting_by_scan(&original, limit);
            let expected = from(&original, start);
            match fitted {
                Ok(dropped) => {
                    assert_eq!(roles(&r), roles(&expected), "case {case}");
                    assert_eq!(dropped, super::dropped(messages_of(&original), start));
                }
                Err(_) => assert!(
                    Words.prompt_tokens(&expected).unwrap() >= window as usize,
                    "case {case}"
                ),
            }
            let counts = counted.counts.load(Ordering::Relaxed);
            assert!(
                counts <= 24,
                "case {case}: {counts} counts for {n} messages"
            );
        }
    }

    #[test]
    fn a_hundred_thousand_messages_are_cut_to_the_window_before_counting() {
        let mut messages = vec![message("system", 3)];
        messages.extend((1..100_000).map(|i| message(["user", "assistant"][i % 2], 1)));
        messages.push(message("user", 2));
        let original = request(messages, Some(100));
        let counted = Counted::default();
        let mut r = original.clone();
        let dropped = fit(&counted, &mut r, 1000, true).unwrap();
        // 900 tokens for the prompt: the system message (7), the last turn
        // (6) and 177 of 5 tokens.
        assert_eq!(dropped, 100_000 - 1 - 177);
        let kept = roles(&r);
        assert_eq!(kept.len(), 1 + 177 + 1);
        assert_eq!(kept[0], ("system".into(), 3));
        assert_eq!(kept[kept.len() - 1], ("user".into(), 2));
        assert_eq!(Words.prompt_tokens(&r).unwrap(), 7 + 177 * 5 + 6);
        assert_eq!(r, from(&original, 100_001 - 178));
        // No render saw more messages than the window holds tokens.
        assert!(counted.most_messages.load(Ordering::Relaxed) <= 1000);
        assert!(counted.counts.load(Ordering::Relaxed) <= 8);
    }

    #[test]
    fn more_messages_than_the_window_holds_is_refused_before_counting() {
        let messages: Vec<ChatMessage> = (0..1001).map(|_| message("user", 0)).collect();
        let counted = Counted::default();
        let mut r = request(messages, None);
        let e = fit(&counted, &mut r, 1000, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the conversation has 1001 messages but the context window holds 1000 tokens, and \
             each message takes at least one: send at most 1000 messages, or turn truncation on \
             to drop the oldest"
        );
        assert_eq!(counted.counts.load(Ordering::Relaxed), 0);
        // Truncation keeps the system messages and the last turn: 1001 here.
        let mut messages = vec![message("system", 1); 1000];
        messages.push(message("user", 1));
        let mut r = request(messages, None);
        let e = fit(&counted, &mut r, 1000, true).unwrap_err();
        assert!(
            matches!(
                e,
                FitError::TooManyKept {
                    kept: 1001,
                    n_ctx: 1000
                }
            ),
            "{e:?}"
        );
        assert_eq!(counted.counts.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn raw_prompts_are_only_checked() {
        let mut r = BackendRequest {
            prompt: Prompt::Text {
                text: "a b c".into(),
            },
            context: vec![1; 97],
            params: GenerationParams::default(),
        };
        assert!(fit(&Words, &mut r, 101, true).is_ok());
        assert!(fit(&Words, &mut r, 100, true).is_err());
    }
}
