//! `hypura-synth`: writes synthetic GGUF models for tests and benchmarks.
//!
//! ```text
//! hypura-synth dense|moe --preset NAME [--layers N] [--type q4_k|q8_0|f16|q4_0] [--seed S] [--sparse] -o FILE
//! hypura-synth moe ... [--routing mixtral|qwen3|uniform|degenerate|random]
//! hypura-synth derive-moe --from SRC.gguf [--experts 4] [--used 2] [--perturb 0.01] [--seed S] -o FILE
//! ```
use std::path::PathBuf;
use std::process::ExitCode;

use hypura_synth::{self as synth, Routing, SynthSpec, WriteReport};
use llama_tiered::llama::gguf_write::GgmlType;

const USAGE: &str = "\
usage:
  hypura-synth dense|moe --preset PRESET [--layers N] [--type TYPE] [--seed S] [--sparse] -o FILE
        moe only: [--routing mixtral|qwen3|uniform|degenerate|random]
  hypura-synth derive-moe --from SRC.gguf [--experts 4] [--used 2] [--perturb 0.01] [--seed S] -o FILE

presets: llama-8b, llama-70b, mixtral-8x7b, qwen3-30b-a3b, tiny-llama, tiny-mixtral
types:   q4_k (default; output q6_k), q8_0, f16, q4_0
`dense` refuses MoE presets and `moe` dense ones.
--routing sets how the experts are chosen (see docs/benchmarks.md):
  mixtral, qwen3  skewed per-layer popularity and a set overlap of
                  consecutive generated tokens' experts, from published
                  measurements of those models
  uniform         every expert alike, tokens independent
  degenerate      the same experts for every token
  random          a random router (the files of earlier versions)
  default: qwen3 for qwen3-30b-a3b, mixtral for the other MoE presets.
--sparse writes only the header and tensor table and extends the file to its
full size with a hole (zero data, no disk space): for `hypura inspect --plan`
on model-sized files, not for running them.";

/// Flags that take no value.
const SWITCHES: [&str; 1] = ["--sparse"];

/// Parsed `--flag value` pairs (and switches) after the subcommand.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            if !flag.starts_with('-') {
                return Err(format!("unexpected argument {flag:?}"));
            }
            if SWITCHES.contains(&flag.as_str()) {
                pairs.push((flag.clone(), String::new()));
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            pairs.push((flag.clone(), value.clone()));
        }
        Ok(Self(pairs))
    }

    /// The value of `names` (aliases), removed so leftovers can be reported.
    fn take(&mut self, names: &[&str]) -> Option<String> {
        let at = self
            .0
            .iter()
            .position(|(f, _)| names.contains(&f.as_str()))?;
        Some(self.0.remove(at).1)
    }

    fn take_parsed<T: std::str::FromStr>(&mut self, names: &[&str]) -> Result<Option<T>, String> {
        match self.take(names) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{}: invalid value {v:?}", names[0])),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.0.first() {
            None => Ok(()),
            Some((flag, _)) => Err(format!("unknown or repeated flag {flag}")),
        }
    }
}

fn preset(name: &str) -> Result<SynthSpec, String> {
    Ok(match name {
        "llama-8b" => SynthSpec::llama_8b(),
        "llama-70b" => SynthSpec::llama_70b(),
        "mixtral-8x7b" => SynthSpec::mixtral_8x7b(),
        "qwen3-30b-a3b" => SynthSpec::qwen3_30b_a3b(),
        "tiny-llama" => SynthSpec::tiny_llama(),
        "tiny-mixtral" => SynthSpec::tiny_mixtral(),
        _ => return Err(format!("unknown preset {name:?}")),
    })
}

fn weight_type(name: &str) -> Result<GgmlType, String> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "q4_k" | "q4_k_m" => GgmlType::Q4_K,
        "q8_0" => GgmlType::Q8_0,
        "f16" => GgmlType::F16,
        "q4_0" => GgmlType::Q4_0,
        _ => return Err(format!("unknown type {name:?}")),
    })
}

