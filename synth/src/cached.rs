//! Synthetic models written once and kept for later runs: the tests' models.
//!
//! A test suite run needs several hundred MB of synthetic models; written
//! under a name per process, they would pile up in the temporary directory
//! at every run. So each is named by what it is (its spec, or the source and
//! settings of a derived MoE) and by this crate's generator source: a later run,
//! or another test process, reuses it, and a change to the generator writes
//! it anew. A file is written under a name of its own and renamed into place
//! when complete: readers never see half a file, and two writers racing each
//! leave a whole one.
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{derive_moe_from_dense, write, write_sparse, SynthError, SynthSpec};

/// The directory of the kept models: `$TMPDIR/hypura-synth-models`, one
/// directory per generator source inside.
pub fn cache_dir() -> PathBuf {
    std::env::temp_dir().join("hypura-synth-models")
}

/// [`write`]'s model for `spec`, written on first use.
pub fn model(spec: &SynthSpec) -> Result<PathBuf, SynthError> {
    kept("random", &format!("{spec:?}"), |path| {
        write(spec, path).map(drop)
    })
}

/// [`write_sparse`]'s model for `spec` (sparse file, few blocks on disk).
pub fn sparse_model(spec: &SynthSpec) -> Result<PathBuf, SynthError> {
    kept("sparse", &format!("{spec:?}"), |path| {
        write_sparse(spec, path).map(drop)
    })
}

/// [`derive_moe_from_dense`]'s model from `src`, written on first use. The
/// source is named by its path, size and modification time.
pub fn derived_moe(
    src: &Path,
    n_expert: u32,
    n_expert_used: u32,
    perturb: f32,
    seed: u64,
) -> Result<PathBuf, SynthError> {
    let meta = std::fs::metadata(src)?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = format!(
        "{}:{}:{modified}:{n_expert}:{n_expert_used}:{perturb}:{seed}",
        src.display(),
        meta.len()
    );
    kept("moe", &key, |path| {
        derive_moe_from_dense(src, path, n_expert, n_expert_used, perturb, seed).map(drop)
    })
}

/// The kept file for `key`, written by `write_to` if absent.
fn kept(
    kind: &str,
    key: &str,
    write_to: impl FnOnce(&Path) -> Result<(), SynthError>,
) -> Result<PathBuf, SynthError> {
    let dir = generator_dir()?;
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    let path = dir.join(format!("{kind}-{:016x}.gguf", hasher.finish()));
    if path.exists() {
        return Ok(path);
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let part = dir.join(format!(".{kind}-{}-{nanos:x}.part", std::process::id()));
    let written = write_to(&part).and_then(|()| Ok(std::fs::rename(&part, &path)?));
    if written.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    written.map(|()| path)
}

/// The models of this generator: a directory named by the hash of its
/// source (a change to it makes every model anew). Made on first use, when
/// the directories of other generators not used for a day are removed, so
/// the cache holds about one generator's models.
fn generator_dir() -> std::io::Result<PathBuf> {
    let mut hasher = DefaultHasher::new();
    include_str!("random.rs").hash(&mut hasher);
    let dir = cache_dir().join(format!("{:016x}", hasher.finish()));
    if dir.is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let day_ago = SystemTime::now() - std::time::Duration::from_secs(24 * 3600);
    for entry in std::fs::read_dir(cache_dir())?.filter_map(Result::ok) {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t < day_ago);
        if stale && entry.path() != dir && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(dir)
}

/// A name for `kept` in `dir`: a hard link to it (no copy), else a copy.
/// For tests that serve a directory of models.
pub fn link_into(kept: &Path, dir: &Path, name: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    if std::fs::hard_link(kept, &path).is_err() {
        std::fs::copy(kept, &path)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_written_once_and_found_again() {
        let spec = SynthSpec::tiny_llama().with_layers(2).with_seed(4242);
        let first = model(&spec).unwrap();
        let written = std::fs::metadata(&first).unwrap().modified().unwrap();
        let again = model(&spec).unwrap();
        assert_eq!(first, again);
        assert_eq!(
            std::fs::metadata(&again).unwrap().modified().unwrap(),
            written
        );
        // Another spec is another file.
        let other = model(&spec.clone().with_seed(4243)).unwrap();
        assert_ne!(first, other);
        // No part file is left behind.
        let parts = std::fs::read_dir(first.parent().unwrap())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".part") && name.contains(&format!("-{}-", std::process::id()))
            })
            .count();
        assert_eq!(parts, 0);
    }
}
