//! The GPU tier: how a planned placement's GPU tensors become llama.cpp's
//! `n_gpu_layers` plus buffer-type overrides. Which tensors go to the GPU
//! is the planner's (`hypura_scheduler::plan`, `hypura_scheduler::gpu`).
//!
//! llama.cpp offloads the *last* `n_gpu_layers` layers, counting the output
//! layer as the last one (`-ngl 16` on a 32-layer model: the output layer
//! and layers 17–31): their weights, KV cache and compute go to the GPU;
//! `token_embd` always stays on the CPU. A placement whose GPU layers form such a suffix needs no override
//! (like `-ngl N`); tensors placed against that rule get anchored overrides
//! (like `-ngl 99 -ot exps=CPU`). An op runs where its weight lives, so
//! "attention on the GPU, experts in RAM or streamed" computes the experts on
//! the CPU. STREAM tensors always stay in host memory (the STREAM buffer is
//! host memory filled from the file).
use std::collections::{BTreeMap, BTreeSet};

use hypura_scheduler::gpu::gpu_layers;
use hypura_scheduler::roles::layer_index;

use super::placement::{Placement, Tier};
use crate::llama::GpuOffload;
use hypura_gguf::GgufFile;

/// What llama.cpp needs to load `placement`: `None` when no tensor is on the GPU.
pub fn offload(placement: &Placement, file: &GgufFile) -> Option<GpuOffload> {
    let gpu_weight_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| placement.tier(&t.name) == Some(Tier::Gpu))
        .map(|t| t.n_bytes)
        .sum();
    if !placement.tiers.values().any(|&t| t == Tier::Gpu) {
        return None;
    }
    let n_layer = layer_count(file);
    let n_gpu_layers = gpu_layers(
        file.tensors().iter().map(|t| t.name.as_str()),
        &placement.tiers,
        n_layer,
    );
    // llama.cpp's first GPU layer: the output layer is counted first.
    let first_gpu_layer = (n_layer + 1).saturating_sub(n_gpu_layers);
    let mut gpu = Overrides::default();
    let mut ram = Overrides::default();
    for t in file.tensors() {
        let tier = placement.tier(&t.name);
        match layer_index(&t.name) {
            Some(il) => {
                let default_gpu = il >= first_gpu_layer;
                match tier {
                    Some(Tier::Gpu) if !default_gpu => gpu.add(&t.name),
                    Some(Tier::Ram) if default_gpu => ram.add(&t.name),
                    _ => {}
                }
            }
            // Global tensors whose llama.cpp layer is not known for sure
            // are named whatever their tier.
            None => {
                let default_gpu = global_default_gpu(&t.name, n_gpu_layers);
                match tier {
                    Some(Tier::Gpu) if default_gpu != Some(true) => gpu.add(&t.name),
                    Some(Tier::Ram) if default_gpu != Some(false) => ram.add(&t.name),
                    _ => {}
                }
            }
        }
    }
    Some(GpuOffload {
        gpu_index: 0,
        n_gpu_layers,
        gpu_patterns: gpu.patterns(),
        ram_patterns: ram.patterns(),
        gpu_weight_bytes,
    })
}

/// Whether llama.cpp puts global tensor `name` on the GPU by default with
/// `n_gpu_layers`: never the input layer, the output layer from
/// `n_gpu_layers = 1` on; `None` for other names.
fn global_default_gpu(name: &str, n_gpu_layers: u32) -> Option<bool> {
    match name {
        "token_embd.weight" => Some(false),
        "output.weight" | "output.bias" | "output_norm.weight" | "output_norm.bias" => {
            Some(n_gpu_layers >= 1)
        }
        _ => None,
    }
}

/// The number of repeating layers: the architecture's `block_count`, else
/// one more than the highest `blk.N` index.
fn layer_count(file: &GgufFile) -> u32 {
    file.arch_u64("block_count")
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_else(|| {
            file.tensors()
                .iter()
                .filter_map(|t| layer_index(&t.name))
                .max()
                .map_or(0, |il| il + 1)
        })
}

/// Tensor names of one target, turned into few anchored regexes: per-layer
/// tensors grouped by their set of layers (`^blk\.(1[6-9]|2[0-9]|3[01])\.(ffn_up_exps\.weight|…)$`),
/// global ones in one alternation.
#[derive(Default)]
struct Overrides {
    /// Name after `blk.N.` → its layers.
    per_layer: BTreeMap<String, BTreeSet<u32>>,
    global: BTreeSet<String>,
}

impl Overrides {
    fn add(&mut self, name: &str) {
        match (layer_index(name), name.splitn(3, '.').nth(2)) {
            (Some(il), Some(rest)) => {
                self.per_layer
                    .entry(rest.to_owned())
                    .or_default()
                    .insert(il);
            }
            _ => {
                self.global.insert(name.to_owned());
            }
        }
    }

