//! The decode loop: prompt → tokens → text, with llama-server's semantics for
//! stop strings, UTF-8 split across tokens, end-of-generation and cancellation.
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::llama::{Batch, Context, Model, Sampler, SamplingParams};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    /// Most tokens to generate (`None` = until end of generation or a full context).
    pub max_tokens: Option<u32>,
    /// Generation ends before the first occurrence of any of these strings,
    /// which is not returned (matched on text, so also across token boundaries).
    pub stop: Vec<String>,
    /// The batch engine may start from a cached prefix of the prompt and
    /// keeps this conversation's KV for a later turn (llama-server's
    /// `cache_prompt`, on by default). Off: the prompt is read whole and its
    /// KV forgotten at the end.
    pub cache_prompt: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            sampling: SamplingParams::default(),
            max_tokens: None,
            stop: Vec::new(),
            cache_prompt: true,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// Wall-clock timings of one generation, measured around llama.cpp calls.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Timings {
    /// Prompt tokens evaluated (the prompt less its cached prefix).
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prompt cache, not evaluated.
    pub cached_prompt_tokens: usize,
    pub prompt_eval_seconds: f64,
    pub generated_tokens: usize,
    pub eval_seconds: f64,
}

impl Timings {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_eval_seconds)
    }
    /// Decode speed over the tokens after the first (the first is sampled from the prompt's logits).
    pub fn eval_tokens_per_second(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.eval_seconds)
    }
}

fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// The result of [`generate`].
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub text: String,
    /// Every sampled token, including an end-of-generation token if one ended it.
    pub tokens: Vec<i32>,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    /// With [`SamplingParams::top_logprobs`]: one entry per token whose text
    /// was released, in order (an end-of-generation token, and the tokens of a
    /// stop string, have none).
    pub logprobs: Vec<TokenLogprobs>,
}

/// A token and its log-probability (natural log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logprob {
    pub token: i32,
    /// Its text: the sampled token's as it went into the reply; an
    /// alternative's with special tokens written out.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A sampled token's log-probability and the most likely tokens at its
/// position ([`Sampler::log_probs`](crate::llama::Sampler::log_probs) says
/// which distribution).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub sampled: Logprob,
    /// [`SamplingParams::top_logprobs`] tokens, most likely first.
    pub top: Vec<Logprob>,
}

/// Decodes `prompt` into sequence `seq` of `ctx` (whose KV cache for `seq`
/// must be empty) and samples until end of generation, a stop string,
/// `max_tokens`, a full context, or `on_text` returning `false`.
/// `on_text` receives the text as it becomes final: whole UTF-8 characters,
/// never a prefix of a stop string that may still complete.
pub fn generate(
    ctx: &mut Context,
    seq: i32,
    prompt: &[i32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Completion, EngineError> {
    let n_ctx = ctx.n_ctx();
    check_prompt(prompt, n_ctx)?;
    let model = std::sync::Arc::clone(ctx.model());
    let mut sequence = Sequence::new(params, prompt, &model, n_ctx)?;
    ctx.set_device_greedy(seq, sequence.wants_device_greedy());

    let mut timings = Timings {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let started = Instant::now();
    let mut last_row = decode_prompt(ctx, seq, prompt)?;
    timings.prompt_eval_seconds = started.elapsed().as_secs_f64();

    let mut batch = Batch::new(1);
    let mut eval = Duration::ZERO;
    let on_piece = &mut |text: &str, _: Vec<TokenLogprobs>| text.is_empty() || on_text(text);
    let finish = loop {
        let token = match sequence.advance(ctx, last_row, on_piece) {
            Next::Decode(token) => token,
            Next::Finish(reason) => break reason,
            Next::Fail(e) => return Err(e),
        };
        let step = Instant::now();
        batch.clear();
        last_row = batch.push(token, sequence.next_pos(), seq, true)?;
        ctx.decode(&batch)?;
        eval += step.elapsed();
    };
    timings.eval_seconds = eval.as_secs_f64();
    Ok(sequence.complete(finish, timings, on_piece))
}

/// Rejects prompts that cannot be generated from in `n_ctx` tokens.
pub(crate) fn check_prompt(prompt: &[i32], n_ctx: u32) -> Result<(), EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::InvalidArgument("the prompt is empty".into()));
    }
    if prompt.len() >= n_ctx as usize {
        return Err(EngineError::PromptTooLong {
            prompt_tokens: prompt.len(),
            n_ctx,
        });
    }
    Ok(())
}

