//! Embeddings ([`BatchEngine::embed`]): on the caller's thread, in a context of
//! their own beside the generation context.
use std::sync::{Arc, PoisonError};

use super::queue::{BatchEngine, Current};
use crate::error::EngineError;
use crate::llama::{Batch, Context, ContextParams, EvalHook, Model};

/// Tokens decoded together when embedding a text on a causal model: a
/// longer text is decoded in pieces of this many tokens over the context's
/// KV cache, and llama.cpp computes logits for every token of a piece
/// (`output_all`), so this bounds the output and compute buffers whatever
/// the context length.
pub const EMBED_N_CTX: u32 = 512;

/// The embedding context of a model serving `n_ctx` tokens a sequence
/// (its training context or less): texts of up to `n_ctx` tokens are
/// embedded. A causal model decodes a text in pieces of [`EMBED_N_CTX`]
/// tokens; a non-causal one (BERT and the like) must see the whole text in
/// one micro-batch, so its batch is the context, as llama-server sizes it
/// (`n_batch = n_ubatch = n_ctx`).
pub(super) fn embed_context(n_ctx: u32, causal: bool, n_threads: u32) -> ContextParams {
    let n_ctx = n_ctx.max(1);
    ContextParams {
        n_ctx,
        n_batch: if causal {
            EMBED_N_CTX.min(n_ctx)
        } else {
            n_ctx
        },
        n_seq_max: 1,
        n_threads,
        embeddings: true,
        mean_pooling: true,
        ..Default::default()
    }
}

/// Whether `model` attends causally (every decoder-only LLM), as llama.cpp
/// decides it: `{arch}.attention.causal` when present, else false only for
/// the BERT family of encoders.
pub fn is_causal(model: &Model) -> bool {
    let arch = model.meta("general.architecture").unwrap_or_default();
    match model.meta(&format!("{arch}.attention.causal")).as_deref() {
        Some("false") => false,
        Some(_) => true,
        None => !arch.contains("bert"),
    }
}

impl BatchEngine {
    /// Tokens of the longest text [`BatchEngine::embed_tokens`] embeds: the
    /// served context per sequence, at most the model's training context.
    pub fn embed_n_ctx(&self) -> u32 {
        let model = self.model();
        self.inner
            .config
            .n_ctx_per_seq
            .min(model.n_ctx_train().max(1))
    }

    /// One embedding per text: the mean of its tokens' final hidden states,
    /// L2-normalized (as Ollama's `/api/embed` returns them). Texts are
    /// tokenized with BOS as the model wants it and special-token text left
    /// as text, then embedded as [`BatchEngine::embed_tokens`] does.
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model();
        let tokenized = texts
            .iter()
            .map(|text| model.tokenize(text, true, false))
            .collect::<Result<Vec<_>, _>>()?;
        self.embed_tokens(&tokenized)
    }

    /// One embedding per token sequence (see [`BatchEngine::embed`]). One
    /// longer than [`BatchEngine::embed_n_ctx`] fails with
    /// [`EngineError::PromptTooLong`], an empty one or one holding a token
    /// outside the vocabulary with [`EngineError::InvalidArgument`].
    ///
    /// Runs on the caller's thread, in a separate context created on first
    /// use and kept behind a mutex: concurrent calls take turns, and
    /// generation on the worker goes on meanwhile (sharing the cores).
    pub fn embed_tokens(&self, inputs: &[Vec<i32>]) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model();
        let n_ctx = self.embed_n_ctx();
        let n_vocab = model.n_vocab() as i32;
        for (i, tokens) in inputs.iter().enumerate() {
            if tokens.is_empty() {
                return Err(EngineError::InvalidArgument(format!(
                    "input {i} is empty: nothing to embed"
                )));
            }
            if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
                return Err(EngineError::InvalidArgument(format!(
                    "input {i} holds token {bad}, outside the vocabulary of {n_vocab} tokens"
                )));
            }
            if tokens.len() > n_ctx as usize {
                return Err(EngineError::PromptTooLong {
                    prompt_tokens: tokens.len(),
                    n_ctx,
                });
            }
        }
        let mut guard = self
            .inner
            .embedder
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The model now (read under the embedder's lock): one switched to
        // meanwhile gets its own embedding context.
        let Current { model, hook } = self.inner.current();
        if guard
            .as_ref()
            .is_some_and(|e| !Arc::ptr_eq(e.ctx.model(), &model))
        {
            *guard = None;
        }
        let embedder = match guard.as_mut() {
            Some(embedder) => embedder,
            None => {
                let params = embed_context(n_ctx, is_causal(&model), self.inner.config.n_threads);
                guard.insert(Embedder::new(&model, &params, hook)?)
            }
        };
        inputs.iter().map(|t| embedder.embed(t)).collect()
    }
}

/// The embedding context: one text at a time in sequence 0.
pub(super) struct Embedder {
    pub(super) ctx: Context,
    pub(super) batch: Batch,
    /// Tokens decoded at once: a text longer than this (only on a causal
    /// model) is decoded in pieces over the KV cache.
    n_batch: usize,
}

impl Embedder {
    pub(super) fn new(
        model: &Arc<Model>,
        params: &ContextParams,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<Embedder, EngineError> {
        Ok(Embedder {
            ctx: Context::with_hook(Arc::clone(model), params, hook)?,
            batch: Batch::new(params.n_batch as usize),
            n_batch: params.n_batch as usize,
        })
    }

    /// The mean of `tokens`' hidden states, L2-normalized. llama.cpp pools
    /// each decode on its own, so pieces' means are weighted by their
    /// lengths: with causal attention over the KV cache the result is the
    /// whole text's mean, as one decode would give it.
    pub(super) fn embed(&mut self, tokens: &[i32]) -> Result<Vec<f32>, EngineError> {
        self.ctx.clear_all();
        let mut sum: Vec<f64> = Vec::new();
        for (piece, chunk) in tokens.chunks(self.n_batch).enumerate() {
            self.batch.clear();
            let start = piece * self.n_batch;
            for (offset, &token) in chunk.iter().enumerate() {
                self.batch.push(token, (start + offset) as i32, 0, true)?;
            }
            self.ctx.decode(&self.batch)?;
            let pooled = self.ctx.embeddings_seq(0).ok_or_else(|| {
                EngineError::Context("llama.cpp returned no pooled embedding".into())
            })?;
            sum.resize(pooled.len(), 0.0);
            let weight = chunk.len() as f64;
            for (s, &x) in sum.iter_mut().zip(pooled) {
                *s += f64::from(x) * weight;
            }
        }
        let mean: Vec<f32> = sum
            .iter()
            .map(|&s| (s / tokens.len() as f64) as f32)
            .collect();
        Ok(l2_normalized(&mean))
    }
}

pub(super) fn l2_normalized(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (f64::from(x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_normalized_has_unit_norm() {
        let v = l2_normalized(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(l2_normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
