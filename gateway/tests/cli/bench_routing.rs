//! `hypura bench --routing --json` reports the experts a MoE's layers chose
//! in an untimed run: per-layer histograms and the overlap of consecutive
//! tokens' experts, whole and split into prompt and decode, with the
//! synthetic model's routing profile named; `--routing-trace` writes the
//! decode's choices themselves. Small synthetic MoEs, CPU only.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hypura_synth::{self as synth, Routing, SynthSpec};
use llama_tiered::llama::gguf_write::GgmlType;
use serde_json::Value;

const DECODE: u64 = 300;
const PROMPT: u64 = 16;

fn hypura(args: &[&str]) -> Output {
    let cache = std::env::temp_dir().join(format!("hypura-bench-routing-{}", std::process::id()));
    Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(args)
        .env("HYPURA_CACHE_DIR", cache)
        .output()
        .expect("run hypura")
}

/// 64 experts, 4 used, 3 layers of 256 wide (Qwen3-MoE layout).
fn tiny_moe(routing: Routing) -> PathBuf {
    let spec = SynthSpec::tiny_qwen3_moe()
        .with_weight_type(GgmlType::Q8_0)
        .with_routing(routing);
    synth::cached::model(&spec).expect("write the model")
}

/// The bench report of `model`, planned with the H200 profile for its CPU
/// side (`--gpu-budget 0`): the plan does not matter here.
fn bench(model: &Path, extra: &[&str]) -> Output {
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/profiles/h200.json");
    let (decode, prompt) = (DECODE.to_string(), PROMPT.to_string());
    let mut args = vec![
        "bench",
        model.to_str().unwrap(),
        "--json",
        "--tokens",
        &decode,
        "--prompt-tokens",
        &prompt,
        "--repetitions",
        "1",
        "--threads",
        "2",
        "--profile",
        profile.to_str().unwrap(),
        "--gpu-budget",
        "0",
    ];
    args.extend_from_slice(extra);
    hypura(&args)
}

fn report(model: &Path, extra: &[&str]) -> Value {
    let out = bench(model, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn histogram(v: &Value) -> Vec<Vec<u64>> {
    serde_json::from_value(v["histogram"].clone()).unwrap()
}

#[test]
fn bench_reports_the_routing_of_a_run() {
    let r = report(&tiny_moe(Routing::Qwen3), &["--routing"]);
    let routing = &r["routing"];
    assert_eq!(routing["profile"], "qwen3", "{routing}");
    assert_eq!(routing["n_expert"], 64);
    assert_eq!(routing["n_expert_used"], 4);
    assert_eq!(routing["tokens"], PROMPT + DECODE);
    let (prompt, decode) = (&routing["prompt"], &routing["decode"]);
    assert_eq!(decode["tokens"], DECODE);
    assert_eq!(prompt["tokens"], PROMPT);
    // Every layer chose 4 experts per token; the last layer computed its
    // FFN only for the prompt's last token (its only output).
    let (all, p, d) = (histogram(routing), histogram(prompt), histogram(decode));
    assert_eq!(all.len(), 3);
    for (layer, h) in all.iter().enumerate() {
        assert_eq!(h.len(), 64);
        let prompt_rows = if layer == 2 { 1 } else { PROMPT };
        assert_eq!(h.iter().sum::<u64>(), 4 * (prompt_rows + DECODE));
        assert_eq!(p[layer].iter().sum::<u64>(), 4 * prompt_rows);
        assert_eq!(d[layer].iter().sum::<u64>(), 4 * DECODE);
        let summed: Vec<u64> = p[layer].iter().zip(&d[layer]).map(|(a, b)| a + b).collect();
        assert_eq!(&summed, h);
    }
    // The qwen3 profile's decode overlap is 0.35 (independent uniform: 1/16).
    let overlap = decode["overlap"].as_f64().unwrap();
    assert!((overlap - 0.35).abs() < 0.05, "decode overlap {overlap}");

    let r = report(&tiny_moe(Routing::Degenerate), &["--routing"]);
    assert_eq!(r["routing"]["profile"], "degenerate");
    assert_eq!(r["routing"]["decode"]["overlap"], 1.0);
    assert_eq!(r["routing"]["prompt"]["overlap"], 1.0);

    // Without --routing nothing is recorded.
    let r = report(&tiny_moe(Routing::Qwen3), &[]);
    assert!(r["routing"].is_null(), "{}", r["routing"]);
}

#[test]
fn bench_routing_needs_a_moe() {
    let dense = synth::cached::model(&SynthSpec::tiny_llama()).unwrap();
    let out = bench(&dense, &["--routing"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--routing needs a MoE model"), "{stderr}");
}

#[test]
fn bench_writes_the_decodes_choices_to_a_routing_trace() {
    let path =
        std::env::temp_dir().join(format!("hypura-routing-trace-{}.jsonl", std::process::id()));
    let arg = path.to_str().unwrap();
    let r = report(
        &tiny_moe(Routing::Qwen3),
        &["--routing", "--routing-trace", arg],
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "one line per prompt size");
    assert_eq!(lines[0]["prompt_tokens"], PROMPT);
    assert_eq!(lines[0]["n_expert"], 64);
    // Per layer, per decoded token, its 4 experts: the report's decode histogram.
    let decode: Vec<Vec<Vec<u32>>> = serde_json::from_value(lines[0]["decode"].clone()).unwrap();
    assert_eq!(decode.len(), 3);
    let want = histogram(&r["routing"]["decode"]);
    for (layer, rows) in decode.iter().enumerate() {
        assert_eq!(rows.len() as u64, DECODE);
        let mut h = vec![0u64; 64];
        for row in rows {
            assert_eq!(row.len(), 4);
            row.iter().for_each(|&e| h[e as usize] += 1);
        }
        assert_eq!(h, want[layer], "layer {layer}");
    }

    // Only with --routing, which records it.
    let model = tiny_moe(Routing::Qwen3);
    let out = bench(&model, &["--routing-trace", arg]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--routing"), "{stderr}");
    assert!(!path.exists(), "nothing written without --routing");
}