/// What a [`Sequence`] does after a sampling step.
pub(crate) enum Next {
    /// Decode this token at [`Sequence::next_pos`], then call `advance` on its logits.
    Decode(i32),
    Finish(FinishReason),
    /// Sampling failed (a grammar that allows no token): the request fails.
    Fail(EngineError),
}

/// One sequence's generation after its prompt: samples, turns tokens into
/// text and decides when it ends. Shared by [`generate`] and the batch engine
/// so that both end a generation by the same rules.
pub(crate) struct Sequence {
    sampler: Sampler,
    /// Special tokens whose text is kept ([`SamplingParams::preserved_tokens`]).
    preserved: Vec<i32>,
    text: TextStream,
    tokens: Vec<i32>,
    n_prompt: usize,
    max_tokens: usize,
    /// Context tokens this sequence may occupy.
    n_ctx: u32,
    /// [`SamplingParams::top_logprobs`].
    top_logprobs: Option<usize>,
    /// Bytes of text the sampled tokens made so far.
    n_bytes: usize,
    /// Log-probabilities of tokens whose text is not yet released, with the
    /// offset of their first byte in the reply.
    held_logprobs: Vec<(usize, TokenLogprobs)>,
    /// Log-probabilities of the tokens whose text was released.
    logprobs: Vec<TokenLogprobs>,
}

/// Receives the text now final, and the log-probabilities of the tokens
/// whose first byte it releases (when they were asked); returns false to
/// cancel. Either may be empty, not both.
pub(crate) type OnPiece<'a> = dyn FnMut(&str, Vec<TokenLogprobs>) -> bool + 'a;

impl Sequence {
    /// Builds the sampler (rejecting bad sampling options or a grammar that
    /// does not parse) and feeds it the prompt (for penalties).
    pub(crate) fn new(
        params: &GenerateParams,
        prompt: &[i32],
        model: &Model,
        n_ctx: u32,
    ) -> Result<Sequence, EngineError> {
        let mut sampler = Sampler::new(&params.sampling, model, n_ctx)?;
        for &t in prompt {
            sampler.accept(t);
        }
        Ok(Sequence {
            sampler,
            preserved: preserved_tokens(model, &params.sampling.preserved_tokens),
            text: TextStream::new(&params.stop),
            tokens: Vec::new(),
            n_prompt: prompt.len(),
            max_tokens: params.max_tokens.map_or(usize::MAX, |m| m as usize),
            n_ctx,
            top_logprobs: params.sampling.top_logprobs.map(|n| n as usize),
            n_bytes: 0,
            held_logprobs: Vec::new(),
            logprobs: Vec::new(),
        })
    }

    /// Samples a token from batch row `row` of the last decode, passes the
    /// text now final (and its tokens' log-probabilities) to `on_piece`, and
    /// says whether to go on.
    pub(crate) fn advance(&mut self, ctx: &mut Context, row: i32, on_piece: &mut OnPiece) -> Next {
        if self.tokens.len() >= self.max_tokens {
            return Next::Finish(FinishReason::Length);
        }
        let sampled = match self.top_logprobs {
            None => self.sampler.sample(ctx, row).map(|t| (t, None)),
            Some(n) => self
                .sampler
                .sample_with_log_probs(ctx, row, n)
                .map(|(t, logprob, top)| (t, Some((logprob, top)))),
        };
        let (token, logprobs) = match sampled {
            Ok(sampled) => sampled,
            Err(e) => return Next::Fail(e),
        };
        self.tokens.push(token);
        let model = ctx.model();
        if model.is_eog(token) {
            return Next::Finish(FinishReason::Stop);
        }
        let special = self.preserved.contains(&token);
        let bytes = model.token_to_bytes(token, special);
        if let Some((logprob, top)) = logprobs {
            let top = top
                .into_iter()
                .map(|(id, logprob)| Logprob {
                    token: id,
                    bytes: model.token_to_bytes(id, true),
                    logprob,
                })
                .collect();
            let sampled = Logprob {
                token,
                bytes: bytes.clone(),
                logprob,
            };
            let entry = TokenLogprobs { sampled, top };
            self.held_logprobs.push((self.n_bytes, entry));
        }
        self.n_bytes += bytes.len();
        let (emitted, stopped) = self.text.push(&bytes);
        let released = self.release_logprobs(false);
        if stopped {
            // What is still held belongs to the stop string.
            self.held_logprobs.clear();
        }
        let quiet = emitted.is_empty() && released.is_empty();
        if !quiet && !on_piece(&emitted, released) {
            return Next::Finish(FinishReason::Cancelled);
        }
        if stopped {
            return Next::Finish(FinishReason::Stop);
        }
        if self.tokens.len() >= self.max_tokens {
            return Next::Finish(FinishReason::Length);
        }
        if self.next_pos() as u32 + 1 >= self.n_ctx {
            return Next::Finish(FinishReason::Length);
        }
        Next::Decode(token)
    }