    fn patterns(&self) -> Vec<String> {
        let mut by_layers: BTreeMap<&BTreeSet<u32>, Vec<&str>> = BTreeMap::new();
        for (rest, layers) in &self.per_layer {
            by_layers.entry(layers).or_default().push(rest);
        }
        let mut patterns: Vec<String> = by_layers
            .into_iter()
            .map(|(layers, rests)| {
                let layers: Vec<u32> = layers.iter().copied().collect();
                format!(
                    r"^blk\.({})\.({})$",
                    layers_regex(&layers),
                    alternation(rests.into_iter())
                )
            })
            .collect();
        if !self.global.is_empty() {
            patterns.push(format!(
                "^({})$",
                alternation(self.global.iter().map(String::as_str))
            ));
        }
        patterns
    }
}

fn alternation<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.map(escape).collect::<Vec<_>>().join("|")
}

/// `name` with regex metacharacters escaped (tensor names hold dots).
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if r"\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A regex (no anchors, no outer group) matching exactly the decimal
/// numbers in `layers` (sorted, distinct): consecutive runs become digit
/// ranges, so 0..=31 is `[0-9]|[12][0-9]|3[01]`.
pub(crate) fn layers_regex(layers: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.extend(range_regex(layers[i], layers[j]));
        i = j + 1;
    }
    parts.join("|")
}

/// Alternatives matching exactly the numbers `lo..=hi`.
fn range_regex(lo: u32, hi: u32) -> Vec<String> {
    let mut parts = Vec::new();
    let mut lo = lo;
    // Split into runs of equal digit count: 7..=123 → 7..=9, 10..=99, 100..=123.
    while lo <= hi {
        let width = lo.to_string().len() as u32;
        let top = 10u32.saturating_pow(width).saturating_sub(1).min(hi);
        same_width(&lo.to_string(), &top.to_string(), &mut parts, String::new());
        if top == u32::MAX {
            break;
        }
        lo = top + 1;
    }
    parts
}

/// Alternatives (each prefixed by `prefix`) for the numbers between `a` and
/// `b`, two digit strings of equal length with `a <= b`.
fn same_width(a: &str, b: &str, out: &mut Vec<String>, prefix: String) {
    let (a0, b0) = (a.as_bytes()[0] - b'0', b.as_bytes()[0] - b'0');
    let (a_rest, b_rest) = (&a[1..], &b[1..]);
    let any = |n: usize| "[0-9]".repeat(n);
    let digits = |x: u8, y: u8| {
        if x == y {
            x.to_string()
        } else {
            format!("[{x}-{y}]")
        }
    };
    if a_rest.is_empty() {
        out.push(format!("{prefix}{}", digits(a0, b0)));
        return;
    }
    if a0 == b0 {
        same_width(a_rest, b_rest, out, format!("{prefix}{a0}"));
        return;
    }
    let all_zero = a_rest.bytes().all(|c| c == b'0');
    let all_nine = b_rest.bytes().all(|c| c == b'9');
    let n = a_rest.len();
    // The first leading digit (partly, unless it starts at ...0).
    let mut mid_lo = a0 + 1;
    if all_zero {
        mid_lo = a0;
    } else {
        same_width(a_rest, &"9".repeat(n), out, format!("{prefix}{a0}"));
    }
    let mut mid_hi = b0 - 1;
    if all_nine {
        mid_hi = b0;
    }
    if mid_lo <= mid_hi {
        out.push(format!("{prefix}{}{}", digits(mid_lo, mid_hi), any(n)));
    }
    if !all_nine {
        same_width(&"0".repeat(n), b_rest, out, format!("{prefix}{b0}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regex as a plain matcher over digit strings: checks every number
    /// 0..=999 against the set, with a tiny evaluator of the subset used.
    fn matches(alternatives: &str, s: &str) -> bool {
        alternatives.split('|').any(|alt| {
            let mut chars = s.chars();
            let mut rest = alt;
            while !rest.is_empty() {
                let Some(c) = chars.next() else { return false };
                if let Some(r) = rest.strip_prefix('[') {
                    let (class, after) = r.split_once(']').unwrap();
                    let b = class.as_bytes();
                    if !(b[0] as char <= c && c <= b[2] as char) {
                        return false;
                    }
                    rest = after;
                } else {
                    if !rest.starts_with(c) {
                        return false;
                    }
                    rest = &rest[1..];
                }
            }
            chars.next().is_none()
        })
    }

    #[test]
    fn layer_regexes_match_exactly_their_layers() {
        let sets: Vec<Vec<u32>> = vec![
            (0..32).collect(),
            (16..32).collect(),
            (0..16).collect(),
            vec![5],
            vec![0, 2, 4, 9, 10, 11, 99, 100, 101, 199, 200],
            (7..124).collect(),
            (0..1000).collect(),
            (95..105).chain(400..412).collect(),
        ];
        for set in sets {
            let re = layers_regex(&set);
            for n in 0..1000u32 {
                assert_eq!(
                    matches(&re, &n.to_string()),
                    set.contains(&n),
                    "{n} against {re} for {set:?}"
                );
            }
        }
        assert_eq!(
            layers_regex(&(0..32).collect::<Vec<_>>()),
            "[0-9]|[1-2][0-9]|3[0-1]"
        );
        assert_eq!(
            layers_regex(&(16..32).collect::<Vec<_>>()),
            "1[6-9]|2[0-9]|3[0-1]"
        );
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(escape("attn_q.weight"), r"attn_q\.weight");
    }
}
