//! Log-probabilities through the serving engine on SmolLM2, checked against
//! values this test computes itself from the model's logits: decoded again
//! token by token in a context of its own, penalised as llama.cpp's
//! penalties sampler does, log-softmaxed in f64.
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use llama_tiered::engine::generate::{Completion, GenerateParams, TokenLogprobs};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{BatchConfig, BatchEngine, GenerateRequest, GenerationEvent};
use llama_tiered::llama::{Batch, Context, ContextParams, Model, SamplingParams};
use llama_tiered::test_models;

const DEADLINE: Duration = Duration::from_secs(120);
const N_CTX: u32 = 512;
/// Reported and recomputed log-probabilities agree this closely.
const TOLERANCE: f64 = 1e-3;
/// A prompt that invites repeating itself, so the penalties matter.
const PROMPT: &str = "one two three one two three one two three one two";

fn engine(model: &Arc<Model>) -> BatchEngine {
    let config = BatchConfig {
        n_parallel: 1,
        n_ctx_per_seq: N_CTX,
        n_batch: 512,
        n_ubatch: 0,
        n_threads: 2,
        queue_limit: 4,
        prompt_cache: Default::default(),
    };
    BatchEngine::start(Arc::clone(model), config).unwrap()
}

/// What a request streamed: its events' log-probabilities and text in order.
struct Streamed {
    completion: Completion,
    /// Every `Logprobs` event's entries, in order.
    logprobs: Vec<TokenLogprobs>,
    /// Whether each `Logprobs` event came right before a `Text` or `Done`.
    logprobs_lead: bool,
    text: String,
}

fn run(engine: &BatchEngine, prompt: &[i32], params: GenerateParams) -> Streamed {
    let (tx, rx) = mpsc::channel();
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        params,
    };
    engine
        .submit(request, Box::new(move |event| tx.send(event).is_ok()))
        .unwrap();
    collect(&rx)
}

fn collect(rx: &Receiver<GenerationEvent>) -> Streamed {
    let mut logprobs = Vec::new();
    let mut text = String::new();
    let mut logprobs_lead = true;
    let mut after_logprobs = false;
    loop {
        let event = rx.recv_timeout(DEADLINE).expect("an event");
        if after_logprobs {
            logprobs_lead &= matches!(event, GenerationEvent::Text(_) | GenerationEvent::Done(_));
        }
        after_logprobs = matches!(event, GenerationEvent::Logprobs(_));
        match event {
            GenerationEvent::Started => {}
            GenerationEvent::Logprobs(l) => logprobs.extend(l),
            GenerationEvent::Text(t) => text.push_str(&t),
            GenerationEvent::Done(completion) => {
                return Streamed {
                    completion,
                    logprobs,
                    logprobs_lead,
                    text,
                }
            }
            GenerationEvent::Error(e) => panic!("{e}"),
        }
    }
}

/// The model's logits before each of `tokens`: the prompt decoded at once,
/// then each token alone, as the engine decodes a sequence.
fn logits_before_each(model: &Arc<Model>, prompt: &[i32], tokens: &[i32]) -> Vec<Vec<f32>> {
    let params = ContextParams {
        n_ctx: N_CTX,
        n_batch: 512,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(model), &params).unwrap();
    let mut batch = Batch::new(prompt.len());
    let mut row = 0;
    for (pos, &t) in prompt.iter().enumerate() {
        row = batch
            .push(t, pos as i32, 0, pos + 1 == prompt.len())
            .unwrap();
    }
    ctx.decode(&batch).unwrap();
    let mut out = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        out.push(ctx.logits(row).unwrap().to_vec());
        if i + 1 == tokens.len() {
            break;
        }
        let mut one = Batch::new(1);
        row = one.push(t, (prompt.len() + i) as i32, 0, true).unwrap();
        ctx.decode(&one).unwrap();
    }
    out
}

