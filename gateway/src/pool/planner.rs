//! The server's side of the planner: the hardware profile it plans with,
//! and every placement it loads asked of the one planner
//! ([`hypura_scheduler::plan::plan`], through [`plan_file`]).
//!
//! The profile is the one given (`--profile FILE`), else the one `hypura
//! profile` cached under `$HYPURA_CACHE_DIR` (default `~/.cache/hypura`),
//! else this machine's sizes at assumed speeds while the measurement runs in
//! the background ([`ServerProfile::measure_in_background`]); models loaded
//! after it ends are planned with the measured one.
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use anyhow::{bail, Context as _};
use hypura_gguf::GgufFile;
use hypura_scheduler::plan::{Budgets, Plan, PlanSettings};
use hypura_scheduler::profile::{HardwareProfile, PROFILE_VERSION};
use llama_tiered::hwprobe::{self, Effort};
use llama_tiered::tiered::{plan_file, PlannedLoad, TieredParams};

/// What the planner is asked for a model: the budgets, the context of each
/// sequence in tokens and the sequences decoded together; the rest (mode,
/// the GPU's share, the stream cache) left to the planner unless the caller
/// fixes it on the result. The one builder of [`PlanSettings`] for the
/// server's loads and budget, `hypura run` and `hypura inspect --plan`.
pub fn plan_settings(budgets: Budgets, context_tokens: u32, sequences: u32) -> PlanSettings {
    PlanSettings {
        budgets,
        context_tokens,
        sequences,
        ..PlanSettings::default()
    }
}

/// A hardware profile and where it came from.
pub struct LoadedProfile {
    pub profile: HardwareProfile,
    pub path: PathBuf,
}

/// The profile at `explicit`, else the cached one of this machine; `None`
/// when neither exists (`hypura profile` has not run).
pub fn find_profile(explicit: Option<&Path>) -> anyhow::Result<Option<LoadedProfile>> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let Ok(dir) = hwprobe::default_cache_dir() else {
                return Ok(None);
            };
            let cached = hwprobe::cache_file(&dir);
            if !cached.exists() {
                return Ok(None);
            }
            cached
        }
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the hardware profile {}", path.display()))?;
    let profile: HardwareProfile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a hardware profile (run `hypura profile` to measure this machine)",
            path.display()
        )
    })?;
    if profile.version != PROFILE_VERSION {
        bail!(
            "the hardware profile {} has version {}, this hypura reads {PROFILE_VERSION}: run `hypura profile` again",
            path.display(),
            profile.version
        );
    }
    Ok(Some(LoadedProfile { profile, path }))
}

/// The profile the server plans with; replaced once when a background
/// measurement ends.
#[derive(Debug)]
pub struct ServerProfile {
    current: RwLock<Arc<HardwareProfile>>,
}

impl ServerProfile {
    /// The profile at `explicit`, else the cached one, else an estimate
    /// (then [`ServerProfile::measure_in_background`] should follow once the
    /// server is up). Says in the log which one is in force.
    pub fn resolve(explicit: Option<&Path>) -> anyhow::Result<Arc<ServerProfile>> {
        let profile = match find_profile(explicit)? {
            Some(loaded) => {
                eprintln!(
                    "hypura: planning with the hardware profile {} (host {})",
                    loaded.path.display(),
                    loaded.profile.host
                );
                loaded.profile
            }
            None => {
                eprintln!(
                    "hypura: no hardware profile of this machine yet: planning with an estimate \
                     (its sizes, assumed speeds) until the measurement started in the background ends"
                );
                hwprobe::estimated()
            }
        };
        Ok(Self::new(profile))
    }

    pub fn new(profile: HardwareProfile) -> Arc<ServerProfile> {
        Arc::new(ServerProfile {
            current: RwLock::new(Arc::new(profile)),
        })
    }

    /// The profile in force now.
    pub fn get(&self) -> Arc<HardwareProfile> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Measures this machine as `hypura profile` does (about 20 s, on a
    /// thread of its own), caches the result, and plans with it from then
    /// on. Does nothing when the profile in force was measured.
    pub fn measure_in_background(self: &Arc<Self>) {
        if self.get().is_measured() {
            return;
        }
        let this = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("hypura-profile".into())
            .spawn(move || match measure() {
                Ok((profile, file)) => {
                    eprintln!(
                        "hypura: measured this machine's profile (saved to {}); \
                         models loaded from now on are planned with it",
                        file.display()
                    );
                    *this.current.write().unwrap_or_else(PoisonError::into_inner) =
                        Arc::new(profile);
                }
                Err(e) => eprintln!(
                    "hypura: measuring this machine failed ({e:#}); planning goes on with the \
                     estimate (`hypura profile` measures it explicitly)"
                ),
            });
        if let Err(e) = spawned {
            eprintln!("hypura: cannot measure this machine in the background: {e}");
        }
    }
}

/// `hypura profile`'s measurement, cached where it caches it.
fn measure() -> anyhow::Result<(HardwareProfile, PathBuf)> {
    let cache_dir = hwprobe::default_cache_dir()?;
    let disk_path = hwprobe::default_disk_path(&cache_dir);
    std::fs::create_dir_all(&disk_path)?;
    let profile = hwprobe::measure_and_cache(&cache_dir, &disk_path, Effort::Full)?;
    Ok((profile, hwprobe::cache_file(&cache_dir)))
}

/// The planner's placement of the model at `path` with `settings`, and the
/// load options that hold it (no CPU repacking, so a prompt gets the same
/// tokens whichever way the model is held; read-ahead on).
pub fn plan_model(
    path: &Path,
    profile: &HardwareProfile,
    settings: PlanSettings,
) -> Result<(Plan, TieredParams), String> {
    // Validated again: the file may have changed since it was registered.
    let file = GgufFile::open_validated(path).map_err(|e| e.to_string())?;
    let plan = plan_file(&file, profile, settings).map_err(|e| e.to_string())?;
    let planned = PlannedLoad::from_plan(&file, &plan).map_err(|e| e.to_string())?;
    let params = TieredParams {
        plan: Some(planned),
        no_repack: true,
        prefetch: true,
        ..Default::default()
    };
    Ok((plan, params))
}

/// The line the server writes for each placement it loads: the summary for
/// people, then (after `| plan `) the same as JSON, with the keys `hypura
/// inspect --plan --json` prints for the same inputs. Recorded on the current
/// span too (a load's or a switch's).
pub fn log_placement(model: &str, residency: &str, plan: &Plan) {
    crate::telemetry::pool::record_plan(plan);
    let summary = plan.summary();
    let json = serde_json::to_string(&summary).unwrap_or_default();
    eprintln!("hypura: placement of {model} ({residency}): {summary} | plan {json}");
}
