//! The engine against real llama.cpp on the real SmolLM2 model.
use std::sync::Arc;

use hypura_chat::ChatMessage;
use hypura_llama_sys as sys;
use llama_tiered::engine::generate::{generate, FinishReason, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::llama::{Batch, Context, ContextParams, Model, SamplingParams};
use llama_tiered::{test_models, EngineError};

fn smollm2() -> Arc<Model> {
    test_models::smollm2_model()
}

fn context(model: &Arc<Model>, n_seq_max: u32) -> Context {
    let params = ContextParams {
        n_ctx: 1024,
        n_seq_max,
        n_threads: 2,
        ..Default::default()
    };
    Context::new(Arc::clone(model), &params).expect("context")
}

fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: vec![],
        cache_prompt: true,
    }
}

/// A plain llama.cpp decode loop written directly against the C API: tokenize,
/// `llama_decode`, argmax of the logits. The reference for greedy decoding.
fn reference_greedy(text: &str, n: usize) -> Vec<i32> {
    let path = std::ffi::CString::new(test_models::smollm2().to_str().unwrap()).unwrap();
    // SAFETY: straightforward use of the C API; every pointer is checked or
    // sized from the API's own return values; everything is freed at the end.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        mp.n_gpu_layers = 0;
        let model = sys::llama_model_load_from_file(path.as_ptr(), mp);
        assert!(!model.is_null());
        let vocab = sys::llama_model_get_vocab(model);
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 512;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        let ctx = sys::llama_init_from_model(model, cp);
        assert!(!ctx.is_null());
        let mut tokens = vec![0i32; 512];
        let n_prompt = sys::llama_tokenize(
            vocab,
            text.as_ptr().cast(),
            text.len() as i32,
            tokens.as_mut_ptr(),
            tokens.len() as i32,
            true,
            true,
        );
        assert!(n_prompt > 0);
        tokens.truncate(n_prompt as usize);
        let n_vocab = sys::llama_vocab_n_tokens(vocab) as usize;
        let mut out = Vec::new();
        let mut batch = sys::llama_batch_get_one(tokens.as_mut_ptr(), tokens.len() as i32);
        let mut next: i32;
        for _ in 0..n {
            assert_eq!(sys::llama_decode(ctx, batch), 0);
            let logits = std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, -1), n_vocab);
            next = logits
                .iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |best, (i, &l)| {
                    if l > best.1 {
                        (i, l)
                    } else {
                        best
                    }
                })
                .0 as i32;
            out.push(next);
            if sys::llama_vocab_is_eog(vocab, next) {
                break;
            }
            batch = sys::llama_batch_get_one(&mut next, 1);
        }
        sys::llama_free(ctx);
        sys::llama_model_free(model);
        out
    }
}

#[test]
fn greedy_raw_completion_equals_plain_llama_cpp_decode_loop() {
    let model = smollm2();
    for text in [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a land far away,",
    ] {
        let mut ctx = context(&model, 1);
        let tokens = prompt::tokenize_raw(&model, text).unwrap();
        let completion = generate(&mut ctx, 0, &tokens, &greedy(32), &mut |_| true).unwrap();
        let expected = reference_greedy(text, 32);
        assert_eq!(completion.tokens, expected, "prompt {text:?}");
    }
}

