//! The continuous-batching engine against real llama.cpp on SmolLM2.
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_tiered::engine::generate::{generate, Completion, FinishReason, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{BatchConfig, BatchEngine, EventSink, GenerateRequest, GenerationEvent};
use llama_tiered::llama::{Context, ContextParams, Model, SamplingParams};
use llama_tiered::{test_models, EngineError};

/// How long any single wait in these tests may take before it is a failure.
const DEADLINE: Duration = Duration::from_secs(120);

fn smollm2() -> Arc<Model> {
    test_models::smollm2_model()
}

fn config(n_parallel: u32) -> BatchConfig {
    BatchConfig {
        n_parallel,
        n_ctx_per_seq: 512,
        n_batch: 512,
        n_ubatch: 0,
        n_threads: 2,
        queue_limit: 16,
        prompt_cache: Default::default(),
    }
}

fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: vec![],
        cache_prompt: true,
    }
}

fn request(text: &str, params: GenerateParams) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt::tokenize_raw(&smollm2(), text).unwrap(),
        params,
    }
}

/// The same request run alone through `generate::generate`, in a context of
/// the engine's per-sequence size.
fn alone(request: &GenerateRequest) -> Completion {
    let params = ContextParams {
        n_ctx: 512,
        n_batch: 512,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(smollm2(), &params).unwrap();
    generate(&mut ctx, 0, &request.prompt, &request.params, &mut |_| true).unwrap()
}

/// A sink that forwards every event to a channel (and stops the request
/// when the receiver is gone).
fn channel_sink() -> (EventSink, Receiver<GenerationEvent>) {
    let (tx, rx) = mpsc::channel();
    (Box::new(move |event| tx.send(event).is_ok()), rx)
}

/// Waits for a request's events: the streamed text and its final outcome.
fn outcome(rx: &Receiver<GenerationEvent>) -> (String, Result<Completion, EngineError>) {
    let mut streamed = String::new();
    loop {
        match rx.recv_timeout(DEADLINE) {
            Ok(GenerationEvent::Started) => assert!(streamed.is_empty(), "Started after text"),
            Ok(GenerationEvent::Text(text)) => streamed.push_str(&text),
            Ok(GenerationEvent::Logprobs(_)) => {}
            Ok(GenerationEvent::Done(completion)) => return (streamed, Ok(completion)),
            Ok(GenerationEvent::Error(e)) => return (streamed, Err(e)),
            Err(e) => panic!("no outcome: {e:?}"),
        }
    }
}

fn completed(rx: &Receiver<GenerationEvent>) -> Completion {
    let (streamed, result) = outcome(rx);
    let completion = result.expect("a completion");
    assert_eq!(streamed, completion.text);
    completion
}

/// Collects what a sink sent until the engine dropped it.
fn events_until_dropped(rx: &Receiver<GenerationEvent>) -> Vec<GenerationEvent> {
    let mut events = Vec::new();
    loop {
        match rx.recv_timeout(DEADLINE) {
            Ok(event) => events.push(event),
            Err(RecvTimeoutError::Disconnected) => return events,
            Err(RecvTimeoutError::Timeout) => panic!("the sink was never dropped"),
        }
    }
}

/// A sink that blocks the worker on its first text event until `release` is
/// sent, telling `held` when it starts waiting; then forwards events.
/// `Started` is forwarded and never stops the request.
fn gated_sink(
    keep_going: bool,
) -> (
    EventSink,
    Receiver<GenerationEvent>,
    Receiver<()>,
    mpsc::Sender<()>,
) {
    let (tx, rx) = mpsc::channel();
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let mut first = true;
    let sink: EventSink = Box::new(move |event| {
        if matches!(event, GenerationEvent::Started) {
            return tx.send(event).is_ok();
        }
        if first {
            first = false;
            held_tx.send(()).unwrap();
            release_rx.recv_timeout(DEADLINE).unwrap();
        }
        tx.send(event).is_ok() && keep_going
    });
    (sink, rx, held_rx, release_tx)
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "My favourite colour is",
    "The three laws of robotics are",
    "To make a cup of tea, first",
    "Water boils at",
    "In 1492, Christopher Columbus",
];

#[test]
fn eight_concurrent_greedy_requests_match_each_run_alone() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(8)).unwrap();
    let requests: Vec<GenerateRequest> = PROMPTS.iter().map(|p| request(p, greedy(32))).collect();

    // The first request holds the worker on its first token until the other
    // seven are queued: they then enter together, their prompts in the same
    // batch as the first request's next token.
    let (sink, first_rx, held, release) = gated_sink(true);
    engine.submit(requests[0].clone(), sink).unwrap();
    held.recv_timeout(DEADLINE).unwrap();
    let mut receivers = vec![first_rx];
    for r in &requests[1..] {
        let (sink, rx) = channel_sink();
        engine.submit(r.clone(), sink).unwrap();
        receivers.push(rx);
    }
    assert_eq!(engine.status().queued, 7);
    release.send(()).unwrap();

    let batched: Vec<Completion> = receivers.iter().map(completed).collect();
    let status = engine.status();
    for ((text, request), got) in PROMPTS.iter().zip(&requests).zip(&batched) {
        let expected = alone(request);
        assert_eq!(got.tokens, expected.tokens, "prompt {text:?}");
        assert_eq!(got.text, expected.text, "prompt {text:?}");
        assert_eq!(got.finish_reason, expected.finish_reason, "prompt {text:?}");
        assert_eq!(got.timings.prompt_tokens, request.prompt.len());
        assert_eq!(got.timings.generated_tokens, got.tokens.len());
        assert!(got.timings.prompt_eval_seconds > 0.0);
        assert!(got.timings.eval_seconds > 0.0);
    }
    // One step for the first prompt, then every step serves all eight.
    assert!(
        status.decode_steps_total <= 33,
        "{} decode steps: the requests were not batched",
        status.decode_steps_total
    );
    let generated: usize = batched.iter().map(|c| c.tokens.len()).sum();
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt.len()).sum();
    assert_eq!(status.tokens_generated_total, generated as u64);
    assert_eq!(status.prompt_tokens_total, prompt_tokens as u64);
    assert_eq!(status.requests_completed_total, 8);
    assert_eq!((status.active, status.queued), (0, 0));
}

