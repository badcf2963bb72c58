//! The decode thread: it owns the generation context and the slots (one per sequence id),
//! admits queued requests, decodes one batch per step and streams each sequence's text.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use super::generate::{FinishReason, Next, Sequence, Timings, TokenLogprobs};
use super::queue::{BatchConfig, Counters, EventSink, GenerationEvent, Queued, RequestId, Shared};
use super::reuse::{Kept, Tiers};
use super::switch::Switch;
use crate::error::EngineError;
use crate::llama::{Batch, Context};

/// A request in a slot.
pub(super) struct Slot {
    pub(super) id: RequestId,
    pub(super) sink: EventSink,
    pub(super) sequence: Sequence,
    pub(super) prompt: Vec<i32>,
    /// Prompt tokens already in the KV cache.
    pub(super) n_prompt_decoded: usize,
    /// Prompt tokens the prompt cache gave (not evaluated).
    pub(super) n_cached: usize,
    /// Whether this request's KV may stay for a later one.
    pub(super) cache_prompt: bool,
    /// The sampled token to decode next, once the prompt is in.
    pub(super) next_token: Option<i32>,
    /// Prompt tokens in the current batch.
    pub(super) step_prompt_tokens: usize,
    /// Row of this sequence's logits in the current batch.
    pub(super) step_row: Option<i32>,
    pub(super) prompt_eval: Duration,
    pub(super) eval: Duration,
}

impl Slot {
    pub(super) fn new(
        id: RequestId,
        prompt: Vec<i32>,
        sequence: Sequence,
        sink: EventSink,
        n_cached: usize,
        cache_prompt: bool,
    ) -> Slot {
        Slot {
            id,
            sink,
            sequence,
            prompt,
            n_prompt_decoded: n_cached,
            n_cached,
            cache_prompt,
            next_token: None,
            step_prompt_tokens: 0,
            step_row: None,
            prompt_eval: Duration::ZERO,
            eval: Duration::ZERO,
        }
    }

    pub(super) fn in_batch(&self) -> bool {
        self.next_token.is_some() || self.step_prompt_tokens > 0
    }

    /// Tokens of this sequence in the KV cache: the prompt decoded so far,
    /// then every sampled token but the one still to decode.
    pub(super) fn kv_cells(&self) -> usize {
        if self.n_prompt_decoded < self.prompt.len() {
            self.n_prompt_decoded
        } else {
            self.sequence.next_pos().max(0) as usize
        }
    }

    /// The tokens whose KV this sequence holds, in position order.
    pub(super) fn kv_tokens(&self) -> Vec<i32> {
        let n = self.kv_cells();
        let from_prompt = n.min(self.prompt.len());
        let mut tokens = self.prompt[..from_prompt].to_vec();
        let generated = self.sequence.tokens();
        tokens.extend_from_slice(&generated[..(n - from_prompt).min(generated.len())]);
        tokens
    }
}

/// The worker thread's state: the context and the slots (index = sequence id).
pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) ctx: Context,
    pub(super) batch: Batch,
    pub(super) slots: Vec<Option<Slot>>,
    /// What each idle slot's KV still holds ([`super::reuse`]).
    pub(super) kept: Vec<Kept>,
    pub(super) tiers: Tiers,
    pub(super) n_batch: usize,
    /// Most slots decoding at once (the others keep idle conversations).
    pub(super) n_parallel: usize,
    /// Copies of a slot's KV into another, `(from, to)`, that llama.cpp
    /// makes at the start of the next decode: until then `from` is not
    /// given to a request, and `to`, if its request ends first, keeps nothing.
    pub(super) pending_copies: Vec<(usize, usize)>,
}

/// Marks the engine stopped when the worker exits, even by a panic, and
/// fails the requests still queued then.
pub(super) struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let (queued, switch): (Vec<Queued>, _) = {
            let mut state = self.0.lock();
            state.accepting = false;
            (state.queue.drain(..).collect(), state.switch.take())
        };
        drop(switch);
        for mut q in queued {
            Counters::add(&self.0.counters.failed, 1);
            send(
                &mut q.sink,
                GenerationEvent::Error(EngineError::ShuttingDown),
            );
        }
    }
}

