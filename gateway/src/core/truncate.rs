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
//! Counting renders the template and tokenizes ([`ModelBackend::prompt_tokens`]);
//! the first message to keep is found by bisection, so a long history costs
//! a few counts, not one per message.
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
    /// Rendering or counting failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl From<FitError> for ApiError {
    fn from(e: FitError) -> Self {
        match e {
            FitError::TooLong(e) => e.into(),
            FitError::Backend(e) => e.into(),
        }
    }
}

/// Tokens of the window kept free for the reply when a conversation is cut:
/// its `max_tokens`, at most a quarter of the window.
pub fn reply_room(window: u32, max_tokens: Option<u32>) -> u32 {
    max_tokens.unwrap_or(window).min(window / 4)
}

/// Fits `request` into `window` tokens: when its prompt leaves no room for
/// the reply and `truncate` is on, drops the oldest messages that are not
/// system messages. Returns how many messages were dropped.
pub fn fit(
    backend: &dyn ModelBackend,
    request: &mut BackendRequest,
    window: u32,
    truncate: bool,
) -> Result<usize, FitError> {
    let tokens = backend.prompt_tokens(request)?;
    let limit = window.saturating_sub(reply_room(window, request.params.max_tokens)) as usize;
    let last_turn = match &request.prompt {
        Prompt::Messages { messages, .. } if truncate && tokens > limit => last_turn(messages),
        _ => 0,
    };
    if last_turn == 0 {
        check(tokens, window)?;
        return Ok(0);
    }
    // The smallest start in 1..=last_turn whose prompt fits (fewer messages,
    // fewer tokens); the last turn is kept whatever its length.
    let (mut low, mut high) = (1, last_turn);
    while low < high {
        let middle = (low + high) / 2;
        if backend.prompt_tokens(&from(request, middle))? <= limit {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let fitted = from(request, high);
    let tokens = backend.prompt_tokens(&fitted)?;
    check(tokens, window)?;
    let dropped = dropped(messages_of(request), high);
    *request = fitted;
    Ok(dropped)
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

    use super::*;
    use crate::core::backend::{
        BackendStatus, EmbedOutput, EventStream, MemoryUse, ModelFacts, Residency,
    };
    use crate::core::request::{EmbedBatch, GenerationParams};

    /// Counts each message as its words plus 4, as the trait's estimate does.
    struct Words;

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
