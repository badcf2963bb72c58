//! The prompt cache against real llama.cpp: a conversation's later turn
//! decodes only its new tokens (from its slot, from RAM, from NVMe) and
//! gives exactly the tokens a cold run of the same prompt gives.
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hypura_synth as synth;
use llama_tiered::engine::generate::{Completion, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{
    BatchConfig, BatchEngine, GenerateRequest, GenerationEvent, PromptCacheConfig,
};
use llama_tiered::llama::{Model, ModelParams, SamplingParams};
use llama_tiered::test_models;

const DEADLINE: Duration = Duration::from_secs(300);

/// A system prompt of several hundred tokens, as agents send.
fn system_text() -> String {
    (0..40)
        .map(|i| {
            format!("Rule {i}: answer briefly, cite the file you read, and never invent a path. ")
        })
        .collect()
}

fn config(n_parallel: u32, prompt_cache: PromptCacheConfig) -> BatchConfig {
    BatchConfig {
        n_parallel,
        n_ctx_per_seq: 2048,
        n_batch: 256,
        n_ubatch: 0,
        n_threads: 2,
        queue_limit: 16,
        prompt_cache,
    }
}

fn greedy(max_tokens: u32, cache_prompt: bool) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: vec![],
        cache_prompt,
    }
}

fn run(engine: &BatchEngine, prompt: &[i32], cache_prompt: bool) -> Completion {
    run_for(engine, prompt, cache_prompt, 12)
}

/// `run` with a reply of `max_tokens`: long enough, a reply shows whether
/// the KV under it was the prompt's own.
fn run_for(
    engine: &BatchEngine,
    prompt: &[i32],
    cache_prompt: bool,
    max_tokens: u32,
) -> Completion {
    let (tx, rx) = mpsc::channel();
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        params: greedy(max_tokens, cache_prompt),
    };
    engine
        .submit(request, Box::new(move |e| tx.send(e).is_ok()))
        .unwrap();
    done(&rx)
}

