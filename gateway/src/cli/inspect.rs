//! `hypura inspect`: reads only the GGUF header and tensor table.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use llama_tiered::gguf::GgufFile;
use llama_tiered::inspect::ModelReport;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Path of a GGUF model file.
    model: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.model)?;
    file.validate()?;
    let report = ModelReport::from_gguf(&file);
    if args.json {
        let json = serde_json::to_string_pretty(&report).context("serializing the report")?;
        println!("{json}");
    } else {
        print!("{report}");
    }
    Ok(())
}
