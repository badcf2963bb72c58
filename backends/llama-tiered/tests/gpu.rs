//! The GPU tier: which tensors a GPU share takes, what llama.cpp is told to
//! load them there, and the clear error of a GPU placement without a GPU.
//! Tests that need a GPU skip (with a note) where this build sees none.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hypura_gguf::GgufFile;
use hypura_scheduler::roles::{classify, TensorRole};
use hypura_synth::{self as synth, SynthSpec};
use llama_tiered::engine::prompt;
use llama_tiered::llama::{gpu_devices, ContextParams};
use llama_tiered::test_models;
use llama_tiered::tiered::{
    gpu, GpuShare, Mode, Placement, PlannedLoad, Tier, TieredModel, TieredParams,
};

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hypura-gpu-{}-{name}", std::process::id()))
}

fn tiny(spec: SynthSpec) -> PathBuf {
    synth::cached::model(&spec).expect("write synthetic model")
}

fn tiny_llama() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| tiny(SynthSpec::tiny_llama().with_layers(4)))
}

fn tiny_mixtral() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| tiny(SynthSpec::tiny_mixtral().with_layers(4)))
}

/// The planner's placement of `path` with `mode` and `share` fixed.
fn placed(path: &Path, mode: Mode, share: GpuShare) -> (GgufFile, Placement) {
    let file = GgufFile::open(path).unwrap();
    let placement = PlannedLoad::fixed(&file, mode, share, None)
        .unwrap()
        .placement;
    (file, placement)
}

fn planned(path: &Path, mode: Mode, share: GpuShare) -> Option<PlannedLoad> {
    let file = GgufFile::open(path).unwrap();
    Some(PlannedLoad::fixed(&file, mode, share, None).unwrap())
}

fn is_ffn(name: &str) -> bool {
    matches!(
        classify(name),
        TensorRole::Ffn | TensorRole::Experts | TensorRole::SharedExperts
    )
}

/// Bytes of everything but FFN / expert weights and the token embeddings.
fn non_ffn_bytes(file: &GgufFile) -> u64 {
    file.tensors()
        .iter()
        .filter(|t| !is_ffn(&t.name) && classify(&t.name) != TensorRole::Embedding)
        .map(|t| t.n_bytes)
        .sum()
}

#[test]
fn whole_layers_need_no_override() {
    // As llama.cpp's `-ngl 3`: the output layer and the last two layers.
    let (file, placement) = placed(tiny_llama(), Mode::FullResident, GpuShare::Layers(3));
    for t in file.tensors() {
        let expected = if t.name.starts_with("blk.2.")
            || t.name.starts_with("blk.3.")
            || t.name.starts_with("output")
        {
            Tier::Gpu
        } else {
            Tier::Ram
        };
        assert_eq!(placement.tier(&t.name), Some(expected), "{}", t.name);
    }
    let offload = gpu::offload(&placement, &file).expect("GPU tensors");
    assert_eq!(offload.n_gpu_layers, 3);
    assert!(offload.gpu_patterns.is_empty() && offload.ram_patterns.is_empty());
    let gpu_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| placement.tier(&t.name) == Some(Tier::Gpu))
        .map(|t| t.n_bytes)
        .sum();
    assert_eq!(offload.gpu_weight_bytes, gpu_bytes);
}

#[test]
fn more_layers_than_the_model_takes_the_output_layer_but_not_the_embeddings() {
    let (file, placement) = placed(tiny_llama(), Mode::FullResident, GpuShare::Layers(99));
    assert_eq!(placement.tier("token_embd.weight"), Some(Tier::Ram));
    assert_eq!(placement.tier("output.weight"), Some(Tier::Gpu));
    assert_eq!(placement.tier("output_norm.weight"), Some(Tier::Gpu));
    let offload = gpu::offload(&placement, &file).unwrap();
    // llama.cpp's `-ngl 99`: no override.
    assert_eq!(offload.n_gpu_layers, 5);
    assert!(offload.gpu_patterns.is_empty() && offload.ram_patterns.is_empty());
}

