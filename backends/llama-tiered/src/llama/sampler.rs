//! Token sampling through llama.cpp's sampler chain.
use std::ptr::NonNull;

use hypura_llama_sys as sys;

use super::context::Context;
use super::grammar::{GrammarSampler, GRAMMAR_ROOT};
use super::model::Model;
use crate::error::EngineError;

/// `LLAMA_DEFAULT_SEED` of llama.h (a macro bindgen does not export): asks
/// llama.cpp's distribution sampler for a random seed.
const LLAMA_DEFAULT_SEED: u32 = 0xFFFF_FFFF;

/// Sampling options, with llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// `<= 0` means greedy (argmax after penalties).
    pub temperature: f32,
    /// `<= 0` disables top-k.
    pub top_k: i32,
    /// `>= 1` disables top-p.
    pub top_p: f32,
    /// `<= 0` disables min-p.
    pub min_p: f32,
    /// `1.0` disables the repeat penalty.
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (`0` disables them, `-1` = whole context).
    pub repeat_last_n: i32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `None` picks a random seed.
    pub seed: Option<u32>,
    /// A GBNF grammar (root rule `root`) every sampled token must fit, as
    /// llama.cpp's `--grammar`; `None` or empty: unconstrained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Texts of special tokens that stay in the output text when sampled
    /// (llama.cpp's `preserved_tokens`: tool-call markers such as
    /// `<|python_tag|>` or `[TOOL_CALLS]`); other special tokens render as
    /// nothing. A text that is not one token of the vocabulary is ignored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preserved_tokens: Vec<String>,
    /// Report each sampled token's log-probability and this many of the most
    /// likely tokens at its position (`0..=`[`MAX_TOP_LOGPROBS`]); `None`: no
    /// log-probabilities, and none of their cost (a softmax over the whole
    /// vocabulary per token). See [`Sampler::log_probs`] for which
    /// distribution they come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Added to token ids' logits before any other sampler, as OpenAI's and
    /// llama-server's `logit_bias`: `(token id, bias)`, the bias in
    /// [`-LOGIT_BIAS_MAX`, `LOGIT_BIAS_MAX`]; `-100` bans the token (it is
    /// applied as minus infinity, as OpenAI documents it). Kept finite here
    /// so that it crosses JSON (a runner's IPC, a peer) unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logit_bias: Vec<(i32, f32)>,
}

/// Largest bias [`SamplingParams::logit_bias`] takes, either sign (OpenAI's range).
pub const LOGIT_BIAS_MAX: f32 = 100.0;

/// Token ids with their log-probabilities, most likely first.
pub type TopLogProbs = Vec<(i32, f32)>;

/// Most alternatives [`SamplingParams::top_logprobs`] may ask for (OpenAI's and Ollama's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            grammar: None,
            preserved_tokens: Vec::new(),
            top_logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Rejects values llama.cpp would misbehave on (NaN, negative top-p…).
    pub fn validate(&self) -> Result<(), EngineError> {
        let finite = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        for (name, value) in finite {
            if !value.is_finite() {
                return Err(EngineError::InvalidArgument(format!(
                    "{name} must be a finite number, got {value}"
                )));
            }
        }
        if self.top_p < 0.0 {
            return Err(EngineError::InvalidArgument(format!(
                "top_p must be in [0, 1] (1 disables it), got {}",
                self.top_p
            )));
        }
        if self.min_p > 1.0 {
            return Err(EngineError::InvalidArgument(format!(
                "min_p must be in [0, 1], got {}",
                self.min_p
            )));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(EngineError::InvalidArgument(format!(
                "repeat_penalty must be > 0 (1.0 disables it), got {}",
                self.repeat_penalty
            )));
        }
        if self.top_logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::InvalidArgument(format!(
                "top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs.unwrap_or_default()
            )));
        }
        for &(token, bias) in &self.logit_bias {
            if token < 0 {
                return Err(EngineError::InvalidArgument(format!(
                    "logit_bias: token id {token} is not a token id (ids are 0 or more)"
                )));
            }
            if !(-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&bias) {
                return Err(EngineError::InvalidArgument(format!(
                    "logit_bias: the bias of token {token} must be between -{LOGIT_BIAS_MAX} \
                     and {LOGIT_BIAS_MAX}, got {bias}"
                )));
            }
        }
        if self.repeat_last_n < -1 {
            return Err(EngineError::InvalidArgument(format!(
                "repeat_last_n must be -1, 0 or positive, got {}",
                self.repeat_last_n
            )));
        }
        Ok(())
    }

    /// Checks [`SamplingParams::logit_bias`] against a vocabulary of
    /// `n_vocab` tokens (known only once a model is loaded).
    pub fn check_vocabulary(&self, n_vocab: usize) -> Result<(), EngineError> {
        match self
            .logit_bias
            .iter()
            .find(|&&(token, _)| token < 0 || token as usize >= n_vocab)
        {
            Some(&(token, _)) => Err(EngineError::InvalidArgument(format!(
                "logit_bias: token {token} is outside the model's vocabulary of {n_vocab} tokens \
                 (ids 0 to {})",
                n_vocab.saturating_sub(1)
            ))),
            None => Ok(()),
        }
    }
}

