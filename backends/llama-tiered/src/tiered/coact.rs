//! Expert co-activation statistics, persisted per model file so a restarted
//! server prefetches well from its first token.
//!
//! Kept in `$HYPURA_CACHE_DIR/coactivation/` (else `~/.cache/hypura/…`), one
//! JSON file per model, named by a content key: the SHA-256 of the file's
//! header (metadata and tensor table) and size. Never written next to the model.
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `counts[l][a * n_experts + b]`: tokens that chose expert `a` in layer `l`
/// and expert `b` in layer `l + 1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coactivation {
    pub n_layers: u32,
    pub n_experts: u32,
    pub counts: Vec<Vec<u32>>,
}

impl Coactivation {
    pub fn new(n_layers: u32, n_experts: u32) -> Self {
        Coactivation {
            n_layers,
            n_experts,
            counts: vec![vec![0; (n_experts * n_experts) as usize]; n_layers as usize],
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().map(|&c| c as u64).sum()
    }

    /// `selections[l][e]`: the times expert `e` of layer `l` was chosen, as
    /// the counts say when every token chooses `n_used` experts a layer: the
    /// pairs from layer `l` to the next (row sums) or from the layer before
    /// to `l` (column sums), whichever saw more tokens (a layer whose
    /// neighbour is not streamed has only one of them).
    pub fn selections(&self, n_used: u32) -> Vec<Vec<u64>> {
        let n = self.n_experts as usize;
        let n_used = u64::from(n_used.max(1));
        let from = |table: &[u32]| -> Vec<u64> {
            (0..n)
                .map(|a| {
                    table[a * n..(a + 1) * n]
                        .iter()
                        .map(|&c| u64::from(c))
                        .sum()
                })
                .collect()
        };
        let to = |table: &[u32]| -> Vec<u64> {
            (0..n)
                .map(|b| (0..n).map(|a| u64::from(table[a * n + b])).sum())
                .collect()
        };
        (0..self.counts.len())
            .map(|l| {
                let rows = from(&self.counts[l]);
                let cols = match l.checked_sub(1) {
                    Some(before) => to(&self.counts[before]),
                    None => vec![0; n],
                };
                let best = if cols.iter().sum::<u64>() > rows.iter().sum::<u64>() {
                    cols
                } else {
                    rows
                };
                best.into_iter().map(|c| c / n_used).collect()
            })
            .collect()
    }

    /// Loads saved statistics of the same shape, if any.
    pub fn load(path: &Path, n_layers: u32, n_experts: u32) -> Option<Coactivation> {
        let saved: Coactivation = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let shape_ok = saved.n_layers == n_layers
            && saved.n_experts == n_experts
            && saved.counts.len() == n_layers as usize
            && saved
                .counts
                .iter()
                .all(|l| l.len() == (n_experts * n_experts) as usize);
        shape_ok.then_some(saved)
    }

    /// Writes atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        save_json(path, self)
    }
}

/// Writes `value` as JSON to `path` atomically (a temp file beside it,
/// renamed over it), creating its folder: a model's statistics files.
pub fn save_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(value).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(tmp, path)
}

/// Where the statistics of the model file `model` (whose header is
/// `data_offset` bytes long) are kept: under `cache_dir`, else the default
/// cache directory (`$HYPURA_CACHE_DIR`, else `~/.cache/hypura`).
pub fn stats_path(
    model: &Path,
    data_offset: u64,
    cache_dir: Option<&Path>,
) -> std::io::Result<PathBuf> {
    model_stats_path("coactivation", model, data_offset, cache_dir)
}

/// Where a model's statistics of `kind` are kept: `kind/KEY.json` under
/// `cache_dir`, else the default cache directory, KEY a hash of the file's
/// header and size (so a file moved or linked keeps its statistics, and a
/// changed one starts afresh).
pub fn model_stats_path(
    kind: &str,
    model: &Path,
    data_offset: u64,
    cache_dir: Option<&Path>,
) -> std::io::Result<PathBuf> {
    let dir = match cache_dir {
        Some(dir) => dir.to_path_buf(),
        None => default_cache_dir()?,
    };
    let mut file = File::open(model)?;
    let size = file.metadata()?.len();
    let mut header = vec![0u8; data_offset.min(size) as usize];
    file.read_exact(&mut header)?;
    let mut hash = Sha256::new();
    hash.update(&header);
    hash.update(size.to_le_bytes());
    let key: String = hash
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(dir.join(kind).join(format!("{key}.json")))
}

fn default_cache_dir() -> std::io::Result<PathBuf> {
    hypura_gguf::paths::cache_dir()
        .ok_or_else(|| std::io::Error::other("neither HYPURA_CACHE_DIR nor HOME is set"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_count_each_layers_choices_from_the_pairs() {
        // 3 layers of 2 experts, top-1: three tokens chose (0,1,1), (0,1,0), (1,1,1).
        let mut c = Coactivation::new(3, 2);
        for t in [[0, 1, 1], [0, 1, 0], [1, 1, 1]] {
            for l in 0..2 {
                c.counts[l][t[l] * 2 + t[l + 1]] += 1;
            }
        }
        assert_eq!(c.selections(1), vec![vec![2, 1], vec![0, 3], vec![1, 2]]);
        // Top-2 counts each token's pairs twice over: halved.
        let doubled = Coactivation {
            counts: c
                .counts
                .iter()
                .map(|t| t.iter().map(|x| x * 2).collect())
                .collect(),
            ..c.clone()
        };
        assert_eq!(doubled.selections(2), c.selections(1));
    }
}