#[test]
fn a_budget_for_all_but_the_ffn_keeps_the_ffn_in_ram_like_n_cpu_moe() {
    for (path, names) in [
        (
            tiny_llama(),
            r"ffn_down\.weight|ffn_gate\.weight|ffn_up\.weight",
        ),
        (
            tiny_mixtral(),
            r"ffn_down_exps\.weight|ffn_gate_exps\.weight|ffn_up_exps\.weight",
        ),
    ] {
        let file = GgufFile::open(path).unwrap();
        let budget = non_ffn_bytes(&file);
        let (file, placement) = placed(path, Mode::FullResident, GpuShare::BudgetBytes(budget));
        for t in file.tensors() {
            let on_gpu = !is_ffn(&t.name) && classify(&t.name) != TensorRole::Embedding;
            let expected = if on_gpu { Tier::Gpu } else { Tier::Ram };
            assert_eq!(placement.tier(&t.name), Some(expected), "{}", t.name);
        }
        let offload = gpu::offload(&placement, &file).unwrap();
        assert_eq!(offload.n_gpu_layers, 5, "every layer and the output");
        assert_eq!(
            offload.ram_patterns,
            vec![format!(r"^blk\.([0-3])\.({names})$")]
        );
        assert_eq!(offload.gpu_weight_bytes, budget);
    }
}

#[test]
fn a_budget_short_of_a_layer_stops_at_whole_units() {
    let file = GgufFile::open(tiny_llama()).unwrap();
    // The output layer and the last layer's attention and norms, not one byte more.
    let output: u64 = ["output.weight", "output_norm.weight"]
        .iter()
        .map(|n| file.tensor(n).unwrap().n_bytes)
        .sum();
    let last: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.3.") && !is_ffn(&t.name))
        .map(|t| t.n_bytes)
        .sum();
    let (file, placement) = placed(
        tiny_llama(),
        Mode::FullResident,
        GpuShare::BudgetBytes(output + last + last / 2),
    );
    let offload = gpu::offload(&placement, &file).unwrap();
    assert_eq!(offload.gpu_weight_bytes, output + last);
    // llama.cpp's `-ngl 2`: the output layer and the last layer.
    assert_eq!(
        offload.n_gpu_layers, 2,
        "only the last layer's KV on the GPU"
    );
    assert!(offload.gpu_patterns.is_empty());
    // Its FFN stays in RAM against llama.cpp's default for a GPU layer.
    assert_eq!(
        offload.ram_patterns,
        vec![r"^blk\.(3)\.(ffn_down\.weight|ffn_gate\.weight|ffn_up\.weight)$".to_string()]
    );
}

#[test]
fn an_output_layer_in_ram_beside_gpu_layers_is_named() {
    let (file, mut placement) = placed(tiny_llama(), Mode::FullResident, GpuShare::Layers(3));
    for name in ["output.weight", "output_norm.weight"] {
        placement.tiers.insert(name.to_string(), Tier::Ram);
    }
    let offload = gpu::offload(&placement, &file).unwrap();
    assert_eq!(offload.n_gpu_layers, 3);
    assert!(offload.gpu_patterns.is_empty());
    assert_eq!(
        offload.ram_patterns,
        vec![r"^(output\.weight|output_norm\.weight)$".to_string()]
    );
}

#[test]
fn streamed_tensors_never_move_to_the_gpu() {
    let (file, placement) = placed(tiny_mixtral(), Mode::ExpertStreaming, GpuShare::Layers(99));
    for t in file.tensors() {
        let tier = placement.tier(&t.name).unwrap();
        if classify(&t.name) == TensorRole::Experts {
            assert_eq!(tier, Tier::Stream, "{}", t.name);
        } else if classify(&t.name) != TensorRole::Embedding {
            assert_eq!(tier, Tier::Gpu, "{}", t.name);
        }
    }
    let offload = gpu::offload(&placement, &file).unwrap();
    assert_eq!(offload.n_gpu_layers, 5);
    assert!(offload.ram_patterns.is_empty());
}

#[test]
fn no_gpu_share_means_no_offload() {
    let (file, placement) = placed(tiny_llama(), Mode::FullResident, GpuShare::None);
    assert!(gpu::offload(&placement, &file).is_none());
}

fn greedy(model: &TieredModel, n: u32) -> Vec<i32> {
    test_models::greedy_tokens(model, "The history of the city of Paris begins", n)
}