#[test]
fn a_long_prompt_is_split_and_does_not_stall_generating_sequences() {
    let model = smollm2();
    // A batch of 32 tokens: the 300-token prompt needs many steps, during
    // which the short request keeps generating a token per step.
    let engine = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            n_batch: 32,
            n_ubatch: 0,
            ..config(2)
        },
    )
    .unwrap();
    let short = request("The capital of France is", greedy(24));
    let long = request(
        &"The quick brown fox jumps over the lazy dog. ".repeat(30),
        greedy(8),
    );
    assert!(long.prompt.len() > 250, "{}", long.prompt.len());

    let (sink, short_rx, held, release) = gated_sink(true);
    engine.submit(short.clone(), sink).unwrap();
    held.recv_timeout(DEADLINE).unwrap();
    let (sink, long_rx) = channel_sink();
    engine.submit(long.clone(), sink).unwrap();
    release.send(()).unwrap();

    let short_done = completed(&short_rx);
    let long_done = completed(&long_rx);
    assert_eq!(short_done.tokens, alone(&short).tokens);
    assert_eq!(long_done.tokens, alone(&long).tokens);
    // Every step carried the short request's next token beside a 31-token
    // chunk of the long prompt: fewer steps than reading the whole prompt
    // first and generating after.
    let steps = engine.status().decode_steps_total;
    let serial_steps = 1 + long.prompt.len().div_ceil(32) + 7 + 23;
    assert!(
        (steps as usize) < serial_steps,
        "{steps} steps, {serial_steps} if run one after the other"
    );
}