impl Worker {
    pub(super) fn new(shared: Arc<Shared>, ctx: Context, config: &BatchConfig) -> Worker {
        let tiers = Tiers::new(
            &config.prompt_cache,
            ctx.model().path(),
            config.n_ctx_per_seq,
        );
        Worker {
            shared,
            ctx,
            batch: Batch::new(config.n_batch as usize),
            slots: (0..config.n_slots()).map(|_| None).collect(),
            kept: (0..config.n_slots()).map(|_| Kept::default()).collect(),
            n_parallel: config.n_parallel as usize,
            pending_copies: Vec::new(),
            tiers,
            n_batch: config.n_batch as usize,
        }
    }

    pub(super) fn run(mut self) {
        let _guard = ExitGuard(Arc::clone(&self.shared));
        while self.wait_for_work() {
            if self.slots.iter().any(Option::is_some) {
                self.step();
            }
            let kv_cells: usize = self.slots.iter().flatten().map(Slot::kv_cells).sum();
            let gauge = &self.shared.counters.kv_cells;
            gauge.store(kv_cells as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.flush();
    }

    /// Drops cancelled requests and fills free slots from the queue, blocking
    /// while there is nothing to do. False when the worker should exit
    /// (shutting down, and no request left).
    pub(super) fn wait_for_work(&mut self) -> bool {
        let mut admitted = Vec::new();
        let mut dropped = Vec::new();
        let mut ram_limit = None;
        let (keep_running, switch) = {
            let mut state = self.shared.lock();
            let keep_running = loop {
                for (seq, slot) in self.slots.iter_mut().enumerate() {
                    if slot
                        .as_ref()
                        .is_some_and(|s| state.cancelled.contains(&s.id))
                    {
                        if let Some(s) = slot.take() {
                            state.active.remove(&s.id);
                            dropped.push((seq, s));
                        }
                    }
                }
                state.cancelled.clear();
                let n_active = self.slots.iter().filter(|s| s.is_some()).count();
                let n_free = self.n_parallel.saturating_sub(n_active);
                while admitted.len() < n_free {
                    let Some(q) = state.queue.pop_front() else {
                        break;
                    };
                    state.active.insert(q.id);
                    admitted.push(q);
                }
                if let Some(bytes) = state.prompt_cache_ram_bytes.take() {
                    ram_limit = Some(bytes);
                }
                let busy = !admitted.is_empty() || self.slots.iter().any(Option::is_some);
                // Dropped slots still need their KV kept or cleared (outside the lock).
                let chores = !dropped.is_empty() || ram_limit.is_some();
                if busy || chores || state.switch.is_some() {
                    break true;
                }
                if !state.accepting && state.queue.is_empty() {
                    break false;
                }
                state = self
                    .shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            };
            (keep_running, state.switch.take())
        };
        for (seq, slot) in dropped {
            // Cancelled between two steps: its KV is whole, and the next
            // turn of that conversation can start from it (unless it is
            // still to be copied in).
            let copying = self.pending_copies.iter().any(|&(_, to)| to == seq);
            self.keep_after(seq, &slot, !copying);
            Counters::add(&self.shared.counters.cancelled, 1);
            drop(slot);
        }
        if let Some(bytes) = ram_limit {
            self.set_ram_limit(bytes);
        }
        if let Some(Switch { ctx, done }) = switch {
            let _ = done.send(self.switch(ctx));
        }
        let mut free: Vec<usize> = (0..self.slots.len())
            .filter(|&seq| self.slots[seq].is_none())
            .filter(|&seq| !self.pending_copies.iter().any(|&(from, _)| from == seq))
            .collect();
        let n_admitted = admitted.len();
        for (i, mut q) in admitted.into_iter().enumerate() {
            let choice = self.choose_slot(&q.prompt, q.cache_prompt, &free, n_admitted - i);
            let seq = choice.seq;
            free.retain(|&s| s != seq);
            if !Arc::ptr_eq(&q.model, self.ctx.model()) {
                // Queued before a switch: its sampler knows the old model.
                if let Err(e) = q.sequence.rebind(self.ctx.model()) {
                    self.shared.lock().active.remove(&q.id);
                    Counters::add(&self.shared.counters.failed, 1);
                    send(&mut q.sink, GenerationEvent::Error(e));
                    continue;
                }
            }
            let n_cached = self.prepare_slot(&choice, &q.prompt, q.cache_prompt);
            // A slot being copied from is written by nothing before the copy.
            free.retain(|&s| !self.pending_copies.iter().any(|&(from, _)| from == s));
            let Queued {
                id,
                prompt,
                sequence,
                sink,
                cache_prompt,
                ..
            } = q;
            // Kept as it is while consecutive requests in a slot agree:
            // each change costs llama.cpp a graph reservation.
            self.ctx
                .set_device_greedy(seq as i32, sequence.wants_device_greedy());
            let slot = Slot::new(id, prompt, sequence, sink, n_cached, cache_prompt);
            let slot = self.slots[seq].insert(slot);
            if !send(&mut slot.sink, GenerationEvent::Started) {
                self.finish(seq, FinishReason::Cancelled);
            }
        }
        keep_running
    }

    /// One decode step over every active sequence.
    pub(super) fn step(&mut self) {
        let result = self.fill_batch().and_then(|()| {
            let started = Instant::now();
            let decoded = self.ctx.decode(&self.batch).map(|()| started.elapsed());
            // llama.cpp made the pending copies before computing.
            self.pending_copies.clear();
            decoded
        });
        Counters::add(&self.shared.counters.decode_steps, 1);
        match result {
            Ok(elapsed) => self.after_decode(elapsed),
            Err(e) => self.fail_batch(&e),
        }
    }

    /// Shares the batch: one token for each generating sequence first, the
    /// rest for prompts in slot order.
    pub(super) fn plan_batch(&mut self) {
        let n_generating = self
            .slots
            .iter()
            .flatten()
            .filter(|s| s.next_token.is_some())
            .count();
        let mut budget = self.n_batch.saturating_sub(n_generating);
        for slot in self.slots.iter_mut().flatten() {
            slot.step_row = None;
            slot.step_prompt_tokens = 0;
            if slot.next_token.is_none() {
                let remaining = slot.prompt.len().saturating_sub(slot.n_prompt_decoded);
                let take = remaining.min(budget);
                slot.step_prompt_tokens = take;
                budget -= take;
            }
        }
    }

    /// Writes the planned tokens in sequence-id order: llama.cpp splits a
    /// batch over a non-unified KV cache into micro-batches of consecutive
    /// sequence ids, so this order gives the fewest.
    pub(super) fn fill_batch(&mut self) -> Result<(), EngineError> {
        self.plan_batch();
        self.batch.clear();
        for (seq, slot) in self.slots.iter_mut().enumerate() {
            let Some(slot) = slot else { continue };
            let seq = seq as i32;
            if let Some(token) = slot.next_token {
                let row = self
                    .batch
                    .push(token, slot.sequence.next_pos(), seq, true)?;
                slot.step_row = Some(row);
                continue;
            }
            let start = slot.n_prompt_decoded;
            for (i, &token) in slot.prompt[start..start + slot.step_prompt_tokens]
                .iter()
                .enumerate()
            {
                let pos = start + i;
                let last = pos + 1 == slot.prompt.len();
                let row = self.batch.push(token, pos as i32, seq, last)?;
                if last {
                    slot.step_row = Some(row);
                }
            }
        }
        Ok(())
    }

    /// Samples every sequence that got logits, streams its text, and frees
    /// the slots of those that ended.
    pub(super) fn after_decode(&mut self, elapsed: Duration) {
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        let step_prompt: usize = self
            .slots
            .iter()
            .flatten()
            .map(|s| s.step_prompt_tokens)
            .sum();
        self.measured_prefill(step_prompt, elapsed.as_secs_f64());
        for seq in 0..self.slots.len() {
            let Some(slot) = self.slots[seq].as_mut() else {
                continue;
            };
            if !slot.in_batch() {
                continue;
            }
            if slot.next_token.take().is_some() {
                slot.eval += elapsed;
            } else {
                slot.prompt_eval += elapsed;
                slot.n_prompt_decoded += slot.step_prompt_tokens;
                Counters::add(&counters.prompt_tokens, slot.step_prompt_tokens as u64);
            }
            slot.step_prompt_tokens = 0;
            let Some(row) = slot.step_row.take() else {
                continue;
            };
            let before = slot.sequence.n_generated();
            let sink = &mut slot.sink;
            let next = slot
                .sequence
                .advance(&mut self.ctx, row, &mut |text, logprobs| {
                    send_piece(sink, text, logprobs)
                });
            let sampled = slot.sequence.n_generated() - before;
            Counters::add(&counters.tokens_generated, sampled as u64);
            match next {
                Next::Decode(token) => slot.next_token = Some(token),
                Next::Finish(reason) => self.finish(seq, reason),
                Next::Fail(error) => self.fail(seq, error),
            }
        }
    }

    /// Frees a slot and, unless the request was cancelled, sends its result.
    pub(super) fn finish(&mut self, seq: usize, reason: FinishReason) {
        let Some(slot) = self.release(seq, true) else {
            return;
        };
        let counters = &self.shared.counters;
        if reason == FinishReason::Cancelled {
            Counters::add(&counters.cancelled, 1);
            return;
        }
        Counters::add(&counters.completed, 1);
        let timings = Timings {
            cached_prompt_tokens: slot.n_cached,
            prompt_eval_seconds: slot.prompt_eval.as_secs_f64(),
            eval_seconds: slot.eval.as_secs_f64(),
            ..Default::default()
        };
        let Slot {
            mut sink, sequence, ..
        } = slot;
        let completion = sequence.complete(reason, timings, &mut |text, logprobs| {
            send_piece(&mut sink, text, logprobs)
        });
        send(&mut sink, GenerationEvent::Done(completion));
    }

    /// One sequence failed (its sampler): it gets the error and its slot back.
    pub(super) fn fail(&mut self, seq: usize, error: EngineError) {
        if let Some(mut slot) = self.release(seq, false) {
            Counters::add(&self.shared.counters.failed, 1);
            send(&mut slot.sink, GenerationEvent::Error(error));
        }
    }

    /// A failed decode: every sequence in the batch gets the error and its
    /// slot back; the others (prompts not in this batch) go on.
    pub(super) fn fail_batch(&mut self, error: &EngineError) {
        tracing::warn!("decode step failed: {error}");
        for seq in 0..self.slots.len() {
            if !self.slots[seq].as_ref().is_some_and(Slot::in_batch) {
                continue;
            }
            // What a failed decode left in the KV is not known: not kept.
            if let Some(mut slot) = self.release(seq, false) {
                Counters::add(&self.shared.counters.failed, 1);
                send(&mut slot.sink, GenerationEvent::Error(copy_error(error)));
            }
        }
    }

    /// Empties slot `seq`, the slot is free for the next step; its KV stays
    /// for a later turn when `kv_valid` and its request allowed it.
    pub(super) fn release(&mut self, seq: usize, kv_valid: bool) -> Option<Slot> {
        let slot = self.slots[seq].take()?;
        self.keep_after(seq, &slot, kv_valid);
        self.shared.lock().active.remove(&slot.id);
        Some(slot)
    }
}

/// Calls a sink; a panic inside it counts as "stop sending".
pub(super) fn send(sink: &mut EventSink, event: GenerationEvent) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink(event))).unwrap_or_else(|_| {
        tracing::error!("an event sink panicked: its request is cancelled");
        false
    })
}

