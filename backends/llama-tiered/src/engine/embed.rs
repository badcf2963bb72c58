//! Embeddings ([`BatchEngine::embed`]): on the caller's thread, in a small context of
//! their own beside the generation context.
use std::sync::{Arc, PoisonError};

use super::queue::{BatchEngine, Current};
use crate::error::EngineError;
use crate::llama::{Batch, Context, ContextParams, EvalHook, Model};

/// Context length of the embedding context: every text is decoded in one
/// micro-batch (mean pooling needs all its tokens at once), and llama.cpp
/// computes logits for each of them, so this stays small.
pub const EMBED_N_CTX: u32 = 512;

/// The embedding context of a model trained on `n_ctx_train` tokens.
pub(super) fn embed_context(n_ctx_train: u32, n_threads: u32) -> ContextParams {
    let n_ctx = EMBED_N_CTX.min(n_ctx_train.max(1));
    ContextParams {
        n_ctx,
        n_batch: n_ctx,
        n_seq_max: 1,
        n_threads,
        embeddings: true,
        mean_pooling: true,
    }
}

impl BatchEngine {
    /// One embedding per text: the mean of its tokens' final hidden states,
    /// L2-normalized (as Ollama's `/api/embed` returns them). Texts are
    /// tokenized with BOS as the model wants it and special-token text left
    /// as text; one longer than 512 tokens (or the model's training context)
    /// fails with [`EngineError::PromptTooLong`], an empty one with
    /// [`EngineError::InvalidArgument`].
    ///
    /// Runs on the caller's thread, in a separate small context created on
    /// first use and kept behind a mutex: concurrent calls take turns, and
    /// generation on the worker goes on meanwhile (sharing the cores).
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model();
        let model = &model;
        let params = embed_context(model.n_ctx_train(), self.inner.config.n_threads);
        let n_ctx = params.n_ctx;
        let tokenized = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let tokens = model.tokenize(text, true, false)?;
                if tokens.is_empty() {
                    return Err(EngineError::InvalidArgument(format!(
                        "text {i} is empty: nothing to embed"
                    )));
                }
                if tokens.len() > n_ctx as usize {
                    return Err(EngineError::PromptTooLong {
                        prompt_tokens: tokens.len(),
                        n_ctx,
                    });
                }
                Ok(tokens)
            })
            .collect::<Result<Vec<_>, _>>()?;
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
            None => guard.insert(Embedder::new(&model, &params, hook)?),
        };
        tokenized.iter().map(|t| embedder.embed(t)).collect()
    }
}

/// The embedding context: one text at a time in sequence 0.
pub(super) struct Embedder {
    pub(super) ctx: Context,
    pub(super) batch: Batch,
}

impl Embedder {
    pub(super) fn new(
        model: &Arc<Model>,
        params: &ContextParams,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<Embedder, EngineError> {
        Ok(Embedder {
            ctx: Context::with_hook(Arc::clone(model), params, hook)?,
            batch: Batch::new(params.n_ctx as usize),
        })
    }

    pub(super) fn embed(&mut self, tokens: &[i32]) -> Result<Vec<f32>, EngineError> {
        self.ctx.clear_all();
        self.batch.clear();
        for (pos, &token) in tokens.iter().enumerate() {
            self.batch.push(token, pos as i32, 0, true)?;
        }
        self.ctx.decode(&self.batch)?;
        let pooled = self
            .ctx
            .embeddings_seq(0)
            .ok_or_else(|| EngineError::Context("llama.cpp returned no pooled embedding".into()))?;
        Ok(l2_normalized(pooled))
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
