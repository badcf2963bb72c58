//! How fast each model's streamer read its file, persisted per model file
//! (`reads/KEY.json` under the cache directory, keyed as the co-activation
//! counts are: [`super::coact::model_stats_path`]), for the planner to price
//! the model's next load by ([`hypura_scheduler::reads`]). Never written
//! next to the model.
use std::path::{Path, PathBuf};

use hypura_scheduler::reads::MeasuredReads;

/// Where the read rates of `model` (whose header is `data_offset` bytes
/// long) are kept: under `cache_dir`, else the default cache directory.
pub fn path(model: &Path, data_offset: u64, cache_dir: Option<&Path>) -> std::io::Result<PathBuf> {
    super::coact::model_stats_path("reads", model, data_offset, cache_dir)
}

/// The saved totals, if any (unreadable ones count as none).
pub fn load(path: &Path) -> Option<MeasuredReads> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Adds one run's reads to the saved totals ([`MeasuredReads::after`]) and
/// writes them atomically (temp file + rename).
pub fn save_run(path: &Path, run: MeasuredReads) -> std::io::Result<()> {
    super::coact::save_json(path, &load(path).unwrap_or_default().after(run))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypura_scheduler::reads::ReadTotals;

    #[test]
    fn runs_add_up_in_the_saved_file() {
        let dir = std::env::temp_dir().join(format!("hypura-reads-{}", std::process::id()));
        let at = dir.join("reads").join("key.json");
        assert_eq!(load(&at), None);
        let run = MeasuredReads {
            decode: ReadTotals {
                bytes: 2e9,
                seconds: 1.0,
                layer_requests: 100.0,
                stall_seconds: 1.25,
            },
            ..Default::default()
        };
        save_run(&at, run).unwrap();
        assert_eq!(load(&at), Some(run));
        save_run(&at, run).unwrap();
        assert_eq!(
            load(&at),
            Some(MeasuredReads::default().after(run).after(run))
        );
        std::fs::write(&at, b"not json").unwrap();
        assert_eq!(load(&at), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
