//! `hypura profile`: measures this machine (or reads the cached measurement)
//! and prints it as a table or as one JSON object (`HardwareProfile`).
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use llama_tiered::hwprobe::{self, Effort, ProfileTable};

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// A directory on the volume that holds the models; its read speed is
    /// measured. Default: $HYPURA_MODELS_DIR, else ./models if it exists,
    /// else the cache directory.
    #[arg(long, value_name = "DIR")]
    path: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Measure again even when a cached profile is valid.
    #[arg(long)]
    refresh: bool,
    /// Small buffers and short reads: rough numbers in a few seconds (for tests).
    #[arg(long, hide = true)]
    quick: bool,
}

pub fn profile(args: ProfileArgs) -> anyhow::Result<()> {
    let cache_dir = hwprobe::default_cache_dir()?;
    let disk_path = match args.path {
        Some(path) => path,
        None => {
            let path = hwprobe::default_disk_path(&cache_dir);
            std::fs::create_dir_all(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            path
        }
    };
    let effort = if args.quick {
        Effort::Quick
    } else {
        Effort::Full
    };
    let cache_file = hwprobe::cache_file(&cache_dir);
    let cached = if args.refresh {
        None
    } else {
        hwprobe::cached(&cache_dir, &disk_path, effort)?
    };
    let profile = match cached {
        Some(profile) => {
            eprintln!(
                "cached profile {} (measure again with --refresh)",
                cache_file.display()
            );
            profile
        }
        None => {
            eprintln!(
                "measuring this machine and the disk under {} (about 20 s)…",
                disk_path.display()
            );
            let profile = hwprobe::measure_and_cache(&cache_dir, &disk_path, effort)?;
            eprintln!("saved to {}", cache_file.display());
            profile
        }
    };
    let text = if args.json {
        let json = serde_json::to_string_pretty(&profile).context("serializing the profile")?;
        format!("{json}\n")
    } else {
        ProfileTable(&profile).to_string()
    };
    // A reader that stops early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing the profile to stdout")
        }
        _ => Ok(()),
    }
}
