//! `hypura cp SOURCE DESTINATION`: serves a model under a second name
//! (`POST /api/copy`), as `ollama cp` does; prints `copied 'SOURCE' to
//! 'DESTINATION'`.
use clap::Args;
use serde_json::json;

use super::Client;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// The model to copy (`name[:tag]`).
    source: String,
    /// Its new name.
    destination: String,
}

pub fn cp(args: CpArgs) -> anyhow::Result<()> {
    let body = json!({"source": args.source, "destination": args.destination});
    Client::from_env()?.call(reqwest::Method::POST, "/api/copy", &body)?;
    println!("copied '{}' to '{}'", args.source, args.destination);
    Ok(())
}