    /// The held log-probabilities of the tokens whose first byte the text
    /// released so far holds, or (`all`, at the end) of every token held.
    /// (Offsets count the tokens' bytes: exact unless invalid UTF-8 was
    /// replaced, which moves a token to a neighbouring piece.)
    fn release_logprobs(&mut self, all: bool) -> Vec<TokenLogprobs> {
        let released = if all {
            usize::MAX
        } else {
            self.text.released_bytes()
        };
        let n = self
            .held_logprobs
            .iter()
            .take_while(|(start, _)| *start < released)
            .count();
        let out: Vec<TokenLogprobs> = self.held_logprobs.drain(..n).map(|(_, l)| l).collect();
        self.logprobs.extend(out.iter().cloned());
        out
    }

    /// Whether llama.cpp can choose this sequence's tokens inside the decode
    /// graph ([`Context::set_device_greedy`]): plain greedy, and no
    /// log-probabilities asked (they need the logits on the host).
    pub(crate) fn wants_device_greedy(&self) -> bool {
        self.sampler.is_plain_greedy() && self.top_logprobs.is_none()
    }

    /// Moves the sequence's sampler onto `model`, another load of the same
    /// file (a switch of placement between decode steps).
    pub(crate) fn rebind(&mut self, model: &Model) -> Result<(), EngineError> {
        self.sampler.rebind(model)
    }

    /// Position of the last sampled token (where [`Next::Decode`] puts it).
    pub(crate) fn next_pos(&self) -> i32 {
        (self.n_prompt + self.tokens.len()).saturating_sub(1) as i32
    }

    /// Every token sampled so far, in order.
    pub(crate) fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// Tokens sampled so far.
    pub(crate) fn n_generated(&self) -> usize {
        self.tokens.len()
    }

    /// Releases the held text (unless cancelled) and builds the result;
    /// `timings` gets the token counts filled in.
    pub(crate) fn complete(
        mut self,
        finish: FinishReason,
        mut timings: Timings,
        on_piece: &mut OnPiece,
    ) -> Completion {
        if finish != FinishReason::Cancelled {
            let rest = self.text.finish();
            // With tokens that made no text (nothing follows them).
            let released = self.release_logprobs(true);
            let quiet = rest.is_empty() && released.is_empty();
            if !quiet {
                on_piece(&rest, released);
            }
        }
        timings.prompt_tokens = self.n_prompt - timings.cached_prompt_tokens.min(self.n_prompt);
        timings.generated_tokens = self.tokens.len();
        Completion {
            text: self.text.into_text(),
            tokens: self.tokens,
            finish_reason: finish,
            timings,
            logprobs: self.logprobs,
        }
    }
}

/// The ids of the texts in `texts` that are one token each (special-token
/// text parsed); the others cannot be told apart from plain text anyway.
fn preserved_tokens(model: &Model, texts: &[String]) -> Vec<i32> {
    texts
        .iter()
        .filter_map(
            |text| match model.tokenize(text, false, true).ok()?.as_slice() {
                [one] => Some(*one),
                _ => None,
            },
        )
        .collect()
}

/// Decodes a prompt in chunks of the context's batch size; returns the batch
/// row holding the last token's logits.
fn decode_prompt(ctx: &mut Context, seq: i32, prompt: &[i32]) -> Result<i32, EngineError> {
    let n_batch = ctx.n_batch().max(1) as usize;
    let mut batch = Batch::new(n_batch.min(prompt.len()));
    let mut last_row = 0;
    for (chunk_index, chunk) in prompt.chunks(n_batch).enumerate() {
        batch.clear();
        let base = chunk_index * n_batch;
        for (i, &t) in chunk.iter().enumerate() {
            let is_last = base + i + 1 == prompt.len();
            let row = batch.push(t, (base + i) as i32, seq, is_last)?;
            if is_last {
                last_row = row;
            }
        }
        ctx.decode(&batch)?;
    }
    Ok(last_row)
}

/// Turns token bytes into text: holds back an incomplete UTF-8 character and
/// any tail that could still become a stop string.
pub struct TextStream {
    stop: Vec<String>,
    pending_bytes: Vec<u8>,
    /// Text decoded but not yet released (may be the start of a stop string).
    held: String,
    emitted: String,
    stopped: bool,
}