#[test]
fn sink_returning_false_frees_the_slot_for_the_queued_request() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(1)).unwrap();
    let (tx, first_rx) = mpsc::channel();
    let mut events = 0;
    let stopping: EventSink = Box::new(move |event| {
        if matches!(event, GenerationEvent::Text(_)) {
            events += 1;
        }
        tx.send(event).unwrap();
        events < 2
    });
    engine
        .submit(request("Once upon a time", greedy(200)), stopping)
        .unwrap();
    let (sink, second_rx) = channel_sink();
    let second = request("The capital of France is", greedy(8));
    engine.submit(second.clone(), sink).unwrap();

    // Started, exactly two text events, then the sink is dropped: no Done.
    let first_events = events_until_dropped(&first_rx);
    assert_eq!(first_events.len(), 3, "{first_events:?}");
    assert!(matches!(first_events[0], GenerationEvent::Started));
    assert!(first_events[1..]
        .iter()
        .all(|e| matches!(e, GenerationEvent::Text(_))));
    let done = completed(&second_rx);
    assert_eq!(done.tokens, alone(&second).tokens);
    assert_eq!(done.finish_reason, FinishReason::Length);
    let status = engine.status();
    assert_eq!(status.requests_cancelled_total, 1);
    assert_eq!(status.requests_completed_total, 1);
    assert_eq!((status.active, status.queued), (0, 0));
}

/// `Started` marks the slot assignment, not the first token: with one slot,
/// the second request starts only once the first is done, and each request's
/// `Started` precedes its text.
#[test]
fn started_comes_at_slot_assignment_after_the_queue() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(1)).unwrap();
    // One channel for both requests: the worker calls the sinks in order.
    let (tx, rx) = mpsc::channel::<(usize, GenerationEvent, Instant)>();
    let requests = [
        request("Once upon a time", greedy(24)),
        request("The capital of France is", greedy(8)),
    ];
    let submitted = Instant::now();
    for (i, r) in requests.iter().enumerate() {
        let tx = tx.clone();
        let sink: EventSink = Box::new(move |event| tx.send((i, event, Instant::now())).is_ok());
        engine.submit(r.clone(), sink).unwrap();
    }
    drop(tx);
    let mut events = Vec::new();
    while events
        .iter()
        .filter(|(_, e, _)| matches!(e, GenerationEvent::Done(_)))
        .count()
        < 2
    {
        events.push(rx.recv_timeout(DEADLINE).expect("both requests finish"));
    }
    let position = |i: usize, want: fn(&GenerationEvent) -> bool| {
        events
            .iter()
            .position(|(j, e, _)| *j == i && want(e))
            .unwrap_or_else(|| panic!("request {i}: event missing in {events:?}"))
    };
    let started = |e: &GenerationEvent| matches!(e, GenerationEvent::Started);
    let text = |e: &GenerationEvent| matches!(e, GenerationEvent::Text(_));
    let done = |e: &GenerationEvent| matches!(e, GenerationEvent::Done(_));
    for i in 0..2 {
        assert!(position(i, started) < position(i, text), "{events:?}");
    }
    assert!(position(0, done) < position(1, started), "{events:?}");
    // Queue time is observable: the second waited for the whole first request.
    let second_queued_for = events[position(1, started)].2 - submitted;
    let first_done_after = events[position(0, done)].2 - submitted;
    assert!(second_queued_for >= first_done_after);
    for (i, r) in requests.iter().enumerate() {
        let GenerationEvent::Done(c) = &events[position(i, done)].1 else {
            unreachable!()
        };
        assert_eq!(c.tokens, alone(r).tokens, "request {i}");
    }
}

