//! Where hypura keeps model files and its caches: the one place that reads
//! `HYPURA_MODELS_DIR` and `HYPURA_CACHE_DIR`.
//!
//! An empty variable counts as unset. Callers turn `None` (no variable and no `HOME`) into
//! their own error, which names the variable to set.
use std::ffi::OsString;
use std::path::PathBuf;

/// `$HYPURA_MODELS_DIR`, when set.
pub fn models_dir_override() -> Option<PathBuf> {
    non_empty("HYPURA_MODELS_DIR").map(PathBuf::from)
}

/// Where downloaded models are kept: `$HYPURA_MODELS_DIR`, else `~/.cache/hypura/models`.
pub fn models_dir() -> Option<PathBuf> {
    models_dir_override().or_else(|| home().map(|h| h.join(".cache/hypura/models")))
}

/// hypura's cache (the hardware profile, expert co-activation statistics):
/// `$HYPURA_CACHE_DIR`, else `~/.cache/hypura`.
pub fn cache_dir() -> Option<PathBuf> {
    non_empty("HYPURA_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".cache/hypura")))
}

fn home() -> Option<PathBuf> {
    non_empty("HOME").map(PathBuf::from)
}

fn non_empty(var: &str) -> Option<OsString> {
    std::env::var_os(var).filter(|v| !v.is_empty())
}