/// The sampler inside the decode graph (`set_device_greedy`, hypura's
/// two-stage argmax) chooses the argmax of the logits the host would have
/// read, step by step;
/// `generate` uses it for plain greedy and not for sampling.
#[test]
fn device_greedy_chooses_the_host_argmax_and_only_for_plain_greedy() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "Once upon a time, in a land far away,").unwrap();
    let mut host = context(&model, 1);
    let mut device = context(&model, 1);
    assert!(device.set_device_greedy(0, true));
    assert!(device.device_greedy(0));
    // SmolLM2's 49,152 logits as 256 rows of 192.
    assert_eq!(
        device.device_greedy_name(0).as_deref(),
        Some("greedy-two-stage")
    );
    let steps = test_models::greedy_side_by_side(&mut host, &mut device, &tokens, 24);
    for (step, seen) in steps.iter().enumerate() {
        assert_eq!(seen.host_sampled, None, "the host context samples nothing");
        assert_eq!(seen.device_sampled, Some(seen.argmax), "step {step}");
    }
    assert!(!device.set_device_greedy(0, false));
    let mut one = Batch::new(1);
    one.push(tokens[0], tokens.len() as i32 + 24, 0, true)
        .unwrap();
    device.decode(&one).unwrap();
    assert_eq!(device.sampled_token(0), None);
    assert!(device.logits(0).is_ok());

    let mut ctx = context(&model, 1);
    generate(&mut ctx, 0, &tokens, &greedy(4), &mut |_| true).unwrap();
    assert!(ctx.device_greedy(0));
    let mut sampled = greedy(4);
    sampled.sampling.temperature = 0.8;
    sampled.sampling.seed = Some(7);
    ctx.clear_all();
    generate(&mut ctx, 0, &tokens, &sampled, &mut |_| true).unwrap();
    assert!(!ctx.device_greedy(0));
}

#[test]
fn capital_of_france_is_paris() {
    let model = smollm2();
    let mut ctx = context(&model, 1);
    let tokens = prompt::tokenize_raw(&model, "The capital of France is").unwrap();
    let completion = generate(&mut ctx, 0, &tokens, &greedy(8), &mut |_| true).unwrap();
    assert!(
        completion.text.starts_with(" Paris."),
        "{:?}",
        completion.text
    );
    assert_eq!(completion.finish_reason, FinishReason::Length);
    assert_eq!(completion.tokens.len(), 8);
}

#[test]
fn streamed_pieces_concatenate_to_the_detokenized_text() {
    let model = smollm2();
    let mut ctx = context(&model, 1);
    // Non-ASCII output makes characters span several byte-level tokens.
    let tokens = prompt::tokenize_raw(&model, "Translate to Japanese: Good morning =").unwrap();
    let mut pieces = String::new();
    let completion = generate(&mut ctx, 0, &tokens, &greedy(40), &mut |p| {
        pieces.push_str(p);
        true
    })
    .unwrap();
    let body: Vec<i32> = completion
        .tokens
        .iter()
        .copied()
        .filter(|&t| !model.is_eog(t))
        .collect();
    assert_eq!(pieces, completion.text);
    assert_eq!(pieces, model.detokenize(&body, false));
}

#[test]
fn stop_string_ends_generation_and_is_not_returned() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "The capital of France is").unwrap();
    let full = generate(
        &mut context(&model, 1),
        0,
        &tokens,
        &greedy(24),
        &mut |_| true,
    )
    .unwrap();
    // Stop at a word from the middle of the greedy continuation.
    let word = full
        .text
        .split_whitespace()
        .nth(3)
        .expect("a few words")
        .to_string();
    let at = full.text.find(&word).unwrap();
    let params = GenerateParams {
        stop: vec![word.clone()],
        ..greedy(24)
    };
    let mut streamed = String::new();
    let stopped = generate(&mut context(&model, 1), 0, &tokens, &params, &mut |p| {
        streamed.push_str(p);
        true
    })
    .unwrap();
    assert_eq!(stopped.text, full.text[..at], "stop {word:?}");
    assert_eq!(streamed, stopped.text);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
}