impl TextStream {
    pub fn new(stop: &[String]) -> Self {
        TextStream {
            stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending_bytes: Vec::new(),
            held: String::new(),
            emitted: String::new(),
            stopped: false,
        }
    }

    /// Adds a token's bytes; returns the text now final and whether a stop
    /// string was reached (the text before it is returned, the rest dropped).
    pub fn push(&mut self, bytes: &[u8]) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.pending_bytes.extend_from_slice(bytes);
        let valid = valid_utf8_prefix(&self.pending_bytes);
        let decoded = String::from_utf8_lossy(&self.pending_bytes[..valid]).into_owned();
        self.pending_bytes.drain(..valid);
        self.held.push_str(&decoded);

        if let Some(at) = self
            .stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.held.truncate(at);
            self.stopped = true;
            self.pending_bytes.clear();
            return (self.release(self.held.len()), true);
        }
        let keep = self.partial_stop_suffix();
        (self.release(self.held.len() - keep), false)
    }

    /// Releases whatever is held (end of generation): a partial stop string is
    /// then just text, and stray bytes of a broken character become U+FFFD.
    pub fn finish(&mut self) -> String {
        if !self.stopped && !self.pending_bytes.is_empty() {
            let tail = String::from_utf8_lossy(&self.pending_bytes).into_owned();
            self.held.push_str(&tail);
            self.pending_bytes.clear();
        }
        self.release(self.held.len())
    }

    /// Bytes of text released so far.
    pub fn released_bytes(&self) -> usize {
        self.emitted.len()
    }

    /// All text released so far.
    pub fn into_text(self) -> String {
        self.emitted
    }

    fn release(&mut self, n: usize) -> String {
        let out: String = self.held.drain(..n).collect();
        self.emitted.push_str(&out);
        out
    }

    /// Length of the longest tail of `held` that is a proper prefix of a stop string.
    fn partial_stop_suffix(&self) -> usize {
        let mut longest = 0;
        for stop in &self.stop {
            for (i, _) in stop.char_indices().skip(1) {
                if i > longest && self.held.ends_with(&stop[..i]) {
                    longest = i;
                }
            }
        }
        longest
    }
}

/// Length of the longest prefix of `bytes` that is valid UTF-8 or ends in
/// invalid bytes that can never become valid (those are decoded lossily);
/// only an incomplete final character is held back.
fn valid_utf8_prefix(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stop: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut s = TextStream::new(&stop);
        let mut out = Vec::new();
        let mut stopped = false;
        for p in pieces {
            let (text, st) = s.push(p);
            out.push(text);
            if st {
                stopped = true;
                break;
            }
        }
        if !stopped {
            out.push(s.finish());
        }
        (out, stopped, s.into_text())
    }

    #[test]
    fn utf8_character_split_across_tokens_is_held_until_complete() {
        let euro = "€".as_bytes(); // 3 bytes
        let (out, _, text) = run(&[], &[b"a", &euro[..1], &euro[1..2], &euro[2..], b"b"]);
        assert_eq!(out, vec!["a", "", "", "€", "b", ""]);
        assert_eq!(text, "a€b");
    }

    #[test]
    fn stop_string_split_across_tokens_is_not_emitted() {
        let (out, stopped, text) = run(&["</end>"], &[b"hello </", b"en", b"d> more"]);
        assert!(stopped);
        assert_eq!(out, vec!["hello ", "", ""]);
        assert_eq!(text, "hello ");
    }

    #[test]
    fn partial_stop_prefix_is_released_when_it_does_not_complete() {
        let (out, stopped, text) = run(&["STOP"], &[b"a ST", b"ART"]);
        assert!(!stopped);
        assert_eq!(out, vec!["a ", "START", ""]);
        assert_eq!(text, "a START");
    }

    #[test]
    fn earliest_of_several_stop_strings_wins() {
        let (_, stopped, text) = run(&["world", "lo w"], &[b"hello world"]);
        assert!(stopped);
        assert_eq!(text, "hel");
    }

    #[test]
    fn held_prefix_released_at_end_of_generation() {
        let (out, stopped, text) = run(&["\n\n"], &[b"line\n"]);
        assert!(!stopped);
        assert_eq!(out, vec!["line", "\n"]);
        assert_eq!(text, "line\n");
    }

    #[test]
    fn invalid_bytes_do_not_stall_the_stream() {
        let (_, _, text) = run(&[], &[&[0xff], b"ok"]);
        assert_eq!(text, "\u{fffd}ok");
    }
}