fn done(rx: &Receiver<GenerationEvent>) -> Completion {
    loop {
        match rx.recv_timeout(DEADLINE).expect("an outcome") {
            GenerationEvent::Done(c) => return c,
            GenerationEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
}

fn tokens(model: &Model, text: &str) -> Vec<i32> {
    prompt::tokenize_raw(model, text).unwrap()
}

/// A conversation's turns: each the previous prompt, its reply, and a new question.
fn turns(model: &Model, engine: &BatchEngine, questions: &[&str]) -> Vec<(Vec<i32>, Completion)> {
    let mut prompt = tokens(model, &system_text());
    let mut out = Vec::new();
    for q in questions {
        prompt.extend(tokens(model, &format!("\nUser: {q}\nAssistant:"))[1..].iter());
        let reply = run(engine, &prompt, true);
        out.push((prompt.clone(), reply.clone()));
        prompt.extend(&reply.tokens);
    }
    out
}

/// A cold run of `prompt`: an engine of its own, nothing cached.
fn cold(model: &Arc<Model>, prompt: &[i32]) -> Completion {
    let engine = BatchEngine::start(Arc::clone(model), config(1, Default::default())).unwrap();
    run(&engine, prompt, false)
}

#[test]
fn a_later_turn_decodes_only_its_new_tokens_and_matches_a_cold_run() {
    let model = test_models::smollm2_model();
    let engine = BatchEngine::start(Arc::clone(&model), config(2, Default::default())).unwrap();
    let questions = ["Which file holds the config?", "And the tests?", "Thanks."];
    let history = turns(&model, &engine, &questions);
    let (first, reply) = &history[0];
    assert_eq!(reply.timings.cached_prompt_tokens, 0);
    assert_eq!(reply.timings.prompt_tokens, first.len());
    for (k, (prompt, reply)) in history.iter().enumerate().skip(1) {
        let (previous, previous_reply) = &history[k - 1];
        // The previous prompt and every reply token but the last (never decoded).
        let held = previous.len() + previous_reply.tokens.len() - 1;
        assert_eq!(reply.timings.cached_prompt_tokens, held, "turn {k}");
        assert_eq!(reply.timings.prompt_tokens, prompt.len() - held, "turn {k}");
        assert_eq!(reply.tokens, cold(&model, prompt).tokens, "turn {k}");
    }
    let status = engine.status().prompt_cache;
    assert_eq!(status.slot_hits_total, 2);
    let asked: usize = history.iter().map(|(p, _)| p.len()).sum();
    assert_eq!(status.query_tokens_total, asked as u64);

    // A prompt that leaves the conversation in its middle keeps what it shares.
    let (prompt, _) = &history[2];
    let mut edited = prompt[..prompt.len() / 2].to_vec();
    edited.extend(tokens(&model, " Something else entirely.")[1..].iter());
    let reply = run(&engine, &edited, true);
    assert_eq!(reply.timings.cached_prompt_tokens, prompt.len() / 2);
    assert_eq!(reply.tokens, cold(&model, &edited).tokens);

    // Opting out reads the whole prompt.
    let reply = run(&engine, prompt, false);
    assert_eq!(reply.timings.cached_prompt_tokens, 0);
    assert_eq!(reply.timings.prompt_tokens, prompt.len());
}

#[test]
fn two_users_on_one_slot_alternate_through_the_ram_tier() {
    let model = test_models::smollm2_model();
    let cache = PromptCacheConfig {
        ram_bytes: 256 << 20,
        ..Default::default()
    };
    let engine = BatchEngine::start(Arc::clone(&model), config(1, cache)).unwrap();
    let alice = tokens(&model, &format!("{}\nUser: I am Alice.", system_text()));
    let bob = tokens(
        &model,
        "<|im_start|>user\nWrite a long travel guide to Lisbon: its weather in each month, \
        the sea temperature, and which beaches are reachable by train.<|im_end|>\n<|im_start|>assistant\n",
    );
    let a1 = run(&engine, &alice, true);
    let b1 = run(&engine, &bob, true);
    // Alice's next turn: her slot went to Bob, her state waits in RAM.
    let mut alice2 = alice.clone();
    alice2.extend(&a1.tokens);
    alice2.extend(tokens(&model, "\nUser: What was my name?")[1..].iter());
    let a2 = run(&engine, &alice2, true);
    let held = alice.len() + a1.tokens.len() - 1;
    assert_eq!(a2.timings.cached_prompt_tokens, held);
    assert_eq!(a2.tokens, cold(&model, &alice2).tokens);
    // Bob's too.
    let mut bob2 = bob.clone();
    bob2.extend(&b1.tokens);
    bob2.extend(
        tokens(
            &model,
            "<|im_end|>\n<|im_start|>user\nNow the same for Porto.<|im_end|>\n<|im_start|>assistant\n",
        )[1..]
            .iter(),
    );
    // Saving Alice's turn drops her first one from RAM: Bob's lookup must
    // still restore Bob's state, not whatever took its place in the tier.
    let b2 = run_for(&engine, &bob2, true, 48);
    assert_eq!(
        b2.timings.cached_prompt_tokens,
        bob.len() + b1.tokens.len() - 1
    );
    // The reference: Bob's two turns in a slot of his own (his restored KV
    // was computed that way: the prompt in a batch, the reply token by token).
    let alone = BatchEngine::start(Arc::clone(&model), config(1, Default::default())).unwrap();
    assert_eq!(run(&alone, &bob, true).tokens, b1.tokens);
    assert_eq!(b2.tokens, run_for(&alone, &bob2, true, 48).tokens);

    let status = engine.status().prompt_cache;
    assert_eq!(status.ram_restores_total, 2, "{status:?}");
    assert!(status.saves_total >= 2, "{status:?}");
    assert!(status.ram_bytes > 0 && status.ram_bytes <= 256 << 20);

    // A smaller budget evicts down to it.
    engine.set_prompt_cache_ram_bytes(0);
    let deadline = std::time::Instant::now() + DEADLINE;
    while engine.status().prompt_cache.ram_bytes > 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(engine.status().prompt_cache.ram_limit_bytes, 0);
}

/// The next turn's prompt: `prompt`, its `reply`, then `text`.
fn continued(model: &Model, prompt: &[i32], reply: &Completion, text: &str) -> Vec<i32> {
    [prompt, &reply.tokens, &tokens(model, text)[1..]].concat()
}

/// The same requests one after another on an engine of one slot: each
/// later one starts from what the slot kept, the computation a slot hit
/// makes, token for token (a cold run computes a reply's tokens in one
/// batch instead of one at a time, and near ties may then break the other
/// way).
fn in_one_slot(model: &Arc<Model>, prompts: &[&[i32]]) -> Vec<Completion> {
    let engine = BatchEngine::start(Arc::clone(model), config(1, Default::default())).unwrap();
    prompts.iter().map(|p| run(&engine, p, true)).collect()
}

#[test]
fn idle_slots_keep_more_conversations_than_decode_at_once() {
    let model = test_models::smollm2_model();
    // One decoding slot, three idle ones, no RAM tier: three conversations
    // take turns and each finds its KV in a slot, never saved or restored.
    let cache = PromptCacheConfig {
        idle_slots: 3,
        ..Default::default()
    };
    let engine = BatchEngine::start(Arc::clone(&model), config(1, cache)).unwrap();
    let users: Vec<Vec<i32>> = ["Alice", "Bob", "Carol"]
        .iter()
        .map(|name| {
            tokens(
                &model,
                &format!("{name} asks. {}\nUser: Hello.", system_text()),
            )
        })
        .collect();
    let first: Vec<Completion> = users.iter().map(|p| run(&engine, p, true)).collect();
    // Each user's second prompt, and that turn's reply.
    let mut seconds = Vec::new();
    for (user, reply) in users.iter().zip(&first) {
        let next = continued(&model, user, reply, "\nUser: What was my name?");
        let again = run(&engine, &next, true);
        assert_eq!(
            again.timings.cached_prompt_tokens,
            user.len() + reply.tokens.len() - 1
        );
        // What the same turns give in a slot of their own.
        let alone = in_one_slot(&model, &[user, &next]);
        assert_eq!(again.tokens, alone[1].tokens);
        seconds.push((next, again));
    }
    let status = engine.status();
    assert_eq!(status.prompt_cache.slot_hits_total, 3, "{status:?}");
    assert_eq!(status.prompt_cache.saves_total, 0, "{status:?}");

    // Dave's prompt leaves Alice's conversation 60 tokens before its end:
    // the shared prefix is copied into the empty slot, and Alice's next
    // turn still finds all of hers.
    let (alice2, alice2_reply) = &seconds[0];
    let alice = [alice2.as_slice(), &alice2_reply.tokens].concat();
    let shared = alice.len() - 60;
    let mut dave = alice[..shared].to_vec();
    dave.extend(tokens(&model, " Something else entirely, Dave speaking.")[1..].iter());
    let reply = run(&engine, &dave, true);
    assert_eq!(reply.timings.cached_prompt_tokens, shared);
    let alone = in_one_slot(&model, &[&users[0], alice2, &dave]);
    assert_eq!(reply.tokens, alone[2].tokens);
    let alice3 = continued(&model, alice2, alice2_reply, "\nUser: And again?");
    let again = run(&engine, &alice3, true);
    assert!(again.timings.cached_prompt_tokens >= alice.len() - 1);
    let alone = in_one_slot(&model, &[&users[0], alice2, &alice3]);
    assert_eq!(again.tokens, alone[2].tokens);

    // Three at once: one decodes, two wait, though four slots are free.
    let (tx, rx) = mpsc::channel();
    for user in &users {
        let tx = tx.clone();
        let request = GenerateRequest {
            prompt: user.clone(),
            params: greedy(24, true),
        };
        engine
            .submit(request, Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
    }
    drop(tx);
    let mut finished = 0;
    while finished < users.len() {
        let status = engine.status();
        assert!(status.active <= 1, "{status:?}");
        match rx.recv_timeout(DEADLINE).expect("an outcome") {
            GenerationEvent::Done(_) => finished += 1,
            GenerationEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
}

/// A copy of SmolLM2 under a folder of the test's own (a model "replaced on disk").
fn copy_of_smollm2(dir: &Path) -> PathBuf {
    let path = dir.join("smollm2.gguf");
    std::fs::copy(test_models::smollm2(), &path).unwrap();
    path
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-pc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load(path: &Path) -> Arc<Model> {
    Arc::new(Model::load(path, ModelParams::default()).unwrap())
}

#[test]
fn a_conversation_survives_a_restart_on_nvme_and_a_replaced_model_never_loads_it() {
    let dir = scratch("disk");
    let model_path = copy_of_smollm2(&dir);
    let cache = PromptCacheConfig {
        ram_bytes: 0,
        disk_dir: Some(dir.join("kv")),
        disk_bytes: 1 << 30,
        disk_read_bytes_per_second: 0,
        idle_slots: 0,
    };
    let alice = {
        let model = load(&model_path);
        tokens(&model, &format!("{}\nUser: I am Alice.", system_text()))
    };
    let a1 = {
        let model = load(&model_path);
        let engine = BatchEngine::start(Arc::clone(&model), config(1, cache.clone())).unwrap();
        let a1 = run(&engine, &alice, true);
        engine.shutdown();
        // Written when the engine stopped (only the slot held it).
        assert_eq!(engine.status().prompt_cache.disk_entries, 1);
        a1
    };
    let mut alice2 = alice.clone();
    alice2.extend(&a1.tokens);
    alice2.extend(tokens(&load(&model_path), "\nUser: What was my name?")[1..].iter());
    let model = load(&model_path);
    let engine = BatchEngine::start(Arc::clone(&model), config(1, cache.clone())).unwrap();
    let a2 = run(&engine, &alice2, true);
    assert_eq!(
        a2.timings.cached_prompt_tokens,
        alice.len() + a1.tokens.len() - 1
    );
    assert_eq!(engine.status().prompt_cache.disk_restores_total, 1);
    assert_eq!(a2.tokens, cold(&model, &alice2).tokens);
    engine.shutdown();
    drop((engine, model));

    // The file replaced (another write, a new modification time): nothing loads.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&model_path, std::fs::read(test_models::smollm2()).unwrap()).unwrap();
    let model = load(&model_path);
    let engine = BatchEngine::start(Arc::clone(&model), config(1, cache)).unwrap();
    let again = run(&engine, &alice2, true);
    assert_eq!(again.timings.cached_prompt_tokens, 0);
    assert_eq!(engine.status().prompt_cache.disk_restores_total, 0);
    assert_eq!(again.tokens, a2.tokens);
    engine.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// SmolLM2 made a MoE (4 experts, 2 used, real routing).
fn smollm2_moe() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        synth::cached::derived_moe(&test_models::smollm2(), 4, 2, 0.01, 7).expect("derive MoE")
    })
}

#[test]
fn a_later_turn_on_a_moe_matches_a_cold_run() {
    let model = load(smollm2_moe());
    let engine = BatchEngine::start(Arc::clone(&model), config(1, Default::default())).unwrap();
    let history = turns(
        &model,
        &engine,
        &["Which file holds the config?", "And the tests?"],
    );
    let (prompt, reply) = &history[1];
    assert!(reply.timings.cached_prompt_tokens > history[0].0.len());
    assert_eq!(reply.tokens, cold(&model, prompt).tokens);
}