#[test]
fn queue_limit_gives_queue_full_and_cancel_removes_a_queued_request() {
    let model = smollm2();
    let engine = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            queue_limit: 1,
            ..config(1)
        },
    )
    .unwrap();
    // The first request holds the only slot (its sink blocks, then stops it).
    let (sink, first_rx, held, release) = gated_sink(false);
    engine
        .submit(request("Once upon a time", greedy(200)), sink)
        .unwrap();
    held.recv_timeout(DEADLINE).unwrap();

    let (sink, queued_rx) = channel_sink();
    let queued = engine.submit(request("Hello", greedy(4)), sink).unwrap();
    let (sink, _) = channel_sink();
    let err = engine
        .submit(request("Hello", greedy(4)), sink)
        .unwrap_err();
    assert!(matches!(err, EngineError::QueueFull), "{err}");
    assert!(err.to_string().contains("retry"), "{err}");
    assert_eq!((engine.status().active, engine.status().queued), (1, 1));

    engine.cancel(queued);
    assert_eq!(engine.status().queued, 0);
    assert!(events_until_dropped(&queued_rx).is_empty());

    let (sink, last_rx) = channel_sink();
    let last = request("The capital of France is", greedy(6));
    engine.submit(last.clone(), sink).unwrap();
    release.send(()).unwrap();
    // Started, then the text event that stopped it.
    let first_events = events_until_dropped(&first_rx);
    assert_eq!(first_events.len(), 2, "{first_events:?}");
    assert!(matches!(first_events[0], GenerationEvent::Started));
    assert_eq!(completed(&last_rx).tokens, alone(&last).tokens);
    assert_eq!(engine.status().requests_cancelled_total, 2);
}

#[test]
fn cancel_drops_an_active_request_before_the_next_step() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(1)).unwrap();
    let (sink, rx, held, release) = gated_sink(true);
    let id = engine
        .submit(request("Once upon a time", greedy(200)), sink)
        .unwrap();
    held.recv_timeout(DEADLINE).unwrap();
    engine.cancel(id);
    release.send(()).unwrap();
    // Started, the text event being delivered when it was cancelled, then
    // nothing more.
    let events = events_until_dropped(&rx);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(events[0], GenerationEvent::Started));
    let status = engine.status();
    assert_eq!(status.requests_cancelled_total, 1);
    assert_eq!(status.active, 0);
    assert_eq!(status.tokens_generated_total, 1);
}

#[test]
fn bad_requests_fail_at_submit() {
    let model = smollm2();
    let engine = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            n_ctx_per_seq: 64,
            ..config(2)
        },
    )
    .unwrap();
    let submit = |prompt: Vec<i32>, params: GenerateParams| {
        let (sink, _) = channel_sink();
        engine.submit(GenerateRequest { prompt, params }, sink)
    };
    let long = prompt::tokenize_raw(&model, &"word ".repeat(80)).unwrap();
    let err = submit(long.clone(), greedy(4)).unwrap_err();
    assert!(
        matches!(err, EngineError::PromptTooLong { prompt_tokens, n_ctx: 64 } if prompt_tokens == long.len()),
        "{err}"
    );
    // Exactly n_ctx_per_seq tokens leaves no room to generate.
    let err = submit(long[..64].to_vec(), greedy(4)).unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { .. }), "{err}");

    let err = submit(vec![], greedy(4)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    let err = submit(vec![1, 49_152], greedy(4)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    let bad_sampling = GenerateParams {
        sampling: SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        ..greedy(4)
    };
    let err = submit(vec![1, 2], bad_sampling).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    assert_eq!(engine.status().queued + engine.status().active, 0);

    let bad_config = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            n_parallel: 0,
            ..config(1)
        },
    );
    assert!(matches!(bad_config, Err(EngineError::InvalidArgument(_))));
}

#[test]
fn shutdown_completes_in_flight_requests_and_rejects_new_ones() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(2)).unwrap();
    let requests: Vec<GenerateRequest> =
        PROMPTS[..3].iter().map(|p| request(p, greedy(8))).collect();
    let receivers: Vec<_> = requests
        .iter()
        .map(|r| {
            let (sink, rx) = channel_sink();
            engine.submit(r.clone(), sink).unwrap();
            rx
        })
        .collect();
    let clone = engine.clone();
    engine.shutdown();
    // The worker has exited: every event is already in the channels.
    for (rx, r) in receivers.iter().zip(&requests) {
        let done = completed(rx);
        assert_eq!(done.tokens.len(), 8);
        assert_eq!(done.tokens, alone(r).tokens);
    }
    let (sink, _) = channel_sink();
    let err = clone.submit(requests[0].clone(), sink).unwrap_err();
    assert!(matches!(err, EngineError::ShuttingDown), "{err}");
    let status = clone.status();
    assert!(status.shutting_down);
    assert_eq!(status.requests_completed_total, 3);
    assert_eq!((status.active, status.queued), (0, 0));
}