fn output(flags: &mut Flags) -> Result<PathBuf, String> {
    flags
        .take(&["-o", "--output"])
        .map(PathBuf::from)
        .ok_or_else(|| "-o FILE is required".to_string())
}

fn synth_cmd(moe: bool, mut flags: Flags) -> Result<WriteReport, String> {
    let name = flags.take(&["--preset"]).ok_or("--preset is required")?;
    let mut spec = preset(&name)?;
    if spec.arch.experts().is_some() != moe {
        let (kind, right) = if moe {
            ("dense", "dense")
        } else {
            ("MoE", "moe")
        };
        return Err(format!(
            "preset {name} is a {kind} model: use `hypura-synth {right}`"
        ));
    }
    if let Some(layers) = flags.take_parsed(&["--layers"])? {
        spec = spec.with_layers(layers);
    }
    if let Some(ty) = flags.take(&["--type"]) {
        spec = spec.with_weight_type(weight_type(&ty)?);
    }
    if let Some(seed) = flags.take_parsed(&["--seed"])? {
        spec = spec.with_seed(seed);
    }
    if moe {
        let routing = match flags.take(&["--routing"]) {
            Some(r) => Routing::parse(&r).ok_or_else(|| {
                format!(
                    "unknown routing {r:?} (one of {})",
                    Routing::NAMES.join(", ")
                )
            })?,
            None if name == "qwen3-30b-a3b" => Routing::Qwen3,
            None => Routing::Mixtral,
        };
        spec = spec.with_routing(routing);
    }
    let sparse = flags.take(&["--sparse"]).is_some();
    let path = output(&mut flags)?;
    flags.finish()?;
    let routing = if moe {
        format!(", routing {}", spec.routing.name())
    } else {
        String::new()
    };
    eprintln!(
        "writing {}{} ({} layers, {}{routing}) to {}",
        if sparse { "a sparse " } else { "" },
        spec.name,
        spec.n_layer,
        spec.weight_type,
        path.display()
    );
    if sparse {
        synth::write_sparse(&spec, &path)
    } else {
        synth::write(&spec, &path)
    }
    .map_err(|e| e.to_string())
}

fn derive_cmd(mut flags: Flags) -> Result<WriteReport, String> {
    let src = flags
        .take(&["--from"])
        .ok_or("--from SRC.gguf is required")?;
    let experts = flags
        .take_parsed(&["--experts"])?
        .unwrap_or(synth::DERIVE_DEFAULT_EXPERTS);
    let used = flags
        .take_parsed(&["--used"])?
        .unwrap_or(synth::DERIVE_DEFAULT_USED);
    let perturb = flags
        .take_parsed(&["--perturb"])?
        .unwrap_or(synth::DERIVE_DEFAULT_PERTURB);
    let seed = flags.take_parsed(&["--seed"])?.unwrap_or(0);
    let path = output(&mut flags)?;
    flags.finish()?;
    eprintln!(
        "deriving a {experts}-expert (top-{used}) MoE from {src} into {}",
        path.display()
    );
    synth::derive_moe_from_dense(src.as_ref(), &path, experts, used, perturb, seed)
        .map_err(|e| e.to_string())
}

fn run(args: &[String]) -> Result<WriteReport, String> {
    let (cmd, rest) = args.split_first().ok_or("missing subcommand")?;
    let flags = Flags::parse(rest)?;
    match cmd.as_str() {
        "dense" => synth_cmd(false, flags),
        "moe" => synth_cmd(true, flags),
        "derive-moe" => derive_cmd(flags),
        _ => Err(format!("unknown subcommand {cmd:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(r) => {
            println!(
                "wrote {} ({:.1} MiB, {} tensors) in {:.2} s: {:.0} MB/s",
                r.path.display(),
                r.bytes as f64 / (1 << 20) as f64,
                r.tensors,
                r.seconds,
                r.mb_per_s()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hypura-synth: {e}\n\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}