/// llama.cpp's penalties over the last `last_n` of `history`, then a log-softmax.
fn log_softmax_penalised(logits: &[f32], history: &[i32], p: &SamplingParams) -> Vec<f64> {
    let window = &history[history.len().saturating_sub(p.repeat_last_n as usize)..];
    let mut counts: HashMap<i32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    let penalised: Vec<f64> = logits
        .iter()
        .enumerate()
        .map(|(id, &logit)| {
            let Some(&count) = counts.get(&(id as i32)) else {
                return f64::from(logit);
            };
            let mut l = if logit <= 0.0 {
                logit * p.repeat_penalty
            } else {
                logit / p.repeat_penalty
            };
            l -= count as f32 * p.frequency_penalty + p.presence_penalty;
            f64::from(l)
        })
        .collect();
    let max = penalised.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let log_sum = max + penalised.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
    penalised.iter().map(|l| l - log_sum).collect()
}

/// Token ids by decreasing log-probability (lower id first among equals).
fn ranked(log_probs: &[f64]) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..log_probs.len() as i32).collect();
    ids.sort_by(|&a, &b| log_probs[b as usize].total_cmp(&log_probs[a as usize]));
    ids
}

/// Checks every reported entry against the recomputed distribution and
/// returns the largest difference seen and, per token, its rank in it.
fn check_against_logits(
    model: &Arc<Model>,
    prompt: &[i32],
    params: &GenerateParams,
    streamed: &Streamed,
) -> (f64, Vec<usize>) {
    let c = &streamed.completion;
    let n_top = params.sampling.top_logprobs.unwrap() as usize;
    let generated: Vec<i32> = c
        .tokens
        .iter()
        .copied()
        .filter(|&t| !model.is_eog(t))
        .collect();
    assert_eq!(
        c.logprobs.len(),
        generated.len(),
        "one entry per text token"
    );
    assert_eq!(streamed.logprobs, c.logprobs, "the events carry them all");
    assert!(streamed.logprobs_lead, "Logprobs come before their Text");
    let logits = logits_before_each(model, prompt, &generated);
    let mut worst: f64 = 0.0;
    let mut ranks = Vec::new();
    for (i, (entry, &token)) in c.logprobs.iter().zip(&generated).enumerate() {
        let history = [prompt, &generated[..i]].concat();
        let reference = log_softmax_penalised(&logits[i], &history, &params.sampling);
        let order = ranked(&reference);
        assert_eq!(entry.sampled.token, token);
        assert_eq!(entry.sampled.bytes, model.token_to_bytes(token, false));
        assert!(entry.sampled.logprob <= 0.0, "{entry:?}");
        worst = worst.max((f64::from(entry.sampled.logprob) - reference[token as usize]).abs());
        assert_eq!(entry.top.len(), n_top);
        let top_ids: Vec<i32> = entry.top.iter().map(|t| t.token).collect();
        assert_eq!(top_ids, order[..n_top], "step {i}");
        for pair in entry.top.windows(2) {
            assert!(pair[0].logprob >= pair[1].logprob, "sorted: {entry:?}");
        }
        for t in &entry.top {
            worst = worst.max((f64::from(t.logprob) - reference[t.token as usize]).abs());
            assert_eq!(t.bytes, model.token_to_bytes(t.token, true));
        }
        let mass: f64 = entry.top.iter().map(|t| f64::from(t.logprob).exp()).sum();
        assert!(mass <= 1.0 + 1e-6, "{mass}");
        ranks.push(order.iter().position(|&id| id == token).unwrap());
    }
    assert!(worst < TOLERANCE, "largest difference {worst}");
    (worst, ranks)
}

fn penalised(sampling: SamplingParams, top_logprobs: u32) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams {
            repeat_penalty: 1.3,
            frequency_penalty: 0.2,
            presence_penalty: 0.1,
            repeat_last_n: 64,
            top_logprobs: Some(top_logprobs),
            ..sampling
        },
        max_tokens: Some(16),
        stop: vec![],
        cache_prompt: true,
    }
}

