//! Token sampling through llama.cpp's sampler chain.
use std::ptr::NonNull;

use hypura_llama_sys as sys;

use super::context::Context;
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
}

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
        if self.repeat_last_n < -1 {
            return Err(EngineError::InvalidArgument(format!(
                "repeat_last_n must be -1, 0 or positive, got {}",
                self.repeat_last_n
            )));
        }
        Ok(())
    }
}

/// A llama.cpp sampler chain built from [`SamplingParams`], in llama.cpp's
/// order: penalties → top-k → top-p → min-p → temperature → distribution.
pub struct Sampler {
    raw: NonNull<sys::llama_sampler>,
}

// SAFETY: the chain owns its state; used by one thread at a time (`&mut self`).
unsafe impl Send for Sampler {}

impl Sampler {
    pub fn new(
        params: &SamplingParams,
        n_vocab: usize,
        n_ctx: u32,
    ) -> Result<Sampler, EngineError> {
        params.validate()?;
        // SAFETY: creates an empty chain that owns the samplers added to it.
        let chain = unsafe {
            let mut chain_params = sys::llama_sampler_chain_default_params();
            chain_params.no_perf = true;
            sys::llama_sampler_chain_init(chain_params)
        };
        let raw = NonNull::new(chain)
            .ok_or_else(|| EngineError::Context("could not create a sampler".into()))?;
        let sampler = Sampler { raw };
        let penalties_on = params.repeat_penalty != 1.0
            || params.presence_penalty != 0.0
            || params.frequency_penalty != 0.0;
        let last_n = if params.repeat_last_n == -1 {
            n_ctx as i32
        } else {
            params.repeat_last_n
        };
        // SAFETY (whole block): each init returns a new sampler whose ownership
        // passes to the chain, freed with it.
        unsafe {
            if penalties_on && last_n != 0 {
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

    /// # Safety
    /// `s` must be a fresh sampler not owned by anything else.
    unsafe fn add(&self, s: *mut sys::llama_sampler) {
        // SAFETY: per the contract, the chain takes ownership of `s`.
        unsafe { sys::llama_sampler_chain_add(self.raw.as_ptr(), s) }
    }

    /// Samples from the logits of batch row `idx` and records the token
    /// (for penalties).
    pub fn sample(&mut self, ctx: &mut Context, idx: i32) -> i32 {
        // SAFETY: both are alive; llama_sampler_sample also accepts the token.
        unsafe { sys::llama_sampler_sample(self.raw.as_ptr(), ctx.as_ptr(), idx) }
    }

    /// Records a token the sampler did not pick (e.g. the prompt, for penalties).
    pub fn accept(&mut self, token: i32) {
        // SAFETY: the chain is alive.
        unsafe { sys::llama_sampler_accept(self.raw.as_ptr(), token) }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: frees the chain and the samplers it owns, once.
        unsafe { sys::llama_sampler_free(self.raw.as_ptr()) }
    }
}