/// `path` loaded with the planner's placement for `mode` and `share`.
fn load_planned(path: &Path, mode: Mode, share: GpuShare) -> TieredModel {
    TieredModel::load(
        path,
        &TieredParams {
            plan: planned(path, mode, share),
            no_repack: true,
            cache_dir: Some(temp_path("cache")),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn a_gpu_placement_without_a_gpu_is_a_clear_error() {
    if !gpu_devices().is_empty() {
        eprintln!("skipped: this build sees a GPU");
        return;
    }
    for (mode, share) in [
        (Mode::FullResident, GpuShare::Layers(99)),
        (Mode::DenseFfnStreaming, GpuShare::BudgetBytes(1 << 30)),
    ] {
        let err = TieredModel::load(
            &test_models::smollm2(),
            &TieredParams {
                plan: planned(&test_models::smollm2(), mode, share),
                ..Default::default()
            },
        )
        .err()
        .expect("no GPU to load on");
        let text = err.to_string();
        assert!(text.contains("sees no GPU"), "{text}");
        assert!(text.contains("--gpu-layers"), "says what to do: {text}");
    }
}

/// On a GPU: every GPU share loads and decodes; the GPU share of a streamed
/// model gives the tokens of the same share with the streamed tensors in RAM
/// (the same ops on the same devices).
#[test]
fn gpu_shares_decode_and_streaming_matches_ram_on_the_same_devices() {
    if gpu_devices().is_empty() {
        eprintln!("skipped: no GPU in this build");
        return;
    }
    let path = tiny_mixtral();
    let file = GgufFile::open(path).unwrap();
    let load = |mode, gpu| load_planned(path, mode, gpu);
    let ram = greedy(
        &load(
            Mode::FullResident,
            GpuShare::BudgetBytes(non_ffn_bytes(&file)),
        ),
        16,
    );
    let stream = greedy(&load(Mode::ExpertStreaming, GpuShare::Layers(99)), 16);
    assert_eq!(ram, stream);
    assert!(!greedy(&load(Mode::FullResident, GpuShare::Layers(2)), 16).is_empty());
}

/// A decode step of one sequence runs on one host thread exactly when the
/// host computes nothing but the input row lookup: every layer and the
/// output layer on the GPU, nothing streamed. Larger batches keep every
/// thread asked for.
#[test]
fn only_a_model_wholly_on_the_gpu_decodes_single_tokens_on_one_host_thread() {
    let threads = |mode, share| {
        let path = if mode == Mode::FullResident {
            tiny_llama()
        } else {
            tiny_mixtral()
        };
        let model = load_planned(path, mode, share);
        let ctx = model
            .new_context(&ContextParams {
                n_ctx: 256,
                n_threads: 3,
                ..Default::default()
            })
            .unwrap();
        (model.model.host_input_only(), ctx.threads())
    };
    assert_eq!(threads(Mode::FullResident, GpuShare::None), (false, (3, 3)));
    if gpu_devices().is_empty() {
        eprintln!("skipped the GPU placements: no GPU in this build");
        return;
    }
    assert_eq!(
        threads(Mode::FullResident, GpuShare::Layers(99)),
        (true, (1, 3))
    );
    // The first layer (or, below, the experts) computed on the host.
    assert_eq!(
        threads(Mode::FullResident, GpuShare::Layers(4)),
        (false, (3, 3))
    );
    assert_eq!(
        threads(Mode::ExpertStreaming, GpuShare::Layers(99)),
        (false, (3, 3))
    );
}

/// On the GPU (and on the CPU where there is none), the argmax taken inside
/// the decode graph (`set_device_greedy`: two stages over 200 rows of 160
/// logits) is a largest of the logits the host reads, step by step.
#[test]
fn the_decode_graphs_argmax_is_the_hosts() {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        tiny(SynthSpec {
            n_vocab: 32_000,
            ..SynthSpec::tiny_llama().with_layers(4)
        })
    });
    let share = if gpu_devices().is_empty() {
        GpuShare::None
    } else {
        GpuShare::Layers(99)
    };
    let model = load_planned(path, Mode::FullResident, share);
    let params = ContextParams {
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    let mut host = model.new_context(&params).unwrap();
    let mut device = model.new_context(&params).unwrap();
    assert!(device.set_device_greedy(0, true));
    assert_eq!(
        device.device_greedy_name(0).as_deref(),
        Some("greedy-two-stage")
    );
    let tokens =
        prompt::tokenize_raw(&model.model, "The history of the city of Paris begins").unwrap();
    let steps = test_models::greedy_side_by_side(&mut host, &mut device, &tokens, 24);
    for (step, seen) in steps.iter().enumerate() {
        // A largest logit: this synthetic model's output rows repeat, so
        // exact ties occur, and either side of one may win.
        let token = seen.device_sampled.expect("a device token") as usize;
        assert_eq!(
            seen.logits[token], seen.logits[seen.argmax as usize],
            "step {step}"
        );
    }
}