#[test]
fn stop_strings_max_tokens_and_full_context_in_batched_mode() {
    let model = smollm2();
    let engine = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            n_ctx_per_seq: 48,
            ..config(4)
        },
    )
    .unwrap();
    let text = "The capital of France is";
    let full = alone(&request(text, greedy(24)));
    let word = full.text.split_whitespace().nth(3).unwrap().to_string();
    let at = full.text.find(&word).unwrap();

    let stop = request(
        text,
        GenerateParams {
            stop: vec![word.clone()],
            ..greedy(24)
        },
    );
    let short = request(text, greedy(5));
    // No max_tokens: generation runs until the sequence's 48 tokens are used.
    let unbounded = request(
        "one, two, three, four, five, six, seven,",
        GenerateParams {
            max_tokens: None,
            ..greedy(0)
        },
    );
    let receivers: Vec<_> = [&stop, &short, &unbounded]
        .iter()
        .map(|r| {
            let (sink, rx) = channel_sink();
            engine.submit((*r).clone(), sink).unwrap();
            rx
        })
        .collect();

    let stopped = completed(&receivers[0]);
    assert_eq!(stopped.text, full.text[..at], "stop {word:?}");
    assert_eq!(stopped.finish_reason, FinishReason::Stop);

    let five = completed(&receivers[1]);
    assert_eq!(five.tokens, full.tokens[..5]);
    assert_eq!(five.finish_reason, FinishReason::Length);

    let filled = completed(&receivers[2]);
    assert_eq!(filled.finish_reason, FinishReason::Length);
    assert_eq!(unbounded.prompt.len() + filled.tokens.len(), 48);
}

#[test]
fn a_panicking_sink_cancels_only_its_request() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(2)).unwrap();
    let panicking: EventSink = Box::new(|_| panic!("sink bug (expected by this test)"));
    engine
        .submit(request("Once upon a time", greedy(50)), panicking)
        .unwrap();
    let (sink, rx) = channel_sink();
    let ok = request("The capital of France is", greedy(8));
    engine.submit(ok.clone(), sink).unwrap();
    assert_eq!(completed(&rx).tokens, alone(&ok).tokens);
    // Both entered in the first step; the panic came with its Started event,
    // long before the other request's eighth token.
    let status = engine.status();
    assert_eq!(status.requests_cancelled_total, 1);
    assert_eq!(status.active, 0);
}