/// A llama.cpp sampler chain built from [`SamplingParams`], in llama.cpp's
/// order: logit bias → penalties → top-k → top-p → min-p → temperature → distribution,
/// with the grammar (when there is one) constraining before all of them, as
/// llama.cpp's common sampler does.
pub struct Sampler {
    raw: NonNull<sys::llama_sampler>,
    grammar: Option<GrammarSampler>,
    /// Candidate buffer for grammar sampling and log-probabilities, `n_vocab` long.
    candidates: Vec<sys::llama_token_data>,
    /// How many of the chain's first samplers only move logits (the logit
    /// bias, the repetition penalties): [`Sampler::log_probs`] applies them.
    reshaping: usize,
    /// [`Sampler::log_probs`]' answer, `n_vocab` long once asked.
    log_probs: Vec<f32>,
    /// Plain greedy: no bias, no penalties, no grammar, temperature `<= 0`.
    greedy: bool,
}

// SAFETY: the chain owns its state; used by one thread at a time (`&mut self`).
unsafe impl Send for Sampler {}

impl Sampler {
    pub fn new(params: &SamplingParams, model: &Model, n_ctx: u32) -> Result<Sampler, EngineError> {
        params.validate()?;
        let n_vocab = model.n_vocab();
        params.check_vocabulary(n_vocab)?;
        let grammar = match params.grammar.as_deref() {
            Some(text) if !text.is_empty() => Some(GrammarSampler::new(model, text, GRAMMAR_ROOT)?),
            _ => None,
        };
        // SAFETY: creates an empty chain that owns the samplers added to it.
        let chain = unsafe {
            let mut chain_params = sys::llama_sampler_chain_default_params();
            chain_params.no_perf = true;
            sys::llama_sampler_chain_init(chain_params)
        };
        let raw = NonNull::new(chain)
            .ok_or_else(|| EngineError::Context("could not create a sampler".into()))?;
        let penalties_on = params.repeat_penalty != 1.0
            || params.presence_penalty != 0.0
            || params.frequency_penalty != 0.0;
        // The window holds at most the context's tokens: llama.cpp allocates
        // it whole, so a larger one (up to `i32::MAX`) would take gigabytes
        // for nothing.
        let context = i32::try_from(n_ctx).unwrap_or(i32::MAX);
        let last_n = if params.repeat_last_n == -1 {
            context
        } else {
            params.repeat_last_n.min(context)
        };
        let penalties = penalties_on && last_n != 0;
        let bias = logit_bias(&params.logit_bias);
        let sampler = Sampler {
            raw,
            greedy: params.temperature <= 0.0 && !penalties && bias.is_empty() && grammar.is_none(),
            grammar,
            candidates: Vec::new(),
            reshaping: usize::from(!bias.is_empty()) + usize::from(penalties),
            log_probs: Vec::new(),
        };
        // SAFETY (whole block): each init returns a new sampler whose ownership
        // passes to the chain, freed with it.
        unsafe {
            if !bias.is_empty() {
                // llama.cpp copies the array; every id is in the vocabulary
                // (checked above).
                sampler.add(sys::llama_sampler_init_logit_bias(
                    n_vocab as i32,
                    bias.len() as i32,
                    bias.as_ptr(),
                ));
            }
            if penalties {
                sampler.add(sys::llama_sampler_init_penalties(
                    n_vocab as i32,
                    last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                ));
            }
            if params.temperature <= 0.0 {
                sampler.add(sys::llama_sampler_init_greedy());
            } else {
                if params.top_k > 0 {
                    sampler.add(sys::llama_sampler_init_top_k(params.top_k));
                }
                if params.top_p < 1.0 {
                    sampler.add(sys::llama_sampler_init_top_p(params.top_p, 1));
                }
                if params.min_p > 0.0 {
                    sampler.add(sys::llama_sampler_init_min_p(params.min_p, 1));
                }
                sampler.add(sys::llama_sampler_init_temp(params.temperature));
                let seed = params.seed.unwrap_or(LLAMA_DEFAULT_SEED);
                sampler.add(sys::llama_sampler_init_dist(seed));
            }
        }
        Ok(sampler)
    }

    /// Whether this sampler only takes the argmax of the logits, which
    /// llama.cpp can do inside the decode graph instead
    /// ([`Context::set_device_greedy`]); [`Sampler::sample`] then returns
    /// the token it chose.
    pub fn is_plain_greedy(&self) -> bool {
        self.greedy
    }