/// Greedy: the sampled token is the most likely of the reported
/// distribution, which is the model's after the penalties (and not before).
#[test]
fn greedy_logprobs_are_the_penalised_distribution_and_pick_its_top() {
    let model = test_models::smollm2_model();
    let prompt = prompt::tokenize_raw(&model, PROMPT).unwrap();
    let params = penalised(SamplingParams::greedy(), 5);
    let streamed = run(&engine(&model), &prompt, params.clone());
    assert_eq!(streamed.text, streamed.completion.text);
    let (worst, ranks) = check_against_logits(&model, &prompt, &params, &streamed);
    eprintln!("greedy: largest difference {worst:e}");
    assert!(ranks.iter().all(|&r| r == 0), "{ranks:?}");
    for entry in &streamed.completion.logprobs {
        assert_eq!(entry.sampled.token, entry.top[0].token);
        assert_eq!(entry.sampled.logprob, entry.top[0].logprob);
    }

    // The penalties are in: the same steps without them differ.
    let generated = &streamed.completion.tokens;
    let logits = logits_before_each(&model, &prompt, generated);
    let unpenalised = SamplingParams {
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        ..params.sampling.clone()
    };
    let moved = streamed
        .completion
        .logprobs
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let raw = log_softmax_penalised(&logits[i], &prompt, &unpenalised);
            (f64::from(entry.sampled.logprob) - raw[entry.sampled.token as usize]).abs()
        })
        .fold(0.0, f64::max);
    assert!(moved > 0.01, "the penalties changed nothing ({moved})");
}

/// Sampled (temperature, top-k, a seed): log-probabilities are those of the
/// distribution before temperature and truncation, and the sampled token is
/// one of the top-k it was drawn from.
#[test]
fn sampled_logprobs_come_from_the_distribution_before_temperature() {
    let model = test_models::smollm2_model();
    let prompt = prompt::tokenize_raw(&model, "My favourite colour is").unwrap();
    let sampling = SamplingParams {
        temperature: 1.5,
        top_k: 40,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(11),
        ..SamplingParams::default()
    };
    let params = penalised(sampling, 3);
    let streamed = run(&engine(&model), &prompt, params.clone());
    let (worst, ranks) = check_against_logits(&model, &prompt, &params, &streamed);
    eprintln!("sampled: largest difference {worst:e}, ranks {ranks:?}");
    assert!(ranks.iter().all(|&r| r < 40), "{ranks:?}");
    assert!(
        ranks.iter().any(|&r| r > 0),
        "a hot temperature picked the top token every time: {ranks:?}"
    );
}

/// No logprobs asked: no events, no entries. A stop string: its tokens have none.
#[test]
fn logprobs_only_when_asked_and_not_for_a_stop_string() {
    let model = test_models::smollm2_model();
    let engine = engine(&model);
    let prompt = prompt::tokenize_raw(&model, "The capital of France is").unwrap();
    let plain = GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(8),
        stop: vec![],
        cache_prompt: true,
    };
    let streamed = run(&engine, &prompt, plain.clone());
    assert!(streamed.logprobs.is_empty());
    assert!(streamed.completion.logprobs.is_empty());

    let mut asked = plain;
    asked.sampling.top_logprobs = Some(0);
    let whole = run(&engine, &prompt, asked.clone());
    assert!(whole.completion.logprobs.iter().all(|l| l.top.is_empty()));
    let pieces: Vec<String> = whole
        .completion
        .logprobs
        .iter()
        .map(|l| String::from_utf8_lossy(&l.sampled.bytes).into_owned())
        .collect();
    assert!(pieces.len() >= 4, "{pieces:?}");
    assert_eq!(pieces.concat(), whole.completion.text);

    // Stop at the third token's text: the first two remain (and whatever of
    // the third came before the stop string, none here).
    asked.stop = vec![pieces[2].clone()];
    let stopped = run(&engine, &prompt, asked);
    assert_eq!(stopped.completion.text, pieces[..2].concat());
    let kept: Vec<&[u8]> = stopped
        .completion
        .logprobs
        .iter()
        .map(|l| l.sampled.bytes.as_slice())
        .collect();
    assert_eq!(kept.len(), 2, "{pieces:?}");
    assert_eq!(stopped.logprobs, stopped.completion.logprobs);
}