#[test]
fn embeddings_are_unit_vectors_that_tell_texts_apart() {
    let model = smollm2();
    let engine = BatchEngine::start(Arc::clone(&model), config(1)).unwrap();
    let texts: Vec<String> = [
        "The cat sat on the mat.",
        "Quarterly revenue grew by 4%.",
        "The cat sat on the mat.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let vectors = engine.embed(&texts).unwrap();
    assert_eq!(vectors.len(), 3);
    for v in &vectors {
        assert_eq!(v.len(), model.n_embd());
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
    assert_eq!(vectors[0], vectors[2]);
    let cosine: f32 = vectors[0].iter().zip(&vectors[1]).map(|(a, b)| a * b).sum();
    assert!(cosine < 0.999, "cosine {cosine}");
    // A second call reuses the context and gives the same vector.
    assert_eq!(engine.embed(&texts[..1]).unwrap()[0], vectors[0]);

    let err = engine.embed(&["word ".repeat(600)]).unwrap_err();
    assert!(
        matches!(err, EngineError::PromptTooLong { n_ctx: 512, .. }),
        "{err}"
    );
    let err = engine.embed(&[String::new()]).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
}

/// A text longer than one piece of [`llama_tiered::engine::EMBED_N_CTX`]
/// tokens is embedded whole, up to the served context: the same vector as
/// one decode of every token in a context as large as the text, and its
/// tail changes it.
#[test]
fn embeddings_cover_the_served_context_in_pieces() {
    let model = smollm2();
    let engine = BatchEngine::start(
        Arc::clone(&model),
        BatchConfig {
            n_ctx_per_seq: 2048,
            ..config(1)
        },
    )
    .unwrap();
    assert_eq!(engine.embed_n_ctx(), 2048);
    let head = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let tail_a = "Apples are red and grow on trees in the orchard. ".repeat(15);
    let tail_b = "Stock markets fell sharply after the bank raised rates. ".repeat(15);
    let a = model
        .tokenize(&format!("{head}{tail_a}"), true, false)
        .unwrap();
    let b = model
        .tokenize(&format!("{head}{tail_b}"), true, false)
        .unwrap();
    assert!(a.len() > 600 && a.len() < 1024, "{}", a.len());
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared > 590, "{shared}");
    let vectors = engine.embed_tokens(&[a.clone(), b]).unwrap();
    let cosine: f32 = vectors[0].iter().zip(&vectors[1]).map(|(x, y)| x * y).sum();
    eprintln!("two texts, the same first {shared} tokens: cosine {cosine}");
    assert!(cosine < 0.9999, "cosine {cosine}");

    // One decode of the whole text, pooled by llama.cpp.
    let params = ContextParams {
        n_ctx: 1024,
        n_batch: 1024,
        n_threads: 2,
        embeddings: true,
        mean_pooling: true,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), &params).unwrap();
    let mut batch = llama_tiered::llama::Batch::new(a.len());
    for (pos, &token) in a.iter().enumerate() {
        batch.push(token, pos as i32, 0, true).unwrap();
    }
    ctx.decode(&batch).unwrap();
    let whole = ctx.embeddings_seq(0).unwrap();
    let norm = whole.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cosine: f32 = whole
        .iter()
        .zip(&vectors[0])
        .map(|(x, y)| x / norm * y)
        .sum();
    eprintln!("pieces against one decode: cosine {cosine}");
    assert!(cosine > 0.9999, "cosine {cosine}");

    let err = engine.embed_tokens(&[vec![0; 2049]]).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::PromptTooLong {
                n_ctx: 2048,
                prompt_tokens: 2049
            }
        ),
        "{err}"
    );
    let err = engine
        .embed_tokens(&[vec![model.n_vocab() as i32]])
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
}

/// Aggregate decode throughput, 8 parallel requests against 1. Prints, asserts nothing:
/// `cargo test --release -p llama-tiered --test batch -- --ignored --nocapture`
/// (`HYPURA_BENCH_THREADS` sets the decoding threads; default all cores).
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_parallel_decode_throughput() {
    let model = smollm2();
    let threads = std::env::var("HYPURA_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for n in [1usize, 8] {
        let engine = BatchEngine::start(
            Arc::clone(&model),
            BatchConfig {
                n_threads: threads,
                ..config(n as u32)
            },
        )
        .unwrap();
        // Warm-up (first-use allocations), not measured.
        let (sink, rx) = channel_sink();
        engine.submit(request(PROMPTS[0], greedy(4)), sink).unwrap();
        completed(&rx);

        let started = Instant::now();
        let receivers: Vec<_> = PROMPTS[..n]
            .iter()
            .map(|p| {
                let (sink, rx) = channel_sink();
                engine.submit(request(p, greedy(64)), sink).unwrap();
                rx
            })
            .collect();
        let done: Vec<Completion> = receivers.iter().map(completed).collect();
        let wall = started.elapsed().as_secs_f64();
        let generated: usize = done.iter().map(|c| c.tokens.len()).sum();
        let eval_tps: f64 = done
            .iter()
            .map(|c| c.timings.eval_tokens_per_second())
            .sum::<f64>()
            / n as f64;
        println!(
            "n_parallel {n}: {generated} tokens in {wall:.3} s = {:.1} tok/s aggregate \
             (incl. prompts); per request decode {eval_tps:.1} tok/s, aggregate decode {:.1} tok/s; {} steps",
            generated as f64 / wall,
            eval_tps * n as f64,
            engine.status().decode_steps_total,
        );
    }
}