    /// # Safety
    /// `s` must be a fresh sampler not owned by anything else.
    unsafe fn add(&self, s: *mut sys::llama_sampler) {
        // SAFETY: per the contract, the chain takes ownership of `s`.
        unsafe { sys::llama_sampler_chain_add(self.raw.as_ptr(), s) }
    }

    /// Samples from the logits of batch row `idx` and records the token
    /// (for penalties, and in the grammar). Fails only when a grammar allows
    /// no token at all.
    pub fn sample(&mut self, ctx: &mut Context, idx: i32) -> Result<i32, EngineError> {
        if self.grammar.is_none() {
            // SAFETY: both are alive; llama_sampler_sample also accepts the
            // token. It returns the token llama.cpp's own sampler chose
            // inside the decode (`Context::set_device_greedy`) when there is one.
            return Ok(unsafe { sys::llama_sampler_sample(self.raw.as_ptr(), ctx.as_ptr(), idx) });
        }
        // llama.cpp's common sampler: sample unconstrained, and only when the
        // grammar refuses that token apply it to the whole vocabulary and
        // sample again (checking one token is much cheaper than all of them).
        let mut token = self.sample_from(ctx, idx, false)?;
        if self.grammar.as_mut().is_some_and(|g| !g.allows(token)) {
            token = self.sample_from(ctx, idx, true)?;
        }
        if let Some(grammar) = self.grammar.as_mut() {
            grammar.accept(token)?;
        }
        // SAFETY: the chain is alive.
        unsafe { sys::llama_sampler_accept(self.raw.as_ptr(), token) };
        Ok(token)
    }