#[test]
fn chat_reply_ends_on_end_of_generation_token() {
    let model = smollm2();
    let template = prompt::model_template(&model).unwrap();
    let france = [ChatMessage::new("user", "What is the capital of France?")];
    assert_eq!(
        prompt::render_chat(&template, &france).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let rendered = prompt::render_chat(
        &template,
        &[ChatMessage::new("user", "What is the capital of Germany?")],
    )
    .unwrap();
    let tokens = prompt::tokenize_chat(&model, &rendered).unwrap();
    // Special-token text became single special tokens.
    assert_eq!(model.token_text(tokens[0]).as_deref(), Some("<|im_start|>"));
    let completion = generate(
        &mut context(&model, 1),
        0,
        &tokens,
        &greedy(128),
        &mut |_| true,
    )
    .unwrap();
    assert_eq!(completion.finish_reason, FinishReason::Stop);
    assert!(model.is_eog(*completion.tokens.last().unwrap()));
    // SmolLM2-135M's greedy answer, verified against the plain decode loop.
    assert_eq!(completion.text, "The capital of Germany is Berlin.");
}

#[test]
fn two_sequences_in_one_context_are_independent() {
    let model = smollm2();
    let mut shared = context(&model, 2);
    let a = prompt::tokenize_raw(&model, "The capital of France is").unwrap();
    let b = prompt::tokenize_raw(&model, "My favourite colour is").unwrap();
    let a_shared = generate(&mut shared, 0, &a, &greedy(16), &mut |_| true).unwrap();
    let b_shared = generate(&mut shared, 1, &b, &greedy(16), &mut |_| true).unwrap();
    let a_alone = generate(&mut context(&model, 1), 0, &a, &greedy(16), &mut |_| true).unwrap();
    let b_alone = generate(&mut context(&model, 1), 0, &b, &greedy(16), &mut |_| true).unwrap();
    assert_eq!(a_shared.tokens, a_alone.tokens);
    assert_eq!(b_shared.tokens, b_alone.tokens);
}

#[test]
fn callback_returning_false_cancels() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "Once upon a time").unwrap();
    let mut pieces = 0;
    let completion = generate(
        &mut context(&model, 1),
        0,
        &tokens,
        &greedy(100),
        &mut |_| {
            pieces += 1;
            pieces < 3
        },
    )
    .unwrap();
    assert_eq!(completion.finish_reason, FinishReason::Cancelled);
    assert!(completion.tokens.len() < 10, "{}", completion.tokens.len());
}

#[test]
fn abort_flag_cancels_decoding() {
    let model = smollm2();
    let mut ctx = context(&model, 1);
    let flag = ctx.abort_flag();
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
    let tokens = prompt::tokenize_raw(&model, "Hello").unwrap();
    let err = generate(&mut ctx, 0, &tokens, &greedy(4), &mut |_| true).unwrap_err();
    assert!(matches!(err, EngineError::Cancelled), "{err}");
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "Once upon a time").unwrap();
    let run = |seed| {
        let sampling = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..Default::default()
        };
        let params = GenerateParams {
            sampling,
            max_tokens: Some(24),
            stop: vec![],
            cache_prompt: true,
        };
        generate(&mut context(&model, 1), 0, &tokens, &params, &mut |_| true)
            .unwrap()
            .tokens
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn prompt_longer_than_context_is_a_clear_error() {
    let model = smollm2();
    let params = ContextParams {
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::clone(&model), &params).unwrap();
    let tokens = prompt::tokenize_raw(&model, &"word ".repeat(ctx.n_ctx() as usize + 10)).unwrap();
    let err = generate(&mut ctx, 0, &tokens, &greedy(4), &mut |_| true).unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { .. }), "{err}");
    assert!(err.to_string().contains("context"), "{err}");
}

#[test]
fn absurd_sampling_options_are_rejected() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "Hi").unwrap();
    for sampling in [
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            top_p: -0.5,
            ..Default::default()
        },
        SamplingParams {
            repeat_penalty: 0.0,
            ..Default::default()
        },
    ] {
        let params = GenerateParams {
            sampling,
            max_tokens: Some(2),
            stop: vec![],
            cache_prompt: true,
        };
        let err =
            generate(&mut context(&model, 1), 0, &tokens, &params, &mut |_| true).unwrap_err();
        assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    }
}

#[test]
fn repeat_penalty_changes_greedy_output() {
    let model = smollm2();
    let tokens = prompt::tokenize_raw(&model, "one one one one one one").unwrap();
    let plain = generate(&mut context(&model, 1), 0, &tokens, &greedy(8), &mut |_| {
        true
    })
    .unwrap();
    let sampling = SamplingParams {
        repeat_penalty: 1.5,
        ..SamplingParams::greedy()
    };
    let params = GenerateParams {
        sampling,
        max_tokens: Some(8),
        stop: vec![],
        cache_prompt: true,
    };
    let penalized = generate(&mut context(&model, 1), 0, &tokens, &params, &mut |_| true).unwrap();
    assert_ne!(plain.tokens, penalized.tokens);
}