/// Sends a piece of text, after its tokens' log-probabilities (either may be empty).
fn send_piece(sink: &mut EventSink, text: &str, logprobs: Vec<TokenLogprobs>) -> bool {
    (logprobs.is_empty() || send(sink, GenerationEvent::Logprobs(logprobs)))
        && (text.is_empty() || send(sink, GenerationEvent::Text(text.to_string())))
}

/// The same error for another sequence of a failed batch (`EngineError` is not `Clone`).
pub(super) fn copy_error(error: &EngineError) -> EngineError {
    match error {
        EngineError::ContextFull => EngineError::ContextFull,
        EngineError::Cancelled => EngineError::Cancelled,
        EngineError::Decode(rc) => EngineError::Decode(*rc),
        other => EngineError::Context(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    use super::super::generate::GenerateParams;
    use super::super::{BatchEngine, GenerateRequest};
    use super::*;
    use crate::llama::SamplingParams;
    use crate::test_models::smollm2_model as smollm2;

    /// A failed decode (here: llama.cpp's abort flag) fails the sequences
    /// in that batch and leaves the worker serving later requests.
    #[test]
    fn decode_failure_fails_the_batch_and_the_worker_goes_on() {
        let model = smollm2();
        let prompt = model
            .tokenize("The capital of France is", true, true)
            .unwrap();
        let config = BatchConfig {
            n_parallel: 2,
            n_ctx_per_seq: 256,
            n_batch: 64,
            n_ubatch: 0,
            n_threads: 2,
            queue_limit: 4,
            prompt_cache: Default::default(),
        };
        let engine = BatchEngine::start(Arc::clone(&model), config).unwrap();
        let request = GenerateRequest {
            prompt: prompt.clone(),
            params: GenerateParams {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(16),
                stop: vec![],
                cache_prompt: true,
            },
        };
        // The sink holds the worker on its first event while the abort flag is set.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let mut first = true;
        let sink: EventSink = Box::new(move |event| {
            if first && matches!(event, GenerationEvent::Text(_)) {
                first = false;
                held_tx.send(()).unwrap();
                gate_rx.recv_timeout(Duration::from_secs(60)).unwrap();
            }
            tx.send(event).is_ok()
        });
        engine.submit(request.clone(), sink).unwrap();
        held_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        engine.inner.abort.store(true, Ordering::SeqCst);
        gate_tx.send(()).unwrap();
        let deadline = Duration::from_secs(60);
        let mut saw_error = false;
        while let Ok(event) = rx.recv_timeout(deadline) {
            match event {
                GenerationEvent::Started
                | GenerationEvent::Text(_)
                | GenerationEvent::Logprobs(_) => {}
                GenerationEvent::Error(e) => {
                    assert!(matches!(e, EngineError::Cancelled), "{e}");
                    saw_error = true;
                }
                GenerationEvent::Done(c) => panic!("unexpected completion {c:?}"),
            }
        }
        assert!(saw_error);
        assert_eq!(engine.status().requests_failed_total, 1);
        assert_eq!(engine.status().active, 0);

        engine.inner.abort.store(false, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        engine
            .submit(request, Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
        let done = loop {
            match rx.recv_timeout(deadline).unwrap() {
                GenerationEvent::Done(c) => break c,
                GenerationEvent::Started
                | GenerationEvent::Text(_)
                | GenerationEvent::Logprobs(_) => {}
                GenerationEvent::Error(e) => panic!("{e}"),
            }
        };
        assert_eq!(done.tokens.len(), 16);
        assert!(done.text.starts_with(" Paris"), "{:?}", done.text);
    }

    /// Each slot samples with its own grammar: two requests decoded together
    /// follow two different schemas.
    #[test]
    fn grammars_constrain_each_sequence_on_its_own() {
        let model = smollm2();
        let config = BatchConfig {
            n_parallel: 2,
            n_ctx_per_seq: 512,
            n_batch: 128,
            n_ubatch: 0,
            n_threads: 2,
            queue_limit: 4,
            prompt_cache: Default::default(),
        };
        let engine = BatchEngine::start(Arc::clone(&model), config).unwrap();
        let schema = |values: &str| {
            crate::llama::json_schema_to_grammar(&format!(
                r#"{{"type":"object","properties":{{"answer":{{"enum":{values}}}}},"required":["answer"]}}"#
            ))
            .unwrap()
        };
        let prompt =
            super::super::prompt::tokenize_raw(&model, "Is Paris in France? Answer in JSON:")
                .unwrap();
        let receivers: Vec<_> = [schema(r#"["yes","no"]"#), schema("[1,2,3]")]
            .into_iter()
            .map(|grammar| {
                let (tx, rx) = mpsc::channel();
                let params = GenerateParams {
                    sampling: SamplingParams {
                        grammar: Some(grammar),
                        ..SamplingParams::greedy()
                    },
                    max_tokens: Some(64),
                    stop: vec![],
                    cache_prompt: true,
                };
                let request = GenerateRequest {
                    prompt: prompt.clone(),
                    params,
                };
                engine
                    .submit(request, Box::new(move |e| tx.send(e).is_ok()))
                    .unwrap();
                rx
            })
            .collect();
        let answers: Vec<serde_json::Value> = receivers
            .into_iter()
            .map(|rx| loop {
                match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                    GenerationEvent::Done(c) => {
                        assert_eq!(c.finish_reason, FinishReason::Stop, "{:?}", c.text);
                        break serde_json::from_str(&c.text).unwrap();
                    }
                    GenerationEvent::Started
                    | GenerationEvent::Text(_)
                    | GenerationEvent::Logprobs(_) => {}
                    GenerationEvent::Error(e) => panic!("{e}"),
                }
            })
            .collect();
        let first = answers[0]["answer"].as_str().unwrap();
        assert!(["yes", "no"].contains(&first), "{answers:?}");
        let second = answers[1]["answer"].as_i64().unwrap();
        assert!((1..=3).contains(&second), "{answers:?}");
        assert_eq!(answers[0].as_object().unwrap().len(), 1);
        assert_eq!(answers[1].as_object().unwrap().len(), 1);

        let bad = GenerateRequest {
            prompt,
            params: GenerateParams {
                sampling: SamplingParams {
                    grammar: Some("root ::= missing-rule".into()),
                    ..SamplingParams::greedy()
                },
                ..Default::default()
            },
        };
        let err = engine.submit(bad, Box::new(|_| true)).unwrap_err();
        assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    }
}