    /// [`Sampler::sample`], and the log-probabilities of the sampled token
    /// and of the `n_top` most likely tokens (ids, most likely first) in the
    /// distribution [`Sampler::log_probs`] describes.
    pub fn sample_with_log_probs(
        &mut self,
        ctx: &mut Context,
        idx: i32,
        n_top: usize,
    ) -> Result<(i32, f32, TopLogProbs), EngineError> {
        let top = most_likely(self.log_probs(ctx, idx)?, n_top);
        let token = self.sample(ctx, idx)?;
        let log_prob = self
            .log_probs
            .get(token as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        Ok((token, log_prob, top))
    }

    /// The distribution log-probabilities are reported from, at batch row
    /// `idx`: the log-softmax of the model's logits after the logit bias and
    /// the repetition penalties, before the grammar, top-k, top-p, min-p and
    /// temperature cut and reshape them; indexed by token id. Without bias
    /// or penalties this is what llama.cpp's server reports by default
    /// (`n_probs` without `post_sampling_probs`: a softmax of the raw
    /// logits); with them it is the distribution greedy decoding picks the
    /// most likely token of (a banned token's is minus infinity). Call it
    /// before [`Sampler::sample`], which adds the sampled token to the
    /// penalties' history.
    pub fn log_probs(&mut self, ctx: &Context, idx: i32) -> Result<&[f32], EngineError> {
        let logits = ctx.logits(idx)?;
        fill_candidates(&mut self.candidates, logits);
        for i in 0..self.reshaping {
            let mut array = sys::llama_token_data_array {
                data: self.candidates.as_mut_ptr(),
                size: self.candidates.len(),
                selected: -1,
                sorted: false,
            };
            // SAFETY: the chain is alive and its first `reshaping` samplers
            // (the bias, the penalties) change logits in place, without
            // resizing `array`, which points at `candidates`.
            unsafe {
                let reshaper = sys::llama_sampler_chain_get(self.raw.as_ptr(), i as i32);
                sys::llama_sampler_apply(reshaper, &mut array);
            }
        }
        let max = self
            .candidates
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = self
            .candidates
            .iter()
            .map(|c| f64::from(c.logit - max).exp())
            .sum();
        let log_sum = max + sum.ln() as f32;
        self.log_probs.clear();
        self.log_probs.resize(logits.len(), f32::NEG_INFINITY);
        for c in &self.candidates {
            if let Some(slot) = self.log_probs.get_mut(c.id as usize) {
                *slot = c.logit - log_sum;
            }
        }
        Ok(&self.log_probs)
    }

    /// Runs the chain (after the grammar when `constrained`) over row `idx`'s
    /// logits and returns the token it selects, without accepting it.
    fn sample_from(
        &mut self,
        ctx: &mut Context,
        idx: i32,
        constrained: bool,
    ) -> Result<i32, EngineError> {
        let logits = ctx.logits(idx)?;
        fill_candidates(&mut self.candidates, logits);
        if constrained {
            if let Some(grammar) = self.grammar.as_mut() {
                constrain(grammar, &mut self.candidates, logits);
            }
        }
        let mut array = sys::llama_token_data_array {
            data: self.candidates.as_mut_ptr(),
            size: self.candidates.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: `array` points at `candidates`, valid for the call; the
        // samplers reorder and shrink it in place and set `selected`.
        unsafe { sys::llama_sampler_apply(self.raw.as_ptr(), &mut array) };
        let selected = usize::try_from(array.selected)
            .ok()
            .filter(|&i| i < array.size)
            .ok_or_else(|| EngineError::Context("the sampler selected no token".into()))?;
        // SAFETY: `selected < size`, and `data` holds `size` entries.
        let chosen = unsafe { *array.data.add(selected) };
        if constrained && chosen.logit == f32::NEG_INFINITY {
            return Err(EngineError::InvalidArgument(
                "the grammar allows no token of the vocabulary here".into(),
            ));
        }
        Ok(chosen.id)
    }

    /// Points the sampler at `model`, another load of the same file (see
    /// [`GrammarSampler::rebind`]); the rest of the chain does not depend on
    /// the model.
    pub fn rebind(&mut self, model: &Model) -> Result<(), EngineError> {
        match self.grammar.as_mut() {
            Some(grammar) => grammar.rebind(model),
            None => Ok(()),
        }
    }

    /// Records a token the sampler did not pick (e.g. the prompt, for
    /// penalties); the grammar only sees sampled tokens.
    pub fn accept(&mut self, token: i32) {
        // SAFETY: the chain is alive.
        unsafe { sys::llama_sampler_accept(self.raw.as_ptr(), token) }
    }
}

/// `biases` as llama.cpp applies them: OpenAI's `-100` is a ban (minus
/// infinity), the others are added as they are.
fn logit_bias(biases: &[(i32, f32)]) -> Vec<sys::llama_logit_bias> {
    biases
        .iter()
        .map(|&(token, bias)| sys::llama_logit_bias {
            token,
            bias: if bias <= -LOGIT_BIAS_MAX {
                f32::NEG_INFINITY
            } else {
                bias
            },
        })
        .collect()
}

/// Candidates the grammar checks first when it refused the sampled token.
const GRAMMAR_HEAD_TOKENS: usize = 256;

/// Keeps the tokens the grammar allows. Checking every token of a large
/// vocabulary against a grammar costs far more than a decode step of a
/// small model, so only the [`GRAMMAR_HEAD_TOKENS`] most likely are checked;
/// the whole vocabulary only when none of them fits. Greedy decoding picks
/// what it would from the whole vocabulary (no allowed token outside the
/// head is more likely than one inside); sampling loses only the tail past
/// the head.
fn constrain(
    grammar: &mut GrammarSampler,
    candidates: &mut Vec<sys::llama_token_data>,
    logits: &[f32],
) {
    if candidates.len() > GRAMMAR_HEAD_TOKENS {
        candidates
            .select_nth_unstable_by(GRAMMAR_HEAD_TOKENS - 1, |a, b| b.logit.total_cmp(&a.logit));
        candidates.truncate(GRAMMAR_HEAD_TOKENS);
    }
    grammar.apply(candidates);
    candidates.retain(|c| c.logit != f32::NEG_INFINITY);
    if candidates.is_empty() {
        fill_candidates(candidates, logits);
        grammar.apply(candidates);
    }
}

/// The `n` largest of `log_probs` (token id, value), largest first; the
/// lower id first among equals, as greedy sampling picks.
fn most_likely(log_probs: &[f32], n: usize) -> TopLogProbs {
    let mut top: TopLogProbs = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (id, &log_prob) in log_probs.iter().enumerate() {
        if top.len() == n && log_prob <= top[n - 1].1 {
            continue;
        }
        let at = top.partition_point(|&(_, p)| p >= log_prob);
        top.insert(at, (id as i32, log_prob));
        top.truncate(n);
    }
    top
}

/// One candidate per token of the vocabulary, with its logit.
fn fill_candidates(candidates: &mut Vec<sys::llama_token_data>, logits: &[f32]) {
    candidates.clear();
    candidates.extend(
        logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| sys::llama_token_data {
                id: id as i32,
                logit,
                p: 0.0,
            }),
    );
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: frees the chain and the samplers it owns, once.
        unsafe { sys::llama_sampler_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::most_likely;

    #[test]
    fn most_likely_keeps_the_largest_in_order_and_the_lower_id_among_equals() {
        let log_probs = [-3.0, -0.5, -2.0, -0.5, -9.0, -1.0];
        assert_eq!(
            most_likely(&log_probs, 3),
            [(1, -0.5), (3, -0.5), (5, -1.0)]
        );
        assert_eq!(most_likely(&log_probs, 0), []);
        assert_eq!(most_likely(&log_probs, 10).len(), log_probs.len());
    }
}
