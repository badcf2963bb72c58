//! Routing profiles, measured: small MoEs written with each profile run
//! through llama.cpp on the CPU while [`RoutingRecorder`] keeps the experts
//! every layer chose; the generated tokens' statistics must be the
//! profile's (popularity skew, overlap of consecutive tokens), and
//! `uniform` and `degenerate` must be what they say.
use std::path::Path;
use std::sync::Arc;

use hypura_synth::{cached, Arch, Routing, SynthSpec};
use llama_tiered::llama::gguf_write::GgmlType;
use llama_tiered::llama::{Batch, Context, ContextParams, Model, ModelParams};
use llama_tiered::tiered::routing::{RoutingRecorder, RoutingSummary};

/// Generated tokens measured: fewer than the tiny vocabulary's normal
/// tokens, so none repeats.
const GENERATED: usize = 600;

/// A Qwen3-MoE layout of 64 experts, 4 used, 3 layers of 256 wide (with
/// fewer experts, Qwen3's popularity alone overlaps more than its target).
fn tiny_qwen3(routing: Routing) -> SynthSpec {
    SynthSpec::tiny_qwen3_moe()
        .with_weight_type(GgmlType::Q8_0)
        .with_routing(routing)
}

/// Tiny Mixtral layout with Mixtral's 8 experts, 2 used.
fn tiny_mixtral8(routing: Routing) -> SynthSpec {
    SynthSpec {
        arch: Arch::Mixtral {
            n_expert: 8,
            n_expert_used: 2,
        },
        ..SynthSpec::tiny_mixtral().with_layers(3)
    }
    .with_routing(routing)
}

/// Greedy generation of [`GENERATED`] tokens after a short prompt; the
/// routing statistics of the generated tokens, and how many distinct
/// tokens were generated.
fn generated_routing(path: &Path, n_expert: usize) -> (RoutingSummary, usize) {
    let model = Arc::new(Model::load(path, ModelParams::default()).expect("load"));
    let params = ContextParams {
        n_ctx: 1024,
        n_batch: 64,
        n_threads: 2,
        ..Default::default()
    };
    let recorder = RoutingRecorder::new(None);
    let mut ctx =
        Context::with_hook(Arc::clone(&model), &params, Some(recorder.clone())).expect("context");
    recorder.set_recording(true);
    let prompt = model.tokenize("Hello world, the cat", true, false).unwrap();
    let mut batch = Batch::new(64);
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == prompt.len()).unwrap();
    }
    ctx.decode(&batch).unwrap();
    let mut row = prompt.len() as i32 - 1;
    let mut tokens = Vec::new();
    for k in 0..GENERATED {
        let logits = ctx.logits(row).unwrap();
        let next = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as i32;
        tokens.push(next);
        batch.clear();
        row = batch
            .push(next, (prompt.len() + k) as i32, 0, true)
            .unwrap();
        ctx.decode(&batch).unwrap();
    }
    recorder.set_recording(false);
    let trace = recorder.trace();
    // Every layer saw every token, but the last layer only the prompt's last.
    let rows: Vec<usize> = trace.layers.iter().map(Vec::len).collect();
    let n = prompt.len() + GENERATED;
    assert_eq!(rows[..rows.len() - 1], vec![n; rows.len() - 1], "{rows:?}");
    assert_eq!(rows.last(), Some(&(GENERATED + 1)));
    let summary = trace.split_last(GENERATED).1.summary(n_expert);
    tokens.sort_unstable();
    tokens.dedup();
    (summary, tokens.len())
}

fn run(spec: &SynthSpec) -> (RoutingSummary, usize) {
    let path = cached::model(spec).expect("write the model");
    let (n_expert, _) = spec.arch.experts().unwrap();
    let (s, distinct) = generated_routing(&path, n_expert as usize);
    eprintln!(
        "{} {}: overlap {:.3}, concentration {:.3}, top share {:.3}, {distinct} distinct tokens; histogram {:?}",
        spec.name,
        spec.routing.name(),
        s.overlap,
        s.concentration,
        s.top_share,
        s.histogram
    );
    (s, distinct)
}

/// Sorted shares of one layer's histogram, descending.
fn sorted_shares(hist: &[u64]) -> Vec<f64> {
    let total: u64 = hist.iter().sum();
    let mut s: Vec<f64> = hist.iter().map(|&h| h as f64 / total as f64).collect();
    s.sort_by(|a, b| b.total_cmp(a));
    s
}

/// Measured against the profile: overlap and concentration within 0.04,
/// each layer's sorted selection shares within 0.2 total variation of the
/// profile's (600 tokens: sampling noise).
fn assert_profile(spec: &SynthSpec) {
    let profile = spec.routing.profile().unwrap();
    let (n_expert, used) = spec.arch.experts().unwrap();
    let (s, distinct) = run(spec);
    assert!(
        distinct > GENERATED * 9 / 10,
        "generation loops: {distinct} distinct tokens of {GENERATED}"
    );
    let want = profile.overlap.unwrap();
    assert!(
        (s.overlap - want).abs() < 0.04,
        "overlap {:.3}, profile {want}",
        s.overlap
    );
    let target = profile.shares(n_expert as usize, used as usize);
    for hist in &s.histogram {
        let got = sorted_shares(hist);
        let tv: f64 = got
            .iter()
            .zip(&target)
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 0.2, "shares {got:?} against {target:?}: TV {tv:.3}");
    }
    let c = profile.concentration(n_expert as usize, used as usize);
    assert!(
        (s.concentration - c).abs() < 0.04,
        "concentration {:.3}, profile {c:.3}",
        s.concentration
    );
}

#[test]
fn qwen3_profile_routes_as_set() {
    assert_profile(&tiny_qwen3(Routing::Qwen3));
}

#[test]
fn mixtral_profile_routes_as_set() {
    assert_profile(&tiny_mixtral8(Routing::Mixtral));
}

#[test]
fn uniform_and_degenerate_differ_as_named() {
    let (uniform, _) = run(&tiny_qwen3(Routing::Uniform));
    // Independent uniform choices of 4 of 64: overlap 1/16.
    assert!(
        (uniform.overlap - 0.0625).abs() < 0.03,
        "{}",
        uniform.overlap
    );
    assert!(uniform.concentration < 0.02, "{}", uniform.concentration);
    let (degenerate, _) = run(&tiny_qwen3(Routing::Degenerate));
    assert_eq!(degenerate.overlap, 1.0);
    for hist in &degenerate.histogram {
        let chosen: Vec<u64> = hist.iter().copied().filter(|&h| h > 0).collect();
        assert_eq!(chosen, vec![GENERATED as u64; 4], "{hist:?}");
    }
    let (qwen3, _) = run(&tiny_qwen3(Routing::Qwen3));
    assert!(qwen3.concentration > uniform.concentration + 0.05);
    assert!(qwen3.overlap > uniform.overlap + 0.05 && qwen3.overlap < 0.9);
}
